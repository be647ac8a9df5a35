"""A resumable sweep: every (encoding, seed) as its own `seq2seq-train` run in a fixed folder.

Usage:
    python scripts/sweep.py --dir multirun/pos_multi30k --encodings sinusoidal,rope \\
        --seeds 1,2 [--jobs 2] -- experiment=pos_multi30k [more overrides]

Each run trains in `<dir>/<encoding>_seed<seed>/` (a Hydra run dir: .hydra/, checkpoints/,
train_log.jsonl, results.json, tb/). Run again after an interruption: a run with results.json is
finished and skipped; an unfinished one resumes from its own checkpoints (trainer.resume=auto);
the others start. Runs go seed-major (every encoding's first seed, then the second ...), so
that a stopped sweep already compares every encoding once.

`--jobs N` runs N at once with trainer.threads = cores / N each (on 2 cores, two runs of one
thread train ~1.3x more steps per minute than one run of two threads for the Multi30k model;
docs/POSITIONAL_ENCODINGS.md). A run's wall time is in its results.json ("minutes", and
"train_minutes" of its last start); this script adds sweep.json: per run its state and the wall
time of this invocation, and the invocation's wall time. A failed run is reported at the end and
makes the exit status 1; the others still run. Compare them with scripts/compare_runs.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass
class Run:
    """One (encoding, seed) of the sweep and what happened to it in this invocation."""

    encoding: str
    seed: int
    folder: Path
    state: str = "pending"  # pending | finished | ran | failed
    seconds: float | None = None  # wall time of this invocation's run (None: not run now)
    returncode: int | None = None


def plan(folder: Path, encodings: list[str], seeds: list[int]) -> list[Run]:
    """Every (encoding, seed), seed-major; those with results.json are already finished."""
    runs = [Run(e, s, folder / f"{e}_seed{s}") for s in seeds for e in encodings]
    for run in runs:
        if (run.folder / "results.json").is_file():
            run.state = "finished"
    return runs


def command(run: Run, overrides: list[str], threads: int) -> list[str]:
    """The seq2seq-train command of one run (this interpreter's seq2seq)."""
    return [
        sys.executable,
        "-m",
        "seq2seq.cli.train",
        *overrides,
        f"pos_encoding={run.encoding}",
        f"trainer.seed={run.seed}",
        f"trainer.threads={threads}",
        f"hydra.run.dir={run.folder}",
    ]


def execute(run: Run, overrides: list[str], threads: int) -> Run:
    """Train one run; its console output goes to <run folder>/sweep.log."""
    run.folder.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with (run.folder / "sweep.log").open("a", encoding="utf-8") as log:
        done = subprocess.run(command(run, overrides, threads), stdout=log, stderr=log, check=False)
    run.seconds, run.returncode = time.monotonic() - start, done.returncode
    ok = done.returncode == 0 and (run.folder / "results.json").is_file()
    run.state = "ran" if ok else "failed"
    mins = run.seconds / 60
    print(f"sweep: {run.folder.name}: {run.state} in {mins:.1f} min", flush=True)
    return run


def write_record(folder: Path, runs: list[Run], jobs: int, threads: int, start: float) -> None:
    """sweep.json: this invocation's settings, wall time so far, each run's state and time."""
    record = {
        "jobs": jobs,
        "threads_per_run": threads,
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(start)),
        "wall_minutes": (time.time() - start) / 60,
        "runs": [{**asdict(r), "folder": str(r.folder)} for r in runs],
    }
    tmp = folder / ".sweep.json.tmp"
    tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    tmp.replace(folder / "sweep.json")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="the sweep's folder")
    parser.add_argument("--encodings", required=True, help="pos_encoding option names, a,b,c")
    parser.add_argument("--seeds", default="1,2", help="trainer.seed values, 1,2")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (threads split)")
    parser.add_argument("overrides", nargs="*", help="seq2seq-train overrides (after --)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run every unfinished run; 0 when all are finished, 1 when one failed."""
    args = parse_args(argv)
    start = time.time()
    encodings = [e for e in args.encodings.split(",") if e]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    args.dir.mkdir(parents=True, exist_ok=True)
    runs = plan(args.dir, encodings, seeds)
    todo = [r for r in runs if r.state == "pending"]
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    print(
        f"sweep: {len(runs)} runs in {args.dir}: {len(runs) - len(todo)} finished, "
        f"{len(todo)} to run, {args.jobs} at once with {threads} thread(s) each",
        flush=True,
    )
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for _ in pool.map(lambda r: execute(r, args.overrides, threads), todo):
            write_record(args.dir, runs, args.jobs, threads, start)
    write_record(args.dir, runs, args.jobs, threads, start)
    print(f"sweep: this invocation took {(time.time() - start) / 60:.1f} min", flush=True)
    failed = [r for r in runs if r.state == "failed"]
    for run in failed:
        print(f"sweep: FAILED {run.folder} (exit {run.returncode}): see its sweep.log")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
