"""float32 matrix products on oneDNN, for linear layers and the loss on a CPU.

PyTorch's float32 CPU matmuls (F.linear, torch.mm) call MKL's SGEMM, and on AMD CPUs MKL takes
a code path far below the hardware, where oneDNN's JIT kernels run the same products near the
peak (docs/BENCHMARKS.md, "Kernel notes"). bfloat16 matmuls already go to oneDNN. Here float32
ones go there too, through `mkldnn::_linear_pointwise`, the op that torch.compile emits for CPU
linear layers: forward, both gradients, and the fused loss.

Which is faster depends on the CPU: on the AMD EPYC oneDNN's training step was 1.6x MKL's, on an
Intel Xeon without AMX MKL's was 1.12x oneDNN's (docs/BENCHMARKS.md, section `products`). So a
training run measures both on its own shapes (`time_products`, ~0.1-1 s) and keeps the faster
(`set_products`). Decoding differs (products without gradients, a few hundred rows at most, the
weights packed, below): a Translator's first translation with some settings times a few
decoding steps of the model itself (seq2seq/decode/load.py) with each backend for the small
weights and each for the large ones (LARGE_WEIGHT: the output layer's (V, D)), and keeps the
fastest pair. A large weight is read from memory at every step, where oneDNN's packed layout
pays, while the small ones stay in cache, where ATen's cheaper call can win: on the AVX2-only
AMD EPYC (family 23 model 1) ATen ran the small products 1.05-6.7x faster than oneDNN and
oneDNN the output layer's 1.4-4.3x faster than ATen (docs/BENCHMARKS.md). Until a choice is
made, products go to oneDNN. `set_products("aten")` keeps F.linear and torch.mm everywhere.

oneDNN caches what it builds for each new shape: its primitive cache and ideep's LRU cache hold
1,024 entries each by default, and every batch brings new shapes (its token count), so memory
grew as training went on, while a step's products share few shapes. `cap_caches` (called by
seq2seq.kernels.setup_process at a training run's start-up, never on import) sets both
capacities to CACHE_CAPACITY unless they are set already; oneDNN reads them when it first runs,
so that must happen before the process's first oneDNN product. Decoding keeps oneDNN's default
(1,024): its row count changes whenever a sentence ends, and its shapes (rows up to batch x
beam, by the model's few weight shapes) overflowed a cache of 16 at every step, rebuilding a
primitive for most products (greedy decoding 1.1x slower on the Intel Xeon).

Decoding multiplies by weights kept in oneDNN's blocked layout (`_packed`), made again when a
weight changes: a load or an in-place write bumps its version, and any optimizer's step, which
may write without bumping it (fused AdamW does), drops the stepped weights' packed copies
(`_forget_stepped`, a global optimizer hook installed when the first weight is packed).
"""

from __future__ import annotations

import os
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.hooks import RemovableHandle
from torch.utils.weak import WeakIdKeyDictionary

from seq2seq.kernels.timing import time_alternating

CACHE_CAPACITY = 16  # oneDNN primitives and ideep computations cached, each (see above)
CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")

AVAILABLE = torch.backends.mkldnn.is_available() and all(
    hasattr(torch.ops.mkldnn, op) for op in ("_linear_pointwise", "_reorder_linear_weight")
)
ENABLED = AVAILABLE  # float32 products go to oneDNN (see `set_products`)
# decoding's products (no gradients) by weights of at least LARGE_WEIGHT elements (2 MiB of
# float32, at least a core's L2 cache on the CPUs seen) go to oneDNN: the large ones' choice
LARGE_WEIGHT = 1 << 19
LARGE_ENABLED = AVAILABLE
PRODUCTS = ("onednn", "aten")  # where float32 CPU products can run: oneDNN, or ATen's (MKL)
TIMED_ROUNDS = 3  # timed rounds per backend in `time_products`, after an untimed one
_ACTIVATION = {False: "none", True: "relu"}  # fused after the matmul
# weight -> ((data pointer, version), its copy in oneDNN's blocked layout)
_PACKED: MutableMapping[Tensor, tuple[tuple[int, int], Tensor]] = WeakIdKeyDictionary()
_STEP_HOOK: list[RemovableHandle] = []  # the optimizer hook, once installed


def cap_caches() -> None:
    """Cap oneDNN's two shape caches at CACHE_CAPACITY entries each, unless the user exported
    the variables (see the module docstring)."""
    for variable in CACHE_VARIABLES:
        os.environ.setdefault(variable, str(CACHE_CAPACITY))


def _autocast_cpu_since_2_4() -> bool:
    return torch.is_autocast_enabled("cpu")


_autocast_cpu: Callable[[], bool]
try:  # chosen once: `usable` runs for every product
    _autocast_cpu_since_2_4()
    _autocast_cpu = _autocast_cpu_since_2_4
except TypeError:  # torch < 2.4
    _autocast_cpu = torch.is_autocast_cpu_enabled


def usable(*tensors: Tensor) -> bool:
    """Whether products of these tensors go to oneDNN: float32 on a CPU, outside autocast."""
    return ENABLED and _float32_cpu(*tensors)


def decodes(x: Tensor, weight: Tensor, large: bool) -> bool:
    """Whether a product without gradients of x by weight goes to oneDNN: `usable`, with the
    choice for large weights where `large` (weight has at least LARGE_WEIGHT elements)."""
    return (LARGE_ENABLED if large else ENABLED) and _float32_cpu(x, weight)


def _float32_cpu(*tensors: Tensor) -> bool:
    if _autocast_cpu():
        return False
    return all(t.dtype == torch.float32 and t.is_cpu for t in tensors)


def _linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, relu: bool = False) -> Tensor:
    """x @ weight.T (+ bias, then ReLU) on oneDNN; x (..., K), weight (N, K), each row-major or
    transposed (x is then copied)."""
    out: Tensor = torch.ops.mkldnn._linear_pointwise(x, weight, bias, _ACTIVATION[relu], [], "")
    return out


def matmul_t(a: Tensor, b: Tensor) -> Tensor:
    """a @ b.T for a (M, K) and b (N, K), each row-major or transposed, on oneDNN where
    `usable`."""
    return _linear(a, b) if usable(a, b) else a @ b.T


def weight_grad(grad: Tensor, x: Tensor) -> Tensor:
    """grad.T @ x (N, K) for grad (M, N) and x (M, K): a linear layer's weight gradient, summed
    over M rows. oneDNN runs it faster with the smaller of N and K as the output's rows, so for
    N > K it computes x.T @ grad and returns its transpose."""
    if not usable(grad, x):
        return grad.T @ x
    if grad.size(1) <= x.size(1):
        return _linear(grad.T, x.T)  # (N, K)
    return _linear(x.T, grad.T).T  # (N, K), transposed strides


def pack(weight: Tensor) -> Tensor:
    """`weight` (N, K) reordered into oneDNN's blocked layout, for `matmul_t` and `_linear`:
    the products then run faster. Counting the reorder, packing a weight for one training step
    pays only when N > K."""
    packed: Tensor = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
    return packed


def weight_grad_zeros(n: int, k: int, operand: Tensor) -> Tensor:
    """Float32 zeros (N, K) laid out as `weight_grad` returns gradients of `operand`'s dtype and
    device (transposed when N > K), so that summing those into it runs in memory order."""
    if n > k and usable(operand):
        return torch.zeros(k, n, device=operand.device).T  # (N, K)
    return torch.zeros(n, k, device=operand.device)  # (N, K)


def _forget_stepped(optimizer: torch.optim.Optimizer, *_: Any) -> None:
    """After any optimizer's step: drop the packed copies of the weights it stepped, which it
    may have written without bumping their versions (fused AdamW does)."""
    if len(_PACKED) == 0:
        return
    for group in optimizer.param_groups:
        for param in group["params"]:
            _PACKED.pop(param, None)


def _packed(weight: Tensor) -> Tensor:
    """`weight` reordered into oneDNN's blocked layout once, and again whenever it changes (a
    load or an in-place write bumps its version; an optimizer step drops the copy): faster than
    the plain layout when decoding, whose weights are no longer in cache."""
    key = (weight.data_ptr(), weight._version)
    hit = _PACKED.get(weight)
    if hit is None or hit[0] != key:
        if not _STEP_HOOK:  # from now on, every optimizer's step is seen
            hook = register_optimizer_step_post_hook(_forget_stepped)
            _STEP_HOOK.append(hook)
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
        # torch's Function.apply has no annotations
        out: Tensor = _Linear.apply(x, weight, bias, relu)  # type: ignore[no-untyped-call]
        return out
    packed = weight if weight.is_inference() else _packed(weight)  # no version to follow
    return _linear(x, packed, bias, relu)


def set_products(name: str, large: str | None = None) -> None:
    """From now on, process-wide, float32 CPU products run on oneDNN ("onednn", where this
    torch has its ops) or on ATen ("aten": F.linear and torch.mm, MKL's SGEMM on x86); those
    without gradients by weights of at least LARGE_WEIGHT elements on `large` (default: name)."""
    global ENABLED, LARGE_ENABLED
    for backend in (name, large or name):
        if backend not in PRODUCTS:
            raise ValueError(f"float32 products {backend!r} are unknown; use one of {PRODUCTS}")
    ENABLED = AVAILABLE and name == "onednn"
    LARGE_ENABLED = AVAILABLE and (large or name) == "onednn"


def products() -> str:
    """Where float32 CPU products run now: "onednn" or "aten"."""
    return "onednn" if ENABLED else "aten"


def large_products() -> str:
    """Where float32 CPU products without gradients by LARGE_WEIGHT weights run now."""
    return "onednn" if LARGE_ENABLED else "aten"


def _train_products(operands: list[tuple[Tensor, Tensor, Tensor, Tensor]], name: str) -> None:
    """Each linear layer's forward and both gradients on `name`'s products."""
    for x, weight, bias, grad_out in operands:
        x.grad = weight.grad = bias.grad = None
        if name == "onednn":
            out: Tensor = _Linear.apply(x, weight, bias, False)  # type: ignore[no-untyped-call]
        else:
            out = F.linear(x, weight, bias)
        out.backward(grad_out)


def time_products(
    shapes: Sequence[tuple[int, int, int]], rounds: int = TIMED_ROUNDS
) -> dict[str, float]:
    """Median seconds, per backend of PRODUCTS, of float32 training products: for each
    (rows, in, out) of `shapes`, a linear layer's forward and both gradients, as `_Linear` runs
    them (oneDNN) and as F.linear does (ATen), alternating after an untimed round
    (timing.time_alternating)."""
    names = product_backends()
    operands = _product_operands(shapes, torch.float32)
    with torch.enable_grad():
        return time_alternating(names, lambda name, _: _train_products(operands, name), rounds)


def time_product_dtypes(
    shapes: Sequence[tuple[int, int, int]], dtypes: Sequence[torch.dtype], rounds: int
) -> dict[torch.dtype, float]:
    """Median seconds, per dtype, of the same training products on ATen (what autocast runs),
    alternating after an untimed round. Whether bf16 products are faster than float32's depends
    on the CPU: without bf16 instructions they are emulated: 25x slower on one AMD EPYC
    (docs/BENCHMARKS.md names it)."""
    operands = {dtype: _product_operands(shapes, dtype) for dtype in dtypes}
    with torch.enable_grad():
        return time_alternating(dtypes, lambda d, _: _train_products(operands[d], "aten"), rounds)


def _product_operands(
    shapes: Sequence[tuple[int, int, int]], dtype: torch.dtype
) -> list[tuple[Tensor, Tensor, Tensor, Tensor]]:
    """Seeded operands of a linear layer's products for each (rows, in, out), in `dtype`."""
    gen = torch.Generator().manual_seed(0)
    return [
        (
            torch.randn(rows, k, generator=gen).to(dtype).requires_grad_(),  # (M, K)
            (torch.randn(n, k, generator=gen) / k**0.5).to(dtype).requires_grad_(),  # (N, K)
            torch.zeros(n, dtype=dtype, requires_grad=True),  # (N,)
            torch.randn(rows, n, generator=gen).to(dtype),  # (M, N) the output's gradient
        )
        for rows, k, n in shapes
    ]


def product_backends() -> tuple[str, ...]:
    """The backends of PRODUCTS this torch can run: both, or ATen alone without oneDNN's ops."""
    return PRODUCTS if AVAILABLE else PRODUCTS[1:]


def faster_products(times: dict[str, float]) -> str:
    """The backend of `times` with the shortest time (oneDNN on a tie)."""
    return min(times, key=lambda name: (times[name], name != "onednn"))
