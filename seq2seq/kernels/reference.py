"""Plain PyTorch kernels: F.linear, F.scaled_dot_product_attention, F.dropout, and
F.cross_entropy(label_smoothing=...) on full logits.

What trainer.kernels=reference runs everywhere, and what runs on any device but the CPU (CUDA)
in auto mode. Also the pieces the CPU kernels share: the attention mask, SDPA's calls, and
attention with explicit weights.

Shapes: B batch, H heads, Tq queries, Tk keys, Dh = head width, N rows, V vocabulary.
Masks are boolean with True where a key may be attended to.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

# Shaw et al.'s relative values: attention weights (B, H, Tq, Tk) -> a term (B, H, Tq, Dh)
Values = Callable[[Tensor], Tensor | None]
Dropout = Callable[[Tensor, float, bool], Tensor]


def linear(x: Tensor, weight: Tensor, bias: Tensor | None, relu: bool = False) -> Tensor:
    """x @ weight.T + bias, then a ReLU if asked: (..., D_in) -> (..., D_out)."""
    out = F.linear(x, weight, bias)
    return torch.relu(out) if relu else out


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Inverted dropout (Srivastava et al. 2014), skipped outright when it does nothing (a
    decoding step would call it for every layer)."""
    if not training or p == 0:
        return x
    return F.dropout(x, p, True)


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


def key_bias(key_mask: Tensor, dtype: torch.dtype) -> Tensor:
    """The key mask (B, Tk) as a term added to the logits, (B, 1, 1, Tk): 0 at keys that may be
    attended to, -inf at the others. Made once, it serves every step of a decoding (a boolean
    mask would become this float one inside every SDPA call)."""
    bias = torch.zeros(key_mask.shape, dtype=dtype, device=key_mask.device)  # (B, Tk)
    return bias.masked_fill_(key_mask.logical_not(), float("-inf"))[:, None, None, :]


def topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k largest values of each row of x (N, V), largest first, and their indices (N, k)."""
    values, indices = x.topk(k, dim=-1)
    return values, indices


def row_max(x: Tensor) -> tuple[Tensor, Tensor]:
    """The largest value of each row of x (N, V) and its index, (N,) each."""
    values, indices = x.max(dim=-1)
    return values, indices


def sdpa(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    mask: Tensor | None,
    key_mask: Tensor | None,
    dropout_p: float,
) -> Tensor:
    """F.scaled_dot_product_attention of q (B, H, Tq, Dh) over k, v (B, H, Tk, Dh), given the
    logits' bias and the `attention_mask` built from `key_mask`: no mask, or is_causal, where
    they suffice (SDPA's faster kernels), else one float mask holding both."""
    if bias is None and mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
    if bias is None and key_mask is None and q.size(-2) == k.size(-2):  # causal only
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    if bias is not None:
        mask = bias if mask is None else bias.masked_fill(~mask, float("-inf"))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)


def explicit_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    mask: Tensor | None,
    dropout_p: float,
    values: Values | None,
    drop: Dropout = dropout,
) -> Tensor:
    """softmax(q k^T / sqrt(Dh) + bias, masked) v with the weights (B, H, Tq, Tk) written out:
    a float32 softmax, dropped out by `drop`, then `values(weights)` added when given."""
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.size(-1))  # (B, H, Tq, Tk)
    if bias is not None:
        logits = logits + bias
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    weights = logits.softmax(-1, dtype=torch.float32).to(v.dtype)  # (B, H, Tq, Tk)
    weights = drop(weights, dropout_p, True)
    out = weights @ v  # (B, H, Tq, Dh)
    extra = None if values is None else values(weights)
    return out if extra is None else out + extra


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    key_mask: Tensor | None,
    causal: bool,
    dropout_p: float,
    values: Values | None,
) -> Tensor:
    """Scaled dot-product attention (B, H, Tq, Dh) on SDPA; with explicit weights when the
    positional encoding's `values` needs them."""
    mask = attention_mask(key_mask, causal, q.size(-2), k.size(-2), q.device)
    if values is not None:
        return explicit_attention(q, k, v, bias, mask, dropout_p, values)
    return sdpa(q, k, v, bias, mask, key_mask, dropout_p)


def output_loss(
    hidden: Tensor, weight: Tensor, target: Tensor, eps: float, ignore: int | None = None
) -> tuple[Tensor, Tensor]:
    """Summed label-smoothed loss and summed NLL of hidden states (N, D) through the output
    layer (V, D), from the full float32 logits (N, V); targets (N,) hold no padding, or rows
    whose target is `ignore`, which add nothing (F.cross_entropy's ignore_index). Only the
    loss carries a gradient."""
    skip = -100 if ignore is None else ignore  # -100: F.cross_entropy's default, no class
    logits = F.linear(hidden, weight).float()  # (N, V)
    loss = F.cross_entropy(logits, target, reduction="sum", label_smoothing=eps, ignore_index=skip)
    with torch.no_grad():
        nll = F.cross_entropy(logits, target, reduction="sum", ignore_index=skip)
    return loss, nll


def rdrop_loss(
    hidden: Tensor,
    again: Tensor,
    weight: Tensor,
    target: Tensor,
    eps: float,
    alpha: float,
    ignore: int | None = None,
) -> tuple[Tensor, Tensor]:
    """R-Drop's loss (Liang et al. 2021) from the full float32 logits (N, V) of both passes:
    the mean of their summed label-smoothed losses + alpha x their symmetric KL divergence,
    (KL(p1 || p2) + KL(p2 || p1)) / 2 summed over the vocabulary and the rows (kernels.
    rdrop_loss). hidden, again: the two passes' hidden states (N, D); targets (N,) hold no
    padding, or rows whose target is `ignore`: their logits are zeroed in both passes, so that
    their KL is exactly 0, and the cross-entropies skip them. Returns it and the mean of the
    two summed NLLs (no gradient)."""
    x1, x2 = F.linear(hidden, weight).float(), F.linear(again, weight).float()  # (N, V) each
    skip = -100 if ignore is None else ignore  # -100: F.cross_entropy's default, no class
    if ignore is not None:
        keep = target.ne(ignore)[:, None]  # (N, 1)
        x1, x2 = x1.where(keep, 0.0), x2.where(keep, 0.0)  # (N, V) each
    ce = F.cross_entropy(x1, target, reduction="sum", label_smoothing=eps, ignore_index=skip)
    ce = ce + F.cross_entropy(x2, target, reduction="sum", label_smoothing=eps, ignore_index=skip)
    lp1, lp2 = x1.log_softmax(-1), x2.log_softmax(-1)  # (N, V) each
    kl = F.kl_div(lp1, lp2, reduction="sum", log_target=True)  # () KL(p2 || p1)
    kl = kl + F.kl_div(lp2, lp1, reduction="sum", log_target=True)  # () + KL(p1 || p2)
    with torch.no_grad():
        nll = F.nll_loss(lp1, target, reduction="sum", ignore_index=skip)
        nll = nll + F.nll_loss(lp2, target, reduction="sum", ignore_index=skip)
    return 0.5 * ce + alpha * 0.5 * kl, 0.5 * nll
