"""trainer.precision=auto: the training precision that is faster on this machine, measured.

Whether bfloat16 autocast pays on a CPU depends on the CPU, not on its instruction flags alone:
on some AMD EPYC boxes our step is much faster in bf16, on an Intel Xeon with AVX512-BF16 but no
AMX it is slower than fp32 (docs/BENCHMARKS.md names the CPUs). On a GPU it depends on the model:
a small one is bound by kernel launches, and bf16's casts make its step slower than fp32's (on an
H200 the benchmark's d=256 model stepped in 0.017 s in fp32 and 0.031 s in bf16), while a large
one gains bf16's tensor cores. So on a CPU and on a CUDA GPU with bf16 the choice is timed on the
run's own model and batches before training. On a CPU, the model's products are timed in both
dtypes first (milliseconds): where bf16's are clearly slower (a CPU without bf16 instructions
emulates them: on an AVX2-only AMD EPYC, docs/BENCHMARKS.md, 25x slower, and a bf16 step took 69 s
against fp32's 3.2), no bf16 step could win, and none is timed.

Where float32 products run on a CPU (oneDNN or ATen's MKL) depends on the CPU too: before the
precision is timed, `resolve_products` times both on the model's own shapes and keeps the faster.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from seq2seq import kernels, mkl
from seq2seq.config.schema import Kernels, Precision, TrainConfig
from seq2seq.train.checkpoint import restore_rng, rng_state
from seq2seq.train.distributed import broadcast

log = logging.getLogger(__name__)

CANDIDATES = (Precision.fp32, Precision.bf16)  # what auto chooses between where it times
TIMED_ROUNDS = 3  # timed steps per candidate, after one untimed warm-up step each
BF16_MARGIN = 1.25  # bf16 steps are timed only where bf16 products take <= this x fp32's
DTYPE_PROBE_ROWS = 512  # rows of the products timed in both dtypes (bf16's may be ~20x slower)
# the dtype each trainer.precision computes its matmuls in (autocast's, and for the MFU's peak)
DTYPES = {
    Precision.fp32: torch.float32,
    Precision.bf16: torch.bfloat16,
    Precision.fp16: torch.float16,
}


def time_precisions(
    step: Callable[[Precision, int], None], rounds: int = TIMED_ROUNDS
) -> dict[Precision, float]:
    """Median seconds of `step(precision, round)` per candidate. Round 0 warms each candidate's
    kernels up untimed; the candidates alternate within every round, so a slow spell of the
    machine falls on both."""
    return kernels.time_alternating(CANDIDATES, step, rounds)


def faster(times: dict[Precision, float]) -> Precision:
    """The candidate with the shortest step (fp32 on a tie: it is the exact one)."""
    return min(CANDIDATES, key=lambda p: (times[p], p != Precision.fp32))


def device_default(device: torch.device) -> Precision | None:
    """The choice where no timing is needed: fp32 on a CUDA GPU without bf16 and on other
    devices; None on a CPU and on a CUDA GPU with bf16 (time both)."""
    if device.type == "cpu":
        return None
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return None
    return Precision.fp32


def bf16_may_pay(times: dict[Precision, float]) -> bool:
    """Whether a bf16 step could beat fp32's, from the seconds of the model's products in each:
    autocast makes the products alone faster, so not where bf16's take more than BF16_MARGIN
    times float32's (ties, such as a clock that did not move, are timed)."""
    return times[Precision.bf16] <= BF16_MARGIN * times[Precision.fp32]


def where(device: torch.device) -> str:
    """The timed device as the log names it."""
    return "this CPU" if device.type == "cpu" else "this GPU"


def resolve(
    asked: Precision,
    resumed: str,
    device: torch.device,
    timing: Callable[[], dict[Precision, float]],
    products: Callable[[], dict[Precision, float]] | None = None,
) -> tuple[Precision, dict[str, float]]:
    """The precision to train in, and auto's step times where it timed them (else {}): `asked`
    unless it is auto; auto keeps a resumed run's choice (`resumed`, "" for a new run), takes
    device_default where there is one, takes fp32 on a CPU where `products` (the model's
    products timed in each precision) says bf16 cannot pay, and else calls `timing` and keeps
    the faster (rank 0's choices bind every rank)."""
    if asked != Precision.auto:
        return asked, {}
    if resumed:
        log.info("precision auto: %s, as chosen when the run started", resumed)
        return Precision(resumed), {}
    chosen = device_default(device)
    if chosen is not None:
        log.info("precision auto: %s on %s", chosen.value, device)
        return chosen, {}
    if device.type == "cpu" and products is not None:
        seconds = products()
        if not broadcast(bf16_may_pay(seconds)):
            shown = ", ".join(f"{p.value} {s * 1e3:.1f} ms" for p, s in seconds.items())
            log.info(
                "precision auto: fp32 on this CPU (the model's products: %s; bf16 steps not "
                "timed: their products take more than %.2fx fp32's)",
                shown,
                BF16_MARGIN,
            )
            return Precision.fp32, {}
    times = {p.value: s for p, s in timing().items()}
    chosen = broadcast(faster({Precision(p): s for p, s in times.items()}))
    shown = ", ".join(f"{p} {s:.4f}" for p, s in times.items())
    log.info("precision auto: %s on %s (s/step: %s)", chosen.value, where(device), shown)
    return chosen, times


# the model's shapes -> the backend chosen for them: once a process, so that every run of one
# process (a sweep's, a test suite's) computes alike; likewise their times in each precision
_PRODUCTS: dict[tuple[tuple[int, int, int], ...], tuple[str, dict[str, float]]] = {}
_DTYPE_TIMES: dict[tuple[tuple[int, int, int], ...], dict[Precision, float]] = {}
LOSS_ROWS = 256  # rows the output layer multiplies at a time (kernels/loss.py's chunks)
PROBE_ROWS = 4096  # at most this many rows timed (a large model's batch would take seconds)


def product_shapes(cfg: TrainConfig, vocab: int) -> tuple[tuple[int, int, int], ...]:
    """(rows, in, out) of a training step's float32 products: the model's projections, its
    feed-forward layers over a batch of trainer.max_tokens rows (at most PROBE_ROWS), and the
    output layer."""
    d, rows = cfg.model.d_model, min(cfg.trainer.max_tokens, PROBE_ROWS)
    return (
        (rows, d, d),
        (rows, d, cfg.model.d_ff),
        (rows, cfg.model.d_ff, d),
        (LOSS_ROWS, d, vocab),
    )


def dtype_times(cfg: TrainConfig, vocab: int) -> dict[Precision, float]:
    """Seconds of the model's products (product_shapes, at most DTYPE_PROBE_ROWS rows) in fp32
    and in bf16 on this CPU (kernels.time_product_dtypes), measured once a process for them."""
    shapes = tuple((min(rows, DTYPE_PROBE_ROWS), k, n) for rows, k, n in product_shapes(cfg, vocab))
    if shapes not in _DTYPE_TIMES:
        dtypes = [DTYPES[p] for p in CANDIDATES]
        times = kernels.time_product_dtypes(shapes, dtypes, TIMED_ROUNDS)
        _DTYPE_TIMES[shapes] = {p: times[DTYPES[p]] for p in CANDIDATES}
    return _DTYPE_TIMES[shapes]


def resolve_products(
    cfg: TrainConfig, vocab: int, resumed: str, device: torch.device
) -> tuple[str, dict[str, float]]:
    """Where the run's float32 products run, and the seconds timed for each backend (else {}):
    "" where none runs on the CPU kernels (another device, trainer.kernels=reference, bf16 or
    fp16 asked for); a resumed run's choice (its products as before: an exact resume); else the
    faster of oneDNN and ATen on the model's shapes (kernels.time_products; rank 0's choice binds
    every rank), measured once a process for those shapes. Sets it process-wide."""
    t = cfg.trainer
    on_cpu_kernels = device.type == "cpu" and t.kernels == Kernels.auto
    if not on_cpu_kernels or t.precision not in (Precision.auto, Precision.fp32):
        return "", {}
    if resumed:
        kernels.set_products(resumed)
        log.info("float32 products: %s, as chosen when the run started", resumed)
        return resumed, {}
    shapes = product_shapes(cfg, vocab)
    if shapes not in _PRODUCTS:
        times = kernels.time_products(shapes)
        _PRODUCTS[shapes] = (broadcast(kernels.faster_products(times)), times)
    chosen, times = _PRODUCTS[shapes]
    kernels.set_products(chosen)
    shown = ", ".join(f"{name} {s * 1e3:.1f} ms" for name, s in times.items())
    log.info(
        "float32 products: %s on this CPU (the model's products: %s; MKL's Intel path: %s)",
        chosen,
        shown,
        mkl.STATE,
    )
    return chosen, times


def check_mkl_path(started: str, products: str) -> str:
    """MKL's Intel path (seq2seq/mkl.py) as the run started: `started` from a resumed run's state,
    else its state now. A resume whose state differs in being on or off is warned where MKL runs
    float32 products (ATen's or the reference kernels'): they round differently, so the resume is
    not bit-exact."""
    now = mkl.STATE
    if started and mkl.is_on(started) != mkl.is_on(now) and products != "onednn":
        log.warning(
            "MKL's Intel path was %r when this run started and is %r now: float32 products "
            "round differently, so this resume is not bit-exact (seq2seq/mkl.py)",
            started,
            now,
        )
    return started or now


@contextmanager
def no_trace(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> Iterator[None]:
    """Steps taken inside leave no trace: the weights, optimizer and schedule states and the
    random generators (a model on CUDA: the GPU's too, which its dropout draws from) are put
    back on the way out."""
    on_cuda = next(model.parameters()).device.type == "cuda"
    saved = (
        copy.deepcopy(model.state_dict()),
        copy.deepcopy(optimizer.state_dict()),
        scheduler.state_dict(),
        rng_state(cuda=on_cuda),
    )
    try:
        yield
    finally:
        model.load_state_dict(saved[0])
        optimizer.load_state_dict(saved[1])
        scheduler.load_state_dict(saved[2])
        restore_rng(saved[3])
