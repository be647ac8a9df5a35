"""Validation curves of single runs side by side, as Markdown: greedy validation BLEU (and loss)
at the same steps, then each run's end (steps, training minutes, precision, best validation
BLEU). For comparing recipe variants at the same number of steps and at the same wall time
(docs/RESULTS.md).

Usage:
    python scripts/run_curves.py plain=runs/r8,runs/r8_to8000 bpe_dropout=runs/r10 \\
        [--steps 800,1600,2400] [--every 800] [--loss]

Each argument is LABEL=RUN_DIR[,RUN_DIR...]: the folders of one run in the order it ran (a copy
resumed in another folder continues its curve; where two folders validated the same step, the
later folder's record wins, as in a resumed run's own log). A step a run never validated shows
as a dash. Everything printed is read from the runs' train_log.jsonl and results.json.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

DASH = "–"

# step -> (validation BLEU, validation loss)
Valid = dict[int, tuple[float, float]]
# a run's validation records and its results.json
Run = tuple[Valid, dict[str, object]]


def read_valid(log: Path) -> Valid:
    """The validation records of a train_log.jsonl, by step; the last record of a step wins (a
    resumed run may validate a step twice). A line cut by a kill is skipped."""
    points: Valid = {}
    if not log.is_file():
        return points
    for line in log.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("type") == "valid" and record.get("bleu") is not None:
            loss = math.nan if record.get("loss") is None else float(record["loss"])
            points[int(record["step"])] = (float(record["bleu"]), loss)
    return points


def read_run(dirs: list[Path]) -> Run:
    """One run's validation records over its folders, and the last folder's results.json ({}
    when it has none: a run still going or stopped without its test evaluation)."""
    valid: Valid = {}
    for folder in dirs:
        valid.update(read_valid(folder / "train_log.jsonl"))
    results = dirs[-1] / "results.json"
    return valid, json.loads(results.read_text(encoding="utf-8")) if results.is_file() else {}


def cell(valid: Valid, step: int, loss: bool) -> str:
    if step not in valid:
        return DASH
    bleu, nll = valid[step]
    return f"{bleu:.2f} ({nll:.3f})" if loss else f"{bleu:.2f}"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def report(read: dict[str, Run], steps: list[int], loss: bool) -> list[str]:
    """The curves table (one row per run, one column per step) and the runs table."""
    what = "validation BLEU (loss)" if loss else "validation BLEU"
    curves = [[label, *(cell(v, s, loss) for s in steps)] for label, (v, _) in read.items()]
    ends = []
    for label, (valid, res) in read.items():
        best = max(valid.items(), key=lambda kv: kv[1][0], default=None)
        ends.append(
            [
                label,
                str(max(valid, default=DASH)),
                str(res.get("steps", DASH)),
                f"{res['train_minutes']:.1f}" if "train_minutes" in res else DASH,
                str(res.get("precision", DASH)),
                DASH if best is None else f"{best[1][0]:.2f} (step {best[0]})",
            ]
        )
    header = ["run", "last validation", "steps", "train minutes", "precision", "best val BLEU"]
    return [
        f"Greedy {what} by step:",
        "",
        *table(["run", *(f"{s:,}" for s in steps)], curves),
        "",
        "Each run's end (results.json of its last folder; train minutes: that start's):",
        "",
        *table(header, ends),
    ]


def parse_runs(specs: list[str]) -> dict[str, list[Path]]:
    runs: dict[str, list[Path]] = {}
    for spec in specs:
        label, sep, dirs = spec.partition("=")
        if not sep or not label or not dirs:
            raise SystemExit(f"run_curves: {spec!r} is not LABEL=RUN_DIR[,RUN_DIR...]")
        paths = [Path(d) for d in dirs.split(",")]
        missing = [str(p) for p in paths if not (p / "train_log.jsonl").is_file()]
        if missing:
            raise SystemExit(f"run_curves: no train_log.jsonl in {', '.join(missing)} ({label})")
        runs[label] = paths
    return runs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="LABEL=RUN_DIR[,RUN_DIR...]")
    parser.add_argument("--steps", help="comma-separated steps (default: every --every steps)")
    parser.add_argument("--every", type=int, default=800, help="column spacing (default 800)")
    parser.add_argument("--loss", action="store_true", help="validation loss beside BLEU")
    args = parser.parse_args(argv)
    read = {label: read_run(dirs) for label, dirs in parse_runs(args.runs).items()}
    if args.steps:
        steps = [int(s) for s in args.steps.split(",")]
    else:
        last = max(max(valid, default=0) for valid, _ in read.values())
        steps = list(range(args.every, last + 1, args.every))
    print("\n".join(report(read, steps, args.loss)))


if __name__ == "__main__":
    main()
