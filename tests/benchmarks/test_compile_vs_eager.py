"""benchmarks/compile_vs_eager.py (train_throughput.py --compile-vs-eager): the verdict's ratios
and the steps that repay the warm-up, from synthetic medians (no timing here)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from tests.benchmarks.test_benchmarks import BENCH


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))
    import compile_vs_eager as module

    return module


def engine(warmup_s: float, steps: int, s_per_step: float, tokens_per_s: float) -> dict[str, Any]:
    return {
        "warmup_s": warmup_s,
        "warmup_steps": steps,
        "s_per_step": s_per_step,
        "real_tokens_per_s": tokens_per_s,
        "real_share": 0.9,
        "epoch_share": 0.87,
        "shapes": 8,
        "peak_rss_mb": 1000.0,
    }


def test_verdict_ratios_and_repaid_steps(bench: ModuleType) -> None:
    """Catches a ratio taken the wrong way round or a warm-up compared unscaled: compiled does
    a step of 1,000 real tokens in 0.8 s (1,250 tokens/s) where eager_exact (1,000 tokens/s)
    takes 1 s, saving 0.2 s a step; its 8 warm-up steps take 100 s where eager_exact's 2 take
    1 s (4 s for 8): 96 s repaid after 480 steps. The reference kernels uncompiled take 1.6 s:
    the compiler makes them 2x faster, and they are 0.625x the CPU kernels."""
    result = {
        "eager_exact": engine(1.0, 2, 0.9, 1000.0),
        "eager_fixed": engine(4.0, 8, 1.0, 1000.0),
        "eager_reference": engine(5.0, 8, 1.6, 625.0),
        "compiled": engine(100.0, 8, 0.8, 1250.0),
    }
    v = bench.verdict(result)
    assert v["same_batches_speedup"] == pytest.approx(1.25)
    assert v["compiler_speedup"] == pytest.approx(2.0)
    assert v["reference_kernels_speedup"] == pytest.approx(0.625)
    assert v["real_tokens_speedup"] == pytest.approx(1.25)
    assert v["repaid_after_steps"] == pytest.approx(480)
    assert v["pays"]
    result["compiled"] = engine(100.0, 8, 1.2, 800.0)  # slower: never repaid
    v = bench.verdict(result)
    assert not v["pays"]
    assert v["repaid_after_steps"] is None
