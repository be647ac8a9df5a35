"""Comparing systems trained with several seeds each against a baseline: is a difference on this
test set (significance.py, every seed's outputs) *and* over training seeds (stats.seed_tests)?

`compare` calls a difference real only where the sentence-level test *and* the seed-level test
both survive Holm's correction (stats.holm) over the report's comparisons at ``alpha``, and every
seed's outputs differ in the same direction. The sentence-level p of a comparison is the largest
p over seeds (and over methods, with ``method="both"``): the intersection-union test (Berger,
1982) of "the difference holds for every seed", valid without any assumption on how the seeds
depend on each other. The verdict words are computed from those numbers, and each verdict's text
gives the numbers behind it. `render_markdown` and `report_to_dict` show the report.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from seq2seq.data.text import DataError
from seq2seq.evaluation.comparison import (
    INTERVAL_NOTE,
    VerdictWord,
    check_alpha,
    fmt_p,
    plain,
    resolution_note,
    signatures,
)
from seq2seq.evaluation.significance import (
    DEFAULT_PAIRED,
    TEST_NAMES,
    Method,
    PairedResult,
    PairedSettings,
    paired_tests,
)
from seq2seq.evaluation.stats import SeedResult, holm, seed_tests


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The call on one (system, metric) comparison, with the numbers it was computed from.

    ``sentence_p`` is the largest decision p-value over seeds and methods, ``seed_p`` the
    seed-level t-test's; the ``*_holm`` values are Holm-adjusted over the report's comparisons.
    ``consistent`` says whether every seed's outputs moved the score in the direction of the mean
    difference. ``text`` is ``verdict`` followed by the numbers behind it.
    """

    system: str
    metric: str
    verdict: VerdictWord
    text: str
    sentence_p: float
    sentence_p_holm: float
    seed_p: float
    seed_p_holm: float
    consistent: bool


@dataclasses.dataclass(frozen=True)
class Report:
    """Everything `compare` computed: per-seed paired tests, seed-level tests and verdicts.

    ``paired[j]`` holds the sentence-level results of the j-th seed's outputs (one
    `PairedResult` per system and metric; their ``p_holm`` is unset, the verdicts hold the
    Holm-adjusted values); ``seed_level`` one `SeedResult` per non-baseline system and metric;
    ``notes`` says what the numbers can and cannot show; ``seed_names[j]`` names the j-th
    outputs (the training seed when the caller gave it, else "#1", "#2", ...).
    """

    baseline: str
    systems: tuple[str, ...]
    metrics: tuple[str, ...]
    method: Method
    alpha: float
    n_seeds: int
    seed_names: tuple[str, ...]
    paired: tuple[tuple[PairedResult, ...], ...]
    seed_level: tuple[SeedResult, ...]
    verdicts: tuple[Verdict, ...]
    notes: tuple[str, ...]


def _per_seed_paired(
    outputs: Mapping[str, Sequence[Sequence[str]]],
    n_references: int,
    run: Callable[[Mapping[str, Sequence[str]]], list[PairedResult]],
) -> list[list[PairedResult]]:
    """Run the sentence-level paired tests of each seed: the j-th outputs of all systems."""
    counts = {name: len(runs) for name, runs in outputs.items()}
    if len(set(counts.values())) != 1 or min(counts.values(), default=0) < 2:
        raise DataError(f"need the same number (>= 2) of seed outputs for every system: {counts}")
    if any(isinstance(runs, str) or isinstance(runs[0], str) for runs in outputs.values()):
        raise DataError("outputs must map each system to a list of per-seed lists of lines")
    per_seed = []
    for j in range(min(counts.values())):
        hypotheses = {name: runs[j] for name, runs in outputs.items()}
        for name, hyps in hypotheses.items():
            if len(hyps) != n_references:
                raise DataError(
                    f"system {name!r}, seed output {j}, has {len(hyps)} lines but the references "
                    f"have {n_references}: every system must translate the same test sentences"
                )
        per_seed.append(run(hypotheses))
    return per_seed


def _reasons(
    sentence_holm: float, seed_holm: float, gain: float, consistent: bool, alpha: float
) -> list[str]:
    """Why a comparison is not called a difference (empty: it is one)."""
    return [
        text
        for failed, text in (
            (sentence_holm > alpha, f"sentence level: Holm-adjusted p > {alpha}"),
            (seed_holm > alpha, f"seed level: Holm-adjusted p > {alpha}"),
            (gain == 0, "the means are equal"),
            (gain != 0 and not consistent, "the seeds' outputs differ in direction"),
        )
        if failed
    ]


def _verdict(
    seed_result: SeedResult,
    paired: list[PairedResult],
    p_values: tuple[float, float, float, float],
    alpha: float,
) -> Verdict:
    """Call one comparison from its numbers: both tests significant after Holm, same direction."""
    sentence_p, sentence_holm, seed_p, seed_holm = p_values
    sign = 1.0 if paired[0].higher_is_better else -1.0
    gain = sign * seed_result.delta
    consistent = gain != 0 and all(sign * t.delta * gain > 0 for r in paired for t in r.tests)
    reasons = _reasons(sentence_holm, seed_holm, gain, consistent, alpha)
    word: VerdictWord = "no difference shown" if reasons else "better" if gain > 0 else "worse"
    tests = ", ".join(
        f"{TEST_NAMES[t.test]} p={fmt_p(max(r.tests[i].p_value for r in paired))}"
        for i, t in enumerate(paired[0].tests)
    )
    s = seed_result
    text = (
        f"{word} (sentence level: {tests} (max over {len(paired)} seeds), Holm-adjusted "
        f"{fmt_p(sentence_holm)}; seed level: {s.test}, delta={s.delta:+.2f} "
        f"[{s.ci_low:+.2f}, {s.ci_high:+.2f}], p={fmt_p(seed_p)}, Holm-adjusted "
        f"{fmt_p(seed_holm)}" + "".join(f"; {r}" for r in reasons) + ")"
    )
    return Verdict(
        system=s.system,
        metric=s.metric,
        verdict=word,
        text=text,
        sentence_p=sentence_p,
        sentence_p_holm=sentence_holm,
        seed_p=seed_p,
        seed_p_holm=seed_holm,
        consistent=consistent,
    )


Outputs = Mapping[str, Sequence[Sequence[str]]]


def compare(
    outputs: Outputs,
    references: Sequence[str],
    settings: PairedSettings = DEFAULT_PAIRED,
    *,
    alpha: float = 0.05,
    blocked_seeds: bool = False,
    seed_names: Sequence[str] | None = None,
) -> Report:
    """Compare systems trained with several seeds against the first system (the baseline).

    ``outputs`` maps each system to its translations of ``references``, one list of lines per
    training seed (the same number of seeds for every system; the j-th outputs of the systems
    are tested against each other). Each seed's outputs get `paired_tests` (run as ``settings``
    says); the per-seed corpus scores get `seed_tests` (pooled, or ``blocked_seeds``). Over the
    report's comparisons (every non-baseline system and metric), the sentence-level p-values
    (max over seeds and methods) and the seed-level p-values are each Holm-adjusted; a
    difference is "better" or "worse" only where both adjusted p-values are at most ``alpha``
    and all seeds agree on its direction. ``seed_names`` labels the seeds in the per-seed table.
    """
    tests = {"": (outputs, references)}
    return compare_splits(
        tests, settings, alpha=alpha, blocked_seeds=blocked_seeds, seed_names=seed_names
    )


def compare_splits(
    tests: Mapping[str, tuple[Outputs, Sequence[str]]],
    settings: PairedSettings = DEFAULT_PAIRED,
    *,
    alpha: float = 0.05,
    blocked_seeds: bool = False,
    seed_names: Sequence[str] | None = None,
) -> Report:
    """`compare` on several test sets at once, as one report: Holm over all their comparisons.

    ``tests`` maps a test set's name (a split, a length bucket) to (outputs, references) as
    `compare` takes them; every test set holds the same systems, in the same order, with the
    same number of seeds. With more than one test set each comparison's metric reads
    "<metric> on <name>" (e.g. "BLEU on long"), so the report has one comparison per system,
    metric and test set, and the Holm correction runs over all of them.
    """
    check_alpha(alpha)
    if not tests:
        raise DataError("no test set to compare the systems on")
    per_seed: list[list[PairedResult]] = []
    systems = tuple(next(iter(tests.values()))[0])
    for name, (outputs, references) in tests.items():
        if tuple(outputs) != systems:
            raise DataError(
                f"test set {name!r} has the systems {list(outputs)}, the first one {list(systems)}:"
                " every test set must hold the same systems in the same order"
            )
        run_set = functools.partial(paired_tests, references=references, settings=settings)
        runs = _per_seed_paired(outputs, len(references), run_set)
        if len(tests) > 1:
            runs = [
                [dataclasses.replace(r, metric=f"{r.metric} on {name}") for r in rs] for rs in runs
            ]
        if per_seed and len(runs) != len(per_seed):
            raise DataError(f"test set {name!r} has {len(runs)} seeds, the first {len(per_seed)}")
        per_seed = [a + b for a, b in zip(per_seed, runs, strict=True)] if per_seed else runs
    names = tuple(seed_names) if seed_names is not None else _default_names(len(per_seed))
    if len(names) != len(per_seed):
        raise DataError(f"{len(names)} seed names for {len(per_seed)} seeds' outputs: {names}")
    seed_level, paired = _seed_level(per_seed, systems, blocked_seeds)
    s = settings
    note = resolution_note(s.method, s.bs_samples, s.ar_trials, len(seed_level), alpha)
    return _report(systems, (per_seed, names), seed_level, paired, s.method, alpha, note)


def _default_names(n: int) -> tuple[str, ...]:
    """The j-th outputs' label when the caller did not name the seeds: "#1", "#2", ..."""
    return tuple(f"#{j + 1}" for j in range(n))


def _seed_level(
    per_seed: list[list[PairedResult]], systems: tuple[str, ...], blocked: bool
) -> tuple[list[SeedResult], list[list[PairedResult]]]:
    """Seed-level tests of each metric's per-seed scores, and each comparison's paired results."""
    labels = tuple(dict.fromkeys(r.metric for r in per_seed[0]))
    rows = {
        key: [r for results in per_seed for r in results if (r.system, r.metric) == key]
        for key in itertools.product(systems, labels)
    }
    seed_level = [
        result
        for label in labels
        for result in seed_tests(
            {s: [r.score for r in rows[s, label]] for s in systems}, blocked=blocked, metric=label
        )
    ]
    return seed_level, [rows[s.system, s.metric] for s in seed_level]


def _report(
    systems: tuple[str, ...],
    seeds: tuple[list[list[PairedResult]], tuple[str, ...]],
    seed_level: list[SeedResult],
    paired: list[list[PairedResult]],
    method: Method,
    alpha: float,
    note: str | None,
) -> Report:
    """Holm-adjust both families of p-values, call each comparison and assemble the report.
    ``seeds`` is each seed's sentence-level results and the seeds' names."""
    per_seed, names = seeds
    sentence_p = [max(t.p_value for r in rows for t in r.tests) for rows in paired]
    seed_p = [s.p_value for s in seed_level]
    sentence_holm, seed_holm = holm(sentence_p), holm(seed_p)
    verdicts = tuple(
        _verdict(s, rows, (sentence_p[i], sentence_holm[i], seed_p[i], seed_holm[i]), alpha)
        for i, (s, rows) in enumerate(zip(seed_level, paired, strict=True))
    )
    return Report(
        baseline=systems[0],
        systems=systems,
        metrics=tuple(dict.fromkeys(r.metric for r in per_seed[0])),
        method=method,
        alpha=alpha,
        n_seeds=len(per_seed),
        seed_names=names,
        paired=tuple(tuple(run) for run in per_seed),
        seed_level=tuple(seed_level),
        verdicts=verdicts,
        notes=_NOTES + ((note,) if note else ()),
    )


_NOTES = (
    INTERVAL_NOTE,
    "Sentence-level p: two-sided, ties counting as extreme (paired bootstrap: twice sacreBLEU's"
    " p); the largest over seeds (and methods). sacreBLEU's own values are in the JSON.",
    "Seed-level p and interval: t-test of the difference of means over training seeds.",
    "Both are Holm-adjusted over the report's comparisons; a difference is called only where"
    " both adjusted p-values are at most alpha and every seed agrees on its direction.",
)


def _markdown_cell(text: str) -> str:
    return text.replace("|", "\\|")


def _paired_rows(report: Report) -> list[str]:
    """The per-seed sentence-level table's rows."""
    lines = []
    for name, run in zip(report.seed_names, report.paired, strict=True):
        for r in run:
            bs, ar = ("-" if p is None else fmt_p(p) for p in (r.p_value("bs"), r.p_value("ar")))
            lines.append(
                f"| {_markdown_cell(name)} | {_markdown_cell(r.system)} | {r.metric} | "
                f"{r.score:.2f} | {r.ci_mean:.2f} +- {r.ci_halfwidth:.2f} | {bs} | {ar} |"
            )
    return lines


def render_markdown(report: Report) -> str:
    """The report as Markdown: verdict table, per-seed sentence-level table, notes."""
    lines = [
        f"Baseline: {_markdown_cell(report.baseline)}; {report.n_seeds} seeds per system; "
        f"alpha = {report.alpha} after Holm over {len(report.verdicts)} comparisons per test.",
        "",
        "| System | Metric | Seed-level delta [95% CI] | Verdict |",
        "|---|---|---|---|",
    ]
    by_key = {(s.system, s.metric): s for s in report.seed_level}
    for verdict in report.verdicts:
        s = by_key[(verdict.system, verdict.metric)]
        lines.append(
            f"| {_markdown_cell(s.system)} | {s.metric} | {s.delta:+.2f} "
            f"[{s.ci_low:+.2f}, {s.ci_high:+.2f}] | {_markdown_cell(verdict.text)} |"
        )
    lines += ["", "| Seed | System | Metric | Score | Bootstrap 95% CI | p (bs) | p (ar) |"]
    lines += ["|---|---|---|---|---|---|---|", *_paired_rows(report)]
    sigs = signatures(report.paired[0]).items()
    lines += ["", "sacreBLEU signatures:", "", *(f"- {m}: `{s}`" for m, ss in sigs for s in ss)]
    lines += ["", *(f"- {note}" for note in report.notes)]
    return "\n".join(lines) + "\n"


def report_to_dict(report: Report) -> dict[str, Any]:
    """The report as plain dicts, lists, strings and numbers (``json.dumps`` takes it), with the
    sacreBLEU signatures by metric."""
    return {**plain(dataclasses.asdict(report)), "signatures": signatures(report.paired[0])}
