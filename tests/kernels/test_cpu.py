"""seq2seq.kernels.cpu: attention on matmuls where SDPA's CPU kernel is slower (same results as
SDPA, gradients included), padded keys, and dropout masks from 16 random bits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seq2seq.kernels import cpu, onednn, reference
from seq2seq.kernels.cpu import FAST_SOFTMAX_LEN, MATMUL_MAX_KEYS, _pad_keys, dropout

Y, N = True, False


def no_sdpa(*args: object, **kwargs: object) -> None:
    raise AssertionError("SDPA called where the CPU kernels take matmuls")


def qkv(length: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, ...]:
    """q, k, v (2, 4, length, 8) that need gradients, and a key mask (2, length)."""
    gen = torch.Generator().manual_seed(length)
    q, k, v = (torch.randn(2, 4, length, 8, generator=gen, dtype=dtype) for _ in range(3))
    key_mask = torch.ones(2, length, dtype=torch.bool)
    key_mask[1, length - 3 :] = False
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), key_mask


@pytest.mark.parametrize("biased", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("length", [7, 16, 19, 40])
def test_training_attention_matches_sdpa_with_gradients(
    biased: bool, causal: bool, length: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Training takes matmuls up to MATMUL_MAX_KEYS keys (never SDPA there), keys padded to
    FAST_SOFTMAX_LEN when there are fewer, and SDPA beyond: outputs and the gradients of q, k,
    v and the bias equal reference.attention's (SDPA)."""
    q, k, v, key_mask = qkv(length)
    bias = torch.randn(1, 4, length, length).requires_grad_() if biased else None
    inputs = [t for t in (q, k, v, bias) if t is not None]
    want = reference.attention(q, k, v, bias, key_mask, causal, 0.0, None)
    want_grads = torch.autograd.grad(want.square().sum(), inputs)
    if length <= MATMUL_MAX_KEYS:
        monkeypatch.setattr(F, "scaled_dot_product_attention", no_sdpa)
    got = cpu.attention(q, k, v, bias, key_mask, causal, 0.0, None)
    got_grads = torch.autograd.grad(got.square().sum(), inputs)
    torch.testing.assert_close(got, want)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w)


def test_bf16_attention_takes_matmuls(monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 (autocast training): matmuls around a float32 softmax, never SDPA, within bf16
    rounding of float32 SDPA."""
    q, k, v, key_mask = qkv(40)
    want = reference.attention(q, k, v, None, key_mask, True, 0.0, None)
    monkeypatch.setattr(F, "scaled_dot_product_attention", no_sdpa)
    got = cpu.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), None, key_mask, True, 0.0, None)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, rtol=0.05, atol=0.02)


@pytest.mark.parametrize(
    ("batch", "q_len", "masked", "matmuls"),
    [
        (16, 1, False, True),
        (16, 1, True, False),
        (16, 5, True, True),
        (16, 8, False, True),
        (16, 9, False, False),
        (1, 1, False, False),
        (1, 5, True, False),
        (8, 1, False, False),
    ],
)
def test_decoding_queries_choose_matmuls_or_sdpa(
    batch: int, q_len: int, masked: bool, matmuls: bool
) -> None:
    """Without gradients: in a batch, a few queries per row take matmuls, except a single query
    under a padding mask; many queries take SDPA; so does one sentence alone (at most
    FEW_QUERY_ROWS query rows in all). Either way the result is SDPA's."""
    with torch.no_grad():
        q, k, v = (torch.randn(batch, 4, 12, 8) for _ in range(3))
        key_mask = torch.ones(batch, 12, dtype=torch.bool)
        key_mask[0, 9:] = False
        q = q[:, :, :q_len]
        mask = reference.attention_mask(key_mask if masked else None, False, q_len, 12, q.device)
        assert cpu._matmul_attention(q, 12, mask) is matmuls
        want = reference.attention(q, k, v, None, key_mask if masked else None, False, 0.0, None)
        got = cpu.attention(q, k, v, None, key_mask if masked else None, False, 0.0, None)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("batch", [1, 16], ids=["alone", "batch"])
@pytest.mark.parametrize("q_len", [1, 5])
def test_key_bias_attends_as_the_key_mask(batch: int, q_len: int) -> None:
    """A key mask given once as a bias on the logits (kernels.key_bias, what a decoding cache
    keeps) attends exactly as the mask, in both kernels: 0 at real keys, -inf at padding."""
    q, k, v = (torch.randn(batch, 4, n, 8) for n in (q_len, 12, 12))
    key_mask = torch.ones(batch, 12, dtype=torch.bool)
    key_mask[0, 7:] = False
    bias = reference.key_bias(key_mask, q.dtype)
    assert bias.shape == (batch, 1, 1, 12)
    assert bias[0, 0, 0].tolist() == [0.0] * 7 + [float("-inf")] * 5
    with torch.no_grad():
        want = reference.attention(q, k, v, None, key_mask, False, 0.0, None)
        for attention in (reference.attention, cpu.attention):
            got = attention(q, k, v, bias, None, False, 0.0, None)
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize("rows", [1, 8, 9, 64])
def test_small_products_without_gradients_take_f_linear(
    rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decoding products of at most SMALL_ROWS rows go to F.linear, larger ones and any product
    that needs a gradient to oneDNN; the results are F.linear's (a ReLU fused or not)."""
    if not onednn.AVAILABLE:
        pytest.skip("this torch build has no oneDNN ops")
    calls: list[int] = []
    real = onednn.linear
    monkeypatch.setattr(onednn, "linear", lambda *a: calls.append(1) or real(*a))
    x, w, b = torch.randn(rows, 16), torch.randn(24, 16), torch.randn(24)
    with torch.inference_mode():
        got = cpu.linear(x, w, b, relu=True)
    torch.testing.assert_close(got, F.relu(F.linear(x, w, b)))
    assert len(calls) == (1 if rows > cpu.SMALL_ROWS else 0)
    cpu.linear(x, w.requires_grad_(), b)  # training: oneDNN whatever the size
    assert len(calls) == (2 if rows > cpu.SMALL_ROWS else 1)


# --------------------------------------------------------------------------- top-k, row max


def rows_with_padding(n: int, v: int, seed: int) -> torch.Tensor:
    """Log-probability-like rows (N, V): random, two -inf columns (PAD, BOS), one row whose
    largest values all sit in one block and one whose largest is in the last elements."""
    x = torch.randn(n, v, generator=torch.Generator().manual_seed(seed)).log_softmax(-1)
    x[:, :2] = float("-inf")
    x[0, 3 * cpu.BLOCK : 3 * cpu.BLOCK + 12] += 50.0  # the 12 largest in block 3
    x[-1, -1] += 60.0  # the largest in the last (maybe partial) block
    return x


@pytest.mark.parametrize("v", [2560, 3000, 8000], ids=lambda v: f"V{v}")
@pytest.mark.parametrize("k", [1, 2, 10])
def test_blocked_topk_equals_torch_topk(k: int, v: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Block by block (forced here on small inputs), the k largest values of each row and
    their indices are torch.topk's, whole blocks or a partial last one."""
    monkeypatch.setattr(cpu, "BLOCKED_MIN_ELEMENTS", 0)
    x = rows_with_padding(6, v, seed=k)
    blocked = []
    monkeypatch.setattr(cpu, "_blocked_topk", spy(cpu._blocked_topk, blocked))
    values, indices = cpu.topk(x, k)
    want_values, want_indices = x.topk(k, dim=-1)
    assert blocked  # the blocked path ran
    assert torch.equal(values, want_values)
    assert torch.equal(indices, want_indices)
    best, where = cpu.row_max(x)
    assert torch.equal(best, x.max(-1).values)
    assert torch.equal(where, x.max(-1).indices)


def test_blocked_topk_keeps_ties_and_minus_infinity_consistent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rows of tied or -inf values (a beam at its length limit: only EOS is finite): the
    values are torch.topk's and every index is distinct and points at its value."""
    monkeypatch.setattr(cpu, "BLOCKED_MIN_ELEMENTS", 0)
    x = torch.full((3, 3000), float("-inf"))
    x[0, 2] = -0.5  # one finite value
    x[1] = 0.0  # all tied
    x[2, ::7] = 1.0  # many tied maxima
    values, indices = cpu.topk(x, 10)
    assert torch.equal(values, x.topk(10, dim=-1).values)
    assert torch.equal(x.gather(1, indices), values)
    assert all(len(set(row)) == 10 for row in indices.tolist())


def test_short_rows_keep_torch_topk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Below BLOCKED_MIN_ELEMENTS elements, or rows too short for k blocks, torch.topk and
    Tensor.max run as they are."""
    blocked: list[int] = []
    monkeypatch.setattr(cpu, "_blocked_topk", spy(cpu._blocked_topk, blocked))
    cpu.topk(torch.randn(1, 8000), 10)  # one sentence's row
    cpu.row_max(torch.randn(1, 8000))
    cpu.topk(torch.randn(200, 1000), 10)  # 15 blocks: too few for 10 with a 4x margin
    assert not blocked
    cpu.topk(torch.randn(16, 8000), 10)
    cpu.row_max(torch.randn(16, 8000))
    assert len(blocked) == 2


def spy(fn: object, calls: list[int]) -> object:
    def wrapped(*args: object) -> object:
        calls.append(1)
        return fn(*args)  # type: ignore[operator]

    return wrapped


def test_pad_keys_hides_the_padding() -> None:
    """Padded keys are zeros the mask hides; the real keys and their mask are unchanged."""
    k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 8)
    mask = torch.tensor([[Y] * 5, [Y, Y, Y, N, N]])[:, None, None, :]
    pk, pv, bias, pmask = _pad_keys(k, v, None, mask)
    assert pk.shape == pv.shape == (2, 4, FAST_SOFTMAX_LEN, 8)
    assert bias is None
    assert torch.equal(pk[:, :, :5], k)
    assert torch.equal(pv[:, :, :5], v)
    assert not pk[:, :, 5:].any()
    assert not pv[:, :, 5:].any()
    assert torch.equal(pmask[..., :5], mask)
    assert not pmask[..., 5:].any()
    _, _, _, unmasked = _pad_keys(k, v, torch.zeros(1, 4, 5, 5), None)
    assert unmasked[..., :5].all()
    assert not unmasked[..., 5:].any()


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
    assert out.dtype == torch.bfloat16
    assert abs(out.eq(0).float().mean().item() - 0.25) < 0.05


def test_cpu_dropout_in_bf16_scales_by_the_rounded_scale_as_f_dropout_does() -> None:
    """The docstring's caveat: in bf16 the kept values are 1 / (1 - p) rounded to bf16, the same
    value F.dropout keeps."""
    torch.manual_seed(0)
    x = torch.ones(64, 33, dtype=torch.bfloat16)
    ours, torch_s = dropout(x, 0.1, training=True), F.dropout(x, 0.1, training=True)
    scale = torch.tensor(65536 / (65536 - round(0.1 * 65536))).bfloat16()
    assert scale.item() == 1.109375  # not 1.111111
    assert set(ours.unique().tolist()) == {0.0, scale.item()}
    assert set(torch_s.unique().tolist()) == {0.0, scale.item()}


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
