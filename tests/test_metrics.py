"""The training loss's hand-written gradients (seq2seq/metrics.py) and the CPU dropout
(seq2seq/layers.py) against PyTorch's own autograd and F.dropout."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seq2seq.layers import dropout
from seq2seq.metrics import label_smoothed_nll, linear_label_smoothed_nll
from seq2seq.tokenizer import PAD_ID


def reference(logits: torch.Tensor, target: torch.Tensor, eps: float) -> torch.Tensor:
    """Summed label-smoothed loss through torch's autograd (padding ignored)."""
    return F.cross_entropy(
        logits.float(), target, ignore_index=PAD_ID, reduction="sum", label_smoothing=eps
    )


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_label_smoothed_nll_gradient_matches_autograd(eps: float) -> None:
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(20, 11, generator=gen) * 3).requires_grad_()
    target = torch.randint(1, 11, (20,), generator=gen)
    target[[0, 7]] = PAD_ID
    ours, _ = label_smoothed_nll(logits, target, eps)
    (ours * 0.7).backward()
    got = logits.grad.clone()
    logits.grad = None
    (reference(logits, target, eps) * 0.7).backward()
    torch.testing.assert_close(got, logits.grad)
    assert got[[0, 7]].abs().max() == 0  # padding gets no gradient


@pytest.mark.parametrize(("eps", "chunk"), [(0.0, 4), (0.1, 7), (0.1, 1000)])
def test_linear_label_smoothed_nll_matches_logits_first(eps: float, chunk: int) -> None:
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(23, 8, generator=gen).requires_grad_()
    weight = torch.randn(13, 8, generator=gen).requires_grad_()
    target = torch.randint(1, 13, (23,), generator=gen)
    loss, nll = linear_label_smoothed_nll(hidden, weight, target, eps, chunk)
    (loss * 1.3).backward()
    got_h, got_w = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    want_loss, want_nll = label_smoothed_nll(hidden @ weight.T, target, eps)
    torch.testing.assert_close(loss, want_loss)
    torch.testing.assert_close(nll, want_nll)
    (reference(hidden @ weight.T, target, eps) * 1.3).backward()
    torch.testing.assert_close(got_h, hidden.grad)
    torch.testing.assert_close(got_w, weight.grad)
    assert not nll.requires_grad


def test_linear_label_smoothed_nll_under_bf16_autocast() -> None:
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(30, 16, generator=gen).requires_grad_()
    weight = torch.randn(50, 16, generator=gen).requires_grad_()
    target = torch.randint(1, 50, (30,), generator=gen)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = linear_label_smoothed_nll(hidden, weight, target, 0.1, 8)
    loss.backward()
    assert loss.dtype == torch.float32
    assert hidden.grad.dtype == weight.grad.dtype == torch.float32
    got_h, got_w = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    want = reference(hidden @ weight.T, target, 0.1)
    want.backward()
    torch.testing.assert_close(loss, want, rtol=2e-2, atol=0.0)  # bf16 matmuls: ~1% apart
    for got, ref in ((got_h, hidden.grad), (got_w, weight.grad)):
        torch.testing.assert_close(got, ref, rtol=0.05, atol=0.03 * float(ref.abs().max()))


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_cpu_dropout_zeroes_a_share_p_and_keeps_the_mean(p: float) -> None:
    torch.manual_seed(0)
    x = torch.ones(401, 499, requires_grad=True)  # an odd size: not a whole number of draws
    out = dropout(x, p, training=True)
    zero = out.eq(0).float()
    assert abs(zero.mean().item() - p) < 0.005
    for share in (zero[:, ::4], zero[:, 1::4], zero[::7, 3::4]):  # each 16 bits of a draw
        assert abs(share.mean().item() - p) < 0.01
    kept = 1 / (1 - round(p * 65536) / 65536)  # p rounded to a multiple of 1/65536
    assert abs(kept - 1 / (1 - p)) < 1e-4
    torch.testing.assert_close(out[out.ne(0)], torch.full_like(out[out.ne(0)], kept))
    out.sum().backward()
    torch.testing.assert_close(x.grad, out.detach())  # the gradient is the same scaled mask


def test_cpu_dropout_keeps_bf16() -> None:
    torch.manual_seed(0)
    out = dropout(torch.ones(64, 33, dtype=torch.bfloat16), 0.25, training=True)
    assert out.dtype == torch.bfloat16 and abs(out.eq(0).float().mean().item() - 0.25) < 0.05


def test_dropout_is_identity_when_off_and_zero_at_p_1() -> None:
    x = torch.randn(5, 6)
    assert dropout(x, 0.3, training=False) is x
    assert dropout(x, 0.0, training=True) is x
    assert dropout(x, 1.0, training=True).eq(0).all()


def test_cpu_dropout_follows_the_torch_seed() -> None:
    x = torch.randn(50, 40)
    torch.manual_seed(5)
    a = dropout(x, 0.5, training=True)
    torch.manual_seed(5)
    torch.testing.assert_close(dropout(x, 0.5, training=True), a)
