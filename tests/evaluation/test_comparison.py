"""Tests for seq2seq.evaluation.comparison: one run per system against a baseline, Holm over the
report's comparisons, verdicts from the numbers, the text table and the JSON values."""

from __future__ import annotations

import json

import numpy as np
import pytest

from seq2seq.errors import ConfigError
from seq2seq.evaluation.comparison import (
    compare_systems,
    comparison_to_dict,
    render_comparison,
    sentence_verdict,
    signatures,
)
from seq2seq.evaluation.significance import PairedSettings
from seq2seq.evaluation.stats import holm
from tests.evaluation.synthetic import corrupt, make_references


@pytest.fixture(scope="module")
def systems() -> tuple[dict[str, list[str]], list[str]]:
    """A baseline, a copy of it, a clearly better and a clearly worse system, 50 sentences."""
    rng = np.random.default_rng(500)
    refs = make_references(rng, 50)
    base = corrupt(rng, refs, 0.3)
    hyps = {"base": base, "copy": list(base), "better": corrupt(rng, refs, 0.1)}
    hyps["worse"] = corrupt(rng, refs, 0.6)
    return hyps, refs


def test_holm_over_the_reports_comparisons(systems: tuple[dict[str, list[str]], list[str]]) -> None:
    """Each test's p-values are Holm-adjusted over the 3 systems x 3 metrics, on their own;
    the baseline has no tests; a copy is p = 1 and no difference; better and worse are called so
    on every metric (TER: lower is better)."""
    hyps, refs = systems
    c = compare_systems(hyps, refs, PairedSettings(method="both", bs_samples=1000, ar_trials=1000))
    assert (c.baseline, c.systems, c.metrics) == ("base", tuple(hyps), ("BLEU", "chrF2", "TER"))
    assert (c.family, c.n_sentences, len(c.results)) == (9, 50, 12)
    others = [r for r in c.results if not r.is_baseline]
    for test in range(2):
        ps = [r.tests[test].p_value for r in others]
        assert [r.tests[test].p_holm for r in others] == pytest.approx(holm(ps))
    for r in c.results:
        word = sentence_verdict(r, c.alpha)
        expected = {"base": None, "copy": "no difference shown"}.get(r.system, r.system)
        assert word == expected, (r.system, r.metric, r.tests)
        if r.system == "copy":
            assert all(t.p_value == 1.0 and t.p_holm == 1.0 for t in r.tests)
    ter_better = next(r for r in others if (r.system, r.key) == ("better", "ter"))
    assert ter_better.tests[0].delta < 0
    assert not ter_better.higher_is_better
    assert not any("use more resamples" in n for n in c.notes)


def test_text_and_json(systems: tuple[dict[str, list[str]], list[str]]) -> None:
    """The table has a row per metric and system and the signatures of both runs; the JSON
    every number, the verdicts and the signatures by metric."""
    hyps, refs = systems
    c = compare_systems(hyps, refs, PairedSettings(method="both", bs_samples=100, ar_trials=100))
    text = render_comparison(c)
    assert text.startswith("baseline: base; 50 sentences; paired bootstrap (100 resamples), ")
    assert "approximate randomization (100 trials), seed 12345; alpha 0.05" in text
    lines = text.splitlines()
    assert sum(line.startswith(("BLEU ", "chrF2 ", "TER ")) for line in lines) == 12 + 3 * 2
    header = next(line for line in lines if line.startswith("metric"))
    words = "metric system score 95% interval delta p bs Holm bs p ar Holm ar verdict"
    assert header.split() == words.split()
    # 100 resamples: p >= 2/101 for the bootstrap, too few for 9 comparisons, and it says so
    better = next(line for line in lines if line.startswith("BLEU    better"))
    assert better.endswith("0.020    0.178    0.010    0.089  no difference shown")
    assert any("use more resamples" in line for line in lines)
    sigs = signatures(c.results)
    assert list(sigs) == ["BLEU", "chrF2", "TER"]
    assert all(len(s) == 2 for s in sigs.values())
    as_dict = comparison_to_dict(c)
    data = json.loads(json.dumps(as_dict, allow_nan=False))
    assert data == as_dict  # plain values: lists, not tuples
    assert data["signatures"] == sigs
    assert data["systems"] == list(hyps)
    row = next(r for r in data["results"] if (r["system"], r["key"]) == ("worse", "chrf"))
    assert row["verdict"] in ("worse", "no difference shown")
    assert row["ci_low"] < row["ci_high"]
    assert {t["test"] for t in row["tests"]} == {"bs", "ar"}
    assert {"p_value", "p_holm", "p_sacrebleu", "delta", "signature"} <= row["tests"][0].keys()
    assert data["results"][0]["verdict"] is None  # the baseline


def test_bad_alpha(systems: tuple[dict[str, list[str]], list[str]]) -> None:
    hyps, refs = systems
    with pytest.raises(ConfigError, match="alpha"):
        compare_systems(hyps, refs, alpha=0.0)
