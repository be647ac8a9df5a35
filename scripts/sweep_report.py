"""Rendering of a sweep comparison: statistics over seeds, the Markdown report, the CSV and the
BLEU-by-length plot. Used by scripts/compare_runs.py, which finds and scores the jobs."""

from __future__ import annotations

import csv
import math
import statistics
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from seq2seq.config.schema import DataConfig
from seq2seq.evaluation.markdown import write_section
from seq2seq.evaluation.scoring import BUCKET_BLEU as BLEU
from seq2seq.evaluation.scoring import BUCKET_CHRF as CHRF
from seq2seq.evaluation.scoring import bucket_key

UNITS = {"words": "words", "items": "comma-separated items", "tokens": "source tokens"}
DASH = "–"


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
    len_ratio: float | None = None  # hypothesis / reference length (runs trained short)


# ----------------------------------------------------------------------------- finding jobs


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


def cell(rows: list[Row], label: str, split: str, bucket: str, metric: str = "bleu") -> list[float]:
    """The values of `metric` over the seeds of one encoding, split and bucket (None skipped)."""
    return [
        getattr(r, metric)
        for r in rows
        if (r.encoding, r.split, r.bucket) == (label, split, bucket)
        and getattr(r, metric) is not None
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


def bucket_table(rows: list[Row], labels: list[str], split: str, metric: str = "bleu") -> list[str]:
    """BLEU, chrF or the length ratio (mean ± std over seeds) of one split: rows encodings,
    columns buckets."""
    buckets = split_buckets(rows, split)
    if not buckets:
        return ["No per-length scores (hypotheses or references could not be read)."]
    sizes: dict[str, set[int]] = {}
    for r in rows:
        if r.split == split:
            sizes.setdefault(r.bucket, set()).add(r.n_sentences)
    n = {b: "–".join(str(k) for k in sorted({min(sizes[b]), max(sizes[b])})) for b in buckets}
    header = ["Encoding", *(f"{b} (n={n[b]})" for b in buckets)]
    digits = 3 if metric == "len_ratio" else 2
    body = [
        [lab, *(fmt_mean_std(cell(rows, lab, split, b, metric), digits) for b in buckets)]
        for lab in labels
    ]
    return md_table(header, body, align="r")


def signature_lines(jobs: list[Job], by: str = "words") -> list[str]:
    """The sacreBLEU signatures used here, and training-time ones when they differ."""
    BLEU.corpus_score(["x"], [["x"]])  # a signature needs a scored corpus
    CHRF.corpus_score(["x"], [["x"]])
    now = {"bleu": str(BLEU.get_signature()), "chrf": str(CHRF.get_signature())}
    where = (
        "Bucket and long-split scores re-computed from the `.hyp` files, by source tokens of "
        "each run's rebuilt tokenizer (results.json's `length` where a run's translations "
        "are missing)"
        if by == "tokens"
        else "Scores re-computed from the `.hyp` files"
    )
    lines = [
        f"{where} with sacreBLEU: BLEU `{now['bleu']}`, "
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


def machine_line(jobs: list[Job]) -> str:
    """The machines and dates the jobs ran on (results.json's "machine"): the times and speeds
    in the tables hold for those CPUs."""
    seen = ordered(
        f"{m.get('cpu_model')}, {m.get('cores')} cores, torch {m.get('torch')}, {m.get('date')}"
        for j in jobs
        if j.results and isinstance(m := j.results.get("machine"), dict)
    )
    unknown = sum(1 for j in jobs if j.results and not isinstance(j.results.get("machine"), dict))
    parts = list(seen) + ([f"not recorded for {unknown} job(s)"] if unknown else [])
    return "Machine (times and speeds hold for it): " + ("; ".join(parts) or "no results") + "."


def failed_lines(jobs: list[Job]) -> list[str]:
    """One line per failed or unfinished job, or a line saying there is none."""
    failed = [j for j in jobs if j.problem is not None]
    if not failed:
        return [f"None: all {len(jobs)} jobs finished."]
    return [f"- `{j.run}` ({j.label}, seed {j.seed}): {j.problem}" for j in failed]


def render_markdown(
    title: str,
    rows: list[Row],
    jobs: list[Job],
    notes: list[str],
    by: str,
    significance: list[str],
) -> str:
    """The whole report: main table, per-length tables (BLEU, chrF and, where the runs wrote
    it, the length ratio), the `significance` section, failures, signatures."""
    splits = ordered(r.split for r in rows)
    labels = rank_encodings(rows, splits)
    n_done = sum(j.problem is None for j in jobs)
    unit = UNITS[by]
    out = [
        f"# {title}",
        "",
        f"Jobs: {n_done} finished, {len(jobs) - n_done} failed or "
        f"unfinished. Sweeps: {', '.join(ordered(f'`{j.sweep}`' for j in jobs))}.",
        "",
        machine_line(jobs),
        "",
        "## Test scores (mean ± std over seeds)",
        "",
        *main_table(rows, labels, splits),
        "",
    ]
    metrics = [("bleu", "BLEU"), ("chrf", "chrF")]
    if any(r.len_ratio is not None for r in rows):
        metrics.append(("len_ratio", "Length ratio (hypothesis / reference)"))
    for metric, name in metrics:
        out += [f"## {name} by source length ({unit})", ""]
        for split in splits:
            if split_buckets(rows, split):  # splits scored whole only get no table
                table = bucket_table(rows, labels, split, metric)
                out += [f"### {split} ({name})", "", *table, ""]
    out += ["## Significance", "", *significance, ""]
    out += ["## Failed or unfinished jobs", "", *failed_lines(jobs), ""]
    if notes:
        out += ["## Notes", "", *(f"- {n}" for n in notes), ""]
    out += ["## sacreBLEU", "", *signature_lines(jobs, by)]
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

    labels = rank_encodings(rows, ordered(r.split for r in rows))
    splits = [s for s in ordered(r.split for r in rows) if split_buckets(rows, s)]
    if not splits:
        return
    fig, axes = plt.subplots(
        1, len(splits), figsize=(max(9.0, 5.5 * len(splits)), 4.8), squeeze=False, sharey=True
    )
    for ax, split in zip(axes[0], splits):
        distinct_styles(ax, len(labels))
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
                capsize=3,
                label=lab,
            )
        ax.set_xticks(range(len(buckets)), buckets)
        ax.set_title(split)
        ax.set_xlabel(f"source length ({UNITS[by]})")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("BLEU (mean ± std over seeds)")
    axes[0][-1].legend(
        title="encoding", fontsize="small", loc="center left", bbox_to_anchor=(1.02, 0.5)
    )
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def distinct_styles(ax: object, n: int) -> None:
    """Colours (and, past 10 lines, markers) that tell up to 20 lines apart: tab10 repeats."""
    from cycler import cycler
    from matplotlib import colormaps

    colors = colormaps["tab10" if n <= 10 else "tab20"].colors[:n]
    markers = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">"] * 2
    ax.set_prop_cycle(cycler(color=colors) + cycler(marker=markers[: len(colors)]))  # type: ignore[attr-defined]


# the report's sections a document embeds (compare_runs.py --doc), by the start of their title
DOC_SECTIONS = ("Test scores", "BLEU by source length", "Length ratio", "Significance")


def doc_section(report: str, link: str) -> str:
    """The tables and tests of a comparison.md (at relative `link`), one heading level down,
    under a line that says where they come from: what a document embeds (write_doc)."""
    parts = ("\n" + report).split("\n## ")[1:]  # "title\nbody" of each ## section
    kept = ["### " + p.rstrip().replace("\n### ", "\n#### ") for p in parts]
    kept = [k for k in kept if k[4:].startswith(DOC_SECTIONS)]
    note = f"Written by scripts/compare_runs.py --doc from [{link}]({link}); do not edit by hand."
    return "\n\n".join([note, *kept])


def write_doc(doc: Path, name: str, body: str) -> None:
    """Put `body` between doc's `<!-- report:name start -->` and `end` markers (appended with
    them when absent); the rest of the document is kept as it is."""
    write_section(doc, f"<!-- report:{name} start -->", f"<!-- report:{name} end -->", body)
