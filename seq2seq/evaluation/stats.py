"""The statistics behind significance.py and comparison.py: Student's t, Holm's correction and
t-tests over training seeds. Plain Python and numpy, no scipy.

- **Student's t** from the regularized incomplete beta function, evaluated by the continued
  fraction of Numerical Recipes (section 6.4, ``betacf``): the CDF, the two-sided p-value and
  the quantile (by bisection).
- **Holm's step-down correction** (Holm, 1979, "A simple sequentially rejective multiple test
  procedure", Scand. J. Statist. 6:65-70) of the p-values of one report's comparisons.
- **Over seeds** (would training the configuration again reproduce the difference?): a t-test
  of the difference of mean scores over training seeds, with the seed noise estimated as the
  pooled variance of all systems (each system's sample variance weighted by its degrees of
  freedom, df = sum(n_i - 1)); or, when every system was trained with the same seeds, a
  seed-blocked t-test whose noise is the residual of the two-way (system + seed) model,
  df = (k - 1)(n - 1).

Scores that cannot be tested (too few seeds, not finite, all equal) raise `DataError`, settings
out of range `ConfigError`; a math function called outside its domain (a bug, not an input)
raises a plain ValueError.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence

import numpy as np

from seq2seq.data.text import DataError
from seq2seq.errors import ConfigError

# ----------------------------------------------------------------------------- Student t


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (Numerical Recipes' ``betacf``)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_001):
        m2 = 2 * m
        for aa in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            return h
    raise ArithmeticError(f"incomplete beta: no convergence for a={a}, b={b}, x={x}")


def regularized_incomplete_beta(x: float, a: float, b: float) -> float:
    """The regularized incomplete beta function I_x(a, b), 0 <= x <= 1, a, b > 0."""
    if a <= 0 or b <= 0 or not 0.0 <= x <= 1.0:
        raise ValueError(f"I_x(a, b) needs 0 <= x <= 1 and a, b > 0, got x={x}, a={a}, b={b}")
    if x in (0.0, 1.0):
        return x
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_continued_fraction(a, b, x) / a
    return 1.0 - front * _beta_continued_fraction(b, a, 1.0 - x) / b


def _check_t(t: float, df: float) -> None:
    if not df > 0 or math.isinf(df):
        raise ValueError(f"degrees of freedom must be positive and finite, got {df}")
    if math.isnan(t):
        raise ValueError("t is NaN")


def _t_upper_tail(t: float, df: float) -> float:
    """P(T > t) for t >= 0."""
    if math.isinf(t):
        return 0.0
    return 0.5 * regularized_incomplete_beta(df / (df + t * t), df / 2.0, 0.5)


def student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t distribution with ``df`` degrees of freedom."""
    _check_t(t, df)
    tail = _t_upper_tail(abs(t), df)
    return 1.0 - tail if t > 0 else tail


def student_t_two_sided_p(t: float, df: float) -> float:
    """The two-sided p-value P(|T| >= |t|) of Student's t with ``df`` degrees of freedom."""
    _check_t(t, df)
    return min(1.0, 2.0 * _t_upper_tail(abs(t), df))


def student_t_quantile(q: float, df: float) -> float:
    """The t with P(T <= t) = q, by bisection on the upper tail (to ~1e-12 relative)."""
    _check_t(0.0, df)
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile level must be in (0, 1), got {q}")
    if q == 0.5:
        return 0.0
    if q < 0.5:
        return -student_t_quantile(1.0 - q, df)
    tail = 1.0 - q
    lo, hi = 0.0, 1.0
    while _t_upper_tail(hi, df) > tail:
        lo, hi = hi, 2.0 * hi
    while hi - lo > 1e-12 * hi:
        mid = 0.5 * (lo + hi)
        if _t_upper_tail(mid, df) > tail:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


# ----------------------------------------------------------------------------- Holm


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the order given.

    The i-th smallest of m p-values is multiplied by m - i + 1 (i from 1), made non-decreasing
    in that order (each takes the largest adjusted value so far) and capped at 1. A hypothesis is
    rejected at family-wise level alpha exactly when its adjusted p-value is at most alpha.
    """
    for p in p_values:
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p-values must lie in [0, 1], got {p}")
    m = len(p_values)
    adjusted = [0.0] * m
    running = 0.0
    for rank, index in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        running = max(running, min(1.0, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


# ----------------------------------------------------------------------------- seed level


@dataclasses.dataclass(frozen=True)
class SeedResult:
    """A system's mean score over training seeds against the baseline's, with a t-test.

    ``std_error`` is the standard error of ``delta`` (system mean minus baseline mean) from the
    pooled (or seed-blocked residual) variance, ``t = delta / std_error`` has ``df`` degrees of
    freedom, ``p_value`` is two-sided and ``ci_low``/``ci_high`` bound ``delta`` at
    ``confidence``. ``test`` names the test and its df.
    """

    system: str
    baseline: str
    metric: str
    test: str
    n_seeds: int
    n_seeds_baseline: int
    mean: float
    baseline_mean: float
    delta: float
    pooled_sd: float
    std_error: float
    t: float
    df: int
    p_value: float
    confidence: float
    ci_low: float
    ci_high: float


@dataclasses.dataclass(frozen=True)
class _Noise:
    """The seed noise of a set of systems: its variance, df and the test's name."""

    variance: float
    df: int
    test: str


def _check_seed_scores(scores: Mapping[str, Sequence[float]]) -> None:
    if len(scores) < 2:
        raise DataError(f"need a baseline and at least one system, got {list(scores)}")
    for name, values in scores.items():
        if not values:
            raise DataError(f"system {name!r} has no scores")
        if not all(math.isfinite(v) for v in values):
            raise DataError(f"system {name!r} has a score that is not finite: {list(values)}")


def _pooled_noise(scores: Mapping[str, Sequence[float]]) -> _Noise:
    """Pooled variance over all systems and its degrees of freedom, sum(n_i - 1)."""
    df = sum(len(v) - 1 for v in scores.values())
    if df < 1:
        sizes = {name: len(v) for name, v in scores.items()}
        raise DataError(f"seed noise needs at least one system with two or more seeds, got {sizes}")
    sum_squares = sum((len(v) - 1) * statistics.variance(v) for v in scores.values() if len(v) > 1)
    return _Noise(sum_squares / df, df, f"pooled-variance t-test, df={df}")


def _blocked_noise(scores: Mapping[str, Sequence[float]]) -> _Noise:
    """Residual variance of the two-way model score = system + seed, df = (k - 1)(n - 1)."""
    counts = {len(v) for v in scores.values()}
    if len(counts) != 1 or min(counts) < 2:
        sizes = {name: len(v) for name, v in scores.items()}
        raise DataError(f"a seed-blocked test needs the same seeds (>= 2) for all, got {sizes}")
    table = np.array([list(v) for v in scores.values()], dtype=np.float64)
    residual = (
        table - table.mean(axis=1, keepdims=True) - table.mean(axis=0, keepdims=True) + table.mean()
    )
    df = (table.shape[0] - 1) * (table.shape[1] - 1)
    return _Noise(
        float(np.sum(residual**2)) / df, df, f"seed-blocked t-test (two-way residual), df={df}"
    )


def seed_tests(
    scores: Mapping[str, Sequence[float]],
    *,
    blocked: bool = False,
    confidence: float = 0.95,
    metric: str = "score",
) -> list[SeedResult]:
    """t-tests over training seeds of every system's mean score against the first's.

    ``scores`` maps each system to its per-seed scores, baseline first. By default the seed noise
    is the pooled variance of all systems, s^2 = sum((n_i - 1) s_i^2) / df with df = sum(n_i - 1),
    and the standard error of a difference of means is s * sqrt(1/n_a + 1/n_b). With
    ``blocked=True`` the i-th score of every system must come from the same seed: the noise is
    then the residual variance of the two-way (system + seed) model, df = (k - 1)(n - 1), and
    the standard error s * sqrt(2/n) (for two systems, the paired t-test). Raises DataError when
    the noise cannot be estimated (no df, or every score repeats exactly).
    """
    _check_seed_scores(scores)
    if not 0.0 < confidence < 1.0:
        raise ConfigError(f"confidence must be in (0, 1), got {confidence}")
    noise = _blocked_noise(scores) if blocked else _pooled_noise(scores)
    if noise.variance <= 0.0:
        raise DataError(
            f"every seed gave the same score ({metric}): the seed noise cannot be estimated"
        )
    quantile = student_t_quantile(0.5 + confidence / 2.0, noise.df)
    (baseline, base), *others = scores.items()
    return [
        _seed_result(system, values, baseline, base, metric, noise, quantile, confidence)
        for system, values in others
    ]


def _seed_result(
    system: str,
    values: Sequence[float],
    baseline: str,
    base: Sequence[float],
    metric: str,
    noise: _Noise,
    quantile: float,
    confidence: float,
) -> SeedResult:
    """Test one system's mean against the baseline's, given the seed noise."""
    mean, baseline_mean = statistics.fmean(values), statistics.fmean(base)
    se = math.sqrt(noise.variance * (1.0 / len(values) + 1.0 / len(base)))
    delta = mean - baseline_mean
    return SeedResult(
        system=system,
        baseline=baseline,
        metric=metric,
        test=noise.test,
        n_seeds=len(values),
        n_seeds_baseline=len(base),
        mean=mean,
        baseline_mean=baseline_mean,
        delta=delta,
        pooled_sd=math.sqrt(noise.variance),
        std_error=se,
        t=delta / se,
        df=noise.df,
        p_value=student_t_two_sided_p(delta / se, noise.df),
        confidence=confidence,
        ci_low=delta - quantile * se,
        ci_high=delta + quantile * se,
    )
