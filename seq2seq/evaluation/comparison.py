"""Comparing one run per system with a baseline (what `seq2seq-evaluate hyp=[a,b,...]`
prints): sacreBLEU's paired tests (significance.py) of every system against the first, Holm-
adjusted, with verdict words computed from the numbers, as a text table or plain values for JSON
(seeds.py compares several training seeds per system).

**Multiplicity**: Holm's step-down correction (stats.holm) over all comparisons of one report,
every non-baseline system on every metric; with both tests, each test's p-values are adjusted
on their own (the two tests ask the same questions of the same outputs; they are not more
comparisons).

**Verdicts**: a difference is called "better" or "worse" when every test that was run finds it
at ``alpha`` after Holm, "no difference shown" otherwise: a statement about these outputs on
this test set, not about training the systems again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from seq2seq.errors import ConfigError
from seq2seq.evaluation.significance import (
    DEFAULT_PAIRED,
    TEST_NAMES,
    Method,
    PairedResult,
    PairedSettings,
    TestType,
    paired_tests,
)
from seq2seq.evaluation.stats import holm

VerdictWord = Literal["better", "worse", "no difference shown"]

INTERVAL_NOTE = (
    "Score intervals are sacreBLEU's bootstrap 95% intervals (bootstrap mean +- half the spread"
    " between the 2.5th and 97.5th percentile resamples): test-sentence sampling only."
)


def fmt_p(p: float) -> str:
    """A p-value to three decimals, or in scientific notation below 0.001."""
    return f"{p:.1e}" if p < 0.001 else f"{p:.3f}"


def check_alpha(alpha: float) -> None:
    """A family-wise level in (0, 1) (else ConfigError)."""
    if not 0.0 < alpha < 1.0:
        raise ConfigError(f"alpha must be in (0, 1), got {alpha}")


def resolution_note(
    method: Method, bs_samples: int, ar_trials: int, family: int, alpha: float
) -> str | None:
    """A note when the resamples are too few for any Holm-adjusted p to reach alpha."""
    floors = {"bs": 2.0 / (bs_samples + 1), "ar": 1.0 / (ar_trials + 1)}
    floor = max(v for k, v in floors.items() if method in (k, "both"))
    if floor * family <= alpha:
        return None
    return (
        f"the smallest attainable sentence-level p ({fmt_p(floor)}) times the {family} "
        f"comparisons exceeds alpha={alpha}: use more resamples to be able to show a difference"
    )


# ----------------------------------------------------------------------------- one run each


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One run per system, tested against the first: `paired_tests`' results (by metric, then
    system) with each test's ``p_holm`` set, Holm over the ``family`` non-baseline results."""

    baseline: str
    systems: tuple[str, ...]
    metrics: tuple[str, ...]
    method: Method
    bs_samples: int
    ar_trials: int
    seed: int | None
    alpha: float
    n_sentences: int
    family: int
    results: tuple[PairedResult, ...]
    notes: tuple[str, ...]


def with_holm(results: Sequence[PairedResult]) -> list[PairedResult]:
    """The results with every test's ``p_holm``: Holm over all non-baseline results, per test."""
    adjusted: dict[tuple[int, int], float] = {}
    for test in TEST_NAMES:
        family = [
            (i, j) for i, r in enumerate(results) for j, t in enumerate(r.tests) if t.test == test
        ]
        ps = holm([results[i].tests[j].p_value for i, j in family])
        adjusted.update(zip(family, ps, strict=True))
    return [
        dataclasses.replace(
            r,
            tests=tuple(
                dataclasses.replace(t, p_holm=adjusted[i, j]) for j, t in enumerate(r.tests)
            ),
        )
        for i, r in enumerate(results)
    ]


def sentence_verdict(result: PairedResult, alpha: float) -> VerdictWord | None:
    """ "better" or "worse" when every test's Holm-adjusted p is at most alpha; None for the
    baseline."""
    if result.is_baseline:
        return None
    delta = result.tests[0].delta
    shown = delta != 0 and all(t.p_holm is not None and t.p_holm <= alpha for t in result.tests)
    if not shown:
        return "no difference shown"
    return "better" if (delta > 0) == result.higher_is_better else "worse"


def compare_systems(
    hypotheses: Mapping[str, Sequence[str]],
    references: Sequence[str],
    settings: PairedSettings = DEFAULT_PAIRED,
    *,
    alpha: float = 0.05,
) -> Comparison:
    """Paired tests (significance.paired_tests) of every system against the first, one run
    each, Holm-adjusted over the report's comparisons (every other system on every metric)."""
    check_alpha(alpha)
    results = paired_tests(hypotheses, references, settings)
    family = sum(not r.is_baseline for r in results)
    note = resolution_note(settings.method, settings.bs_samples, settings.ar_trials, family, alpha)
    return Comparison(
        baseline=next(iter(hypotheses)),
        systems=tuple(hypotheses),
        metrics=tuple(dict.fromkeys(r.metric for r in results)),
        method=settings.method,
        bs_samples=settings.bs_samples,
        ar_trials=settings.ar_trials,
        seed=settings.seed,
        alpha=alpha,
        n_sentences=len(references),
        family=family,
        results=tuple(with_holm(results)),
        notes=_ONE_RUN_NOTES + ((note,) if note else ()),
    )


_ONE_RUN_NOTES = (
    INTERVAL_NOTE,
    "p: two-sided paired p against the baseline, ties counting as extreme (paired bootstrap:"
    " twice sacreBLEU's p, which the JSON keeps as p_sacrebleu); Holm: adjusted over the"
    " report's comparisons, per test.",
    "One run per system: a difference shown holds for these outputs on this test set; whether"
    " training again reproduces it needs several seeds per system.",
)


def signatures(results: Iterable[PairedResult]) -> dict[str, list[str]]:
    """sacreBLEU's signatures by metric: of the run behind the scores and intervals, then of
    each test's run (they differ in the resamples)."""
    out: dict[str, list[str]] = {}
    for r in results:
        sigs = out.setdefault(r.metric, [])
        sigs += [s for s in (r.signature, *(t.signature for t in r.tests)) if s not in sigs]
    return out


def _tests_of(method: Method) -> list[TestType]:
    return [t for t in TEST_NAMES if method in (t, "both")]


def _row(r: PairedResult, tests: list[TestType], alpha: float, width: int) -> str:
    """One table row: metric, system, score, interval; then delta, p, Holm p, verdict."""
    score = (
        f"{r.metric:<6}  {r.system:<{width}}  {r.score:6.2f}  [{r.ci_low:6.2f}, {r.ci_high:6.2f}]"
    )
    if r.is_baseline:
        return score
    by_test = {t.test: t for t in r.tests}
    ps = "".join(
        f"  {fmt_p(by_test[t].p_value):>7}  {fmt_p(by_test[t].p_holm or 1.0):>7}" for t in tests
    )
    return f"{score}  {r.tests[0].delta:+7.2f}{ps}  {sentence_verdict(r, alpha)}"


def render_comparison(c: Comparison) -> str:
    """The comparison as a text table (one row per metric and system), signatures, notes."""
    tests = _tests_of(c.method)
    counts = {"bs": f"{c.bs_samples} resamples", "ar": f"{c.ar_trials} trials"}
    runs = ", ".join(f"{TEST_NAMES[t]} ({counts[t]})" for t in tests)
    width = max(len(s) for s in c.systems)
    head = f"{'metric':<6}  {'system':<{width}}  {'score':>6}  {'95% interval':^16}  {'delta':>7}"
    head += "".join(f"  {'p ' + t:>7}  {'Holm ' + t:>7}" for t in tests) + "  verdict"
    lines = [
        f"baseline: {c.baseline}; {c.n_sentences} sentences; {runs}, seed {c.seed}; "
        f"alpha {c.alpha} after Holm over {c.family} comparisons",
        "",
        head,
        *(_row(r, tests, c.alpha, width) for r in c.results),
        "",
        *(f"{metric:<6}  {sig}" for metric, sigs in signatures(c.results).items() for sig in sigs),
        "",
        *(f"- {note}" for note in c.notes),
    ]
    return "\n".join(lines)


def plain(value: Any) -> Any:
    """Dicts, lists (tuples too, as lists), strings and numbers, as JSON has them."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def comparison_to_dict(c: Comparison) -> dict[str, Any]:
    """The comparison as plain values for JSON: each result gets its ``verdict``, and the
    signatures are listed by metric."""
    out: dict[str, Any] = plain(dataclasses.asdict(c))
    for row, r in zip(out["results"], c.results, strict=True):
        row["verdict"] = sentence_verdict(r, c.alpha)
    out["signatures"] = signatures(c.results)
    return out
