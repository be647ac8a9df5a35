"""Timing candidates against each other on this machine, for the choices made at run time
(where float32 products run, the training precision): which is faster depends on the CPU."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

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
