"""Tests for seq2seq.evaluation.seeds: `compare` over training seeds calls better and worse
systems so and leaves copies and noise alone; its Markdown, JSON and errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from seq2seq.data.text import DataError
from seq2seq.errors import ConfigError
from seq2seq.evaluation.seeds import compare, compare_splits, render_markdown, report_to_dict
from seq2seq.evaluation.significance import PairedSettings
from seq2seq.evaluation.stats import holm
from tests.evaluation.synthetic import corrupt, make_references


def test_compare_calls_only_real_differences() -> None:
    """Better and worse systems are called so; a copy and a noise-only system are not."""
    outputs: dict[str, list[list[str]]] = {"base": [], "copy": [], "noise": [], "better": []}
    outputs["worse"] = []
    rng = np.random.default_rng(300)
    refs = make_references(rng, 60)
    rates = {"base": 0.3, "noise": 0.3, "better": 0.15, "worse": 0.5}
    for _seed in range(3):
        for name, rate in rates.items():
            outputs[name].append(corrupt(rng, refs, rate))
        outputs["copy"].append(list(outputs["base"][-1]))
    report = compare(outputs, refs, PairedSettings(method="both", bs_samples=1000, ar_trials=1000))
    calls = {(v.system, v.metric): v for v in report.verdicts}
    assert len(calls) == 4 * 3
    for metric in ("BLEU", "chrF2", "TER"):
        assert calls["better", metric].verdict == "better"
        assert calls["worse", metric].verdict == "worse"
        for same in ("copy", "noise"):
            assert calls[same, metric].verdict == "no difference shown"
        assert calls["copy", metric].sentence_p == 1.0
    better = calls["better", "BLEU"]
    assert better.text.startswith("better (sentence level: paired bootstrap p=")
    assert "pooled-variance t-test, df=10" in better.text
    assert max(better.sentence_p_holm, better.seed_p_holm) <= 0.05
    assert "seed level: Holm-adjusted p > 0.05" in calls["noise", "BLEU"].text
    assert report.notes
    assert all(len(run) == 5 * 3 for run in report.paired)

    markdown = render_markdown(report)
    assert markdown.count("\n| ") == 2 * 1 + 12 + 3 * 15  # two headers, verdicts, per seed
    assert "| better | TER |" in markdown
    seed_cells = [line.split(" | ")[0] for line in markdown.splitlines() if " | base | " in line]
    assert seed_cells == ["| #1"] * 3 + ["| #2"] * 3 + ["| #3"] * 3  # unnamed: the j-th outputs
    assert "- BLEU: `nrefs:1|bs:1000|seed:12345|case:mixed|" in markdown
    assert "- TER: `nrefs:1|bs:1000|ar:1000|seed:12345|case:lc|" in markdown
    as_dict = json.loads(json.dumps(report_to_dict(report), allow_nan=False))
    assert as_dict == report_to_dict(report)  # plain values: lists, not tuples
    assert as_dict["baseline"] == "base"
    assert list(as_dict["signatures"]) == ["BLEU", "chrF2", "TER"]
    assert as_dict["verdicts"][0]["text"] == report.verdicts[0].text


def test_compare_says_when_resamples_are_too_few() -> None:
    """Too few resamples for any Holm-adjusted p to reach alpha: the report says so."""
    rng = np.random.default_rng(400)
    refs = make_references(rng, 20)
    outputs = {name: [corrupt(rng, refs, 0.3) for _ in range(2)] for name in ("a", "b", "c")}
    report = compare(outputs, refs, PairedSettings(metrics=("bleu",), bs_samples=50))
    assert any("use more resamples" in note for note in report.notes)


def test_compare_errors_name_the_system_and_counts() -> None:
    """A seed output of the wrong length, unequal seed counts, one seed or a bad alpha: a
    DataError or ConfigError saying which."""
    refs = ["a b c"] * 10
    outputs = {"base": [refs, refs], "late": [refs, [*refs, "extra"]]}
    with pytest.raises(DataError, match=r"'late', seed output 1, has 11 lines .* have 10"):
        compare(outputs, refs, PairedSettings(metrics=("bleu",)))
    with pytest.raises(DataError, match=r"same number \(>= 2\) .*'base': 2, 'x': 1"):
        compare({"base": [refs, refs], "x": [refs]}, refs)
    with pytest.raises(DataError, match="same number"):
        compare({"base": [refs], "x": [refs]}, refs)
    with pytest.raises(ConfigError, match="alpha"):
        compare({"base": [refs, refs], "x": [refs, refs]}, refs, alpha=5)


def test_compare_splits_is_one_report_with_holm_over_every_set() -> None:
    """Two test sets (a system better on one only): one comparison per system, metric and set,
    labelled by set, called per set, Holm-adjusted over all of them; a single set is `compare`."""
    rng = np.random.default_rng(500)
    short, long = make_references(rng, 50), make_references(rng, 50)
    rates = {"base": (0.3, 0.3), "good_long": (0.3, 0.1), "same": (0.3, 0.3)}
    tests = {
        "short": (
            {name: [corrupt(rng, short, r[0]) for _ in range(3)] for name, r in rates.items()},
            short,
        ),
        "long": (
            {name: [corrupt(rng, long, r[1]) for _ in range(3)] for name, r in rates.items()},
            long,
        ),
    }
    report = compare_splits(tests, PairedSettings(metrics=("bleu",)))
    calls = {(v.system, v.metric): v for v in report.verdicts}
    assert set(calls) == {(s, f"BLEU on {t}") for s in ("good_long", "same") for t in tests}
    assert calls["good_long", "BLEU on long"].verdict == "better"
    assert calls["good_long", "BLEU on short"].verdict == "no difference shown"
    assert calls["same", "BLEU on long"].verdict == "no difference shown"
    sentence = [v.sentence_p for v in report.verdicts]
    assert [v.sentence_p_holm for v in report.verdicts] == holm(sentence)  # one family of 4
    alone = compare(tests["long"][0], long, PairedSettings(metrics=("bleu",)), seed_names="735")
    assert [v.metric for v in alone.verdicts] == ["BLEU", "BLEU"]  # one set: no label
    assert alone.seed_names == ("7", "3", "5")
    assert "\n| 3 | same | BLEU |" in render_markdown(alone)  # the seed, not its index
    with pytest.raises(DataError, match=r"2 seed names for 3 seeds"):
        compare_splits(tests, PairedSettings(metrics=("bleu",)), seed_names=["1", "2"])
    with pytest.raises(DataError, match="same systems"):
        compare_splits({"a": tests["short"], "b": ({"x": [long] * 3, "y": [long] * 3}, long)})
    with pytest.raises(DataError, match="no test set"):
        compare_splits({})
