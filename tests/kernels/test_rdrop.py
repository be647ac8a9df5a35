"""R-Drop's loss (kernels.rdrop_loss: the chunked CPU kernel in loss.py, the full-logits one in
reference.py) and the model's two passes (EncoderDecoder.forward with rdrop_alpha), against the
loss written out with F.kl_div both ways on full logits (tests/references.py)."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from seq2seq import kernels
from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from seq2seq.kernels import onednn
from seq2seq.kernels.loss import linear_rdrop
from seq2seq.model.transformer import EncoderDecoder
from tests.conftest import VOCAB, MakeModel, MakeSources
from tests.references import rdrop_loss


def two_passes(seed: int = 1) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Hidden states (N, D) of two passes that differ as dropout makes them, weights (V, D),
    targets (N,) without padding."""
    gen = torch.Generator().manual_seed(seed)
    h1 = torch.randn(23, 8, generator=gen)  # (N, D)
    h2 = h1 + 0.3 * torch.randn(23, 8, generator=gen)  # (N, D)
    weight = torch.randn(13, 8, generator=gen)  # (V, D)
    target = torch.randint(1, 13, (23,), generator=gen)  # (N,)
    return h1, h2, weight, target


def grads_of(fn: object, *inputs: Tensor) -> tuple[Tensor, Tensor, list[Tensor]]:
    """fn(*leaves) -> (loss, nll); its loss x 1.3 backpropagated: (loss, nll, the leaves' grads)."""
    leaves = [x.clone().requires_grad_() for x in inputs]
    loss, nll = fn(*leaves)  # type: ignore[operator]
    (loss * 1.3).backward()
    return loss.detach(), nll, [leaf.grad for leaf in leaves]  # type: ignore[misc]


@pytest.mark.parametrize("use_onednn", [True, False], ids=["onednn", "torch-mm"])
@pytest.mark.parametrize(("eps", "alpha", "chunk"), [(0.1, 1.0, 4), (0.0, 5.0, 7), (0.1, 0.3, 256)])
def test_chunked_kernel_equals_the_written_out_loss(
    eps: float, alpha: float, chunk: int, use_onednn: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loss, NLL and the gradients of both passes and of the weights, chunk by chunk (any
    chunk size; oneDNN or torch.mm products) as autograd gives them through F.kl_div both
    ways on the full logits."""
    monkeypatch.setattr(onednn, "ENABLED", use_onednn and onednn.ENABLED)
    h1, h2, weight, target = two_passes()
    got = grads_of(lambda a, b, w: linear_rdrop(a, b, w, target, eps, alpha, chunk), h1, h2, weight)
    want = grads_of(
        lambda a, b, w: rdrop_loss(a @ w.T, b @ w.T, target, eps, alpha), h1, h2, weight
    )
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    for name, g, w in zip(("pass 1", "pass 2", "weights"), got[2], want[2], strict=True):
        assert float(g.abs().max()) > 0, name  # gradients reach both passes
        torch.testing.assert_close(g, w, msg=name)
    assert not got[1].requires_grad


@pytest.mark.parametrize("mode", ["auto", "reference"])
def test_the_seams_choice_equals_the_written_out_loss(mode: str) -> None:
    h1, h2, weight, target = two_passes(seed=2)
    with kernels.use(mode):
        got = grads_of(lambda a, b: kernels.rdrop_loss(a, b, weight, target, 0.1, 2.0), h1, h2)
    want = grads_of(lambda a, b: rdrop_loss(a @ weight.T, b @ weight.T, target, 0.1, 2.0), h1, h2)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-4)
    for g, w in zip(got[2], want[2], strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["auto", "reference"])
def test_identical_passes_have_no_kl(mode: str) -> None:
    """Two identical passes (no dropout): the KL term is 0, whatever alpha, and the loss and
    gradient are the single pass's."""
    h1, _, weight, target = two_passes(seed=3)
    with kernels.use(mode):
        off = grads_of(lambda a, b: kernels.rdrop_loss(a, b, weight, target, 0.1, 0.0), h1, h1)
        on = grads_of(lambda a, b: kernels.rdrop_loss(a, b, weight, target, 0.1, 5.0), h1, h1)
        one = grads_of(lambda a: kernels.output_loss(a, weight, target, 0.1), h1)
    torch.testing.assert_close(on[0], off[0], rtol=0.0, atol=0.0)  # the KL is exactly 0
    torch.testing.assert_close(on[0], one[0])
    for g_on, g_off in zip(on[2], off[2], strict=True):
        torch.testing.assert_close(g_on, g_off, rtol=0.0, atol=1e-7)
    torch.testing.assert_close(on[2][0] + on[2][1], one[2][0])


def test_chunked_kernel_under_bf16_autocast() -> None:
    h1, h2, weight, target = two_passes(seed=4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = grads_of(lambda a, b: linear_rdrop(a, b, weight, target, 0.1, 1.0, 8), h1, h2)
    want = grads_of(lambda a, b: rdrop_loss(a @ weight.T, b @ weight.T, target, 0.1, 1.0), h1, h2)
    assert got[0].dtype == torch.float32
    torch.testing.assert_close(got[0], want[0], rtol=2e-2, atol=0.0)  # bf16 matmuls: ~1% apart
    for g, w in zip(got[2], want[2], strict=True):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, w, rtol=0.05, atol=0.05 * float(w.abs().max()))


# --------------------------------------------------------------------------- the model's passes


def batch(make_sources: MakeSources) -> tuple[Tensor, Tensor, Tensor]:
    """Sources (B, S), decoder inputs and labels (B, T), with padding on both sides."""
    src = make_sources([5, 3, 7], seed=1)  # (3, 8)
    gen = torch.Generator().manual_seed(2)
    tgt_out = torch.full((3, 7), PAD_ID)  # (3, 7)
    for row, n in enumerate([4, 6, 2]):
        tgt_out[row, :n] = torch.randint(4, VOCAB, (n,), generator=gen)
        tgt_out[row, n] = EOS_ID
    tgt_in = torch.cat([torch.full((3, 1), BOS_ID), tgt_out[:, :-1]], 1)  # (3, 7)
    tgt_in[tgt_in == EOS_ID] = PAD_ID
    return src, tgt_in, tgt_out


def todays_forward(
    model: EncoderDecoder, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, eps: float
) -> tuple[Tensor, Tensor]:
    """EncoderDecoder.forward as it was before R-Drop, written out."""
    memory, src_mask = model.encode(src)
    hidden = model.decode_states(tgt_in, memory, src_mask)  # (B, T, D)
    real = tgt_out.ne(PAD_ID)  # (B, T)
    rows = real.flatten().nonzero().squeeze(1)  # (K,)
    kept = hidden.flatten(0, 1).index_select(0, rows)  # (K, D)
    return kernels.output_loss(kept, model.out.weight, tgt_out[real], eps)


def model_grads(
    model: EncoderDecoder, seed: int, fn: object
) -> tuple[Tensor, list[Tensor], Tensor]:
    """fn() -> (loss, nll) under torch seed `seed`, backpropagated: the loss, every parameter's
    gradient, and the next draw of the generator (a pass more would move it)."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss, _ = fn()  # type: ignore[operator]
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
    model.zero_grad(set_to_none=True)
    return loss.detach(), grads, torch.rand(4)


def test_alpha_zero_is_todays_step_bit_for_bit(
    make_model: MakeModel, make_sources: MakeSources
) -> None:
    """trainer.rdrop_alpha=0 (the default): one pass, the same loss, gradients and random
    draws as the forward before R-Drop, to the bit."""
    model = make_model(layers=2, dropout=0.3).train()
    src, tgt_in, tgt_out = batch(make_sources)
    want = model_grads(model, 5, lambda: todays_forward(model, src, tgt_in, tgt_out, 0.1))
    for got in (
        model_grads(model, 5, lambda: model(src, tgt_in, tgt_out, 0.1)),
        model_grads(model, 5, lambda: model(src, tgt_in, tgt_out, 0.1, 0.0)),
    ):
        assert torch.equal(got[0], want[0])
        assert all(torch.equal(g, w) for g, w in zip(got[1], want[1], strict=True))
        assert torch.equal(got[2], want[2])


@pytest.mark.parametrize("mode", ["auto", "reference"])
def test_two_passes_equal_the_written_out_loss(
    make_model: MakeModel, make_sources: MakeSources, mode: str
) -> None:
    """rdrop_alpha > 0: the loss and every parameter's gradient are those of the written-out
    R-Drop loss (the authors': loss1 + loss2 + alpha x KL, halved) on the full (B, T, V) logits
    of two passes with the same dropout draws, padding left out. The gradient flows through
    both passes: with the second pass detached it is another."""
    model = make_model(layers=2, dropout=0.3).train()
    src, tgt_in, tgt_out = batch(make_sources)
    labels = tgt_out.flatten()  # (B T,)

    def reference(detach: bool = False) -> tuple[Tensor, Tensor]:
        first = model.logits(src, tgt_in).flatten(0, 1)  # (B T, V)
        second = model.logits(src, tgt_in).flatten(0, 1)  # (B T, V) other dropout masks
        assert not torch.allclose(first, second)
        # the model's alpha is the authors' (their loss sums the two passes' losses): halved,
        # it weighs the KL against the mean of the two losses that rdrop_loss takes
        return rdrop_loss(first, second.detach() if detach else second, labels, 0.1, 2.0 / 2)

    with kernels.use(mode):
        got = model_grads(model, 5, lambda: model(src, tgt_in, tgt_out, 0.1, 2.0))
        want = model_grads(model, 5, reference)
        one_pass = model_grads(model, 5, lambda: reference(detach=True))
    torch.testing.assert_close(got[0], want[0])
    for g, w in zip(got[1], want[1], strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
    assert torch.equal(got[2], want[2])  # two passes' draws, no more
    far = [float((g - o).norm() / o.norm()) for g, o in zip(got[1], one_pass[1], strict=True)]
    assert max(far) > 0.1


def test_without_dropout_the_kl_term_is_zero(
    make_model: MakeModel, make_sources: MakeSources
) -> None:
    """No dropout: the two passes agree, the KL is 0, and R-Drop's loss and gradients are the
    single pass's (the mean of two equal losses)."""
    model = make_model(layers=2, dropout=0.0).train()
    src, tgt_in, tgt_out = batch(make_sources)
    one = model_grads(model, 5, lambda: model(src, tgt_in, tgt_out, 0.1))
    two = model_grads(model, 5, lambda: model(src, tgt_in, tgt_out, 0.1, 4.0))
    weak = model_grads(model, 5, lambda: model(src, tgt_in, tgt_out, 0.1, 0.5))
    assert torch.equal(two[0], weak[0])  # alpha x a KL of exactly 0
    assert all(torch.equal(a, b) for a, b in zip(two[1], weak[1], strict=True))
    torch.testing.assert_close(two[0], one[0])  # to float rounding: another kernel
    for g2, g1 in zip(two[1], one[1], strict=True):
        torch.testing.assert_close(g2, g1, rtol=1e-4, atol=1e-6)


def test_the_second_pass_has_other_dropout_masks(
    make_model: MakeModel, make_sources: MakeSources, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel gets two passes' hidden states that differ (independent dropout masks)."""
    seen: list[tuple[Tensor, Tensor]] = []
    original = kernels.rdrop_loss

    def spy(h1: Tensor, h2: Tensor, *args: object) -> tuple[Tensor, Tensor]:
        seen.append((h1.detach(), h2.detach()))
        return original(h1, h2, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(kernels, "rdrop_loss", spy)
    model = make_model(layers=1, dropout=0.3).train()
    src, tgt_in, tgt_out = batch(make_sources)
    model(src, tgt_in, tgt_out, 0.1, 1.0)
    ((h1, h2),) = seen
    assert h1.shape == h2.shape == (int(tgt_out.ne(PAD_ID).sum()), 32)
    assert not torch.allclose(h1, h2)
