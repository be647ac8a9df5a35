"""The significance section of a sweep report: every encoding against the baseline on the same
test sentences, per seed over sentences and over seeds (seq2seq.evaluation.seeds.compare_splits),
with Holm's correction over all the report's comparisons. Used by scripts/compare_runs.py.

The test sets are the sentences every run translated (each run's `{split}.hyp`, the splits of
`data.test` in order): with `--length-by tokens` (runs trained on sources of at most L tokens)
the sentences over L ("long") and those within L, counted with the run's tokenizer, which is
rebuilt from the run's config and checked against the counts and BLEU the run itself wrote to
results.json; otherwise each test split whole. The j-th seed of every encoding is paired with the
j-th seed of the baseline (seeds in increasing order); an encoding that lacks one of the seeds
the others share is left out of the tests and named.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from sweep_report import Job, ordered

from seq2seq.config.schema import DataConfig, TokenizerConfig, resolve_path
from seq2seq.data.prepare import tokenizers_for, train_files
from seq2seq.errors import UserError
from seq2seq.evaluation.scoring import bucket_cell
from seq2seq.evaluation.seeds import Report, compare_splits, render_markdown, report_to_dict
from seq2seq.evaluation.significance import PairedSettings

Reader = Callable[[DataConfig, str], list[tuple[str, str]]]


def settings_for(method: str, bs_samples: int, ar_trials: int) -> PairedSettings:
    """The report's tests: BLEU and chrF (cased, as training scores them), sacreBLEU's paired
    bootstrap ("bs"), approximate randomization ("ar") or both, with these resamples."""
    return PairedSettings(
        metrics=("bleu", "chrf"),
        method=method,  # type: ignore[arg-type]
        bs_samples=bs_samples,
        ar_trials=ar_trials,
    )


@dataclasses.dataclass(frozen=True)
class Translations:
    """A finished job's test sentences over all its test splits: references, its hypotheses,
    the test sets (name -> sentence indices) and, counted by source tokens (``by="tokens"``),
    each source's length in the run's tokens (else empty)."""

    refs: list[str]
    hyps: list[str]
    sets: dict[str, list[int]]
    lens: list[int] = dataclasses.field(default_factory=list)


def read_hyps(path: Path) -> list[str]:
    """One hypothesis per line; only "\\n" separates lines (hypotheses may hold other breaks)."""
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    return lines[:-1] if text.endswith("\n") else lines


def source_lengths(job: Job, sources: list[str]) -> list[int]:
    """Source tokens of each sentence with the job's tokenizer, rebuilt from its config (trained
    again, or found in the tokenizer cache, as training did)."""
    cfg = OmegaConf.load(job.path / ".hydra" / "config.yaml")
    merged = OmegaConf.merge(OmegaConf.structured(TokenizerConfig), cfg.get("tokenizer", {}))
    tok: TokenizerConfig = OmegaConf.to_object(merged)  # type: ignore[assignment]
    assert job.data is not None
    src_tok, _ = tokenizers_for(tok, train_files(job.data), resolve_path(tok.cache_dir))
    return [len(ids) for ids in src_tok.encode_batch(sources)]


def length_sets(
    job: Job, lens: list[int], refs: list[str], hyps: list[str]
) -> dict[str, list[int]]:
    """{"long (> L)": sources over the cap L, "short (<= L)": the others}, checked against the
    run's own results.json ("length": its long split's size and BLEU)."""
    length = (job.results or {})["length"]
    cap = int(length["max_src_len"])
    long = [i for i, n in enumerate(lens) if n > cap]
    within = [i for i, n in enumerate(lens) if n <= cap]
    mine = bucket_cell([hyps[i] for i in long], [refs[i] for i in long])
    wrote = length["long"]
    if mine["n"] != wrote["n"] or not math.isclose(float(mine["bleu"]), float(wrote["bleu"])):
        raise SystemExit(
            f"compare_runs: {job.path}: the tokenizer rebuilt from .hydra/config.yaml finds "
            f"{mine['n']} long sentences (BLEU {mine['bleu']}) but the run wrote {wrote['n']} "
            f"(BLEU {wrote['bleu']}) to results.json: its tokenizer cannot be rebuilt here"
        )
    return {f"long (> {cap} tokens)": long, f"short (<= {cap} tokens)": within}


def translations(job: Job, read: Reader, by: str) -> Translations:
    """The job's sentences over its test splits and its test sets (see the module docstring)."""
    assert job.data is not None
    res = job.results or {}
    splits = (res.get("length") or {}).get("splits") or list(res.get("test") or job.data.test)
    srcs, refs, hyps, sets = [], [], [], {}
    for split in splits:
        pairs = read(job.data, split)
        split_hyps = read_hyps(job.path / f"{split}.hyp")
        if len(split_hyps) != len(pairs):
            raise ValueError(
                f"{job.path / f'{split}.hyp'} has {len(split_hyps)} lines, "
                f"the split has {len(pairs)}"
            )
        sets[split] = list(range(len(refs), len(refs) + len(pairs)))
        srcs += [s for s, _ in pairs]
        refs += [r for _, r in pairs]
        hyps += split_hyps
    if by != "tokens":
        return Translations(refs, hyps, sets)
    lens = source_lengths(job, srcs)
    return Translations(refs, hyps, length_sets(job, lens, refs, hyps), lens)


def paired_systems(jobs: list[Job], labels: list[str]) -> tuple[dict[str, list[Job]], list[str]]:
    """Each label's jobs on the seeds every label has (in seed order), and notes on the labels
    left out for lacking a seed the baseline (the first label) has."""
    by_label = {lab: {j.seed: j for j in jobs if j.label == lab} for lab in labels}
    seeds = sorted(by_label[labels[0]], key=lambda s: (s is None, s))
    notes = []
    for lab in labels[1:]:
        if missing := [s for s in seeds if s not in by_label[lab]]:
            notes.append(f"{lab} is not tested: it has no finished run for seed(s) {missing}")
    kept = [lab for lab in labels if all(s in by_label[lab] for s in seeds)]
    return {lab: [by_label[lab][s] for s in seeds] for lab in kept}, notes


def run_tests(
    systems: dict[str, list[Job]], read: Reader, by: str, settings: PairedSettings
) -> Report:
    """compare_splits over every test set, the first system the baseline."""
    runs = {lab: [translations(j, read, by) for j in js] for lab, js in systems.items()}
    first = next(iter(runs.values()))[0]
    for lab, ts in runs.items():
        for t, job in zip(ts, systems[lab], strict=True):
            if t.refs != first.refs or t.sets != first.sets:
                raise SystemExit(f"compare_runs: {job.path} translated other test sentences")
    tests = {
        name: (
            {lab: [[t.hyps[i] for i in idx] for t in ts] for lab, ts in runs.items()},
            [first.refs[i] for i in idx],
        )
        for name, idx in first.sets.items()
    }
    seeds = [str(j.seed) for j in next(iter(systems.values()))]
    return compare_splits(tests, settings, seed_names=seeds)


def significance_section(
    jobs: list[Job], labels: list[str], read: Reader, by: str, settings: PairedSettings
) -> tuple[list[str], dict[str, Any] | None]:
    """The report's "Significance" lines and the report as a dict (None when nothing could be
    tested). ``labels[0]`` is the baseline."""
    done = [j for j in jobs if j.problem is None]
    systems, notes = paired_systems(done, labels)
    n_seeds = len(next(iter(systems.values()), []))
    intro = [
        f"Every encoding against **{labels[0]}** on the same test sentences: sacreBLEU's paired "
        "tests over sentences for each seed, and a t-test over seeds whose noise is the pooled "
        "variance of all encodings; Holm's correction runs over every comparison below. A "
        "difference is called only where both tests survive it and every seed agrees.",
        "",
        *(f"- {n}" for n in notes),
    ]
    if len(systems) < 2 or n_seeds < 2:
        why = f"{n_seeds} seed(s) shared by {len(systems)} encoding(s)"
        return [
            *intro,
            "",
            f"Not tested: the tests need two encodings with two or more seeds in common ({why}).",
        ], None
    try:
        report = run_tests(systems, read, by, settings)
    except (OSError, UserError) as err:
        return [*intro, "", f"Not tested: a run's translations cannot be read ({err})."], None
    return [*intro, "", render_markdown(report).rstrip("\n")], report_to_dict(report)


def labels_for_tests(labels: list[str], baseline: str | None) -> list[str]:
    """The baseline first (given, else the first label), then the others in the given order."""
    first = baseline if baseline in labels else labels[0]
    return ordered([first, *labels])
