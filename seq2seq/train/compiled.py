"""trainer.compile: the training step's model through torch.compile, and its warm-up measured.

With fixed batch shapes (trainer.batch_shapes, seq2seq/data/buckets.py) the model is compiled
with static shapes (dynamic=False): one graph per batch shape (and per precision, which
trainer.precision=auto tries both of), compiled on the first step of that shape and reused after.
Dynamo's limit of graphs per function is raised to hold them all, so that no shape falls back to
eager. With exact shapes every batch has new shapes: dynamic=None, torch's default (a first
static graph, then dynamic shapes), as before fixed shapes existed.

`WarmUp` times the first step of each shape (its compilation included) and logs it, and the
total at the end: the warm-up a compiled run pays before its steady state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch._dynamo

from seq2seq.config.schema import CompileMode
from seq2seq.data.batching import Batch
from seq2seq.data.buckets import ShapeBuckets

log = logging.getLogger(__name__)
# torch.compile's mode for each trainer.compile_mode
MODES = {CompileMode.default: "default", CompileMode.max_autotune: "max-autotune"}
PRECISIONS = 2  # graphs per shape: trainer.precision=auto steps in fp32 and in bf16


# logged (train/build.py) when trainer.compile is on for a CPU run: the advice of README.md's
# "Compiling the training step"
CPU_ADVICE = (
    "trainer.compile on a CPU: the compiled step runs the plain-PyTorch kernels and was slower "
    "than eager on every CPU measured so far (docs/BENCHMARKS.md, 'trainer.compile and fixed "
    "batch shapes'); `python benchmarks/train_throughput.py --compile-vs-eager` measures this "
    "machine, or set trainer.compile=false"
)


def compile_model(module: torch.nn.Module, buckets: ShapeBuckets | None, mode: CompileMode) -> Any:
    """`module` compiled by torch.compile in `mode`: with static shapes when the batches take
    the fixed shapes of `buckets`, Dynamo's graph limit raised to all of them; else (None) with
    torch's automatic dynamic shapes."""
    shapes = len(buckets.shapes()) if buckets is not None else 0
    if shapes > 0:
        needed = PRECISIONS * shapes + 1
        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, needed)
        config.accumulated_recompile_limit = max(config.accumulated_recompile_limit, needed)
    dynamic = False if shapes > 0 else None
    return torch.compile(module, dynamic=dynamic, mode=MODES[mode])


class WarmUp:
    """The steps that meet a new (precision, batch shape) under torch.compile: their seconds,
    compilation included, logged as they happen and summed."""

    def __init__(self, enabled: bool) -> None:
        """Counts nothing unless `enabled` (trainer.compile)."""
        self.enabled = enabled
        self.seen: set[tuple[str, int, int, int]] = set()  # (precision, rows, source, target)
        self.seconds = 0.0

    @contextmanager
    def step(self, group: list[Batch], precision: str, step: int) -> Iterator[None]:
        """Around training step `step` over `group`: timed when one of its batches has a shape
        not met yet in this precision."""
        shapes = {(precision, *b.src.shape, b.tgt_out.shape[1]) for b in group}
        new = sorted(shapes - self.seen) if self.enabled else []
        if not new:
            yield
            return
        start = time.perf_counter()
        yield
        seconds = time.perf_counter() - start
        self.seen |= shapes
        self.seconds += seconds
        log.info(
            "step %d: first step of batch shape %s (%s): %.1f s, compilation included (%d "
            "shapes, %.1f s so far)",
            step,
            ", ".join(f"({b}, {s}, {t})" for _, b, s, t in new),
            precision,
            seconds,
            len(self.seen),
            self.seconds,
        )

    def summary(self) -> None:
        """Log the warm-up's total (nothing when not compiling)."""
        if self.enabled and self.seen:
            log.info(
                "torch.compile warm-up: %d batch shapes, %.1f s in their first steps",
                len(self.seen),
                self.seconds,
            )
