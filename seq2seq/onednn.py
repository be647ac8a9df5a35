"""float32 matrix products on oneDNN, for linear layers and the loss on a CPU.

PyTorch's float32 CPU matmuls (F.linear, torch.mm) call MKL's SGEMM, and on AMD CPUs MKL takes
a code path far below the hardware: on the 2-thread AMD EPYC (AVX-512) of docs/BENCHMARKS.md it
runs the training step's shapes at 170-199 GFLOP/s, where oneDNN's JIT kernels run the same
products at 300-470 (M 256-3,900 rows, K and N 256-8,000). bfloat16 matmuls already go to
oneDNN. Here float32 ones go there too, through `mkldnn::_linear_pointwise`, the op that
torch.compile emits for CPU linear layers: forward, both gradients, and the fused loss.

Set ENABLED to False to keep F.linear and torch.mm everywhere.

oneDNN caches what it builds for each new shape: its primitive cache and ideep's LRU cache hold
1,024 entries each by default, and every batch brings new shapes (its token count). So memory
grew as training went on: on benchmarks/train_throughput.py's batches to 2.4 GB after 90 bf16
steps and 3.2 GB after 120 fp32 steps (4.5-6.3 GB over docs/RESULTS.md's bf16 runs), against
~1.0-1.3 GB flat with 16 entries each, at the same speed (a step's products share few
shapes). Importing this module sets both capacities to CACHE_CAPACITY unless they are set
already; oneDNN reads them when it first runs, so that must happen before the process's first
oneDNN product (importing seq2seq.layers or seq2seq.model does it).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import Tensor
from torch.utils.weak import WeakIdKeyDictionary

CACHE_CAPACITY = 16  # oneDNN primitives and ideep computations cached, each (see above)
for _variable in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
    os.environ.setdefault(_variable, str(CACHE_CAPACITY))

ENABLED = torch.backends.mkldnn.is_available() and all(
    hasattr(torch.ops.mkldnn, op) for op in ("_linear_pointwise", "_reorder_linear_weight")
)
_ACTIVATION = {False: "none", True: "relu"}  # fused after the matmul
# weight -> ((data pointer, version), its copy in oneDNN's blocked layout)
_PACKED: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _autocast_cpu() -> bool:
    try:
        return torch.is_autocast_enabled("cpu")
    except TypeError:  # torch < 2.4
        return torch.is_autocast_cpu_enabled()


def usable(*tensors: Tensor) -> bool:
    """Whether products of these tensors go to oneDNN: float32 on a CPU, outside autocast."""
    return (
        ENABLED
        and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
        and not _autocast_cpu()
    )


def _linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, relu: bool = False) -> Tensor:
    """x @ weight.T (+ bias, then ReLU) on oneDNN; x (..., K), weight (N, K), each row-major or
    transposed (x is then copied)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, _ACTIVATION[relu], [], "")


def matmul_t(a: Tensor, b: Tensor) -> Tensor:
    """a @ b.T for a (M, K) and b (N, K), each row-major or transposed, on oneDNN where
    `usable`."""
    return _linear(a, b) if usable(a, b) else a @ b.T


def weight_grad(grad: Tensor, x: Tensor) -> Tensor:
    """grad.T @ x (N, K) for grad (M, N) and x (M, K): a linear layer's weight gradient, summed
    over M rows. oneDNN runs it ~1.3x faster with the smaller of N and K as the output's rows
    (measured at M 512-3,900), so for N > K it computes x.T @ grad and returns its transpose."""
    if not usable(grad, x):
        return grad.T @ x
    if grad.size(1) <= x.size(1):
        return _linear(grad.T, x.T)  # (N, K)
    return _linear(x.T, grad.T).T  # (N, K), transposed strides


def pack(weight: Tensor) -> Tensor:
    """`weight` (N, K) reordered into oneDNN's blocked layout, for `matmul_t` and `_linear`:
    the products then run 1.1-1.4x faster (M 256-3,900, K 256-1,024, N 256-8,000). Counting
    the reorder (~0.1-0.5 ms in a training step), it pays only when N > K: 1.07-1.17x at
    M 3,900, K 256, N 512-1,024, and ~1.0x at N <= K."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach())


def weight_grad_zeros(n: int, k: int, operand: Tensor) -> Tensor:
    """Float32 zeros (N, K) laid out as `weight_grad` returns gradients of `operand`'s dtype and
    device (transposed when N > K), so that summing those into it runs in memory order (~1.2x
    faster)."""
    if n > k and usable(operand):
        return torch.zeros(k, n, device=operand.device).T  # (N, K)
    return torch.zeros(n, k, device=operand.device)  # (N, K)


def _packed(weight: Tensor) -> Tensor:
    """`weight` reordered into oneDNN's blocked layout once, and again whenever it changes (an
    optimizer step or a load bumps its version); faster than the plain layout (up to 1.5x on a
    decoding step, whose weights are no longer in cache)."""
    key = (weight.data_ptr(), weight._version)
    hit = _PACKED.get(weight)
    if hit is None or hit[0] != key:
        hit = (key, pack(weight))
        _PACKED[weight] = hit
    return hit[1]


class _Linear(torch.autograd.Function):
    """A linear layer (+ ReLU) whose forward and backward products all run on oneDNN."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None, relu: bool) -> Tensor:
        rows = x.reshape(-1, x.size(-1))  # (M, K)
        wide = weight.size(0) > weight.size(1)  # packing pays for itself (see `pack`)
        out = _linear(rows, pack(weight) if wide else weight, bias, relu)  # (M, N)
        ctx.save_for_backward(rows, weight, out if relu else None)
        ctx.relu, ctx.has_bias, ctx.x_shape = relu, bias is not None, x.shape
        return out.view(*x.shape[:-1], out.size(-1))  # (..., N)

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        rows, weight, out = ctx.saved_tensors
        grad = grad_out.reshape(-1, grad_out.size(-1))  # (M, N)
        if ctx.relu:
            grad = torch.ops.aten.threshold_backward(grad, out, 0)  # (M, N) zero where out is
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _linear(grad, weight.T).view(ctx.x_shape)  # (..., K)
        if ctx.needs_input_grad[1]:
            grad_w = weight_grad(grad, rows)  # (N, K)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad.sum(0)  # (N,)
        return grad_x, grad_w, grad_b, None


def linear(x: Tensor, weight: Tensor, bias: Tensor | None, relu: bool = False) -> Tensor:
    """x @ weight.T + bias, then a ReLU if asked, on oneDNN: (..., K) -> (..., N). The caller
    checks `usable(x, weight)`. With gradients, all three products of `_Linear`; without
    (decoding), the weight in oneDNN's blocked layout, kept until it changes."""
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        return _Linear.apply(x, weight, bias, relu)
    packed = weight if weight.is_inference() else _packed(weight)  # no version to follow
    return _linear(x, packed, bias, relu)
