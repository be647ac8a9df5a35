"""benchmarks/data_scale_report.py: the report's tables, notes and issue #17's verdicts, from a
synthetic result (no corpus, no timing here)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from tests.benchmarks.test_benchmarks import BENCH


@pytest.fixture
def rep(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))
    import data_scale_report as module

    return module


def run(rss: float, to_step1: float, steps_per_s: float) -> dict[str, Any]:
    return {
        "wall_s": 20.0,
        "to_model_line_s": to_step1 - 1.0,
        "to_step1_s": to_step1,
        "peak_rss_mb": rss,
        "peak_tree_pss_mb": rss + 100.0,
        "steps_per_s": steps_per_s,
        "tgt_tokens_per_s": 1000.0 * steps_per_s,
    }


def size(pairs: int, new_rss: float, old: dict[str, Any], prep_speed: float) -> dict[str, Any]:
    prepare = {"wall_s": 10.0, "pairs_per_s": pairs / 10.0, "peak_rss_mb": 300.0}
    prepare.update(tokenize_pass_pairs_per_s=prep_speed * 1000.0, disk_bytes=2**20)
    return {
        "pairs": pairs,
        "corpus": {"bytes": {"en": 2**20, "de": 2**20}},
        "prepare": prepare,
        "old_tokenize": {"pairs_per_s": 1000.0, "wall_s": 5.0},
        "old": old,
        "new": run(new_rss, 4.0, 2.0),
        "tokenize_pass_vs_old_tokenize": prep_speed,
    }


def result(second_new_rss: float, second_old: dict[str, Any]) -> dict[str, Any]:
    sizes = [size(29000, 1000.0, run(2000.0, 30.0, 1.0), 3.0)]
    sizes.append(size(1_000_000, second_new_rss, second_old, 1.5))
    return {"old_commit": "86a2410abcdef", "steps": 50, "warm": 10, "results": sizes}


def test_verdicts_follow_the_figures(rep: ModuleType) -> None:
    """Catches a target's comparison turned round or a ratio taken the wrong way: the prepared
    path's RSS grows 1.05x (met) or 1.20x (not met) from 29k to 1M pairs; start to step 1 is 4 s
    (< 10 s: met); prepare's tokenize pass is 3x then 1.5x the old path (met, then not met);
    steps/s new / old is 2 / 1 at 29k."""
    lines = rep.targets(result(1050.0, run(9000.0, 60.0, 1.0)))
    assert "- training peak RSS at 1M pairs / at 29k: 1.050 (target <= 1.10: met)" in lines
    assert any("on the prepared corpus at 1M pairs: 4.0 s (target < 10 s: met)" in x for x in lines)
    assert any("old read + tokenize, speed, at 29k: 3.00x (target >= 2x: met)" in x for x in lines)
    assert any("at 1M: 1.50x (target >= 2x: NOT met)" in x for x in lines)
    assert "- steps/s new / old at 29k: 2.00" in lines
    grown = rep.targets(result(1200.0, run(9000.0, 60.0, 1.0)))
    assert "- training peak RSS at 1M pairs / at 29k: 1.200 (target <= 1.10: NOT met)" in grown


def test_a_skipped_old_path_is_said_and_never_divided(rep: ModuleType) -> None:
    """Catches a skipped run printed as figures or a ratio taken over a missing one: the old path
    skipped at 1M shows "skipped" in its row and its reason among the notes, and no steps/s
    ratio is given at 1M."""
    skipped = {"skipped": "estimated RSS over 80% of MemTotal"}
    r = result(1050.0, skipped)
    text = rep.report(r)
    assert "| 1M | old | skipped | skipped | skipped | skipped | skipped | skipped |" in text
    assert "- 1M old: estimated RSS over 80% of MemTotal" in text
    assert not any(x.startswith("- steps/s new / old at 1M") for x in rep.targets(r))


def test_a_disturbed_run_is_flagged(rep: ModuleType) -> None:
    """Catches the disturbance threshold dropped: other processes' CPU seconds above DISTURBED
    of a run's wall time put a note under the tables; below it, none."""
    r = result(1050.0, run(9000.0, 60.0, 1.0))
    r["results"][0]["new"]["other_cpu_s"] = 20.0 * rep.DISTURBED * 1.5
    assert "- 29k new: disturbed, other processes used" in rep.report(r)
    r["results"][0]["new"]["other_cpu_s"] = 20.0 * rep.DISTURBED * 0.5
    assert "disturbed" not in rep.report(r)


def test_speed_repeats_report_means_and_their_ratio(rep: ModuleType) -> None:
    """Catches the ratio of the repeated runs inverted: new 3.0 steps/s over old 2.0 is 1.50."""
    r = result(1050.0, run(9000.0, 60.0, 1.0))
    stat = {"mean": 2.0, "std": 0.1, "n": 3}
    r["speed"] = {"pairs": 1_000_000, "old_steps_per_s": stat, "old_tgt_tokens_per_s": stat}
    r["speed"].update(new_steps_per_s={**stat, "mean": 3.0}, new_tgt_tokens_per_s=stat)
    lines = rep.speed_lines(r)
    assert lines[0].startswith("Training speed at 1M pairs, 3 runs each")
    assert "- new / old, steps/s: 1.50" in lines
