"""Compare the jobs of a Hydra sweep: a CSV, a Markdown report and a BLEU-by-length plot.

Usage:
    python scripts/compare_runs.py --latest
    python scripts/compare_runs.py SWEEP_DIR [SWEEP_DIR ...] [--out DIR]
        [--length-by words|items] [--title TEXT]

A sweep folder holds one folder per job (`<num>_<overrides>/`, written by `seq2seq-train -m`).
Each finished job has `results.json` and one `{split}.hyp` per test split; this script re-scores
every hypothesis file against the split's references with sacreBLEU, on the whole split and per
source-length bucket, groups the jobs by positional encoding and averages over seeds. Jobs without
results.json are reported, not skipped.

BLEU is training's corpus BLEU (13a, cased) with sacreBLEU's `effective_order`: the same number
whenever the references hold 4-grams, but not 0 by definition for a bucket of references shorter
than 4 tokens (one or two numbers of the numbers data).

Outputs (into --out, default the first sweep folder): comparison.csv (long format, one row per
encoding, seed, split and bucket), comparison.md (also printed) and bleu_by_length.png.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import statistics
import sys
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sacrebleu  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from seq2seq.build import read_split, resolve_path  # noqa: E402
from seq2seq.config import DataConfig  # noqa: E402

WORD_BUCKETS = ((1, 10), (11, 20), (21, 30), (31, 40))  # then "41+"
NOISE_T = 2.0  # |Welch t| above this counts as a difference beyond seed noise
DASH = "–"
BLEU = sacrebleu.BLEU(effective_order=True)  # see the module docstring
CHRF = sacrebleu.CHRF()
Reader = Callable[[DataConfig, str], list[tuple[str, str]]]


@dataclass
class Job:
    """One job folder of a sweep; `problem` says why it has no usable results."""

    path: Path
    sweep: Path  # the folder given on the command line
    run: str  # "<sweep>/<job folder>", unique across merged sweeps
    label: str = "?"
    seed: int | None = None
    data: DataConfig | None = None
    results: dict | None = None
    problem: str | None = None


@dataclass
class Row:
    """One line of comparison.csv: the scores of one job on one bucket of one split."""

    encoding: str
    seed: int | None
    run: str
    split: str
    bucket: str
    n_sentences: int
    bleu: float
    chrf: float
    params: int | None
    train_minutes: float | None
    train_tokens_per_s: float | None


# ----------------------------------------------------------------------------- finding jobs


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
    return sorted(jobs, key=lambda p: (_leading_int(p.name), p.name))


def encoding_label(cfg: DictConfig) -> str:
    """`pos_encoding.kind`, or `enc=<k>/dec=<k>` when encoder_pos / decoder_pos override it."""
    base = str(OmegaConf.select(cfg, "pos_encoding.kind", default="?"))
    enc = OmegaConf.select(cfg, "encoder_pos.kind", default=None)
    dec = OmegaConf.select(cfg, "decoder_pos.kind", default=None)
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


def count_items(src: str) -> int:
    """Number of comma-separated items in a source sentence (numbers data)."""
    return sum(1 for part in src.split(",") if part.strip())


def length_bucket(src: str, by: str) -> str:
    """Bucket label of a source sentence: its item count, or a word-count range."""
    if by == "items":
        return str(count_items(src))
    n = len(src.split())
    for lo, hi in WORD_BUCKETS:
        if n <= hi:
            return f"{lo}-{hi}"
    return f"{WORD_BUCKETS[-1][1] + 1}+"


def bucket_key(bucket: str) -> tuple[int, str]:
    """Sort key: "all" first, then buckets by their leading number."""
    return (-1, bucket) if bucket == "all" else (_leading_int(bucket), bucket)


def _leading_int(text: str) -> int:
    match = re.match(r"\d+", text)
    return int(match.group()) if match else sys.maxsize


def read_hyps(path: Path) -> list[str]:
    """One hypothesis per line; only "\\n" separates lines (hypotheses may hold other breaks)."""
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    return lines[:-1] if text.endswith("\n") else lines


def make_row(job: Job, split: str, bucket: str, hyps: list[str], refs: list[str]) -> Row:
    """Corpus BLEU and chrF of one bucket (2 decimals, as in training), with job size and speed."""
    bleu = round(BLEU.corpus_score(hyps, [refs]).score, 2)
    chrf = round(CHRF.corpus_score(hyps, [refs]).score, 2)
    return _row(job, split, bucket, len(hyps), bleu, chrf)


def _row(job: Job, split: str, bucket: str, n: int, bleu: float, chrf: float) -> Row:
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
    )


def bucket_rows(
    job: Job, split: str, pairs: list[tuple[str, str]], hyps: list[str], by: str
) -> list[Row]:
    """Rows for the whole split ("all") and for each non-empty length bucket."""
    refs = [ref for _, ref in pairs]
    groups: dict[str, list[int]] = {}
    for i, (src, _) in enumerate(pairs):
        groups.setdefault(length_bucket(src, by), []).append(i)
    rows = [make_row(job, split, "all", hyps, refs)]
    for bucket in sorted(groups, key=bucket_key):
        idx = groups[bucket]
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


def cached_reader() -> Reader:
    """read_split, memoized per (root, languages, split): every job of a sweep shares the data."""
    cache: dict[tuple, list[tuple[str, str]]] = {}

    def read(data: DataConfig, split: str) -> list[tuple[str, str]]:
        key = (str(resolve_path(data.root)), data.src_lang, data.tgt_lang, split)
        if key not in cache:
            cache[key] = read_split(data, split)
        return cache[key]

    return read


# ----------------------------------------------------------------------------- statistics


def mean_std(values: list[float]) -> tuple[float, float | None]:
    """Mean and sample standard deviation (n - 1); the std is None for a single value."""
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else None)


def fmt_mean_std(values: list[float], digits: int = 2) -> str:
    """ "m ± s" over seeds, "m" for one seed, a dash for none."""
    if not values:
        return DASH
    mean, std = mean_std(values)
    return f"{mean:.{digits}f}" if std is None else f"{mean:.{digits}f} ± {std:.{digits}f}"


def welch_t(a: list[float], b: list[float]) -> float | None:
    """Welch's t of mean(a) - mean(b); None when a side has fewer than two values."""
    if len(a) < 2 or len(b) < 2:
        return None
    (ma, sa), (mb, sb) = mean_std(a), mean_std(b)
    se = math.sqrt(sa**2 / len(a) + sb**2 / len(b))
    if se == 0:
        return 0.0 if ma == mb else math.copysign(math.inf, ma - mb)
    return (ma - mb) / se


def cell(rows: list[Row], label: str, split: str, bucket: str, metric: str = "bleu") -> list[float]:
    """The values of `metric` over the seeds of one encoding, split and bucket."""
    return [
        getattr(r, metric)
        for r in rows
        if (r.encoding, r.split, r.bucket) == (label, split, bucket)
    ]


def ordered(values: Iterable[str]) -> list[str]:
    """Distinct values in order of first appearance."""
    return list(dict.fromkeys(values))


def rank_encodings(rows: list[Row], splits: list[str]) -> list[str]:
    """Encodings by mean BLEU on the first test split, best first."""
    labels = ordered(r.encoding for r in rows)
    mean = lambda lab: statistics.fmean(cell(rows, lab, splits[0], "all") or [-math.inf])  # noqa: E731
    return sorted(labels, key=lambda lab: (-mean(lab), lab))


def split_buckets(rows: list[Row], split: str) -> list[str]:
    """The length buckets present in a split, shortest first ("all" excluded)."""
    return sorted(
        {r.bucket for r in rows if r.split == split and r.bucket != "all"}, key=bucket_key
    )


# ----------------------------------------------------------------------------- Markdown


def md_table(header: list[str], body: list[list[str]], align: str = "l") -> list[str]:
    """A Markdown table: the first column left-aligned, the others `align`-aligned."""
    rule = [":--"] + [("--:" if align == "r" else ":--")] * (len(header) - 1)
    return ["| " + " | ".join(line) + " |" for line in [header, rule, *body]]


def _job_mean(rows: list[Row], label: str, field: str, fmt: str) -> str:
    """Mean over an encoding's jobs of a per-job field (params, minutes, speed)."""
    per_run = {r.run: getattr(r, field) for r in rows if r.encoding == label}
    values = [v for v in per_run.values() if v is not None]
    return format(statistics.fmean(values), fmt) if values else DASH


def main_table(rows: list[Row], labels: list[str], splits: list[str]) -> list[str]:
    """One row per encoding: BLEU and chrF (mean ± std over seeds), size, speed, seeds."""
    header = [
        "Encoding",
        *(f"BLEU {s}" for s in splits),
        *(f"chrF {s}" for s in splits),
        "Params",
        "Train min",
        "Tokens/s",
        "Seeds",
    ]
    body = []
    for lab in labels:
        bleu = [fmt_mean_std(cell(rows, lab, s, "all")) for s in splits]
        chrf = [fmt_mean_std(cell(rows, lab, s, "all", "chrf")) for s in splits]
        seeds = len({r.run for r in rows if r.encoding == lab})
        body.append(
            [
                lab,
                *bleu,
                *chrf,
                _job_mean(rows, lab, "params", ",.0f"),
                _job_mean(rows, lab, "train_minutes", ".2f"),
                _job_mean(rows, lab, "train_tokens_per_s", ",.0f"),
                str(seeds),
            ]
        )
    return md_table(header, body, align="r")


def bucket_table(rows: list[Row], labels: list[str], split: str) -> list[str]:
    """BLEU (mean ± std over seeds) of one split: rows encodings, columns length buckets."""
    buckets = split_buckets(rows, split)
    if not buckets:
        return ["No per-length scores (hypotheses or references could not be read)."]
    sizes: dict[str, set[int]] = {}
    for r in rows:
        if r.split == split:
            sizes.setdefault(r.bucket, set()).add(r.n_sentences)
    n = {b: "–".join(str(k) for k in sorted({min(sizes[b]), max(sizes[b])})) for b in buckets}
    header = ["Encoding", *(f"{b} (n={n[b]})" for b in buckets)]
    body = [[lab, *(fmt_mean_std(cell(rows, lab, split, b)) for b in buckets)] for lab in labels]
    return md_table(header, body, align="r")


def noise_verdict(best: list[float], other: list[float]) -> tuple[str, str]:
    """(Welch t, verdict) of an encoding's BLEU against the best one's."""
    t = welch_t(other, best)
    if t is None:
        return DASH, "n/a (one seed: noise unknown)"
    return f"{t:.2f}", ("yes" if abs(t) > NOISE_T else "no (within seed noise)")


def noise_section(rows: list[Row], labels: list[str], split: str) -> list[str]:
    """Best encoding of a split and, for each other one, its BLEU gap and the noise verdict."""
    by_mean = sorted(
        labels, key=lambda lab: -statistics.fmean(cell(rows, lab, split, "all") or [-1])
    )
    best = cell(rows, by_mean[0], split, "all")
    lines = [
        f"**{split}**: best is **{by_mean[0]}** (BLEU {fmt_mean_std(best)}, "
        f"{len(best)} seed{'s' * (len(best) != 1)}).",
        "",
    ]
    if len(by_mean) == 1:
        return [*lines, "Only one encoding: nothing to compare."]
    body = []
    for lab in by_mean[1:]:
        values = cell(rows, lab, split, "all")
        gap = statistics.fmean(values) - statistics.fmean(best) if values else math.nan
        body.append([lab, fmt_mean_std(values), f"{gap:+.2f}", *noise_verdict(best, values)])
    header = [
        "Encoding",
        "BLEU",
        f"Δ vs {by_mean[0]}",
        "Welch t",
        "Beyond seed noise",
    ]
    return lines + md_table(header, body, align="r")


def noise_intro(rows: list[Row]) -> list[str]:
    """How the seed-noise verdict is made, or why it cannot be."""
    runs = {r.run: r.encoding for r in rows}
    seeds = [list(runs.values()).count(lab) for lab in set(runs.values())]
    if max(seeds) < 2:
        return [
            "Only one seed per encoding: seed noise can't be estimated, so no difference "
            "below can be called real or noise. Run more seeds (`trainer.seed=1,2,3`)."
        ]
    return [
        f"A BLEU difference counts as beyond seed noise when Welch's t statistic "
        f"t = Δ / sqrt(s₁²/n₁ + s₂²/n₂) has |t| > {NOISE_T:g}, where s is an encoding's "
        "standard deviation of BLEU over its n seeds. This is a rule of thumb, not a "
        "significance test: with 2-3 seeds the std itself is very uncertain."
    ]


def signature_lines(jobs: list[Job]) -> list[str]:
    """The sacreBLEU signatures used here, and training-time ones when they differ."""
    BLEU.corpus_score(["x"], [["x"]])  # a signature needs a scored corpus
    CHRF.corpus_score(["x"], [["x"]])
    now = {"bleu": str(BLEU.get_signature()), "chrf": str(CHRF.get_signature())}
    lines = [
        f"Scores re-computed from the `.hyp` files with sacreBLEU: BLEU `{now['bleu']}`, "
        f"chrF `{now['chrf']}`. BLEU uses the effective n-gram order (`eff:yes`): it equals "
        "standard corpus BLEU when the references hold 4-grams, and is not 0 by definition "
        "for buckets of references shorter than 4 tokens."
    ]
    trained = {
        t.get("bleu_signature")
        for j in jobs
        if j.results
        for t in (j.results.get("test") or {}).values()
    } - {None, now["bleu"]}
    if trained:
        used = ", ".join(f"`{s}`" for s in sorted(trained))
        lines.append(f"results.json (training time) BLEU signature: {used}.")
    return lines


def failed_lines(jobs: list[Job]) -> list[str]:
    """One line per failed or unfinished job, or a line saying there is none."""
    failed = [j for j in jobs if j.problem is not None]
    if not failed:
        return [f"None: all {len(jobs)} jobs finished."]
    return [f"- `{j.run}` ({j.label}, seed {j.seed}): {j.problem}" for j in failed]


def render_markdown(title: str, rows: list[Row], jobs: list[Job], notes: list[str], by: str) -> str:
    """The whole report: main table, per-length tables, seed noise, failures, signatures."""
    splits = ordered(r.split for r in rows)
    labels = rank_encodings(rows, splits)
    n_done = sum(j.problem is None for j in jobs)
    unit = "comma-separated items" if by == "items" else "words"
    out = [
        f"# {title}",
        "",
        f"Jobs: {n_done} finished, {len(jobs) - n_done} failed or "
        f"unfinished. Sweeps: {', '.join(ordered(f'`{j.sweep}`' for j in jobs))}.",
        "",
        "## Test scores (mean ± std over seeds)",
        "",
        *main_table(rows, labels, splits),
        "",
        f"## BLEU by source length ({unit})",
        "",
    ]
    for split in splits:
        out += [f"### {split}", "", *bucket_table(rows, labels, split), ""]
    out += ["## Seed noise", "", *noise_intro(rows), ""]
    for split in splits:
        out += [*noise_section(rows, labels, split), ""]
    out += ["## Failed or unfinished jobs", "", *failed_lines(jobs), ""]
    if notes:
        out += ["## Notes", "", *(f"- {n}" for n in notes), ""]
    out += ["## sacreBLEU", "", *signature_lines(jobs)]
    return "\n".join(out) + "\n"


# ----------------------------------------------------------------------------- CSV and plot


def write_csv(rows: list[Row], path: Path) -> None:
    """comparison.csv: one row per (encoding, seed, split, bucket), long format."""
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=[fl.name for fl in fields(Row)])
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in asdict(row).items()})


def plot_bleu_by_length(rows: list[Row], path: Path, title: str, by: str) -> None:
    """One subplot per test split: mean BLEU per length bucket, std over seeds as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    splits = ordered(r.split for r in rows)
    labels = rank_encodings(rows, splits)
    fig, axes = plt.subplots(
        1, len(splits), figsize=(5.5 * len(splits), 4.2), squeeze=False, sharey=True
    )
    for ax, split in zip(axes[0], splits):
        buckets = split_buckets(rows, split)
        for i, lab in enumerate(labels):
            stats = [
                mean_std(v) if (v := cell(rows, lab, split, b)) else (math.nan, None)
                for b in buckets
            ]
            shift = (i - (len(labels) - 1) / 2) * 0.04  # keep error bars apart
            ax.errorbar(
                [k + shift for k in range(len(buckets))],
                [m for m, _ in stats],
                yerr=[s or 0.0 for _, s in stats],
                marker="o",
                capsize=3,
                label=lab,
            )
        ax.set_xticks(range(len(buckets)), buckets)
        ax.set_title(split)
        ax.set_xlabel(f"source length ({'items' if by == 'items' else 'words'})")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("BLEU (mean ± std over seeds)")
    axes[0][-1].legend(
        title="encoding", fontsize="small", loc="center left", bbox_to_anchor=(1.02, 0.5)
    )
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------- CLI


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
        choices=["words", "items"],
        default="words",
        help="bucket by source words (1-10, ..., 41+) or comma-separated items",
    )
    parser.add_argument("--title", help="title of the report and the plot")
    return parser.parse_args(argv)


def sweep_dirs(args: argparse.Namespace) -> list[Path]:
    """The folders to read: --latest resolved, each one checked to exist."""
    sweeps = [latest_sweep(resolve_path("multirun"))] if args.latest else args.sweeps
    missing = [str(s) for s in sweeps if not s.is_dir()]
    if missing:
        raise SystemExit(f"compare_runs: not a folder: {', '.join(missing)}")
    return sweeps


def main(argv: list[str] | None = None) -> int:
    """Read the sweep(s), score, write comparison.csv/.md and bleu_by_length.png; 1 if no job."""
    args = parse_args(argv)
    sweeps = sweep_dirs(args)
    jobs = [load_job(p, s) for s in sweeps for p in find_job_dirs(s)]
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
        job_rows, job_notes = score_job(job, args.length_by, read)
        rows += job_rows
        notes += job_notes
    if not rows:
        print("compare_runs: the finished jobs list no test split", file=sys.stderr)
        return 1
    out = args.out or sweeps[0]
    out.mkdir(parents=True, exist_ok=True)
    title = args.title or f"Positional encodings: {', '.join(s.name for s in sweeps)}"
    report = render_markdown(title, rows, jobs, notes, args.length_by)
    paths = [out / "comparison.csv", out / "comparison.md", out / "bleu_by_length.png"]
    write_csv(rows, paths[0])
    paths[1].write_text(report, encoding="utf-8")
    plot_bleu_by_length(rows, paths[2], title, args.length_by)
    print(report)
    print("\n".join(f"wrote {p}" for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
