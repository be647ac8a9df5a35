"""Transformer building blocks: attention, feed-forward, encoder and decoder layers.

Shapes: B batch, S source length, T target length, D model width, H heads, Dh = D / H.
Masks are boolean with True where a key may be attended to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from seq2seq.positional import PositionalEncoding


@dataclass
class LayerCache:
    """Keys and values one decoder layer has already computed during incremental decoding."""

    self_k: Tensor | None = None  # (B, H, t, Dh): keys of the t tokens decoded so far
    self_v: Tensor | None = None  # (B, H, t, Dh)
    cross_k: Tensor | None = None  # (B, H, S, Dh): encoder keys, computed once per batch
    cross_v: Tensor | None = None  # (B, H, S, Dh)

    def reorder(self, index: Tensor) -> None:
        """Keep the rows `index` (beam search reorders hypotheses every step)."""
        for name in ("self_k", "self_v", "cross_k", "cross_v"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value.index_select(0, index))


def attention_mask(
    key_mask: Tensor | None, causal: bool, q_len: int, k_len: int, device: torch.device
) -> Tensor | None:
    """Boolean (B or 1, 1, Tq, Tk) mask, True where attention is allowed (None: all allowed)."""
    mask = None if key_mask is None else key_mask[:, None, None, :]  # (B, 1, 1, Tk)
    if causal and q_len > 1:
        # query i sits at position k_len - q_len + i and sees keys up to there
        allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
        allowed = allowed.tril(diagonal=k_len - q_len)  # (Tq, Tk)
        mask = allowed[None, None] if mask is None else mask & allowed
    return mask


class MultiHeadAttention(nn.Module):
    """Scaled dot-product multi-head attention (Vaswani et al. 2017), self or cross.

    Calls the positional hooks `rotate` (queries and keys) and `bias` (logits), and `values` when
    the encoding asks for the attention weights. Runs on `F.scaled_dot_product_attention` unless
    the weights are needed.
    """

    def __init__(
        self, d_model: int, n_heads: int, dropout: float, pos: PositionalEncoding, causal: bool
    ) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not divisible by n_heads {n_heads}")
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.kv_proj = nn.Linear(d_model, 2 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        self.dropout, self.pos, self.causal = dropout, pos, causal

    def _heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, -1, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of `x` (B, T, D), split into heads."""
        k, v = self.kv_proj(x).chunk(2, dim=-1)  # (B, T, D) each
        return self._heads(k), self._heads(v)  # (B, H, T, Dh) each

    def forward(
        self,
        x: Tensor,
        kv: tuple[Tensor, Tensor] | None = None,
        key_mask: Tensor | None = None,
        offset: int = 0,
    ) -> Tensor:
        """Attend from `x` (B, Tq, D) to keys/values `kv` (B, H, Tk, Dh), default: x itself.

        `offset` is the position of x's first token (tokens already in a decoding cache).
        Self-attention callers pass `kv` already rotated when they cache it.
        """
        q = self.pos.rotate(self._heads(self.q_proj(x)), offset)  # (B, H, Tq, Dh)
        if kv is None:
            k, v = self.project_kv(x)
            k = self.pos.rotate(k, offset)  # (B, H, Tk, Dh)
        else:
            k, v = kv
        out = self.attend(q, k, v, key_mask, offset)  # (B, H, Tq, Dh)
        b, _, t, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(b, t, -1))  # (B, Tq, D)

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, key_mask: Tensor | None, offset: int
    ) -> Tensor:
        q_len, k_len = q.size(-2), k.size(-2)
        bias = self.pos.bias(q, offset, k_len)  # (B|1, H, Tq, Tk) or None
        mask = attention_mask(key_mask, self.causal, q_len, k_len, q.device)
        p = self.dropout if self.training else 0.0
        if self.pos.needs_weights:
            logits = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)  # (B, H, Tq, Tk)
            if bias is not None:
                logits = logits + bias
            if mask is not None:
                logits = logits.masked_fill(~mask, float("-inf"))
            weights = F.dropout(logits.softmax(-1), p, self.training)  # (B, H, Tq, Tk)
            return weights @ v + self.pos.values(weights, offset)  # (B, H, Tq, Dh)
        if bias is None and mask is None:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        if bias is None and key_mask is None and q_len == k_len:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        if bias is not None:
            mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)


class FeedForward(nn.Module):
    """Position-wise feed-forward network, two linear maps around a ReLU (Vaswani et al. 2017)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.up = nn.Linear(d_model, d_ff)
        self.down = nn.Linear(d_ff, d_model)
        self.dropout = dropout

    def forward(self, x: Tensor) -> Tensor:
        hidden = F.dropout(F.relu(self.up(x)), self.dropout, self.training)  # (B, T, F)
        return self.down(hidden)  # (B, T, D)


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
        if self.norm_first:
            out = sublayer(self.norm(x), *args, **kwargs)  # (B, T, D)
            return x + F.dropout(out, self.dropout, self.training)
        out = sublayer(x, *args, **kwargs)  # (B, T, D)
        return self.norm(x + F.dropout(out, self.dropout, self.training))


@dataclass
class LayerSpec:
    """Sizes shared by every layer of a stack."""

    d_model: int
    n_heads: int
    d_ff: int
    dropout: float
    attn_dropout: float
    norm_first: bool


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each in a residual block (Vaswani et al. 2017)."""

    def __init__(self, spec: LayerSpec, pos: PositionalEncoding) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(
            spec.d_model, spec.n_heads, spec.attn_dropout, pos, causal=False
        )
        self.ffn = FeedForward(spec.d_model, spec.d_ff, spec.dropout)
        self.res_attn = Residual(spec.d_model, spec.dropout, spec.norm_first)
        self.res_ffn = Residual(spec.d_model, spec.dropout, spec.norm_first)

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        x = self.res_attn(x, self.self_attn, key_mask=src_mask)  # (B, S, D)
        return self.res_ffn(x, self.ffn)  # (B, S, D)


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention to the encoder, feed-forward (Vaswani et al. 2017)."""

    def __init__(self, spec: LayerSpec, pos: PositionalEncoding) -> None:
        super().__init__()
        d, h, p = spec.d_model, spec.n_heads, spec.attn_dropout
        self.self_attn = MultiHeadAttention(d, h, p, pos, causal=True)
        self.cross_attn = MultiHeadAttention(d, h, p, PositionalEncoding(), causal=False)
        self.ffn = FeedForward(d, spec.d_ff, spec.dropout)
        self.res_self = Residual(d, spec.dropout, spec.norm_first)
        self.res_cross = Residual(d, spec.dropout, spec.norm_first)
        self.res_ffn = Residual(d, spec.dropout, spec.norm_first)

    def forward(
        self, x: Tensor, memory: Tensor, src_mask: Tensor, cache: LayerCache | None = None
    ) -> Tensor:
        """x (B, T, D) attends causally to itself and to memory (B, S, D).

        With a cache, x holds only the new tokens; their keys/values are appended to the cache.
        """
        if cache is None:
            x = self.res_self(x, self.self_attn)
            x = self.res_cross(x, self.cross_attn, self.cross_attn.project_kv(memory), src_mask)
            return self.res_ffn(x, self.ffn)  # (B, T, D)
        offset = 0 if cache.self_k is None else cache.self_k.size(2)
        x = self.res_self(x, self._cached_self_attention, cache, offset)
        if cache.cross_k is None:
            cache.cross_k, cache.cross_v = self.cross_attn.project_kv(memory)
        kv = (cache.cross_k, cache.cross_v)
        x = self.res_cross(x, self.cross_attn, kv, src_mask)
        return self.res_ffn(x, self.ffn)  # (B, T, D)

    def _cached_self_attention(self, x: Tensor, cache: LayerCache, offset: int) -> Tensor:
        attn = self.self_attn
        k, v = attn.project_kv(x)  # (B, H, t, Dh) for the new tokens
        k = attn.pos.rotate(k, offset)
        if cache.self_k is not None:
            k = torch.cat((cache.self_k, k), dim=2)  # (B, H, offset + t, Dh)
            v = torch.cat((cache.self_v, v), dim=2)
        cache.self_k, cache.self_v = k, v
        return attn(x, (k, v), None, offset)  # (B, t, D)
