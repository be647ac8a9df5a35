"""scripts/choice_check.py: the split-half check of a run's checkpoint choice. The split and the
rule on known statistics; the whole command on translations already kept in the run folder (the
translating itself is seq2seq-translate's, tested with it); bad folders and files refused."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("choice_check", REPO / "scripts" / "choice_check.py")
cc = importlib.util.module_from_spec(_spec)
sys.modules["choice_check"] = cc
_spec.loader.exec_module(cc)

REFS = [f"ein mann fährt fahrrad nummer {i} ." for i in range(40)]


def mean_score(stats: np.ndarray) -> float:
    """A stand-in score: the mean of column 0 over rows summed with a count in column 1."""
    return float(stats[0] / stats[1])


def rows(values: list[float]) -> np.ndarray:
    return np.array([[v, 1.0] for v in values])  # (N, 2)


def test_the_average_better_everywhere_is_always_kept() -> None:
    average = rows([1.0] * 20)
    singles = np.stack([rows([0.5] * 20), rows([0.0] * 20)])  # (2, 20, 2)
    report = cc.split_half(singles, average, splits=50, seed=0, score=mean_score)
    assert report["single_minus_average_on_b"]["mean"] == pytest.approx(-0.5)
    assert report["single_ahead_share"] == 0.0
    assert report["rule_minus_average_on_b"] == {"mean": 0.0, "std": 0.0}
    assert report["rule_picks_single_share"] == 0.0


def test_a_tie_on_a_goes_to_the_single_as_the_runs_rule() -> None:
    same = rows([float(i % 3) for i in range(20)])
    report = cc.split_half(np.stack([same]), same, splits=20, seed=1, score=mean_score)
    assert report["rule_picks_single_share"] == 1.0  # the average must be strictly better
    assert report["rule_minus_average_on_b"]["mean"] == 0.0


def test_picking_on_a_is_optimistic_on_b() -> None:
    """Ten singles of pure noise around the average's level: the one picked on A is the luckiest
    there and falls back on B; the average, never picked, does not."""
    rng = np.random.default_rng(3)
    average = rows([0.5] * 200)
    singles = np.stack([rows(list(rng.random(200))) for _ in range(10)])
    report = cc.split_half(singles, average, splits=200, seed=2, score=mean_score)
    assert report["single_drop_a_to_b"] > 0.02
    assert report["average_drop_a_to_b"] == pytest.approx(0.0)
    again = cc.split_half(singles, average, splits=200, seed=2, score=mean_score)
    assert again == report  # seeded


def make_run(tmp_path: Path, hyps: dict[str, list[str]]) -> Path:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / cc.OUT).mkdir()
    for name, lines in hyps.items():
        (run / "checkpoints" / f"{name}.pt").write_bytes(b"")  # never loaded: translations kept
        (run / cc.OUT / f"{name}.txt").write_text("".join(h + "\n" for h in lines))
    return run


def test_the_command_on_kept_translations(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    worse = [r.replace("fahrrad", "auto") for r in REFS]
    run = make_run(
        tmp_path,
        {"step_200": worse, "step_1000": worse, "best": worse, "average": REFS},
    )
    (tmp_path / "val.en").write_text("".join(f"a man rides bike {i} .\n" for i in range(40)))
    (tmp_path / "val.de").write_text("".join(r + "\n" for r in REFS))
    cc.main([str(run), "--src", str(tmp_path / "val.en"), "--ref", str(tmp_path / "val.de"),
             "--splits", "30"])  # fmt: skip
    report = json.loads((run / cc.OUT / "report.json").read_text())
    assert list(report["full_set_bleu"]) == ["step_200", "step_1000", "best", "average"]
    assert report["full_set_bleu"]["average"] == pytest.approx(100.0)
    assert report["full_set_bleu"]["best"] < 100.0
    assert report["rule_picks_single_share"] == 0.0
    assert report["single_minus_average_on_b"]["mean"] < 0
    assert "the run's rule minus always the average, on B: +0.00" in capsys.readouterr().out


def test_refused_without_an_average_or_with_a_short_file(tmp_path: Path) -> None:
    run = make_run(tmp_path, {"best": REFS})
    (tmp_path / "val.en").write_text("".join(f"s {i}\n" for i in range(40)))
    (tmp_path / "val.de").write_text("".join(r + "\n" for r in REFS))
    args = [str(run), "--src", str(tmp_path / "val.en"), "--ref", str(tmp_path / "val.de")]
    with pytest.raises(SystemExit, match=r"needs average\.pt"):
        cc.main(args)
    make_run(tmp_path / "b", {"best": REFS, "average": REFS[:-1]})
    args[0] = str(tmp_path / "b" / "run")
    with pytest.raises(SystemExit, match="39 lines for 40 sources; delete it to redo"):
        cc.main(args)


def fake_report(run: str, rule: float, single: float) -> dict:
    return {
        "run": run,
        "rule_minus_average_on_b": {"mean": rule, "std": 0.1},
        "single_minus_average_on_b": {"mean": single, "std": 0.1},
    }


def test_over_runs_tests_the_runs_means_against_zero() -> None:
    reports = [fake_report(f"r{i}", rule, -0.5) for i, rule in enumerate([-0.2, -0.4, -0.6])]
    reports[2]["single_minus_average_on_b"]["mean"] = -0.8
    summary = cc.over_runs(reports)
    rule = summary["rule_minus_average_on_b"]
    # mean -0.4, sample sd 0.2, t = -0.4 / (0.2 / sqrt 3) = -3.464 on 2 df: p = 0.0742
    assert rule["mean"] == pytest.approx(-0.4)
    assert rule["sd"] == pytest.approx(0.2)
    assert rule["t"] == pytest.approx(-3.4641, abs=1e-4)
    assert (rule["df"], rule["below_zero"]) == (2, 3)
    assert rule["p"] == pytest.approx(0.0742, abs=1e-4)
    single = summary["single_minus_average_on_b"]
    assert single["p"] < rule["p"]  # -0.6 +- 0.173: the larger t
    assert single["p_holm"] == pytest.approx(2 * single["p"])  # the smaller of two p-values
    assert rule["p_holm"] == pytest.approx(max(rule["p"], single["p_holm"]))


def test_two_runs_are_summed_up_without_a_test() -> None:
    summary = cc.over_runs([fake_report("a", -0.3, -0.2), fake_report("b", -0.5, -0.4)])
    assert summary["rule_minus_average_on_b"] == {"per_run": [-0.3, -0.5], "mean": -0.4}
    assert "a test needs 3 runs or more" in cc.render_over_runs(summary)
    assert "t-test" not in cc.render_over_runs(summary)


def test_kept_reports_are_summed_up_without_translating(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    runs = []
    for i, rule in enumerate([-0.1, -0.3, -0.2]):
        run = tmp_path / f"run{i}"
        (run / cc.OUT).mkdir(parents=True)
        report = fake_report(str(run), rule, rule - 0.1)
        report.update(
            full_set_bleu={"best": 40.0, "average": 41.0},
            splits=10,
            single_ahead_share=0.0,
            rule_picks_single_share=0.5,
            single_drop_a_to_b=0.4,
            average_drop_a_to_b=0.0,
        )
        (run / cc.OUT / "report.json").write_text(json.dumps(report))
        runs.append(str(run))
    cc.main(runs)
    out = capsys.readouterr().out
    assert "over 3 runs" in out
    assert "the run's rule minus always the average: mean -0.20 (-0.10, -0.30, -0.20)" in out
    assert "below zero in 3 of 3; one-sample t-test t=-3.46, df=2" in out
    with pytest.raises(SystemExit, match="no report; check the run first with --src and --ref"):
        cc.main([str(tmp_path / "elsewhere")])
    with pytest.raises(SystemExit, match="give both --src and --ref"):
        cc.main([runs[0], "--src", "val.en"])


def test_runs_all_equal_are_not_tested() -> None:
    """A rule that never picks the single trails the average by exactly 0 in every run: no
    spread, no test (not t = 0 / 0 or a p of 0); the other difference is still tested, alone."""
    reports = [fake_report(f"r{i}", 0.0, single) for i, single in enumerate([-0.2, -0.4, -0.6])]
    summary = cc.over_runs(reports)
    assert summary["rule_minus_average_on_b"] == {"per_run": [0.0, 0.0, 0.0], "mean": 0.0}
    single = summary["single_minus_average_on_b"]
    assert single["p_holm"] == pytest.approx(single["p"])  # one test: nothing to correct
    text = cc.render_over_runs(summary)
    assert text.count("t-test") == 1
    assert "Holm over 1" in text
    assert "the same in every run: no test" in text
