"""Every device-specific fast path, behind one small API that the model and trainer call.

    linear(x, weight, bias, relu=False)        a linear layer (+ ReLU)
    attention(q, k, v, bias, key_mask, ...)     scaled dot-product attention, masks built here
    dropout(x, p, training)                     inverted dropout
    output_loss(hidden, weight, target, eps)    output layer + label-smoothed loss, summed
    rdrop_loss(hidden, again, weight, ...)      R-Drop's loss of two passes, summed
    topk(x, k), row_max(x)                      the searches' k largest / largest of each row
    attention_mask(key_mask, causal, ...)       the boolean mask attention applies (for weights)
    key_bias(key_mask, dtype)                   a key mask as a bias on the logits, made once
    setup_process(device, training, mode)       process-wide settings, once at start-up
    resolve_device(name)                        'auto', 'cpu', 'cuda:N' -> a device that exists
    time_products(shapes), faster_products(t)  float32 CPU products timed on oneDNN and on ATen
    time_product_dtypes(shapes, dtypes, rounds) the same products timed in each dtype (bf16, fp32)
    product_backends()                          the backends this torch can run them on
    SMALL_ROWS                                  products of at most this many rows without
                                                gradients by small weights take F.linear (cpu.py)
    set_products(name, large), products(),      where they run from now on ("onednn", "aten"),
      large_products()                            and those of decoding's large weights
    time_alternating(candidates, run, rounds)   median seconds of each, alternating (timing.py)

Two modes (trainer.kernels):
- auto (the default): CPU tensors take the fast CPU kernels (cpu.py: oneDNN linears with
  packed weights, 16-bit dropout masks, attention on matmuls or SDPA with padded keys, top-k
  and row maxima block by block; loss.py: the chunked output layer + loss, and R-Drop's);
  tensors on any other device, CUDA included, take the reference path.
- reference: plain PyTorch everywhere (reference.py): F.linear, F.scaled_dot_product_attention,
  F.dropout, F.cross_entropy(label_smoothing=...) (with F.kl_div for R-Drop) on full logits,
  torch.topk and Tensor.max.
Both compute the same function: outputs and gradients agree to float rounding (the dropout
masks differ; where top-k values tie, the indices may differ). The mode is process-wide, like
the settings of setup_process.

These functions run ~100 times a decoding step: their checks stay cheap (`Tensor.is_cpu`, a
module global), and the slower setting-up happens once, in setup_process.

Importing this package changes nothing outside it: no environment variable, no allocator
setting. setup_process makes those changes, at the entry points.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from seq2seq.errors import ConfigError
from seq2seq.kernels import cpu, onednn, reference
from seq2seq.kernels.allocator import keep_freed_memory
from seq2seq.kernels.cpu import SMALL_ROWS
from seq2seq.kernels.loss import linear_label_smoothed_nll, linear_rdrop
from seq2seq.kernels.onednn import (
    faster_products,
    large_products,
    product_backends,
    products,
    set_products,
    time_product_dtypes,
    time_products,
)
from seq2seq.kernels.reference import Values, attention_mask, key_bias
from seq2seq.kernels.timing import time_alternating

MODES = ("auto", "reference")
_mode = "auto"


def set_mode(mode: str) -> None:
    """Choose the kernels for the whole process: "auto" or "reference" (see the docstring)."""
    global _mode
    mode = getattr(mode, "value", mode)  # a config enum
    if mode not in MODES:
        raise ValueError(f"kernels mode {mode!r} is unknown; use one of {', '.join(MODES)}")
    _mode = mode


def get_mode() -> str:
    """The kernels mode in use: "auto" or "reference"."""
    return _mode


@contextmanager
def use(mode: str) -> Iterator[None]:
    """Run a block with the kernels of `mode`, then go back to the previous mode."""
    previous = _mode
    set_mode(mode)
    try:
        yield
    finally:
        set_mode(previous)


def setup_process(
    device: torch.device | str | None = None, training: bool = False, mode: str = "auto"
) -> None:
    """Process-wide settings, made by the entry points before any work (never on import):
    the kernels' mode; for training, oneDNN's cache capacities unless the user exported them
    (they must be set before the first oneDNN product; decoding keeps oneDNN's defaults, see
    onednn.py); SDPA's cuDNN backend off (on a GPU, a graph built for each new shape); and, on
    a CPU, glibc's malloc keeps freed memory for reuse (allocator.py): training's and decoding's
    large blocks (logits, a beam's log-probabilities) come back each step."""
    set_mode(mode)
    if training:
        onednn.cap_caches()
    # cuDNN's attention builds an execution graph for every new shape (hundreds of ms), and
    # our batches bring new lengths at every step (decoding: at every token): SDPA keeps its
    # flash, memory-efficient and math kernels (benchmarks/sdpa_backends.py measures them)
    torch.backends.cuda.enable_cudnn_sdp(False)
    if device is not None and torch.device(device).type == "cpu":
        keep_freed_memory()


def linear(x: Tensor, weight: Tensor, bias: Tensor | None, relu: bool = False) -> Tensor:
    """x @ weight.T + bias, then a ReLU if asked: (..., D_in) -> (..., D_out)."""
    if _mode == "auto" and x.is_cpu:  # inline: ~30 calls per decoding step
        return cpu.linear(x, weight, bias, relu)
    return reference.linear(x, weight, bias, relu)


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Inverted dropout (Srivastava et al. 2014): x itself when not training or p == 0."""
    if not training or p == 0:
        return x
    if _mode == "auto" and x.is_cpu:
        return cpu.dropout(x, p, training)
    return reference.dropout(x, p, training)


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None = None,
    key_mask: Tensor | None = None,
    causal: bool = False,
    dropout_p: float = 0.0,
    values: Values | None = None,
) -> Tensor:
    """Scaled dot-product attention (Vaswani et al. 2017) of q (B, H, Tq, Dh) over k, v
    (B, H, Tk, Dh) -> (B, H, Tq, Dh).

    bias (B|1, H|1, Tq|1, Tk): added to the logits (relative encodings; a `key_bias`). key_mask
    (B, Tk): True at
    keys that may be attended to. causal: query i, at position Tk - Tq + i, sees keys up to
    there. dropout_p: on the attention weights (0 outside training). values: given the weights
    (B, H, Tq, Tk), a term added to the output (Shaw et al.'s relative values), which makes the
    weights explicit.
    """
    if _mode == "auto" and q.is_cpu:
        return cpu.attention(q, k, v, bias, key_mask, causal, dropout_p, values)
    return reference.attention(q, k, v, bias, key_mask, causal, dropout_p, values)


def output_loss(
    hidden: Tensor, weight: Tensor, target: Tensor, eps: float, ignore: int | None = None
) -> tuple[Tensor, Tensor]:
    """Summed label-smoothed loss (Szegedy et al. 2016) and summed NLL of hidden states (N, D)
    through the output layer's weight (V, D), for targets (N,) without padding. Only the loss
    carries a gradient. On a CPU in auto mode the (N, V) logits never exist (loss.py).

    ignore: a target id (PAD) whose rows add nothing, to the sums or the gradients: a batch's
    every position can then be passed, so that no shape depends on the data (torch.compile's
    static shapes). The CPU path drops those rows first; the reference path skips them."""
    if _mode == "auto" and hidden.is_cpu:
        hidden, target = _kept(hidden, target, ignore)
        return linear_label_smoothed_nll(hidden, weight, target, eps)
    return reference.output_loss(hidden, weight, target, eps, ignore)


def rdrop_loss(
    hidden: Tensor,
    again: Tensor,
    weight: Tensor,
    target: Tensor,
    eps: float,
    alpha: float,
    ignore: int | None = None,
) -> tuple[Tensor, Tensor]:
    """R-Drop's loss (Liang et al. 2021) of two passes of one batch with their own dropout
    masks, hidden states (N, D) each, through the output layer's weight (V, D), for targets
    (N,) without padding: the mean of the two summed label-smoothed losses + alpha x the
    symmetric KL divergence of their output distributions, (KL(p1 || p2) + KL(p2 || p1)) / 2
    summed over the vocabulary and the targets (the authors' reduction; loss.py says where
    ours differs). Returns it and the two passes' mean summed NLL (no gradient). On a CPU in
    auto mode neither pass's (N, V) logits exist (loss.py); elsewhere both do (reference.py).
    ignore: as output_loss's."""
    if _mode == "auto" and hidden.is_cpu:
        again = _kept(again, target, ignore)[0]
        hidden, target = _kept(hidden, target, ignore)
        return linear_rdrop(hidden, again, weight, target, eps, alpha)
    return reference.rdrop_loss(hidden, again, weight, target, eps, alpha, ignore)


def _kept(hidden: Tensor, target: Tensor, ignore: int | None) -> tuple[Tensor, Tensor]:
    """The rows (K, D) and targets (K,) whose target is not `ignore` (all when None)."""
    if ignore is None:
        return hidden, target
    rows = target.ne(ignore).nonzero().squeeze(1)  # (K,)
    return hidden.index_select(0, rows), target.index_select(0, rows)


def topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k largest values of each row of x (N, V), largest first, and their indices (N, k)
    (beam search's candidates). On a CPU in auto mode, long rows go block by block (cpu.py)."""
    if _mode == "auto" and x.is_cpu:
        return cpu.topk(x, k)
    return reference.topk(x, k)


def row_max(x: Tensor) -> tuple[Tensor, Tensor]:
    """The largest value of each row of x (N, V) and its index, (N,) each (greedy search)."""
    if _mode == "auto" and x.is_cpu:
        return cpu.row_max(x)
    return reference.row_max(x)


def resolve_device(name: str) -> torch.device:
    """'auto' picks CUDA when present, else the CPU. A device that does not exist here is a
    ConfigError naming it."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ConfigError(
            f"config: device={name!r} is invalid; use auto, cpu, cuda or cuda:N"
        ) from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"config: device={name!r} but torch sees no CUDA GPU; use auto or cpu")
    return device


__all__ = [
    "MODES",
    "SMALL_ROWS",
    "attention",
    "attention_mask",
    "dropout",
    "faster_products",
    "get_mode",
    "key_bias",
    "large_products",
    "linear",
    "output_loss",
    "product_backends",
    "products",
    "rdrop_loss",
    "resolve_device",
    "row_max",
    "set_mode",
    "set_products",
    "setup_process",
    "time_alternating",
    "time_product_dtypes",
    "time_products",
    "topk",
    "use",
]
