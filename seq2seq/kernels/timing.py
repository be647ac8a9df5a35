"""Timing candidates against each other on this machine, for the choices made at run time
(where float32 products run, the training precision): which is faster depends on the CPU."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
import torch.nn.functional as F

Candidate = TypeVar("Candidate")


def time_alternating(
    candidates: Sequence[Candidate], run: Callable[[Candidate, int], None], rounds: int
) -> dict[Candidate, float]:
    """Median seconds of `run(candidate, round)` per candidate over `rounds` timed rounds.
    Round 0 warms every candidate up untimed; the candidates alternate within every round, so
    that a slow spell of the machine falls on all of them."""
    seconds: dict[Candidate, list[float]] = {c: [] for c in candidates}
    for round_ in range(rounds + 1):
        for candidate in candidates:
            start = time.perf_counter()
            run(candidate, round_)
            if round_ > 0:
                seconds[candidate].append(time.perf_counter() - start)
    return {c: statistics.median(s) for c, s in seconds.items()}


def time_product_dtypes(
    shapes: Sequence[tuple[int, int, int]], dtypes: Sequence[torch.dtype], rounds: int
) -> dict[torch.dtype, float]:
    """Median seconds, per dtype, of a linear layer's forward and both gradients on ATen (what
    autocast runs) for each (rows, in, out) of `shapes`, alternating after an untimed round.
    Whether bf16 products are faster than float32's depends on the CPU: without bf16
    instructions they are emulated: 25x slower on one AMD EPYC (docs/BENCHMARKS.md names it)."""
    gen = torch.Generator().manual_seed(0)
    operands = {
        dtype: [
            (
                torch.randn(rows, k, generator=gen).to(dtype).requires_grad_(),  # (M, K)
                (torch.randn(n, k, generator=gen) / k**0.5).to(dtype).requires_grad_(),  # (N, K)
                torch.randn(rows, n, generator=gen).to(dtype),  # (M, N) the output's gradient
            )
            for rows, k, n in shapes
        ]
        for dtype in dtypes
    }

    def run(dtype: torch.dtype, _: int) -> None:
        for x, weight, grad_out in operands[dtype]:
            x.grad = weight.grad = None
            F.linear(x, weight).backward(grad_out)  # (M, N)

    with torch.enable_grad():
        return time_alternating(dtypes, run, rounds)
