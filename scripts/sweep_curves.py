"""Learning curves and wall times of a sweep's runs, for compare_runs.py --curves: validation BLEU
by step (each run's train_log.jsonl) as a Markdown table and a plot, and one line per run with its
steps, precision and minutes (results.json)."""

from __future__ import annotations

import math
from pathlib import Path

from run_curves import read_valid
from sweep_report import DASH, Job, distinct_styles, fmt_mean_std, md_table, mean_std, ordered

from seq2seq.config.schema import length_cap

# encoding label -> run -> [(step, validation BLEU)]
Curves = dict[str, dict[str, list[tuple[int, float]]]]


def read_curve(path: Path) -> list[tuple[int, float]]:
    """(step, BLEU) of every validation record in a train_log.jsonl; the last record of a step
    wins (a resumed run may validate a step twice)."""
    return [(step, bleu) for step, (bleu, _) in sorted(read_valid(path).items())]


def read_curves(jobs: list[Job]) -> Curves:
    """The validation curve of each finished job, grouped by encoding."""
    curves: Curves = {}
    for job in jobs:
        curves.setdefault(job.label, {})[job.run] = read_curve(job.path / "train_log.jsonl")
    return curves


def at_step(curves: Curves, label: str, step: int) -> list[float]:
    """The validation BLEU of each of an encoding's runs at `step` (runs without it left out)."""
    return [b for points in curves[label].values() for s, b in points if s == step]


def valid_set(jobs: list[Job]) -> str:
    """Which validation pairs the runs validate on: within a length experiment's cap
    (corpus.within_cap, the pairs best.pt is chosen on), or the whole split."""
    caps = sorted({length_cap(j.data) for j in jobs if j.data is not None})
    if not caps or caps == [0]:
        return "the whole validation split"
    if len(caps) == 1:
        return f"the validation pairs whose source has at most L = {caps[0]} tokens"
    return "the validation pairs within each run's cap (caps " + ", ".join(map(str, caps)) + ")"


def curve_lines(curves: Curves, valid: str = "the whole validation split") -> list[str]:
    """## Learning curves: validation BLEU (greedy, on `valid`) by step, mean ± std over seeds."""
    steps = sorted({s for runs in curves.values() for pts in runs.values() for s, _ in pts})
    if not steps:
        return ["## Learning curves", "", "No validation records (train_log.jsonl) found."]
    final = lambda lab: mean_std(at_step(curves, lab, steps[-1]) or [-math.inf])[0]  # noqa: E731
    labels = sorted(curves, key=lambda lab: -final(lab))
    body = [[lab, *(fmt_mean_std(at_step(curves, lab, s), 1) for s in steps)] for lab in labels]
    return [
        "## Learning curves",
        "",
        f"Validation BLEU (greedy, {valid}) by step, mean ± std over seeds "
        "(valid_bleu_by_step.png).",
        "",
        *md_table(["Encoding", *(str(s) for s in steps)], body, align="r"),
    ]


def runs_lines(jobs: list[Job]) -> list[str]:
    """## Runs: steps, precision and wall time of each job, and the sum of the wall times."""
    body, total = [], 0.0
    for job in sorted(jobs, key=lambda j: (j.label, j.seed or 0)):
        res = job.results or {}
        minutes = res.get("minutes")
        total += minutes or 0.0
        resumed = "yes" if res.get("resumed_from") else ("no" if res else DASH)
        body.append(
            [
                job.label,
                str(job.seed),
                str(res.get("steps", DASH)),
                str(res.get("precision", DASH)),
                f"{res['train_minutes']:.1f}" if "train_minutes" in res else DASH,
                f"{minutes:.1f}" if minutes is not None else DASH,
                resumed,
            ]
        )
    header = ["Encoding", "Seed", "Steps", "Precision", "Train min", "Run min", "Resumed"]
    return [
        "## Runs",
        "",
        f"Wall time of the finished runs, summed: {total:.1f} min ({total / 60:.2f} h). "
        "Run min is the whole run (data, training, validations, test decoding) of its last start; "
        "a resumed run's earlier starts are not in it. Runs that ran side by side shared the "
        "CPU: their minutes are of that setting.",
        "",
        *md_table(header, body, align="r"),
    ]


def plot_curves(curves: Curves, path: Path, title: str) -> None:
    """Validation BLEU by step: mean over seeds per encoding, std as a band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    distinct_styles(ax, len(curves))
    for label in ordered(curves):
        steps = sorted({s for pts in curves[label].values() for s, _ in pts})
        stats = [mean_std(at_step(curves, label, s)) for s in steps]
        means = [m for m, _ in stats]
        stds = [s or 0.0 for _, s in stats]
        (line,) = ax.plot(steps, means, label=label)
        lo = [m - s for m, s in zip(means, stds, strict=True)]
        hi = [m + s for m, s in zip(means, stds, strict=True)]
        ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.15)
    ax.set_xlabel("step")
    ax.set_ylabel("validation BLEU (greedy; mean ± std over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="lower right")
    ax.set_title(title, fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
