"""Transformer building blocks: attention, feed-forward, encoder and decoder layers.

Shapes: B batch, S source length, T target length, D model width, H heads, Dh = D / H.
Masks are boolean with True where a key may be attended to.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor, nn

from seq2seq import kernels
from seq2seq.model.cache import LayerCache
from seq2seq.model.positional import Offset, PositionalEncoding

# rows at their own positions over at least this many keys may attend in two groups (`long_rows`)
LONG_ROWS_MIN_KEYS = 64


class Linear(nn.Linear):
    """nn.Linear whose forward is kernels.linear, with an optional fused ReLU (same parameters
    and state-dict keys)."""

    def forward(self, x: Tensor, relu: bool = False) -> Tensor:
        """x (..., in) @ weight.T + bias, then a ReLU if asked: (..., out)."""
        return kernels.linear(x, self.weight, self.bias, relu)


class MultiHeadAttention(nn.Module):
    """Scaled dot-product multi-head attention (Vaswani et al. 2017), self or cross.

    Calls the positional hooks `rotate` (queries and keys) and `bias` (logits), and `values` when
    the encoding asks for the attention weights; kernels.attention does the rest.
    """

    def __init__(
        self, d_model: int, n_heads: int, dropout: float, pos: PositionalEncoding, causal: bool
    ) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not divisible by n_heads {n_heads}")
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.q_proj = Linear(d_model, d_model)
        self.kv_proj = Linear(d_model, 2 * d_model)
        self.out_proj = Linear(d_model, d_model)
        self.dropout, self.pos, self.causal = dropout, pos, causal

    def _heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, -1, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def kv_heads(self, x: Tensor) -> Tensor:
        """Keys and values of `x` (B, T, D), split into heads, as one view (2, B, H, T, Dh)."""
        b, t, _ = x.shape
        kv: Tensor = self.kv_proj(x).view(b, t, 2, self.n_heads, self.head_dim)  # (B, T, 2, H, Dh)
        return kv.permute(2, 0, 3, 1, 4)  # (2, B, H, T, Dh)

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of `x` (B, T, D), split into heads."""
        k, v = self.kv_heads(x).unbind(0)  # (B, H, T, Dh) each
        return k, v

    def forward(
        self,
        x: Tensor,
        kv: tuple[Tensor, Tensor] | None = None,
        key_mask: Tensor | None = None,
        offset: Offset = 0,
        bias: Tensor | None = None,
    ) -> Tensor:
        """Attend from `x` (B, Tq, D) to keys/values `kv` (B, H, Tk, Dh), default: x itself.

        `offset` is the position of x's first token (tokens already in a decoding cache): one
        for all rows, or (B,) one per row.
        Self-attention callers pass `kv` already rotated when they cache it. `bias` (B|1, 1,
        1, Tk): a term on the logits besides the encoding's (a cached source's padding).
        """
        q = self.pos.rotate(self._heads(self.q_proj(x)), offset)  # (B, H, Tq, Dh)
        if kv is None:
            k, v = self.project_kv(x)
            k = self.pos.rotate(k, offset)  # (B, H, Tk, Dh)
        else:
            k, v = kv
        out = self.attend(q, k, v, key_mask, offset, bias)  # (B, H, Tq, Dh)
        b, _, t, _ = out.shape
        projected: Tensor = self.out_proj(out.transpose(1, 2).reshape(b, t, -1))  # (B, Tq, D)
        return projected

    def weights(
        self, x: Tensor, kv: tuple[Tensor, Tensor], key_mask: Tensor | None = None
    ) -> Tensor:
        """The attention weights (B, H, Tq, Tk) of `forward(x, kv, key_mask)` without dropout,
        written out (forward may use a fused kernel that never forms them). For inspection:
        alignments and attention plots."""
        q = self.pos.rotate(self._heads(self.q_proj(x)), 0)  # (B, H, Tq, Dh)
        k = kv[0]  # (B, H, Tk, Dh)
        logits = q @ k.transpose(-1, -2) / self.head_dim**0.5  # (B, H, Tq, Tk)
        bias = self.pos.bias(q, 0, k.size(-2))  # (B|1, H, Tq, Tk) or None
        if bias is not None:
            logits = logits + bias
        mask = kernels.attention_mask(key_mask, self.causal, q.size(-2), k.size(-2), q.device)
        if mask is not None:
            logits = logits.masked_fill(~mask, float("-inf"))
        weights: Tensor = logits.softmax(-1, dtype=torch.float32)  # (B, H, Tq, Tk)
        return weights

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        key_mask: Tensor | None,
        offset: Offset,
        extra: Tensor | None = None,
    ) -> Tensor:
        """q (B, H, Tq, Dh) over k, v (B, H, Tk, Dh) -> (B, H, Tq, Dh), with the positional
        bias (and relative values) of queries that start at position `offset`, and the term
        `extra` (B|1, 1, 1, Tk) on the logits.

        Rows at their own positions (`offset` (B,)) see the keys up to their own (`extra`
        masks the rest): where a few reach far past the others (a sentence at its length limit
        beside new ones, continuous batching), the others attend over their own span only
        (`long_rows`) and those few over all Tk keys."""
        if isinstance(offset, Tensor) and extra is not None and extra.size(0) == q.size(0):
            split = long_rows(offset, q.size(-2), k.size(-2)) if key_mask is None else None
            if split is not None:
                rows, span = split  # (J,), the keys the other rows reach
                head = (k[:, :, :span], v[:, :, :span])  # (B, H, L, Dh) each
                out = self._attend(q, head, None, offset, extra[..., :span])
                long = (k[rows], v[rows])  # (J, H, Tk, Dh) each
                out[rows] = self._attend(q[rows], long, None, offset[rows], extra[rows])
                return out  # (B, H, Tq, Dh)
        return self._attend(q, (k, v), key_mask, offset, extra)

    def _attend(
        self,
        q: Tensor,
        kv: tuple[Tensor, Tensor],
        mask: Tensor | None,
        offset: Offset,
        extra: Tensor | None,
    ) -> Tensor:
        k, v = kv  # (B, H, Tk, Dh) each
        bias = self.pos.bias(q, offset, k.size(-2))  # (B|1, H, Tq, Tk) or None
        if extra is not None:
            bias = extra if bias is None else bias + extra  # (B|1, H|1, Tq|1, Tk)
        values = partial(self.pos.values, q_offset=offset) if self.pos.needs_weights else None
        p = self.dropout if self.training else 0.0
        return kernels.attention(q, k, v, bias, mask, self.causal, p, values)


def long_rows(offset: Offset, q_len: int, k_len: int) -> tuple[Tensor, int] | None:
    """For rows at their own positions `offset` (B,) with q_len queries each over k_len keys
    (positions 0 .. k_len - 1): the rows (J,) that attend over all of them and the keys L the
    others reach (their furthest query's position + 1), for the J that attends to the fewest
    keys (J x Tk + (B - J) x L) where that is at most half of B x Tk; else None (an int offset,
    fewer than LONG_ROWS_MIN_KEYS keys, or no split that halves them)."""
    if not isinstance(offset, Tensor) or k_len < LONG_ROWS_MIN_KEYS:
        return None
    reach = (offset + q_len).tolist()  # keys each row reaches
    order = sorted(range(len(reach)), key=reach.__getitem__, reverse=True)
    rows = len(reach)
    best, split = rows * k_len, 0  # (keys attended to, J)
    for j in range(1, rows):
        cost = j * k_len + (rows - j) * reach[order[j]]
        if cost < best:
            best, split = cost, j
    if split == 0 or 2 * best > rows * k_len:
        return None
    return offset.new_tensor(order[:split]), reach[order[split]]


class FeedForward(nn.Module):
    """Position-wise feed-forward network, two linear maps around a ReLU (Vaswani et al. 2017)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.up = Linear(d_model, d_ff)
        self.down = Linear(d_ff, d_model)
        self.dropout = dropout

    def forward(self, x: Tensor) -> Tensor:
        """down(dropout(relu(up(x)))) for x (B, T, D): (B, T, D)."""
        hidden = kernels.dropout(self.up(x, relu=True), self.dropout, self.training)  # (B, T, F)
        out: Tensor = self.down(hidden)  # (B, T, D)
        return out


class Residual(nn.Module):
    """x + dropout(f(norm(x))) in pre-norm, norm(x + dropout(f(x))) in post-norm.

    Post-norm is Vaswani et al. 2017; pre-norm is Xiong et al. 2020, "On Layer Normalization in
    the Transformer Architecture", which trains without a long warmup.
    """

    def __init__(self, d_model: int, dropout: float, norm_first: bool) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout, self.norm_first = dropout, norm_first

    def forward(self, x: Tensor, sublayer: nn.Module, *args: object, **kwargs: object) -> Tensor:
        """`sublayer(x, *args, **kwargs)` for x (B, T, D) in its residual block."""
        if self.norm_first:
            out = sublayer(self.norm(x), *args, **kwargs)  # (B, T, D)
            return x + kernels.dropout(out, self.dropout, self.training)
        out = sublayer(x, *args, **kwargs)  # (B, T, D)
        normed: Tensor = self.norm(x + kernels.dropout(out, self.dropout, self.training))
        return normed


@dataclass
class LayerSpec:
    """Sizes shared by every layer of a stack."""

    d_model: int
    n_heads: int
    d_ff: int
    dropout: float  # residual
    attn_dropout: float  # attention weights
    ffn_dropout: float  # feed-forward hidden activations
    norm_first: bool


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each in a residual block (Vaswani et al. 2017)."""

    def __init__(self, spec: LayerSpec, pos: PositionalEncoding) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(
            spec.d_model, spec.n_heads, spec.attn_dropout, pos, causal=False
        )
        self.ffn = FeedForward(spec.d_model, spec.d_ff, spec.ffn_dropout)
        self.res_attn = Residual(spec.d_model, spec.dropout, spec.norm_first)
        self.res_ffn = Residual(spec.d_model, spec.dropout, spec.norm_first)

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        """x (B, S, D) -> (B, S, D); src_mask (B, S) is True at real tokens."""
        x = self.res_attn(x, self.self_attn, key_mask=src_mask)  # (B, S, D)
        out: Tensor = self.res_ffn(x, self.ffn)  # (B, S, D)
        return out


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention to the encoder, feed-forward (Vaswani et al. 2017)."""

    def __init__(self, spec: LayerSpec, pos: PositionalEncoding) -> None:
        super().__init__()
        d, h, p = spec.d_model, spec.n_heads, spec.attn_dropout
        self.self_attn = MultiHeadAttention(d, h, p, pos, causal=True)
        self.cross_attn = MultiHeadAttention(d, h, p, PositionalEncoding(), causal=False)
        self.ffn = FeedForward(d, spec.d_ff, spec.ffn_dropout)
        self.res_self = Residual(d, spec.dropout, spec.norm_first)
        self.res_cross = Residual(d, spec.dropout, spec.norm_first)
        self.res_ffn = Residual(d, spec.dropout, spec.norm_first)

    def forward(
        self, x: Tensor, memory: Tensor, src_mask: Tensor, cache: LayerCache | None = None
    ) -> Tensor:
        """x (N, T, D) attends causally to itself and to memory (B, S, D).

        N may be a multiple of B: G = N / B hypotheses per sentence, sentence-major (beam search,
        see `_cross_attention`). With a cache, x holds only the new tokens; their keys/values are
        appended to the cache, and the memory's keys/values are computed at the first step only.
        """
        if cache is None:
            kv = self.cross_attn.project_kv(memory)  # (B, H, S, Dh) each
            x = self.res_self(x, self.self_attn)
            x = self.res_cross(x, self._cross_attention, kv, src_mask)
        else:
            k, v, pads = self._cached_memory(memory, src_mask, cache)
            x = self.res_self(x, self._cached_self_attention, cache)
            x = self.res_cross(x, self._cross_attention, (k, v), None, pads)
        out: Tensor = self.res_ffn(x, self.ffn)  # (N, T, D)
        return out

    def _cached_memory(
        self, memory: Tensor, src_mask: Tensor, cache: LayerCache
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The memory's keys and values (B, H, S, Dh) and its padding as a bias (B, 1, 1, S),
        computed at the first step and read from the cache after that."""
        if cache.cross_k is None or cache.cross_v is None or cache.cross_bias is None:
            k, v = self.cross_attn.project_kv(memory)  # (B, H, S, Dh) each
            cache.cross_k, cache.cross_v = k.contiguous(), v.contiguous()  # read every step
            cache.cross_bias = kernels.key_bias(src_mask, k.dtype)  # (B, 1, 1, S)
        return cache.cross_k, cache.cross_v, cache.cross_bias

    def add_sentences(
        self, memory: Tensor, src_mask: Tensor, cache: LayerCache, slots: Tensor | None = None
    ) -> None:
        """Put new sentences, memory (B', S, D) and src_mask (B', S), in the cache's rows
        `slots` (B',) or after its rows (continuous batching): their cross-attention keys and
        values, computed once."""
        k, v = self.cross_attn.project_kv(memory)  # (B', H, S, Dh) each
        bias = kernels.key_bias(src_mask, k.dtype)  # (B', 1, 1, S)
        cache.add_rows(k.contiguous(), v.contiguous(), bias, slots)

    def _cached_self_attention(self, x: Tensor, cache: LayerCache) -> Tensor:
        attn, offset = self.self_attn, cache.offset
        if isinstance(offset, Tensor):  # rows at their own positions: each writes at its own
            k, v = attn.kv_heads(x).unbind(0)  # (N, H, 1, Dh) each
            keys, values, unreached = cache.append_rows(attn.pos.rotate(k, offset), v)
            ragged: Tensor = attn(x, (keys, values), None, offset, unreached)  # (N, 1, D)
            return ragged
        new_k, k, v = cache.append(attn.kv_heads(x))  # (N, H, t, Dh), (N, H, offset + t, Dh)
        rotated = attn.pos.rotate(new_k, offset)  # the hook gives its input back if it does
        if rotated is not new_k:  # nothing; else the rotated keys replace the cached ones
            new_k.copy_(rotated)
        out: Tensor = attn(x, (k, v), None, offset)  # (N, t, D)
        return out

    def _cross_attention(
        self,
        x: Tensor,
        kv: tuple[Tensor, Tensor],
        src_mask: Tensor | None,
        pads: Tensor | None = None,
    ) -> Tensor:
        """Rows of x (N, T, D) are G = N / B hypotheses per sentence, sentence-major (beam
        search). Cross-attention has no positional terms and no causal mask, so the hypotheses of
        a sentence become G * T queries of one row: the memory is never repeated per beam. The
        source's padding comes as src_mask (B, S) or, cached, as a bias `pads` (B, 1, 1, S)."""
        n, t, d = x.shape
        b = kv[0].size(0)
        if n % b:
            raise ValueError(f"{n} decoder rows do not split into hypotheses of {b} sentences")
        queries = x.reshape(b, (n // b) * t, d)  # (B, G*T, D)
        out: Tensor = self.cross_attn(queries, kv, src_mask, bias=pads)  # (B, G*T, D)
        return out.view(n, t, d)
