"""Is system B better than baseline A *on this test set*? sacreBLEU's own paired tests over
sentences, with 95% intervals of every score (comparison.py turns them into reports).

The tests are run exactly as ``sacrebleu --paired-bs`` / ``--paired-ar`` run them
(`sacrebleu.significance.PairedTest`, same metrics, same ``SACREBLEU_SEED`` semantics), for BLEU,
chrF and TER:

- paired bootstrap resampling (Koehn, 2004, "Statistical significance tests for machine
  translation evaluation", EMNLP), in the variant of Moses'
  ``bootstrap-hypothesis-difference-significance.pl`` that sacreBLEU implements;
- approximate randomization (Riezler & Maxwell, 2005, "On some pitfalls in automatic evaluation
  and significance testing for MT", ACL workshop; after Noreen, 1989).

**Two p-values.** Every p-value sacreBLEU prints is kept (`PairedPValue.p_sacrebleu`). The
p-value used for decisions (`PairedPValue.p_value`) is computed from the same resamples, which
this module captures from sacreBLEU, with two corrections:

- a resample as extreme as the observed difference counts as extreme (sacreBLEU counts only
  strictly larger ones, so two identical systems get p = 1/(n+1), "significant"; here p = 1).
  Ties matter beyond identical systems: TER counts whole edits, so many randomized differences
  equal the observed one;
- the bootstrap p-value is doubled (two-sided): sacreBLEU's bootstrap p counts one tail of the
  centred |difference| distribution. Measured: in simulations of two equally good systems (1000
  synthetic test sets of 200 sentences, 1000 resamples each) sacreBLEU's bootstrap p fell below
  0.05 for 11.5% of them, twice the nominal rate; doubled, for 5.7% (approximate
  randomization, already two-sided: 4.9%). tests/evaluation/test_significance.py repeats a
  smaller version of that simulation.

This relies on two sacreBLEU 2.x internals, checked at run time where possible: PairedTest reads
its seed from ``SACREBLEU_SEED``, and its tests call the module-level ``_compute_p_value`` once
per system and metric.

**Intervals.** The confidence interval of a score is sacreBLEU's: over bootstrap resamples of the
test sentences, the mean of the resampled scores plus or minus half the distance between the
resampled scores of rank n//40 and n - n//40 - 1 (about the 2.5th and 97.5th percentiles). It is
centred on the bootstrap mean, not on the score, and covers test-set sampling only, not the
variation between training seeds (stats.py's seed_tests does that).

Systems whose line counts differ from the references' raise `DataError`; unknown metrics or
methods, too few resamples or seed 0 raise `ConfigError`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import sacrebleu.significance as _sb_significance
from sacrebleu.metrics.base import Metric
from sacrebleu.metrics.bleu import BLEU
from sacrebleu.metrics.chrf import CHRF
from sacrebleu.metrics.ter import TER
from sacrebleu.significance import PairedTest

from seq2seq.data.text import DataError
from seq2seq.errors import ConfigError

MetricName = Literal["bleu", "chrf", "ter"]
TestType = Literal["bs", "ar"]
Method = Literal["bs", "ar", "both"]

DEFAULT_METRICS: tuple[MetricName, ...] = ("bleu", "chrf", "ter")
TEST_NAMES: dict[TestType, str] = {"bs": "paired bootstrap", "ar": "approximate randomization"}
HIGHER_IS_BETTER: dict[MetricName, bool] = {"bleu": True, "chrf": True, "ter": False}
_SEED_ENV = "SACREBLEU_SEED"
# a resampled difference within this of the observed one is a tie (scores are on a 0-100 scale)
_TIE_TOLERANCE = 1e-9
# PairedTest reads its seed from the environment and we observe sacreBLEU's module function:
# both are process-wide, so one test at a time
_SACREBLEU_LOCK = threading.Lock()

_Captured = tuple[npt.NDArray[np.float64], float]


@dataclasses.dataclass(frozen=True)
class PairedSettings:
    """How the paired tests run, as sacreBLEU's options: the ``metrics``; ``method`` "bs"
    (paired bootstrap, ``bs_samples`` resamples), "ar" (approximate randomization,
    ``ar_trials`` trials) or "both"; ``seed`` (``SACREBLEU_SEED``; None seeds from the OS);
    ``lowercase`` for BLEU and chrF; ``tokenize`` and ``trg_lang`` for BLEU."""

    metrics: tuple[MetricName, ...] = DEFAULT_METRICS
    method: Method = "bs"
    bs_samples: int = 1000
    ar_trials: int = 10000
    seed: int | None = 12345
    lowercase: bool = False
    tokenize: str | None = None
    trg_lang: str = ""


DEFAULT_PAIRED = PairedSettings()


@dataclasses.dataclass(frozen=True)
class PairedPValue:
    """One paired test of a system against the baseline on one metric.

    ``delta`` is the system's score minus the baseline's. ``p_sacrebleu`` is the p-value exactly
    as sacreBLEU reports it; ``p_value`` is the two-sided, tie-inclusive p-value from the same
    resamples that the decisions use (see the module docstring). ``signature`` is sacreBLEU's
    signature of the test's run (its metric, resamples and seed). ``p_holm`` is ``p_value``
    Holm-adjusted over a report's comparisons, once a report (comparison.py) has set it.
    """

    test: TestType
    n_samples: int
    seed: int | None
    delta: float
    p_sacrebleu: float
    p_value: float
    signature: str
    p_holm: float | None = None


@dataclasses.dataclass(frozen=True)
class PairedResult:
    """One system's corpus score on one metric, its bootstrap CI and its tests vs the baseline.

    ``metric`` is sacreBLEU's score name ("BLEU", "chrF2", "TER"), ``key`` ours ("bleu",
    "chrf", "ter"). The 95% interval is sacreBLEU's ``ci_mean +- ci_halfwidth`` over
    ``ci_resamples`` bootstrap resamples of the test sentences: ``ci_low`` and ``ci_high`` are
    its ends. ``signature`` is sacreBLEU's signature of the run that gave the score and interval.
    ``tests`` is empty for the baseline.
    """

    system: str
    metric: str
    key: MetricName
    higher_is_better: bool
    is_baseline: bool
    score: float
    ci_mean: float
    ci_halfwidth: float
    ci_low: float
    ci_high: float
    ci_resamples: int
    signature: str
    tests: tuple[PairedPValue, ...]

    def p_value(self, test: TestType) -> float | None:
        """The decision p-value of ``test`` ("bs" or "ar"), or None when it was not run."""
        return next((t.p_value for t in self.tests if t.test == test), None)


# ----------------------------------------------------------------------------- checks


def check_systems(hypotheses: Mapping[str, Sequence[str]], references: Sequence[str]) -> None:
    """A baseline and at least one system, each with one line per reference (else DataError)."""
    if len(hypotheses) < 2:
        raise DataError(f"need a baseline and at least one system, got {list(hypotheses)}")
    if not references:
        raise DataError("no references: the test set is empty")
    for name, hyps in hypotheses.items():
        if isinstance(hyps, str):
            raise DataError(f"system {name!r}: expected a list of lines, got one string")
        if len(hyps) != len(references):
            raise DataError(
                f"system {name!r} has {len(hyps)} lines but the references have "
                f"{len(references)}: every system must translate the same test sentences"
            )


def check_metrics(metrics: Sequence[MetricName]) -> tuple[MetricName, ...]:
    """The metric names, distinct and known (else ConfigError)."""
    known = tuple(HIGHER_IS_BETTER)
    if not metrics or len(set(metrics)) != len(metrics) or any(m not in known for m in metrics):
        raise ConfigError(f"metrics must be distinct names among {known}, got {list(metrics)}")
    return tuple(metrics)


def check_resampling(method: str, bs_samples: int, ar_trials: int, seed: int | None) -> None:
    """The method, resample counts and seed as sacreBLEU can run them (else ConfigError)."""
    if method not in ("bs", "ar", "both"):
        raise ConfigError(f'method must be "bs", "ar" or "both", got {method!r}')
    if bs_samples < 1 or ar_trials < 1:
        raise ConfigError(f"need at least one resample, got {bs_samples=}, {ar_trials=}")
    # sacreBLEU's PairedTest treats seed 0 as "no seed" for the systems but not for the baseline
    if seed is not None and (isinstance(seed, bool) or seed < 1):
        raise ConfigError(f"seed must be a positive integer or None (unseeded), got {seed!r}")


# ----------------------------------------------------------------------------- sacreBLEU


def _make_metric(
    name: MetricName, references: Sequence[str], lowercase: bool, tokenize: str | None, trg: str
) -> Metric:
    """Build the metric as ``sacrebleu -m NAME`` does, with the references cached."""
    refs = [list(references)]
    if name == "bleu":
        return BLEU(lowercase=lowercase, tokenize=tokenize, trg_lang=trg, references=refs)
    if name == "chrf":
        return CHRF(lowercase=lowercase, references=refs)
    # sacreBLEU's TER is case-insensitive unless asked (its CLI's default, kept here)
    return TER(references=refs)


@contextlib.contextmanager
def _sacrebleu_session(seed: int | None) -> Iterator[list[_Captured]]:
    """Set ``SACREBLEU_SEED`` as the CLI reads it, and record every null distribution.

    sacreBLEU's tests hand the resampled statistics and the observed difference to its
    module-level ``_compute_p_value``; the wrapper records them and returns sacreBLEU's value.
    """
    captured: list[_Captured] = []
    original = _sb_significance._compute_p_value

    def record(stats: npt.NDArray[Any], real_difference: float) -> float:
        captured.append((np.asarray(stats, dtype=np.float64).copy(), float(real_difference)))
        return float(original(stats, real_difference))

    with _SACREBLEU_LOCK:
        previous = os.environ.get(_SEED_ENV)
        os.environ[_SEED_ENV] = "none" if seed is None else str(seed)
        _sb_significance._compute_p_value = record
        try:
            yield captured
        finally:
            _sb_significance._compute_p_value = original
            if previous is None:
                del os.environ[_SEED_ENV]
            else:
                os.environ[_SEED_ENV] = previous


def decision_p(test: TestType, stats: npt.NDArray[np.float64], observed: float) -> float:
    """Tie-inclusive p-value from sacreBLEU's null distribution; two-sided for the bootstrap."""
    extreme = int(np.sum(stats >= observed - _TIE_TOLERANCE * max(1.0, observed)))
    p = (extreme + 1) / (len(stats) + 1)
    return min(1.0, 2.0 * p) if test == "bs" else p


@dataclasses.dataclass(frozen=True)
class _RunSpec:
    """One PairedTest run: its test, resamples (and those behind the intervals) and seed."""

    test: TestType
    n_samples: int
    n_confidence: int
    seed: int | None


@dataclasses.dataclass(frozen=True)
class _Run:
    """What one PairedTest run gave: its table, null distributions and signatures by label."""

    table: dict[str, list[Any]]
    captured: list[_Captured]
    signatures: dict[str, str]


def _run_paired_test(
    named: list[tuple[str, Sequence[str]]], metrics: dict[str, Metric], spec: _RunSpec
) -> _Run:
    """Run sacreBLEU's PairedTest as its CLI does: its table, null distributions, signatures."""
    with _sacrebleu_session(spec.seed) as captured:
        paired = PairedTest(
            named,
            metrics,
            references=None,
            test_type=spec.test,
            n_samples=spec.n_samples,
            n_ar_confidence=spec.n_confidence if spec.test == "ar" else -1,
            n_jobs=1,
        )
        signatures, table = paired()
    if len(captured) != (len(named) - 1) * len(metrics):
        raise RuntimeError(
            "sacrebleu.significance no longer calls _compute_p_value once per system and metric:"
            " this module needs updating for the installed sacreBLEU"
        )
    return _Run(table, captured, {label: sig.format() for label, sig in signatures.items()})


def _result_row(
    row: Any,
    system: str,
    metric: MetricName,
    label: str,
    baseline_score: float,
    run: _Run,
    capture: _Captured | None,
    spec: _RunSpec,
) -> PairedResult:
    """One sacreBLEU `Result` (score, p_value, mean, ci) as a `PairedResult`."""
    tests: tuple[PairedPValue, ...] = ()
    if capture is not None:
        stats, observed = capture
        test = PairedPValue(
            test=spec.test,
            n_samples=spec.n_samples,
            seed=spec.seed,
            delta=float(row.score) - baseline_score,
            p_sacrebleu=float(row.p_value),
            p_value=decision_p(spec.test, stats, observed),
            signature=run.signatures[label],
        )
        tests = (test,)
    mean, half = float(row.mean), float(row.ci)
    return PairedResult(
        system=system,
        metric=label,
        key=metric,
        higher_is_better=HIGHER_IS_BETTER[metric],
        is_baseline=capture is None,
        score=float(row.score),
        ci_mean=mean,
        ci_halfwidth=half,
        ci_low=mean - half,
        ci_high=mean + half,
        ci_resamples=spec.n_confidence,
        signature=run.signatures[label],
        tests=tests,
    )


def _results_from_run(
    run: _Run, metrics: Sequence[MetricName], spec: _RunSpec
) -> list[PairedResult]:
    """Turn PairedTest's table (``{"System": [...], "BLEU": [Result, ...], ...}``) into results."""
    systems = list(run.table["System"])
    labels = [key for key in run.table if key != "System"]
    results = []
    for m, (metric, label) in enumerate(zip(metrics, labels, strict=True)):
        column = run.table[label]
        baseline_score = float(column[0].score)
        for s, system in enumerate(systems):
            capture = run.captured[(s - 1) * len(metrics) + m] if s > 0 else None
            results.append(
                _result_row(column[s], system, metric, label, baseline_score, run, capture, spec)
            )
    return results


def paired_tests(
    hypotheses: Mapping[str, Sequence[str]],
    references: Sequence[str],
    settings: PairedSettings = DEFAULT_PAIRED,
) -> list[PairedResult]:
    """Paired tests over sentences of every system against the first (the baseline).

    Runs `sacrebleu.significance.PairedTest` as ``sacrebleu REF -i BASE SYS... -m METRICS
    --paired-bs`` (``"bs"``, ``bs_samples`` resamples) or ``--paired-ar`` (``"ar"``,
    ``ar_trials`` trials) does with ``SACREBLEU_SEED=seed``; ``"both"`` runs both (``settings``
    holds these, `PairedSettings`). The result of
    a system and metric holds its score, sacreBLEU's bootstrap 95% interval (from the ``bs``
    resamples; for ``"ar"`` alone from ``bs_samples`` extra resamples, as PairedTest's
    ``n_ar_confidence`` does) and, except for the baseline, the p-value of each test. Results are
    ordered by metric, then system. ``lowercase`` applies to BLEU and chrF; TER is
    case-insensitive (sacreBLEU's default). ``tokenize`` and ``trg_lang`` are BLEU's.
    ``seed=None`` seeds from the OS, as ``SACREBLEU_SEED=None`` does.
    """
    metrics, method, bs_samples, ar_trials, seed = (
        settings.metrics,
        settings.method,
        settings.bs_samples,
        settings.ar_trials,
        settings.seed,
    )
    check_systems(hypotheses, references)
    names = check_metrics(metrics)
    check_resampling(method, bs_samples, ar_trials, seed)
    named: list[tuple[str, Sequence[str]]] = [(n, list(h)) for n, h in hypotheses.items()]
    built: dict[str, Metric] = {
        n: _make_metric(n, references, settings.lowercase, settings.tokenize, settings.trg_lang)
        for n in names
    }
    runs: list[list[PairedResult]] = []
    specs = (
        _RunSpec("bs", bs_samples, bs_samples, seed),
        _RunSpec("ar", ar_trials, bs_samples, seed),
    )
    for spec in specs:
        if method in (spec.test, "both"):
            runs.append(_results_from_run(_run_paired_test(named, built, spec), names, spec))
    if len(runs) == 1:
        return runs[0]
    # both: the bootstrap run's scores and intervals, the tests of both runs
    return [
        dataclasses.replace(bs, tests=bs.tests + ar.tests)
        for bs, ar in zip(runs[0], runs[1], strict=True)
    ]
