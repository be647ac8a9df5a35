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

from seq2seq import onednn
from seq2seq.positional import PositionalEncoding

# PyTorch's CPU softmax takes a scalar path for rows shorter than 16 (~10x slower per element,
# forward and backward); training attention pads its keys up to this many (see `attend`)
FAST_SOFTMAX_LEN = 16
# float32 training attention on a CPU takes matmuls up to this many keys, SDPA beyond
MATMUL_MAX_KEYS = 32


def linear(x: Tensor, weight: Tensor, bias: Tensor | None, relu: bool = False) -> Tensor:
    """x @ weight.T + bias, then a ReLU if asked: (..., D_in) -> (..., D_out).

    float32 on a CPU runs on oneDNN (seq2seq/onednn.py): ~2x MKL's SGEMM behind F.linear on
    the AMD CPU we measure on, training and decoding alike. Other dtypes, autocast and other
    devices keep F.linear.
    """
    if onednn.usable(x, weight):
        return onednn.linear(x, weight, bias, relu)
    out = F.linear(x, weight, bias)
    return F.relu(out) if relu else out


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Inverted dropout (Srivastava et al. 2014), skipped outright when it does nothing (a
    decoding step would call it ~20 times).

    On a CPU the mask comes from 16 random bits per element, four per 64-bit draw: F.dropout's
    bernoulli_ is ~6x slower and torch.rand ~2x (which draws 32 bits per element); before this,
    the mask was the largest single cost of a small model's training step. `p` is rounded to
    a multiple of 1/65536 (0.1 becomes 0.100006) and the kept values are scaled by 1 / (1 - that
    p), so the expectation is exact. Other devices keep F.dropout's fused kernel.
    """
    if not training or p == 0:
        return x
    if x.device.type != "cpu" or p >= 1:
        return F.dropout(x, p, True)
    return x * _keep_mask(x, round(p * 65536))


def _keep_mask(x: Tensor, dropped: int) -> Tensor:
    """A mask shaped and typed like `x`: 0 with probability dropped / 65536, else
    65536 / (65536 - dropped)."""
    n = x.numel()
    bits = torch.empty((n + 3) // 4, dtype=torch.int64, device=x.device)
    bits = bits.random_(-(2**63), 2**63 - 1).view(torch.int16)[:n]  # (N,) uniform int16
    keep = bits.view(x.shape).ge(dropped - 32768)  # (...) True with probability 1 - p
    return keep.to(x.dtype).mul_(65536 / (65536 - dropped))


class Linear(nn.Linear):
    """nn.Linear whose forward is `linear` above (same parameters and state-dict keys)."""

    def forward(self, x: Tensor, relu: bool = False) -> Tensor:
        return linear(x, self.weight, self.bias, relu)


class LayerCache:
    """Keys and values one decoder layer has already computed during incremental decoding.

    Self-attention keys/values have one row per hypothesis (sentences x beams, sentence-major)
    and live in one buffer preallocated for `capacity` positions (doubled when a step goes past
    it): a step writes one slice instead of concatenating the whole history, and a reorder
    copies into a second buffer kept for that, so steps allocate no new memory.
    Cross-attention keys/values are computed once per batch and have one row per sentence: the
    hypotheses of a sentence share them (see `DecoderLayer`).
    """

    def __init__(self, capacity: int = 0) -> None:
        self.capacity, self.length = capacity, 0
        self._kv: Tensor | None = None  # (2, N, H, capacity, Dh): keys, values
        self._spare: Tensor | None = None  # (2, >= N, H, capacity, Dh): reorder writes here
        self.cross_k: Tensor | None = None  # (B, H, S, Dh): encoder keys, computed once
        self.cross_v: Tensor | None = None  # (B, H, S, Dh)

    @property
    def self_k(self) -> Tensor | None:
        """Keys of the tokens decoded so far, (N, H, t, Dh); None before the first step."""
        return None if self._kv is None else self._kv[0, :, :, : self.length]

    @property
    def self_v(self) -> Tensor | None:
        """Values of the tokens decoded so far, (N, H, t, Dh)."""
        return None if self._kv is None else self._kv[1, :, :, : self.length]

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add the keys/values (N, H, t, Dh) of t new tokens; returns all of them so far."""
        start, end = self.length, self.length + k.size(2)
        kv = self._kv
        if kv is None or end > kv.size(3):
            kv = self._grow(k, end)
        kv[0, :, :, start:end] = k
        kv[1, :, :, start:end] = v
        self.length = end
        return kv[0, :, :, :end], kv[1, :, :, :end]  # (N, H, end, Dh) each

    def _grow(self, k: Tensor, end: int) -> Tensor:
        old = self._kv
        size = max(end, self.capacity, 0 if old is None else 2 * old.size(3))
        n, h, _, dh = k.shape
        kv = k.new_empty(2, n, h, size, dh)  # (2, N, H, size, Dh)
        if old is not None:
            kv[:, :, :, : self.length] = old[:, :, :, : self.length]
        self._kv, self._spare = kv, None
        return kv

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Keep the hypotheses `rows` (beam search continues some, several times or not at all)
        and, when given, the cross-attention rows of the sentences `sentences` (sentences that
        are finished leave the batch)."""
        if self._kv is not None:
            n, t = rows.numel(), self.length
            if self._spare is None or self._spare.size(1) < n:
                self._spare = self._kv.new_empty(2, n, *self._kv.shape[2:])
            out = self._spare[:, :n]  # (2, N', H, capacity, Dh)
            torch.index_select(self._kv[:, :, :, :t], 1, rows, out=out[:, :, :, :t])
            self._kv, self._spare = out, self._kv
        if sentences is not None and self.cross_k is not None and self.cross_v is not None:
            self.cross_k = self.cross_k.index_select(0, sentences)
            self.cross_v = self.cross_v.index_select(0, sentences)


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


def _matmul_attention(q: Tensor, k_len: int, mask: Tensor | None) -> bool:
    """Where two batched matmuls beat SDPA's CPU kernel (measured with 2 threads):
    - decoding steps: a few queries per row (one new token, or the beams of a sentence folded
      into one row), except a single query under a padding mask (1.2-2.5x either way);
    - bfloat16 (autocast training): SDPA's bf16 CPU kernel is ~3x slower than its own fp32 one,
      and 1.6-4x slower than bf16 matmuls with a float32 softmax (forward + backward, Dh 64,
      4,096 tokens at T 32-256);
    - float32 training on up to MATMUL_MAX_KEYS keys: 1.1-1.6x faster than SDPA forward +
      backward (B 256, T 11-32, Dh 64, masked), keys padded to FAST_SOFTMAX_LEN. From ~64 keys
      SDPA is as fast or faster, and keeps no (Tq, Tk) weights for backward."""
    if q.device.type != "cpu":
        return False
    q_len = q.size(-2)
    if q.dtype == torch.bfloat16 or (q.requires_grad and k_len <= MATMUL_MAX_KEYS):
        return True
    return q_len <= 8 and (q_len > 1 or mask is None)


def _pad_keys(
    k: Tensor, v: Tensor, bias: Tensor | None, mask: Tensor | None
) -> tuple[Tensor, Tensor, Tensor | None, Tensor]:
    """Keys and values (B, H, Tk, Dh) padded with zeros to FAST_SOFTMAX_LEN positions, which the
    returned mask hides; the logits' bias, if any, padded alike."""
    k_len, pad = k.size(-2), FAST_SOFTMAX_LEN - k.size(-2)
    if mask is None:
        mask = torch.ones(1, 1, 1, k_len, dtype=torch.bool, device=k.device)
    mask = F.pad(mask, (0, pad), value=False)  # (B|1, 1, Tq|1, 16)
    bias = None if bias is None else F.pad(bias, (0, pad))  # (B|1, H, Tq, 16)
    return F.pad(k, (0, 0, 0, pad)), F.pad(v, (0, 0, 0, pad)), bias, mask  # (B, H, 16, Dh)


class MultiHeadAttention(nn.Module):
    """Scaled dot-product multi-head attention (Vaswani et al. 2017), self or cross.

    Calls the positional hooks `rotate` (queries and keys) and `bias` (logits), and `values` when
    the encoding asks for the attention weights. Runs on `F.scaled_dot_product_attention` unless
    the weights are needed or two matmuls are faster on a CPU (`_matmul_attention`).
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
        if self.pos.needs_weights or _matmul_attention(q, k_len, mask):
            if k_len < FAST_SOFTMAX_LEN and q.requires_grad and not self.pos.needs_weights:
                k, v, bias, mask = _pad_keys(k, v, bias, mask)  # Tk -> 16
            logits = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)  # (B, H, Tq, Tk)
            if bias is not None:
                logits = logits + bias
            if mask is not None:
                logits = logits.masked_fill(~mask, float("-inf"))
            weights = logits.softmax(-1, dtype=torch.float32).to(v.dtype)  # (B, H, Tq, Tk)
            weights = dropout(weights, p, self.training)
            out = weights @ v  # (B, H, Tq, Dh)
            extra = self.pos.values(weights, offset)
            return out if extra is None else out + extra
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
        self.up = Linear(d_model, d_ff)
        self.down = Linear(d_ff, d_model)
        self.dropout = dropout

    def forward(self, x: Tensor) -> Tensor:
        hidden = dropout(self.up(x, relu=True), self.dropout, self.training)  # (B, T, F)
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
            return x + dropout(out, self.dropout, self.training)
        out = sublayer(x, *args, **kwargs)  # (B, T, D)
        return self.norm(x + dropout(out, self.dropout, self.training))


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
        x = self.res_attn(x, self.self_attn, key_mask=src_mask)  # (B, S, D)
        return self.res_ffn(x, self.ffn)  # (B, S, D)


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
        else:
            if cache.cross_k is None or cache.cross_v is None:  # contiguous: read every step
                k, v = self.cross_attn.project_kv(memory)  # (B, H, S, Dh) each
                cache.cross_k, cache.cross_v = k.contiguous(), v.contiguous()
            kv = (cache.cross_k, cache.cross_v)
            x = self.res_self(x, self._cached_self_attention, cache)
        x = self.res_cross(x, self._cross_attention, kv, src_mask)
        return self.res_ffn(x, self.ffn)  # (N, T, D)

    def _cached_self_attention(self, x: Tensor, cache: LayerCache) -> Tensor:
        attn, offset = self.self_attn, cache.length
        k, v = attn.project_kv(x)  # (N, H, t, Dh) for the new tokens
        k, v = cache.append(attn.pos.rotate(k, offset), v)  # (N, H, offset + t, Dh)
        return attn(x, (k, v), None, offset)  # (N, t, D)

    def _cross_attention(self, x: Tensor, kv: tuple[Tensor, Tensor], src_mask: Tensor) -> Tensor:
        """Rows of x (N, T, D) are G = N / B hypotheses per sentence, sentence-major (beam
        search). Cross-attention has no positional terms and no causal mask, so the hypotheses of
        a sentence become G * T queries of one row: the memory is never repeated per beam."""
        n, t, d = x.shape
        b = kv[0].size(0)
        if n % b:
            raise ValueError(f"{n} decoder rows do not split into hypotheses of {b} sentences")
        out = self.cross_attn(x.reshape(b, (n // b) * t, d), kv, src_mask)  # (B, G*T, D)
        return out.view(n, t, d)
