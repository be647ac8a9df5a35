"""Tests for seq2seq.evaluation.significance against known truths: sacreBLEU's PairedTest run
directly, identical systems, equally good systems (the false-positive rate) and a clearly better
one, on the synthetic systems of tests/evaluation/synthetic.py."""

from __future__ import annotations

import os

import numpy as np
import pytest
import sacrebleu.significance as sb_significance
from sacrebleu.metrics.bleu import BLEU
from sacrebleu.significance import PairedTest, Result

from seq2seq.data.text import DataError
from seq2seq.errors import ConfigError
from seq2seq.evaluation.significance import PairedSettings, TestType, paired_tests
from seq2seq.evaluation.stats import seed_tests
from tests.evaluation.synthetic import corrupt, make_references


def test_length_mismatch_names_the_system() -> None:
    """A system whose line count differs from the references is a DataError naming it and both
    counts."""
    refs = ["a b c"] * 10
    with pytest.raises(DataError, match=r"'short' has 9 lines but the references have 10"):
        paired_tests({"base": refs, "short": refs[:9]}, refs)
    with pytest.raises(DataError, match="test set is empty"):
        paired_tests({"base": [], "other": []}, [])


def test_invalid_arguments() -> None:
    """Unknown metrics or methods, no resamples and seed 0 are ConfigErrors; a lone system a
    DataError."""
    refs = ["a b c"] * 4
    hyps = {"base": refs, "other": refs}
    with pytest.raises(ConfigError, match="metrics"):
        paired_tests(hyps, refs, PairedSettings(metrics=("bleu", "meteor")))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="method"):
        paired_tests(hyps, refs, PairedSettings(method="t"))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="seed"):
        paired_tests(hyps, refs, PairedSettings(seed=0))
    with pytest.raises(ConfigError, match="at least one resample"):
        paired_tests(hyps, refs, PairedSettings(bs_samples=0))
    with pytest.raises(DataError, match="baseline and at least one system"):
        paired_tests({"base": refs}, refs)


@pytest.mark.parametrize("test", ["bs", "ar"])
def test_matches_sacrebleu_paired_test(test: TestType, monkeypatch: pytest.MonkeyPatch) -> None:
    """Scores, intervals, p-values and signatures equal sacreBLEU's PairedTest run directly,
    same seed; the decision p is sacreBLEU's doubled (bootstrap) or equal (randomization) here,
    where no resample ties the observed difference."""
    rng = np.random.default_rng(7)
    refs = make_references(rng, 40)
    systems = {"base": corrupt(rng, refs, 0.3), "s1": corrupt(rng, refs, 0.2)}
    systems["s2"] = corrupt(rng, refs, 0.3)
    monkeypatch.setenv("SACREBLEU_SEED", "4242")
    n = 300
    paired = PairedTest(
        list(systems.items()),
        {"bleu": BLEU(references=[refs])},
        None,
        test_type=test,
        n_samples=n,
        n_ar_confidence=n if test == "ar" else -1,
    )
    signatures, table = paired()
    direct = [r for r in table["BLEU"] if isinstance(r, Result)]
    monkeypatch.setenv("SACREBLEU_SEED", "999")
    original = sb_significance._compute_p_value
    ours = paired_tests(
        systems,
        refs,
        PairedSettings(metrics=("bleu",), method=test, bs_samples=n, ar_trials=n, seed=4242),
    )
    # sacreBLEU's state is given back: the environment and the function we observe
    assert os.environ["SACREBLEU_SEED"] == "999"
    assert sb_significance._compute_p_value is original
    assert [r.system for r in ours] == list(systems)
    for theirs, mine in zip(direct, ours, strict=True):
        assert (mine.metric, mine.key) == ("BLEU", "bleu")
        assert mine.score == theirs.score
        assert theirs.mean is not None
        assert theirs.ci is not None
        assert (mine.ci_mean, mine.ci_halfwidth) == (theirs.mean, theirs.ci)
        assert mine.ci_low == pytest.approx(theirs.mean - theirs.ci)
        assert mine.signature == signatures["BLEU"].format()
    assert f"{test}:{n}|seed:4242|" in ours[0].signature
    assert ours[0].is_baseline
    assert ours[0].tests == ()
    for theirs, mine in zip(direct[1:], ours[1:], strict=True):
        (result,) = mine.tests
        assert result.p_sacrebleu == theirs.p_value
        assert result.delta == pytest.approx(theirs.score - direct[0].score)
        assert result.signature == mine.signature
        assert result.p_holm is None
        # the decision p: from the same resamples, ties included, two-sided for the bootstrap
        assert theirs.p_value is not None
        expected = min(1.0, 2 * theirs.p_value) if test == "bs" else theirs.p_value
        assert result.p_value == pytest.approx(expected)


def test_identical_systems_are_never_different() -> None:
    """Identical outputs get p = 1 by both tests on all metrics (sacreBLEU says 1/(n+1))."""
    for trial in range(3):
        rng = np.random.default_rng(100 + trial)
        refs = make_references(rng, 30)
        base = corrupt(rng, refs, 0.3)
        results = paired_tests(
            {"base": base, "copy": list(base)},
            refs,
            PairedSettings(method="both", bs_samples=200, ar_trials=200),
        )
        assert [r.key for r in results] == ["bleu", "bleu", "chrf", "chrf", "ter", "ter"]
        for r in results[1::2]:
            assert [t.test for t in r.tests] == ["bs", "ar"]
            assert "|bs:200|ar:200|" in r.tests[1].signature  # the randomization run's own
            for t in r.tests:
                assert t.delta == 0.0
                assert t.p_value == 1.0
                # sacreBLEU counts only strictly larger differences: 1/(n+1), "significant"
                assert t.p_sacrebleu == pytest.approx(1 / 201)


def test_noise_only_differences_are_rarely_called_significant() -> None:
    """Equally good systems (same substitution rate) get p < 0.05 in at most 10% of trials."""
    trials, false_positives = 100, {"bs": 0, "ar": 0}
    for trial in range(trials):
        rng = np.random.default_rng(1000 + trial)
        refs = make_references(rng, 60)
        hyps = {"a": corrupt(rng, refs, 0.3), "b": corrupt(rng, refs, 0.3)}
        result = paired_tests(
            hyps,
            refs,
            PairedSettings(
                metrics=("bleu",), method="both", bs_samples=200, ar_trials=300, seed=trial + 1
            ),
        )[1]
        for t in result.tests:
            false_positives[t.test] += t.p_value < 0.05
    # nominal 5%, allowed 10%. Offline, 1000 such trials (other seeds) gave 5.3% (bs) and 4.6%
    # (ar); sacreBLEU's own bootstrap p-value, not doubled, gave 12% there and 12 of these 100.
    assert false_positives["bs"] <= 0.10 * trials, false_positives
    assert false_positives["ar"] <= 0.10 * trials, false_positives


def test_clearly_better_system_is_significant_both_ways() -> None:
    """Far fewer substitutions: p < 0.05 by bootstrap, randomization and the seed t-test."""
    per_seed: dict[str, list[float]] = {"base": [], "better": []}
    for seed in range(3):
        rng = np.random.default_rng(200 + seed)
        refs = make_references(rng, 60)
        hyps = {"base": corrupt(rng, refs, 0.4), "better": corrupt(rng, refs, 0.15)}
        results = paired_tests(
            hyps, refs, PairedSettings(method="both", bs_samples=200, ar_trials=300)
        )
        for r in results[1::2]:  # the "better" row of each metric
            assert {t.test for t in r.tests} == {"bs", "ar"}
            for t in r.tests:
                assert t.p_value < 0.05
                assert (t.delta > 0) == r.higher_is_better  # BLEU and chrF up, TER down
        per_seed["base"].append(results[0].score)
        per_seed["better"].append(results[1].score)
    (seed_level,) = seed_tests(per_seed, metric="BLEU")
    assert seed_level.test == "pooled-variance t-test, df=4"
    assert seed_level.p_value < 0.05
    assert 0 < seed_level.ci_low < seed_level.delta < seed_level.ci_high
