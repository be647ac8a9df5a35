"""benchmarks/train_throughput.py and its report: the premise check, the summary of an engine's
repeats and the section's name, from synthetic runs (no training, no timing here)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from tests.benchmarks.test_benchmarks import BENCH


@pytest.fixture
def tt(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))
    import train_throughput as module

    return module


def repeat(seconds: list[float], loss: float = 9.0) -> dict[str, Any]:
    n = len(seconds)
    return {
        "seconds": seconds,
        "src_tokens": [100] * n,
        "tgt_tokens": [50] * n,
        "flops": [1e12] * n,
        "rss_mb": 1000.0,
        "losses": [loss] * n,
        "initial_eval_loss": loss,
    }


def test_summary_leaves_out_the_warmup_and_takes_medians(tt: ModuleType) -> None:
    """Catches the warm-up steps counted or a mean for a median: repeats of 1 s steps after a 9 s
    first step, and one repeat of 3 s steps, give 1 s a step (median of 1, 1, 3) and 150 tokens
    a second; the first step never shows."""
    runs = [repeat([9.0, 1.0, 1.0]), repeat([9.0, 1.0, 1.0]), repeat([9.0, 3.0, 3.0])]
    summary = tt.summarise(runs, warmup=1)
    assert summary["s_per_step"] == pytest.approx(1.0)
    assert summary["src_tgt_tokens_per_s"] == pytest.approx(150.0)
    assert summary["tgt_tokens_per_s"] == pytest.approx(50.0)
    assert summary["tflops"] == pytest.approx(1.0)
    assert summary["mfu"] == 0.0  # no peak given: no MFU
    assert tt.summarise(runs, warmup=1, peak=4.0)["mfu"] == pytest.approx(0.25)


def test_premise_aborts_when_an_engine_computes_another_function(tt: ModuleType) -> None:
    """Catches the premise skipped or checked against one Marian only: a gap of 10x the
    tolerance in either Marian stops the run before any timing; within it, the largest gap."""
    tol = tt.LOSS_TOLERANCE
    same = {"ours": [repeat([1.0])], "hf": [repeat([1.0])], "hf_eager": [repeat([1.0])]}
    same["hf_eager"][0]["initial_eval_loss"] += tol / 2
    assert tt.check_premise(same) == pytest.approx(tol / 2)
    for engine in ("hf", "hf_eager"):
        runs = {e: [repeat([1.0])] for e in tt.ENGINES}
        runs[engine][0]["initial_eval_loss"] += 10 * tol
        with pytest.raises(SystemExit, match="do not compute the same function"):
            tt.check_premise(runs)


def test_the_section_is_named_by_its_settings(tt: ModuleType) -> None:
    """Catches two settings writing one section: R-Drop, CUDA and bf16 each add to the name."""
    from argparse import Namespace

    def name(alpha: float, device: str, precision: str) -> str:
        return str(tt.doc_name(Namespace(rdrop_alpha=alpha, device=device, precision=precision))[0])

    assert name(0.0, "cpu", "fp32") == "train_throughput"
    assert name(0.5, "cuda", "bf16") == "train_throughput_rdrop_cuda_bf16"
    assert name(0.0, "cpu", "bf16") == "train_throughput_bf16"
