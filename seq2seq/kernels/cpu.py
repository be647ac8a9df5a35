"""The fast CPU kernels behind seq2seq.kernels in auto mode: linear layers on oneDNN, dropout
masks from 16 random bits per element, attention as two matmuls where SDPA's CPU kernel is
slower, and the searches' top-k and row maxima block by block on long rows.
docs/BENCHMARKS.md ("Kernel notes") has the measurements behind each choice.

Decoding one sentence (or its beams) costs little arithmetic a step and many small calls: there
attention goes to SDPA, one call where the matmuls make about ten, and the products by small
weights to F.linear, without oneDNN's checks and packed-weight lookup (benchmarks/decode_ops.py
counts the calls).

Shapes: B batch, H heads, Tq queries, Tk keys, Dh = head width, N rows, V row length.
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
# products without gradients of at most this many rows by small weights go to F.linear
# (see `linear`)
SMALL_ROWS = 8
# attention without gradients over at most this many query rows (B x Tq) goes to SDPA
FEW_QUERY_ROWS = 8
# (both chosen on an AMD EPYC and timed again on an Intel Xeon without AMX, where they hold:
# benchmarks/small_shapes.py, docs/BENCHMARKS.md)
# top-k and row maxima over at least this many elements go block by block (see `topk`)
BLOCKED_MIN_ELEMENTS = 1 << 16
BLOCK = 64  # elements a block


def linear(x: Tensor, weight: Tensor, bias: Tensor | None, relu: bool = False) -> Tensor:
    """x @ weight.T + bias, then a ReLU if asked: (..., D_in) -> (..., D_out).

    float32 runs on the backend chosen for the process (onednn.py: oneDNN by default, where
    F.linear would call MKL's SGEMM, slow on AMD CPUs); without gradients (decoding), products
    by large weights (the output layer) on the one chosen for those. Products without
    gradients of at most SMALL_ROWS rows by small weights (one sentence decoded, or its beams)
    take F.linear: their arithmetic is negligible, and it spares them the Python side of
    oneDNN's path (its checks and the packed-weight lookup), though its C++ side makes more
    dispatcher calls (t, addmm and their views); benchmarks/decode_ops.py --set SMALL_ROWS=0
    counts both ways. Other dtypes and autocast keep F.linear.
    """
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        if onednn.usable(x, weight):
            return onednn.linear(x, weight, bias, relu)
        return reference.linear(x, weight, bias, relu)
    large = weight.numel() >= onednn.LARGE_WEIGHT
    if not large and x.numel() <= SMALL_ROWS * weight.size(1):
        return reference.linear(x, weight, bias, relu)
    if onednn.decodes(x, weight, large):
        return onednn.linear(x, weight, bias, relu)
    return reference.linear(x, weight, bias, relu)


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Inverted dropout (Srivastava et al. 2014), skipped outright when it does nothing.

    The mask comes from 16 random bits per element, four per 64-bit draw: F.dropout's
    bernoulli_ and torch.rand (32 bits per element) are slower, and the mask was the largest
    single cost of a small model's training step. `p` is rounded to a multiple of 1/65536 (0.1
    becomes 0.100006) and the kept values are scaled by 1 / (1 - that p), so in float32 the
    expectation is exact. In bfloat16 the scale is rounded to bf16, as F.dropout's is: for
    p = 0.1, 1.109375 for 1.111111, so the output's expectation is 0.9984 x (a mask of
    another dtype, or a second pass to scale, would cost time: on an AMX Xeon the mask
    multiply was the fastest of the forms tried, torch.where and masked_fill 1.3x slower).
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
    - decoding steps of a batch: a few queries per row (one new token, or the beams of a
      sentence folded into one row), except a single query under a padding mask; one sentence
      alone (at most FEW_QUERY_ROWS query rows in all) takes SDPA, one call where the matmuls
      make about ten;
    - bfloat16 (autocast training): SDPA's bf16 CPU kernel is slower than its own fp32 one, and
      than bf16 matmuls with a float32 softmax, forward + backward;
    - float32 training on up to MATMUL_MAX_KEYS keys, keys padded to FAST_SOFTMAX_LEN. From ~64
      keys SDPA is as fast or faster, and keeps no (Tq, Tk) weights for backward."""
    q_len = q.size(-2)
    if q.dtype == torch.bfloat16 or (q.requires_grad and k_len <= MATMUL_MAX_KEYS):
        return True
    if q.size(0) * q_len <= FEW_QUERY_ROWS and not q.requires_grad:
        return False
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


def topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """reference.topk's values (N, k), largest first, and indices of a row's k largest: on long
    rows block by block (`_blocked_topk`), elsewhere torch.topk. Where values tie, either may
    return the other's index."""
    n, v = x.shape
    if n * v < BLOCKED_MIN_ELEMENTS or v < 4 * k * BLOCK or x.requires_grad:
        return reference.topk(x, k)
    return _blocked_topk(x, k)


def row_max(x: Tensor) -> tuple[Tensor, Tensor]:
    """reference.row_max's value and index (N,) of each row's largest, block by block on long
    rows."""
    n, v = x.shape
    if n * v < BLOCKED_MIN_ELEMENTS or v < 4 * BLOCK or x.requires_grad:
        return reference.row_max(x)
    values, indices = _blocked_topk(x, 1)  # (N, 1) each
    return values.squeeze(1), indices.squeeze(1)


def _blocked_topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """torch.topk(x, k) for rows x (N, V) of at least k full blocks. torch.topk copies every
    element of a row into a queue of (value, index) pairs; here one vectorized pass takes the
    maximum of each BLOCK elements, and the k largest values lie in the k blocks of largest
    maxima and the last, partial block: torch.topk then runs on those k * BLOCK (+ the rest)
    candidates only."""
    n, v = x.shape
    full = v // BLOCK * BLOCK
    maxima = x[:, :full].reshape(n, full // BLOCK, BLOCK).amax(-1)  # (N, blocks)
    blocks = maxima.topk(k, dim=-1).indices  # (N, k)
    offsets = torch.arange(BLOCK, device=x.device)  # (BLOCK,)
    index = (blocks[:, :, None] * BLOCK + offsets).view(n, k * BLOCK)  # (N, k*BLOCK)
    if full < v:  # the partial block, whole
        rest = torch.arange(full, v, device=x.device).expand(n, -1)  # (N, V - full)
        index = torch.cat((index, rest), 1)  # (N, C)
    values, best = x.gather(1, index).topk(k, dim=-1)  # (N, k) each
    return values, index.gather(1, best)
