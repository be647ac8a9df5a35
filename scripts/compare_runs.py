"""Compare the jobs of a Hydra sweep: a CSV, a Markdown report and a BLEU-by-length plot.

Usage:
    python scripts/compare_runs.py --latest
    python scripts/compare_runs.py SWEEP_DIR [SWEEP_DIR ...] [--out DIR]
        [--length-by words|items|tokens] [--baseline ENCODING] [--reference SWEEP_DIR]
        [--method bs|ar|both] [--bs-samples N] [--ar-trials N] [--curves] [--title TEXT]
        [--doc FILE.md [--doc-name NAME]]

A sweep folder holds one folder per job (`<num>_<overrides>/`, written by `seq2seq-train -m`).
Each finished job has `results.json` and one `{split}.hyp` per test split; this script re-scores
every hypothesis file against the split's references with sacreBLEU, on the whole split and per
source-length bucket, groups the jobs by positional encoding and averages over seeds. Jobs without
results.json are reported, not skipped.

BLEU is training's corpus BLEU (13a, cased) with sacreBLEU's `effective_order`: the same number
whenever the references hold 4-grams, but not 0 by definition for a bucket of references shorter
than 4 tokens (one or two numbers of the numbers data).

`--length-by tokens` is for runs trained short (data.train_max_src_len, make sweep-multi30k): their
results.json holds the test splits scored together by source-token bucket and on the "long" split
(sources over the cap), computed by training with the run's own tokenizer; the report reads those
and the whole test splits' scores. `--reference` adds the jobs of another sweep under their
encoding's name + " (all lengths)": the same model trained on every length (make sweep-multi30k's
reference), scored on the same buckets. `--curves` adds validation BLEU by step
(train_log.jsonl) as a table and valid_bleu_by_step.png, and each run's wall time.

The significance section (scripts/sweep_significance.py) tests every encoding against
`--baseline` (default: the best on the first split) on the same sentences: sacreBLEU's paired
bootstrap and/or approximate randomization for each seed, a pooled-variance t-test over seeds,
Holm's correction over all the report's comparisons; significance.json holds every number.

Outputs (into --out, default the first sweep folder): comparison.csv (long format, one row per
encoding, seed, split and bucket), comparison.md (also printed), significance.json and
bleu_by_length.png. `--doc FILE.md` also writes the report's tables and tests into that document
between its `<!-- report:NAME start -->` and `end` markers (NAME: --doc-name, by default --out's
path under docs/), so the document's tables are the report's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

from omegaconf import DictConfig, OmegaConf
from sweep_curves import curve_lines, plot_curves, read_curves, runs_lines, valid_set
from sweep_report import (
    Job,
    Row,
    doc_section,
    failed_lines,
    plot_bleu_by_length,
    rank_encodings,
    render_markdown,
    write_csv,
    write_doc,
)
from sweep_significance import (
    labels_for_tests,
    read_hyps,
    settings_for,
    significance_section,
    translations,
)

from seq2seq.config.schema import DataConfig, resolve_path
from seq2seq.errors import UserError
from seq2seq.evaluation.scoring import (
    bucket_scores,
    leading_int,
    length_generalization,
    length_groups,
)
from seq2seq.train.corpus import read_split

Reader = Callable[[DataConfig, str], list[tuple[str, str]]]


def latest_sweep(base: Path) -> Path:
    """The newest `base/<name>/<timestamp>` folder: latest timestamp name, then mtime."""
    sweeps = [p for p in base.glob("*/*") if p.is_dir()]
    if not sweeps:
        raise SystemExit(f"compare_runs: no sweep folder under {base}/*/* (run `make sweep`)")
    return max(sweeps, key=lambda p: (p.name, p.stat().st_mtime))


def find_job_dirs(sweep: Path) -> list[Path]:
    """Job folders of a sweep (those with .hydra/ or results.json); a job folder is itself."""
    is_job = lambda p: (p / ".hydra").is_dir() or (p / "results.json").is_file()  # noqa: E731
    if is_job(sweep):
        return [sweep]
    jobs = [p for p in sweep.iterdir() if p.is_dir() and is_job(p)]
    return sorted(jobs, key=lambda p: (leading_int(p.name), p.name))


# positional switches that change an encoding without changing its kind, with their defaults
POS_SWITCHES = {"alibi_directional": False, "share_layers": None, "t5_zero_init": False}


def side_label(cfg: DictConfig, section: str) -> str | None:
    """`kind`, with `[key=value]` for each switch of POS_SWITCHES set away from its default."""
    kind = OmegaConf.select(cfg, f"{section}.kind", default=None)
    if kind is None:
        return None
    changed = [
        f"{key}={value}"
        for key, default in POS_SWITCHES.items()
        if (value := OmegaConf.select(cfg, f"{section}.{key}", default=default)) != default
    ]
    return f"{kind}[{','.join(changed)}]" if changed else str(kind)


def encoding_label(cfg: DictConfig) -> str:
    """`pos_encoding.kind`, or `enc=<k>/dec=<k>` when encoder_pos / decoder_pos override it;
    a kind with a switch changed reads e.g. `alibi[alibi_directional=True]`."""
    base = side_label(cfg, "pos_encoding") or "?"
    enc, dec = side_label(cfg, "encoder_pos"), side_label(cfg, "decoder_pos")
    if enc is None and dec is None:
        return base
    return f"enc={enc or base}/dec={dec or base}"


def load_job(path: Path, sweep: Path) -> Job:
    """Read a job folder's config and results.json; a missing or bad one sets `problem`."""
    job = Job(path, sweep, path.name if path == sweep else f"{sweep.name}/{path.name}")
    cfg_file = path / ".hydra" / "config.yaml"
    if not cfg_file.is_file():
        job.problem = "no .hydra/config.yaml"
        return job
    try:
        cfg = OmegaConf.load(cfg_file)
        job.label, job.seed = encoding_label(cfg), OmegaConf.select(cfg, "trainer.seed")
        merged = OmegaConf.merge(OmegaConf.structured(DataConfig), cfg.get("data", {}))
        job.data = OmegaConf.to_object(merged)
    except Exception as err:
        job.problem = f"unreadable .hydra/config.yaml: {err}"
        return job
    results_file = path / "results.json"
    if not results_file.is_file():
        job.problem = "no results.json (failed or unfinished)"
        return job
    try:
        job.results = json.loads(results_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        job.problem = f"unreadable results.json: {err}"
    return job


# ----------------------------------------------------------------------------- scoring


def make_row(job: Job, split: str, bucket: str, hyps: list[str], refs: list[str]) -> Row:
    """Corpus BLEU and chrF of one bucket (2 decimals, as in training), with job size and speed."""
    return _row(job, split, bucket, len(hyps), *bucket_scores(hyps, refs))


def _row(
    job: Job,
    split: str,
    bucket: str,
    n: int,
    bleu: float,
    chrf: float,
    len_ratio: float | None = None,
) -> Row:
    res = job.results or {}
    return Row(
        job.label,
        job.seed,
        job.run,
        split,
        bucket,
        n,
        bleu,
        chrf,
        res.get("params"),
        res.get("train_minutes"),
        res.get("train_tokens_per_s"),
        len_ratio,
    )


def bucket_rows(
    job: Job, split: str, pairs: list[tuple[str, str]], hyps: list[str], by: str
) -> list[Row]:
    """Rows for the whole split ("all") and for each non-empty length bucket."""
    refs = [ref for _, ref in pairs]
    rows = [make_row(job, split, "all", hyps, refs)]
    for bucket, idx in length_groups([src for src, _ in pairs], by).items():
        rows.append(make_row(job, split, bucket, [hyps[i] for i in idx], [refs[i] for i in idx]))
    return rows


def score_job(job: Job, by: str, read: Reader) -> tuple[list[Row], list[str]]:
    """Rows of every test split of a finished job, and notes on what could not be re-scored.

    A split whose hypotheses or references cannot be read keeps the scores of results.json
    for bucket "all" only.
    """
    rows: list[Row] = []
    notes: list[str] = []
    tests = (job.results or {}).get("test") or {}
    for split in list(tests) or list(job.data.test):
        hyp_file = job.path / f"{split}.hyp"
        try:
            pairs = read(job.data, split)
            hyps = read_hyps(hyp_file)
            if len(hyps) != len(pairs):
                raise ValueError(f"{hyp_file} has {len(hyps)} lines, the split has {len(pairs)}")
        except (OSError, ValueError) as err:
            notes.append(f"`{job.run}` {split}: not re-scored by length ({err})")
            if split in tests:
                t = tests[split]
                rows.append(_row(job, split, "all", t.get("n", 0), t["bleu"], t["chrf"]))
            continue
        rows.extend(bucket_rows(job, split, pairs, hyps, by))
    return rows, notes


def length_rows(job: Job, read: Reader) -> tuple[list[Row], list[str]]:
    """Rows of a run trained short (--length-by tokens): the test splits together, by
    source-token bucket, and the long split, scored again from the run's translations with its
    rebuilt tokenizer (checked against its results.json) on today's buckets, so that runs of any
    version share one table; results.json's "length" block where the translations are missing.
    Then each whole test split as results.json has it."""
    res = job.results or {}
    length = res.get("length")
    if not isinstance(length, dict):
        return [], [
            f'`{job.run}`: results.json has no "length" (not trained with data.train_max_src_len)'
        ]
    cap, joint, notes = length["max_src_len"], " + ".join(length["splits"]), []
    try:
        t = translations(job, read, "tokens")
        length = length_generalization(t.lens, t.hyps, t.refs, int(cap))
    except (OSError, ValueError, UserError) as err:
        notes.append(f"`{job.run}`: buckets as its results.json has them (not re-scored: {err})")
    long = length["long"]
    cell = lambda split, b, c: _row(  # noqa: E731
        job, split, b, c["n"], c["bleu"], c["chrf"], c.get("len_ratio")
    )
    rows = [cell(f"long (> {cap} tokens)", "all", long)]
    every = [("all", length["all"]), *length["buckets"].items()]
    rows += [cell(joint, b, c) for b, c in every]
    for split, scores in (res.get("test") or {}).items():
        rows.append(_row(job, split, "all", scores.get("n", 0), scores["bleu"], scores["chrf"]))
    return rows, notes


def cached_reader() -> Reader:
    """read_split, memoized per (root, languages, split): every job of a sweep shares the data."""
    cache: dict[tuple, list[tuple[str, str]]] = {}

    def read(data: DataConfig, split: str) -> list[tuple[str, str]]:
        key = (str(resolve_path(data.root)), data.src_lang, data.tgt_lang, split)
        if key not in cache:
            cache[key] = read_split(data, split)
        return cache[key]

    return read


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--latest", action="store_true", help="the newest multirun/*/* folder")
    where.add_argument(
        "sweeps",
        nargs="*",
        default=[],
        type=Path,
        metavar="SWEEP_DIR",
        help="sweep folder(s) to merge (or single job folders)",
    )
    parser.add_argument("--out", type=Path, help="output folder (default: the first sweep)")
    parser.add_argument(
        "--length-by",
        choices=["words", "items", "tokens"],
        default="words",
        help="bucket by source words (1-10, ..., 41+), comma-separated items, or read the "
        "source-token buckets of runs trained short (results.json's length)",
    )
    parser.add_argument(
        "--baseline", help="test each encoding against this one (default: the best)"
    )
    parser.add_argument(
        "--reference",
        type=Path,
        help="a sweep of runs trained on every length, reported as '<encoding> (all lengths)'",
    )
    parser.add_argument("--method", choices=["bs", "ar", "both"], default="both")
    parser.add_argument("--bs-samples", type=int, default=1000, help="paired bootstrap resamples")
    parser.add_argument("--ar-trials", type=int, default=10000, help="randomization trials")
    parser.add_argument(
        "--curves", action="store_true", help="add validation BLEU by step and wall times"
    )
    parser.add_argument("--title", help="title of the report and the plot")
    parser.add_argument(
        "--doc",
        type=Path,
        help="also write the report's tables and tests into this Markdown file, between its "
        "<!-- report:NAME start/end --> markers",
    )
    parser.add_argument(
        "--doc-name", help="the markers' NAME (default: the --out folder's path under docs/)"
    )
    return parser.parse_args(argv)


def doc_name(out: Path) -> str:
    """The marker name of a report folder: its path under docs/ (else its own name)."""
    parts = out.resolve().parts
    return "/".join(parts[parts.index("docs") + 1 :]) if "docs" in parts else out.name


def sweep_dirs(args: argparse.Namespace) -> list[Path]:
    """The folders to read: --latest resolved, each one checked to exist."""
    sweeps = [latest_sweep(resolve_path("multirun"))] if args.latest else args.sweeps
    missing = [str(s) for s in sweeps if not s.is_dir()]
    if missing:
        raise SystemExit(f"compare_runs: not a folder: {', '.join(missing)}")
    return sweeps


def load_jobs(sweeps: list[Path], reference: Path | None) -> list[Job]:
    """Every job folder of the sweeps, and of the reference sweep as '<encoding> (all lengths)'."""
    jobs = [load_job(p, s) for s in sweeps for p in find_job_dirs(s)]
    if reference:
        for job in (refs := [load_job(p, reference) for p in find_job_dirs(reference)]):
            job.label += " (all lengths)"
        jobs += refs
    return jobs


def main(argv: list[str] | None = None) -> int:
    """Read the sweep(s), score, write comparison.csv/.md and bleu_by_length.png; 1 if no job."""
    args = parse_args(argv)
    sweeps = sweep_dirs(args)
    jobs = load_jobs(sweeps, args.reference)
    done = [j for j in jobs if j.problem is None]
    if not done:
        found = f"{len(jobs)} job folder(s), none finished" if jobs else "no job folder"
        print(
            f"compare_runs: no finished job (with results.json) in "
            f"{', '.join(map(str, sweeps))}: {found}",
            file=sys.stderr,
        )
        for line in failed_lines(jobs) if jobs else []:
            print(line, file=sys.stderr)
        return 1
    rows, notes, read = [], [], cached_reader()
    for job in done:
        if args.length_by == "tokens":
            job_rows, job_notes = length_rows(job, read)
        else:
            job_rows, job_notes = score_job(job, args.length_by, read)
        rows += job_rows
        notes += job_notes
    if not rows:
        print("compare_runs: the finished jobs list no test split", file=sys.stderr)
        return 1
    out = args.out or sweeps[0]
    out.mkdir(parents=True, exist_ok=True)
    title = args.title or f"Positional encodings: {', '.join(s.name for s in sweeps)}"
    labels = labels_for_tests(rank_encodings(rows, [rows[0].split]), args.baseline)
    settings = settings_for(args.method, args.bs_samples, args.ar_trials)
    significance, tested = significance_section(jobs, labels, read, args.length_by, settings)
    report = render_markdown(title, rows, jobs, notes, args.length_by, significance)
    paths = [out / "comparison.csv", out / "comparison.md", out / "bleu_by_length.png"]
    paths.append(out / "significance.json")
    paths[-1].write_text(json.dumps(tested, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    if args.curves:
        curves = read_curves(done)
        lines = [*curve_lines(curves, valid_set(done)), "", *runs_lines(jobs)]
        report += "\n" + "\n".join(lines) + "\n"
        paths.append(out / "valid_bleu_by_step.png")
        plot_curves(curves, paths[-1], title)
    write_csv(rows, paths[0])
    paths[1].write_text(report, encoding="utf-8")
    if args.doc:
        link = Path(os.path.relpath(paths[1], args.doc.resolve().parent)).as_posix()
        write_doc(args.doc, args.doc_name or doc_name(out), doc_section(report, link))
        paths.append(args.doc)
    plot_bleu_by_length(rows, paths[2], title, args.length_by)
    print(report)
    print("\n".join(f"wrote {p}" for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
