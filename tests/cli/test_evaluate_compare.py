"""Tests for seq2seq-evaluate's comparisons of hypothesis files (hyp=[a,b,...] ref=REF, and
hyp=[[a1,a2],[b1,b2]] for seeds): the table and JSON, a clearly better system against a bad
one, identical files, the one-line errors, and the single-file output left as it was. Through
`python -m seq2seq.cli.evaluate` (the console script's code) and in-process."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

import seq2seq.cli.evaluate
from seq2seq.config.commands import EvaluateConfig
from seq2seq.errors import ConfigError
from seq2seq.evaluation.scoring import format_scores, score
from tests.cli.test_translate import assert_user_error, python
from tests.evaluation.synthetic import corrupt, make_references

N = 40  # sentences


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ref.txt and hypotheses: bad.txt (half the words wrong), good.txt (a tenth), copy.txt
    (bad.txt again), short.txt (one line short), and three seeds each of bad and good."""
    root = tmp_path_factory.mktemp("compare")
    rng = np.random.default_rng(27)
    refs = make_references(rng, N)
    texts = {"ref": refs, "bad": corrupt(rng, refs, 0.5), "good": corrupt(rng, refs, 0.1)}
    texts["copy"], texts["short"] = texts["bad"], texts["good"][:-1]
    for seed in range(3):
        texts[f"bad{seed}"], texts[f"good{seed}"] = corrupt(rng, refs, 0.5), corrupt(rng, refs, 0.1)
    for name, lines in texts.items():
        (root / f"{name}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def evaluate(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return python(["-m", "seq2seq.cli.evaluate", *args], cwd)


def test_json_has_systems_metrics_intervals_and_p_values(files: Path) -> None:
    """hyp=[bad,good,copy] json=-: every system on BLEU, chrF and TER with its 95% interval;
    good against the baseline bad: p < 0.05 by both tests, Holm-adjusted too, "better" (TER:
    lower); copy: p = 1, "no difference shown"; the signatures of both tests' runs."""
    args = ["hyp=[bad.txt,good.txt,copy.txt]", "ref=ref.txt", "paired=both", "json=-"]
    done = evaluate([*args, "paired_bs_n=1000", "paired_ar_n=1000"], files)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert (data["baseline"], data["systems"]) == ("bad.txt", ["bad.txt", "good.txt", "copy.txt"])
    assert data["metrics"] == ["BLEU", "chrF2", "TER"]
    assert data["family"] == 6
    assert data["n_sentences"] == N
    assert data["paths"]["good.txt"] == ["good.txt"]
    rows = {(r["system"], r["key"]): r for r in data["results"]}
    assert len(rows) == 9
    for key in ("bleu", "chrf", "ter"):
        base, good, copy = (rows[s, key] for s in ("bad.txt", "good.txt", "copy.txt"))
        assert base["tests"] == []
        assert base["verdict"] is None
        assert base["ci_low"] < base["score"] < base["ci_high"]
        assert [t["test"] for t in good["tests"]] == ["bs", "ar"]
        assert all(t["p_value"] < 0.05 and t["p_holm"] < 0.05 for t in good["tests"])
        assert good["verdict"] == "better"
        assert (good["score"] < base["score"]) == (key == "ter")
        assert all(t["p_value"] == t["p_holm"] == 1.0 for t in copy["tests"])
        assert copy["verdict"] == "no difference shown"
        assert copy["score"] == base["score"]
    assert data["signatures"]["BLEU"] == [
        rows["bad.txt", "bleu"]["signature"],
        rows["good.txt", "bleu"]["tests"][1]["signature"],
    ]
    assert "|bs:1000|ar:1000|seed:12345|" in data["signatures"]["TER"][1]


def test_lowercase_compares_case_insensitive_scores(files: Path) -> None:
    """lowercase=true: BLEU and chrF of every system and test are the lowercased ones (an
    upper-cased copy of the references scores 100 there, far less cased), their signatures say
    case:lc; TER, case-insensitive anyway, is the same either way."""
    refs = (files / "ref.txt").read_text(encoding="utf-8")
    (files / "upper.txt").write_text(refs.upper(), encoding="utf-8")
    args = ["hyp=[bad.txt,upper.txt]", "ref=ref.txt", "paired_bs_n=200", "json=-"]
    rows = {}
    for case in ("false", "true"):
        done = evaluate([*args, f"lowercase={case}"], files)
        assert done.returncode == 0, done.stderr
        data = json.loads(done.stdout)
        rows[case] = {(r["system"], r["key"]): r for r in data["results"]}
    lower, cased = rows["true"], rows["false"]
    assert lower["upper.txt", "bleu"]["score"] == pytest.approx(100.0)
    assert lower["upper.txt", "chrf"]["score"] == pytest.approx(100.0)
    assert cased["upper.txt", "bleu"]["score"] < 50
    assert "|case:lc|" in lower["upper.txt", "bleu"]["tests"][0]["signature"]
    assert "|case:mixed|" in cased["upper.txt", "bleu"]["tests"][0]["signature"]
    assert lower["upper.txt", "ter"]["score"] == cased["upper.txt", "ter"]["score"]


def test_text_table(files: Path) -> None:
    """The default output: one row per metric and system with interval, delta, p and Holm p,
    and the verdict; the signatures; the notes. json=PATH writes the same numbers as JSON."""
    args = ["hyp=[bad.txt,good.txt]", "ref=ref.txt", "paired_bs_n=500", "json=out.json"]
    done = evaluate(args, files)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == (
        f"baseline: bad.txt; {N} sentences; paired bootstrap (500 resamples), seed 12345; "
        "alpha 0.05 after Holm over 3 comparisons"
    )
    assert lines[2].split()[:6] == ["metric", "system", "score", "95%", "interval", "delta"]
    good = [line for line in lines if " good.txt " in line]
    assert len(good) == 3
    assert all(line.endswith("0.004    0.012  better") for line in good)
    assert sum(line.startswith("BLEU    nrefs:1|bs:500|seed:12345|") for line in lines) == 1
    assert any(line.startswith("- p: two-sided paired p") for line in lines)
    data = json.loads((files / "out.json").read_text())
    assert data["results"][1]["tests"][0]["p_value"] == pytest.approx(2 / 501)


def test_seeds(files: Path) -> None:
    """hyp=[[bad0,bad1,bad2],[good0,good1,good2]] names=[bad,good]: seed-level t-tests and the
    per-seed paired tests; good is better on every metric by both."""
    args = ["hyp=[[bad0.txt,bad1.txt,bad2.txt],[good0.txt,good1.txt,good2.txt]]", "ref=ref.txt"]
    done = evaluate([*args, "names=[bad,good]", "json=-"], files)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["baseline"] == "bad"
    assert data["n_seeds"] == 3
    assert data["paths"]["good"] == ["good0.txt", "good1.txt", "good2.txt"]
    assert [v["verdict"] for v in data["verdicts"]] == ["better"] * 3
    assert [s["test"] for s in data["seed_level"]] == ["pooled-variance t-test, df=4"] * 3
    assert list(data["signatures"]) == ["BLEU", "chrF2", "TER"]
    blocked = evaluate([*args, "names=[bad,good]", "blocked_seeds=true"], files)
    assert blocked.returncode == 0, blocked.stderr
    assert "| good | BLEU |" in blocked.stdout
    assert "seed-blocked t-test" in blocked.stdout
    assert "- BLEU: `nrefs:1|bs:1000|seed:12345|" in blocked.stdout


def test_mismatched_line_counts_are_one_line(files: Path) -> None:
    done = evaluate(["hyp=[bad.txt,short.txt]", "ref=ref.txt"], files)
    assert_user_error(done, "DataError", "short.txt has 39 lines", f"ref=ref.txt has {N}")
    seeds = evaluate(["hyp=[[bad0.txt,bad1.txt],[good0.txt,short.txt]]", "ref=ref.txt"], files)
    assert_user_error(seeds, "DataError", "short.txt has 39 lines", f"ref=ref.txt has {N}")


def test_a_list_of_checkpoints_is_refused_not_guessed(files: Path) -> None:
    """ckpt=[a,b] is an ensemble in seq2seq-translate: seq2seq-evaluate names both meanings."""
    done = evaluate(["ckpt=[a.pt,b.pt]"], files)
    assert_user_error(done, "ConfigError", "systems=[a.pt,b.pt]", "seq2seq-translate")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"ref": None}, "hyp=\\[...\\] needs ref="),
        ({"ckpt": "a.pt"}, "does not take ckpt="),
        ({"by_length": True, "src": "s.txt"}, "does not take src=, by_length="),
        ({"systems": ["a.pt", "b.pt"]}, "compares checkpoints; it does not take hyp=, ref="),
        ({"hyp": ["bad.txt", "bad.txt"]}, "bad.txt given twice"),
        ({"hyp": [["bad0.txt", "bad1.txt"], "good.txt"]}, "mixes paths and lists"),
        ({"hyp": [["bad0.txt"], ["good0.txt"]]}, "same number \\(2 or more\\) of runs"),
        ({"names": ["one"]}, "gives 1 names for the 2 systems"),
        ({"blocked_seeds": True}, "blocked_seeds=true needs several runs"),
        ({"paired_bs_n": 0}, "paired_bs_n=0 is invalid"),
        ({"paired_seed": 0}, "paired_seed=0 is invalid"),
        ({"alpha": 1.0}, "alpha=1.0 is invalid"),
        ({"hyp": "bad.txt", "names": ["a"]}, "names= and blocked_seeds= are for comparisons"),
        ({"hyp": None, "ref": None, "systems": ["a.pt"]}, "systems= compares two or more"),
        ({"hyp": [["bad0.txt", "bad1.txt"]]}, "hyp= compares two or more systems"),
    ],
)
def test_bad_comparisons_are_config_errors(
    files: Path, changes: dict[str, object], message: str
) -> None:
    settings: dict[str, object] = {"hyp": ["bad.txt", "good.txt"], "ref": "ref.txt"} | changes
    cfg = EvaluateConfig(**settings)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=message):
        seq2seq.cli.evaluate.run(cfg)


def test_one_file_is_scored_as_before(files: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """hyp=bad.txt (and hyp=[bad.txt], a list of one) prints what it printed before comparisons:
    the scores of format_scores, and no table; json=- the scores."""
    hyps = (files / "bad.txt").read_text().splitlines()
    refs = (files / "ref.txt").read_text().splitlines()
    expected = format_scores("bad.txt", score(hyps, refs)) + "\n"
    done = evaluate(["hyp=bad.txt", "ref=ref.txt"], files)
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected
    ref = str(files / "ref.txt")
    seq2seq.cli.evaluate.run(EvaluateConfig(hyp=[str(files / "bad.txt")], ref=ref))
    assert capsys.readouterr().out == expected
    seq2seq.cli.evaluate.run(EvaluateConfig(hyp=str(files / "bad.txt"), ref=ref, json="-"))
    assert json.loads(capsys.readouterr().out) == score(hyps, refs)
