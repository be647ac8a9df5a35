"""The label-smoothed loss of the kernel seam's reference path (seq2seq.kernels.reference.
output_loss, what CUDA trains with) against the loss written out from its formula, and the seam's
choice (kernels.output_loss) against both. The fused CPU kernel is checked in test_loss.py."""

from __future__ import annotations

import pytest
import torch

from seq2seq import kernels
from seq2seq.data.tokenizer import PAD_ID
from seq2seq.kernels import reference
from tests.references import smoothed_loss


def hidden_weight_target(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(20, 8, generator=gen)  # (N, D)
    weight = torch.randn(11, 8, generator=gen)  # (V, D)
    target = torch.randint(1, 11, (20,), generator=gen)  # (N,) no padding: the model drops it
    return hidden, weight, target


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_reference_loss_and_gradient_match_the_formula(eps: float) -> None:
    hidden, weight, target = hidden_weight_target()
    h1, w1 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    loss, nll = reference.output_loss(h1, w1, target, eps)
    (loss * 0.7).backward()
    h2, w2 = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    want_loss, want_nll = smoothed_loss(h2 @ w2.T, target, eps)
    (want_loss * 0.7).backward()
    torch.testing.assert_close(loss, want_loss)
    torch.testing.assert_close(nll, want_nll)
    torch.testing.assert_close(h1.grad, h2.grad)
    torch.testing.assert_close(w1.grad, w2.grad)
    assert not nll.requires_grad  # only the loss carries a gradient
    if eps > 0:
        assert not torch.allclose(loss, nll)


@pytest.mark.parametrize("mode", ["auto", "reference"])
def test_the_seams_choice_equals_the_formula(mode: str) -> None:
    hidden, weight, target = hidden_weight_target(seed=2)
    with kernels.use(mode):
        loss, nll = kernels.output_loss(hidden, weight, target, 0.1)
    want_loss, want_nll = smoothed_loss(hidden @ weight.T, target, 0.1)
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(nll, want_nll, rtol=1e-5, atol=1e-4)


def test_the_written_out_formula_ignores_padding() -> None:
    """The reference the kernels are held to: padded targets add nothing, whatever the logits."""
    _, _, target = hidden_weight_target(seed=3)
    target[[2, 5]] = PAD_ID
    logits = torch.randn(20, 11)
    changed = logits.clone()
    changed[[2, 5]] = torch.randn(2, 11) * 10
    torch.testing.assert_close(
        smoothed_loss(logits, target, 0.1), smoothed_loss(changed, target, 0.1)
    )
