"""The fast CPU kernels behind seq2seq.kernels in auto mode: linear layers on oneDNN, dropout
masks from 16 random bits per element, and attention as two matmuls where SDPA's CPU kernel is
slower. docs/BENCHMARKS.md ("Kernel notes") has the measurements behind each choice.

Shapes: B batch, H heads, Tq queries, Tk keys, Dh = head width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from seq2seq.kernels import onednn, reference

# PyTorch's CPU softmax takes a scalar path for rows shorter than 16, forward and backward;
# training attention pads its keys up to this many (see `attention`)
FAST_SOFTMAX_LEN = 16
# float32 training attention takes matmuls up to this many keys, SDPA beyond
MATMUL_MAX_KEYS = 32


def linear(x: Tensor, weight: Tensor, bias: Tensor | None, relu: bool = False) -> Tensor:
    """x @ weight.T + bias, then a ReLU if asked: (..., D_in) -> (..., D_out).

    float32 runs on oneDNN (onednn.py), training and decoding alike, where F.linear would call
    MKL's SGEMM, slow on AMD CPUs. Other dtypes and autocast keep F.linear.
    """
    if onednn.usable(x, weight):
        return onednn.linear(x, weight, bias, relu)
    return reference.linear(x, weight, bias, relu)


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Inverted dropout (Srivastava et al. 2014), skipped outright when it does nothing.

    The mask comes from 16 random bits per element, four per 64-bit draw: F.dropout's
    bernoulli_ and torch.rand (32 bits per element) are slower, and the mask was the largest
    single cost of a small model's training step. `p` is rounded to a multiple of 1/65536 (0.1
    becomes 0.100006) and the kept values are scaled by 1 / (1 - that p), so the expectation
    is exact.
    """
    if not training or p == 0:
        return x
    if p >= 1:
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


def _matmul_attention(q: Tensor, k_len: int, mask: Tensor | None) -> bool:
    """Where two batched matmuls beat SDPA's CPU kernel (measured with 2 threads):
    - decoding steps: a few queries per row (one new token, or the beams of a sentence folded
      into one row), except a single query under a padding mask;
    - bfloat16 (autocast training): SDPA's bf16 CPU kernel is slower than its own fp32 one, and
      than bf16 matmuls with a float32 softmax, forward + backward;
    - float32 training on up to MATMUL_MAX_KEYS keys, keys padded to FAST_SOFTMAX_LEN. From ~64
      keys SDPA is as fast or faster, and keeps no (Tq, Tk) weights for backward."""
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


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    key_mask: Tensor | None,
    causal: bool,
    dropout_p: float,
    values: reference.Values | None,
) -> Tensor:
    """reference.attention's result (B, H, Tq, Dh), on two matmuls around a float32 softmax
    where they are faster (`_matmul_attention`), with training keys padded to FAST_SOFTMAX_LEN,
    and on SDPA elsewhere."""
    q_len, k_len = q.size(-2), k.size(-2)
    mask = reference.attention_mask(key_mask, causal, q_len, k_len, q.device)
    if values is None and not _matmul_attention(q, k_len, mask):
        return reference.sdpa(q, k, v, bias, mask, key_mask, dropout_p)
    if k_len < FAST_SOFTMAX_LEN and q.requires_grad and values is None:
        k, v, bias, mask = _pad_keys(k, v, bias, mask)  # Tk -> 16
    return reference.explicit_attention(q, k, v, bias, mask, dropout_p, values, drop=dropout)
