"""Tests for seq2seq.evaluation.stats: Student's t against printed tables and closed forms,
Holm's correction by hand, the seed-level t-tests by hand, and their errors."""

from __future__ import annotations

import math

import pytest

from seq2seq.data.text import DataError
from seq2seq.errors import ConfigError, UserError
from seq2seq.evaluation.stats import (
    holm,
    regularized_incomplete_beta,
    seed_tests,
    student_t_cdf,
    student_t_quantile,
    student_t_two_sided_p,
)

# ----------------------------------------------------------------------------- Student t


@pytest.mark.parametrize(
    ("q", "df", "table"),
    [
        (0.975, 2, 4.303),
        (0.975, 10, 2.228),
        (0.975, 30, 2.042),
        (0.95, 5, 2.015),
        (0.995, 3, 5.841),
    ],
)
def test_t_quantile_matches_table(q: float, df: int, table: float) -> None:
    """Quantiles of Student t agree with printed tables to 3 decimals, and invert the CDF."""
    assert student_t_quantile(q, df) == pytest.approx(table, abs=5e-4)
    assert student_t_quantile(1.0 - q, df) == pytest.approx(-table, abs=5e-4)
    assert student_t_cdf(student_t_quantile(q, df), df) == pytest.approx(q, abs=1e-10)


def test_t_cdf_matches_known_values() -> None:
    """Two-sided p for t=2, df=5 is 0.1019; df=1 is the Cauchy CDF; large df the normal."""
    assert student_t_two_sided_p(2.0, 5) == pytest.approx(0.1019, abs=1e-4)
    assert student_t_two_sided_p(-2.0, 5) == student_t_two_sided_p(2.0, 5)
    assert student_t_cdf(1.0, 1) == pytest.approx(0.75, abs=1e-12)  # Cauchy: 1/2 + atan(1)/pi
    assert student_t_cdf(0.0, 7) == 0.5
    assert student_t_two_sided_p(0.0, 3) == 1.0
    assert student_t_quantile(0.975, 10**7) == pytest.approx(1.959964, abs=1e-5)  # normal limit
    with pytest.raises(ValueError, match="degrees of freedom"):
        student_t_cdf(1.0, 0)
    with pytest.raises(ValueError, match="NaN"):
        student_t_two_sided_p(math.nan, 3)


def test_incomplete_beta_closed_forms() -> None:
    """I_x(1,1) = x, I_x(a,1) = x^a, I_x(1,b) = 1-(1-x)^b and I_x(a,b) = 1 - I_{1-x}(b,a)."""
    for x in (0.0, 0.1, 0.37, 0.5, 0.9, 1.0):
        assert regularized_incomplete_beta(x, 1.0, 1.0) == pytest.approx(x, abs=1e-13)
        assert regularized_incomplete_beta(x, 3.0, 1.0) == pytest.approx(x**3, abs=1e-13)
        assert regularized_incomplete_beta(x, 1.0, 2.5) == pytest.approx(
            1.0 - (1.0 - x) ** 2.5, abs=1e-13
        )
        assert regularized_incomplete_beta(x, 2.5, 4.0) == pytest.approx(
            1.0 - regularized_incomplete_beta(1.0 - x, 4.0, 2.5), abs=1e-13
        )
    with pytest.raises(ValueError, match="0 <= x <= 1"):
        regularized_incomplete_beta(1.5, 1.0, 1.0)


# ----------------------------------------------------------------------------- Holm


def test_holm_hand_computed() -> None:
    """Holm on hand-computed examples: multipliers m..1, monotone, capped at 1."""
    # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> raised to 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.6]) == [1.0, 1.0]  # 0.5*2 capped at 1, then monotone
    assert holm([0.02]) == [0.02]
    assert holm([]) == []
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        holm([0.1, 1.5])


# ----------------------------------------------------------------------------- seed level


def test_pooled_t_test_by_hand() -> None:
    """The pooled-variance t-test reproduces a hand computation (df, sd, se, t, p, CI)."""
    # variances 1, 1, 2 with df 2, 2, 1: pooled (2 + 2 + 2) / 5 = 1.2
    scores = {"base": [30.0, 31.0, 32.0], "x": [33.0, 34.0, 35.0], "y": [30.0, 32.0]}
    x, y = seed_tests(scores, metric="BLEU")
    assert x.test == "pooled-variance t-test, df=5"
    assert (x.system, x.baseline, x.metric, x.n_seeds, y.n_seeds) == ("x", "base", "BLEU", 3, 2)
    assert x.df == 5
    assert x.pooled_sd == pytest.approx(math.sqrt(1.2))
    assert x.delta == pytest.approx(3.0)
    assert x.std_error == pytest.approx(math.sqrt(1.2 * (1 / 3 + 1 / 3)))
    assert x.t == pytest.approx(3.0 / math.sqrt(0.8))
    assert x.p_value == pytest.approx(student_t_two_sided_p(x.t, 5))
    assert x.ci_low == pytest.approx(3.0 - 2.5706 * x.std_error, abs=1e-3)  # t(0.975, 5)
    assert y.delta == pytest.approx(0.0)
    assert y.p_value == pytest.approx(1.0)
    assert y.std_error == pytest.approx(math.sqrt(1.2 * (1 / 2 + 1 / 3)))


def test_blocked_t_test_is_paired_t_test_for_two_systems() -> None:
    """With two systems the seed-blocked test is the paired t-test on per-seed differences."""
    # differences by seed 1.0, 1.5, 0.5: mean 1, sd 0.5, se 0.5 / sqrt(3), df 2
    (result,) = seed_tests({"base": [30.0, 32.0, 31.0], "x": [31.0, 33.5, 31.5]}, blocked=True)
    assert result.test == "seed-blocked t-test (two-way residual), df=2"
    assert result.std_error == pytest.approx(0.5 / math.sqrt(3))
    assert result.t == pytest.approx(1.0 / (0.5 / math.sqrt(3)))
    with pytest.raises(DataError, match=r"same seeds .* got \{'base': 3, 'x': 2\}"):
        seed_tests({"base": [30.0, 32.0, 31.0], "x": [31.0, 33.5]}, blocked=True)


def test_seed_noise_must_be_estimable() -> None:
    """No degrees of freedom, no variation, no scores or a NaN is a DataError (a UserError the
    CLI prints as one line) rather than p = 0; a bad confidence level a ConfigError."""
    with pytest.raises(DataError, match="two or more seeds"):
        seed_tests({"base": [30.0], "x": [31.0]})
    with pytest.raises(DataError, match="same score"):
        seed_tests({"base": [30.0, 30.0], "x": [31.0, 31.0]})
    with pytest.raises(DataError, match="'x' has no scores"):
        seed_tests({"base": [30.0, 31.0], "x": []})
    with pytest.raises(DataError, match="not finite"):
        seed_tests({"base": [30.0, 31.0], "x": [math.nan, 1.0]})
    with pytest.raises(DataError, match="baseline and at least one system"):
        seed_tests({"base": [30.0, 31.0]})
    with pytest.raises(ConfigError, match="confidence"):
        seed_tests({"base": [30.0, 31.0], "x": [31.0, 33.0]}, confidence=95)
    assert issubclass(DataError, UserError)
    assert issubclass(DataError, ValueError)
