"""Tests for seq2seq.model.layers: attention against a written-out reference, residual
blocks, encoder and decoder layers (cached decoding included)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from seq2seq import kernels
from seq2seq.config.schema import PosKind
from seq2seq.model.cache import LayerCache
from seq2seq.model.layers import (
    LONG_ROWS_MIN_KEYS,
    DecoderLayer,
    EncoderLayer,
    LayerSpec,
    MultiHeadAttention,
    Residual,
    long_rows,
)
from seq2seq.model.positional import PositionalEncoding
from seq2seq.model.relative import ALiBi, ShawRelative
from seq2seq.model.transformer import EncoderDecoder

Y, N = True, False  # short names keep the mask tables readable

# --------------------------------------------------------------------------- attention


def reference_attention(
    attn: MultiHeadAttention,
    x: torch.Tensor,
    key_mask: torch.Tensor | None,
    causal: bool,
    slopes: torch.Tensor | None,
) -> torch.Tensor:
    """softmax(q k^T / sqrt(Dh) - slope * |i - j|, masked) v, written out with loops over heads."""
    b, t, _d = x.shape
    h, dh = attn.n_heads, attn.head_dim
    q = attn.q_proj(x)
    k, v = attn.kv_proj(x).chunk(2, dim=-1)
    allowed = torch.ones(b, t, t, dtype=torch.bool)
    if key_mask is not None:
        allowed &= key_mask[:, None, :]
    if causal:
        allowed &= torch.ones(t, t, dtype=torch.bool).tril()
    heads = []
    for head in range(h):
        sl = slice(head * dh, (head + 1) * dh)
        logits = q[..., sl] @ k[..., sl].transpose(1, 2) / math.sqrt(dh)  # (B, T, T)
        if slopes is not None:
            pos = torch.arange(t)
            logits = logits - slopes[head] * (pos[None, :] - pos[:, None]).abs()
        logits = logits.masked_fill(~allowed, float("-inf"))
        heads.append(logits.softmax(-1) @ v[..., sl])
    return attn.out_proj(torch.cat(heads, dim=-1))


@pytest.mark.parametrize("mode", kernels.MODES)
@pytest.mark.parametrize("alibi", [False, True], ids=["nobias", "alibi"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("padded", [False, True], ids=["nopad", "pad"])
def test_attention_matches_reference(alibi: bool, causal: bool, padded: bool, mode: str) -> None:
    """Every branch of the attention kernels (plain SDPA, is_causal, explicit mask, bias,
    matmuls) computes the same."""
    torch.manual_seed(0)
    pos = ALiBi(4) if alibi else PositionalEncoding()
    attn = MultiHeadAttention(16, 4, dropout=0.0, pos=pos, causal=causal).eval()
    x = torch.randn(2, 5, 16)
    key_mask = torch.tensor([[Y] * 5, [Y, Y, Y, N, N]]) if padded else None
    with kernels.use(mode):
        out = attn(x, key_mask=key_mask)
    slopes = alibi_slopes_of(pos)
    torch.testing.assert_close(out, reference_attention(attn, x, key_mask, causal, slopes))


@pytest.mark.parametrize("mode", kernels.MODES)
@pytest.mark.parametrize("alibi", [False, True], ids=["nobias", "alibi"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("length", [7, 16, 19, 40])
def test_training_attention_matches_reference_with_gradients(
    alibi: bool, causal: bool, length: int, mode: str
) -> None:
    """In training, with either kernels (on a CPU, auto takes matmuls up to 32 keys, with keys
    padded to 16 when there are fewer, and SDPA beyond), outputs and input gradients equal the
    written-out reference."""
    torch.manual_seed(0)
    pos = ALiBi(4) if alibi else PositionalEncoding()
    attn = MultiHeadAttention(16, 4, dropout=0.0, pos=pos, causal=causal)
    x = torch.randn(2, length, 16, requires_grad=True)
    key_mask = torch.ones(2, length, dtype=torch.bool)
    key_mask[1, length - 3 :] = False
    want = reference_attention(attn, x, key_mask, causal, alibi_slopes_of(pos))
    (want_grad,) = torch.autograd.grad(want.square().sum(), [x])
    with kernels.use(mode):
        got = attn(x, key_mask=key_mask)
        (got_grad,) = torch.autograd.grad(got.square().sum(), [x])
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_grad, want_grad)


def alibi_slopes_of(pos: PositionalEncoding) -> torch.Tensor | None:
    return pos.slopes if isinstance(pos, ALiBi) else None


@pytest.mark.parametrize("mode", kernels.MODES)
@pytest.mark.parametrize("alibi", [False, True], ids=["nobias", "alibi"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
def test_bf16_autocast_attention_matches_float32(alibi: bool, causal: bool, mode: str) -> None:
    """Under CPU bf16 autocast (training), outputs and gradients stay within bf16 rounding of
    float32 attention, masks included, with either kernels (auto: bf16 matmuls around a float32
    softmax; reference: SDPA)."""
    torch.manual_seed(0)
    pos = ALiBi(4) if alibi else PositionalEncoding()
    attn = MultiHeadAttention(32, 4, dropout=0.0, pos=pos, causal=causal)
    x = torch.randn(3, 7, 32, requires_grad=True)
    key_mask = torch.tensor([[Y] * 7, [Y] * 4 + [N] * 3, [Y, Y] + [N] * 5])
    want = attn(x, key_mask=key_mask)
    want_grads = torch.autograd.grad(want.square().sum(), [x, attn.q_proj.weight])
    with kernels.use(mode), torch.autocast("cpu", dtype=torch.bfloat16):
        got = attn(x, key_mask=key_mask)
    assert got.dtype == torch.bfloat16
    got_grads = torch.autograd.grad(got.float().square().sum(), [x, attn.q_proj.weight])
    torch.testing.assert_close(got.float(), want, rtol=0.05, atol=0.02)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=0.05, atol=0.05 * float(w.abs().max()))


@pytest.mark.parametrize("mode", kernels.MODES)
def test_attention_weights_path_matches_reference(mode: str) -> None:
    """Shaw attention takes the explicit-softmax path; with zero relative tables it must equal
    plain attention, masks included."""
    torch.manual_seed(0)
    shaw = ShawRelative(head_dim=4, clip=2)
    nn.init.zeros_(shaw.keys.weight)
    nn.init.zeros_(shaw.vals.weight)
    attn = MultiHeadAttention(16, 4, dropout=0.0, pos=shaw, causal=True).eval()
    x = torch.randn(2, 5, 16)
    key_mask = torch.tensor([[Y] * 5, [Y, Y, Y, N, N]])
    with kernels.use(mode):
        out = attn(x, key_mask=key_mask)
    torch.testing.assert_close(out, reference_attention(attn, x, key_mask, True, None))


def test_attention_rejects_indivisible_heads() -> None:
    with pytest.raises(ValueError, match="divisible"):
        MultiHeadAttention(10, 4, 0.0, PositionalEncoding(), causal=False)


def test_causal_attention_ignores_the_future() -> None:
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 4, 0.0, PositionalEncoding(), causal=True).eval()
    x = torch.randn(1, 6, 16)
    y = x.clone()
    y[:, 4] += 1.0
    out_x, out_y = attn(x), attn(y)
    torch.testing.assert_close(out_x[:, :4], out_y[:, :4])
    assert not torch.allclose(out_x[:, 4:], out_y[:, 4:])


def test_masked_keys_are_ignored() -> None:
    torch.manual_seed(0)
    attn = MultiHeadAttention(16, 4, 0.0, PositionalEncoding(), causal=False).eval()
    x = torch.randn(1, 6, 16)
    key_mask = torch.tensor([[Y, Y, Y, Y, N, N]])
    y = x.clone()
    y[:, 4:] = torch.randn(1, 2, 16)
    torch.testing.assert_close(attn(x, key_mask=key_mask)[:, :4], attn(y, key_mask=key_mask)[:, :4])
    # without the mask the change is seen
    assert not torch.allclose(attn(x)[:, :4], attn(y)[:, :4])


# --------------------------------------------------------------------------- residual blocks


@pytest.mark.parametrize("norm_first", [True, False], ids=["pre", "post"])
def test_residual_formula(norm_first: bool) -> None:
    torch.manual_seed(0)
    res = Residual(8, dropout=0.0, norm_first=norm_first)
    nn.init.normal_(res.norm.weight)
    nn.init.normal_(res.norm.bias)
    f = nn.Linear(8, 8)
    x = torch.randn(3, 8)
    # pre-norm: Xiong et al. 2020; post-norm: Vaswani et al. 2017
    expected = x + f(res.norm(x)) if norm_first else res.norm(x + f(x))
    torch.testing.assert_close(res(x, f), expected)


def test_residual_dropout_only_in_training() -> None:
    torch.manual_seed(0)
    res = Residual(8, dropout=0.5, norm_first=True)
    f = nn.Linear(8, 8)
    x = torch.randn(4, 8)
    res.eval()
    torch.testing.assert_close(res(x, f), res(x, f))
    res.train()
    assert not torch.allclose(res(x, f), res(x, f))


# --------------------------------------------------------------------------- layers and caches


SPEC = LayerSpec(
    d_model=16, n_heads=4, d_ff=32, dropout=0.0, attn_dropout=0.0, ffn_dropout=0.0, norm_first=True
)


def test_decoder_layer_cache_matches_full() -> None:
    torch.manual_seed(0)
    layer = DecoderLayer(SPEC, PositionalEncoding()).eval()
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 4, 16)
    src_mask = torch.tensor([[Y, Y, Y, Y], [Y, Y, N, N]])
    full = layer(x, memory, src_mask)
    cache = LayerCache()
    steps = [layer(x[:, i : i + 1], memory, src_mask, cache) for i in range(5)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-4)
    assert cache.self_k is not None
    assert cache.self_k.shape == (2, 4, 5, 4)
    assert cache.cross_k is not None
    assert cache.cross_k.shape == (2, 4, 4, 4)


def test_decoder_layer_hypotheses_share_memory_rows() -> None:
    """N = B * G decoder rows against B memory rows (beam search) equal the same rows against
    the memory repeated G times, sentence-major, with and without a cache."""
    torch.manual_seed(0)
    layer = DecoderLayer(SPEC, PositionalEncoding()).eval()
    x, memory = torch.randn(6, 3, 16), torch.randn(2, 4, 16)
    src_mask = torch.tensor([[Y, Y, Y, Y], [Y, Y, N, N]])
    want = layer(x, memory.repeat_interleave(3, 0), src_mask.repeat_interleave(3, 0))
    torch.testing.assert_close(layer(x, memory, src_mask), want, atol=1e-5, rtol=1e-4)
    cache = LayerCache()
    steps = [layer(x[:, i : i + 1], memory, src_mask, cache) for i in range(3)]
    torch.testing.assert_close(torch.cat(steps, 1), want, atol=1e-5, rtol=1e-4)
    assert cache.cross_k is not None
    assert cache.cross_k.size(0) == 2
    with pytest.raises(ValueError, match="5 decoder rows"):
        layer(x[:5], memory, src_mask)


def test_decoder_layer_respects_source_padding() -> None:
    torch.manual_seed(0)
    layer = DecoderLayer(SPEC, PositionalEncoding()).eval()
    x, memory = torch.randn(1, 3, 16), torch.randn(1, 5, 16)
    src_mask = torch.tensor([[Y, Y, Y, N, N]])
    other = memory.clone()
    other[:, 3:] = torch.randn(1, 2, 16)
    torch.testing.assert_close(layer(x, memory, src_mask), layer(x, other, src_mask))


def test_encoder_layer_shapes_and_padding() -> None:
    torch.manual_seed(0)
    layer = EncoderLayer(SPEC, PositionalEncoding()).eval()
    x = torch.randn(2, 6, 16)
    src_mask = torch.tensor([[Y] * 6, [Y, Y, Y, N, N, N]])
    out = layer(x, src_mask)
    assert out.shape == x.shape
    y = x.clone()
    y[1, 3:] = torch.randn(3, 16)
    torch.testing.assert_close(layer(y, src_mask)[1, :3], out[1, :3])


def test_feed_forward_is_position_wise() -> None:
    torch.manual_seed(0)
    layer = EncoderLayer(SPEC, PositionalEncoding()).eval()
    x = torch.randn(1, 4, 16)
    ffn_all = layer.ffn(x)
    ffn_one = torch.cat([layer.ffn(x[:, i : i + 1]) for i in range(4)], dim=1)
    torch.testing.assert_close(ffn_all, ffn_one)
    torch.testing.assert_close(ffn_all, layer.ffn.down(F.relu(layer.ffn.up(x))))


# --------------------------------------------------------------------------- long rows apart


def test_long_rows_are_the_few_far_past_the_others() -> None:
    offset = torch.tensor([79, 4, 6, 2, 70])  # queries' positions; each reaches offset + 1 keys
    split = long_rows(offset, 1, 80)
    assert split is not None
    rows, span = split
    assert sorted(rows.tolist()) == [0, 4]
    assert span == 7  # the others reach at most position 6
    assert long_rows(offset, 1, LONG_ROWS_MIN_KEYS - 1) is None  # too few keys to bother
    assert long_rows(79, 1, 80) is None  # rows at one position: nothing to split
    assert long_rows(torch.tensor([79, 78, 75, 70]), 1, 80) is None  # no split halves the work


@pytest.mark.parametrize("kind", list(PosKind))
def test_attention_with_long_rows_apart_matches_all_keys(
    make_model: Callable[..., EncoderDecoder], kind: PosKind
) -> None:
    """Every encoding's hooks (bias, Shaw's values, rotation) give each group its own offsets:
    the rows' outputs are those of one attention over every key."""
    attn = make_model(kind, layers=1).decoder[0].self_attn
    gen = torch.Generator().manual_seed(0)
    offset = torch.tensor([79, 3, 10, 0, 5])  # (B,) the new token's position, row by row
    q = torch.randn(5, attn.n_heads, 1, attn.head_dim, generator=gen)  # (B, H, 1, Dh)
    k, v = torch.randn(2, 5, attn.n_heads, 80, attn.head_dim, generator=gen)  # (B, H, 80, Dh)
    reached = torch.arange(80) <= offset[:, None]  # (B, 80)
    extra = kernels.key_bias(reached, q.dtype)  # (B, 1, 1, 80)
    assert long_rows(offset, 1, 80) is not None
    with torch.inference_mode():
        got = attn.attend(q, k, v, None, offset, extra)
        want = attn._attend(q, (k, v), None, offset, extra)
    torch.testing.assert_close(got, want)
