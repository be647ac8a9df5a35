"""seq2seq.kernels.loss: the chunked output layer + loss (CPU training) against the loss on
full logits and PyTorch's autograd."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seq2seq.data.tokenizer import PAD_ID
from seq2seq.kernels import loss as loss_module
from seq2seq.kernels import onednn
from seq2seq.kernels.loss import (
    GROUP_BYTES,
    _chunk_terms,
    linear_label_smoothed_nll,
    linear_rdrop,
)
from tests.references import smoothed_loss


def reference(logits: torch.Tensor, target: torch.Tensor, eps: float) -> torch.Tensor:
    """Summed label-smoothed loss through torch's autograd (padding ignored)."""
    return F.cross_entropy(
        logits.float(), target, ignore_index=PAD_ID, reduction="sum", label_smoothing=eps
    )


@pytest.mark.parametrize("use_onednn", [True, False], ids=["onednn", "torch-mm"])
@pytest.mark.parametrize(
    ("eps", "chunk", "group_bytes"),
    [
        (0.0, 4, GROUP_BYTES),
        (0.1, 7, GROUP_BYTES),
        (0.1, 1000, GROUP_BYTES),
        (0.1, 4, 4 * 13 * 4),
        (0.1, 3, 2 * 3 * 13 * 4),
    ],
)
def test_linear_label_smoothed_nll_matches_logits_first(
    eps: float, chunk: int, group_bytes: int, use_onednn: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any chunk size, and weight gradients from groups of 1 or 2 chunks or of all rows; with
    the products on oneDNN (float32 on a CPU) or on torch.mm."""
    monkeypatch.setattr(loss_module, "GROUP_BYTES", group_bytes)
    monkeypatch.setattr(onednn, "ENABLED", use_onednn and onednn.ENABLED)
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(23, 8, generator=gen).requires_grad_()
    weight = torch.randn(13, 8, generator=gen).requires_grad_()
    target = torch.randint(1, 13, (23,), generator=gen)
    loss, nll = linear_label_smoothed_nll(hidden, weight, target, eps, chunk)
    (loss * 1.3).backward()
    got_h, got_w = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    want_loss, want_nll = smoothed_loss(hidden @ weight.T, target, eps)
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


def test_linear_label_smoothed_nll_when_the_target_probability_underflows() -> None:
    """A target 200 logits below the best has p = 0 in float32: the NLL stays exact."""
    hidden = torch.tensor([[1.0, 0.0], [0.0, 1.0]], requires_grad=True)
    weight = torch.tensor([[200.0, 0.0], [0.0, 0.0], [0.0, 3.0]], requires_grad=True)
    target = torch.tensor([1, 2])
    loss, nll = linear_label_smoothed_nll(hidden, weight, target, 0.1)
    want_loss, want_nll = smoothed_loss(hidden @ weight.T, target, 0.1)
    assert nll.item() > 200
    assert torch.isfinite(loss)
    torch.testing.assert_close(nll, want_nll)
    torch.testing.assert_close(loss, want_loss)


@pytest.mark.parametrize("branchless", [False, True])
def test_chunk_terms_recover_underflowed_target_probabilities(branchless: bool) -> None:
    """Both ways (CPU: only the rows that need it; GPU: all rows) give the exact NLL."""
    logits = torch.tensor([[200.0, 0.0, 0.0], [0.0, 1.0, 3.0]])  # (2, 3)
    target = torch.tensor([1, 2])
    loss, nll = _chunk_terms(logits, logits.softmax(-1), target, 0.1, branchless)
    want_loss, want_nll = smoothed_loss(logits, target, 0.1)
    torch.testing.assert_close(nll, want_nll)
    torch.testing.assert_close(loss, want_loss)


@pytest.mark.parametrize("rdrop", [False, True], ids=["loss", "rdrop"])
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
def test_products_have_the_same_shapes_whatever_the_row_count(
    autocast: bool, rdrop: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last chunk is padded to a whole one: a batch's token count brings no new product
    shape (oneDNN builds a kernel for each shape it meets), and the padding rows change
    nothing (the sums and gradients are checked against full logits above and in test_rdrop.py,
    at 23 rows)."""
    seen: list[tuple[int, ...]] = []

    def recording(fn):  # type: ignore[no-untyped-def]
        def run(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            seen.append((*a.shape, *b.shape))
            return fn(a, b)

        return run

    monkeypatch.setattr(onednn, "matmul_t", recording(onednn.matmul_t))
    monkeypatch.setattr(onednn, "weight_grad", recording(onednn.weight_grad))
    shapes = []
    for rows in (21, 23, 24):
        gen = torch.Generator().manual_seed(rows)
        hidden = torch.randn(rows, 8, generator=gen)
        weight = torch.randn(13, 8, generator=gen)
        target = torch.randint(1, 13, (rows,), generator=gen)
        seen.clear()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            if rdrop:
                loss, _ = linear_rdrop(hidden, hidden * 0.9, weight, target, 0.1, 1.0, 8)
            else:
                loss, _ = linear_label_smoothed_nll(hidden, weight, target, 0.1, 8)
        assert torch.isfinite(loss)
        shapes.append(sorted(set(seen)))
    assert shapes[0] == shapes[1] == shapes[2]
    assert shapes[0]  # the products went through the recorded functions
