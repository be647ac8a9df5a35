"""Keep a sweep's finished runs as the small files its report is made from, and put them back.

Usage:
    python scripts/sweep_archive.py save SWEEP_DIR ARCHIVE_DIR
    python scripts/sweep_archive.py restore ARCHIVE_DIR SWEEP_DIR

`save` copies each finished job of SWEEP_DIR (one with results.json) into ARCHIVE_DIR/<job>/:
results.json, every `*.hyp`, `.hydra/config.yaml` and `.hydra/overrides.yaml`, and the
validation records of train_log.jsonl (the learning curve; the per-step training records stay
behind): what scripts/compare_runs.py reads, a few hundred KB a run, no checkpoint. A job already
in the archive is replaced by the newer copy.

`restore` copies every archived job that SWEEP_DIR does not hold finished back into SWEEP_DIR,
so that the sweep, run again (trainer.skip_finished=true), skips it: a sweep run in parts on
machines that do not keep their files goes on where the archive stands. A job folder in
SWEEP_DIR without results.json (an unfinished run) is replaced, its checkpoints kept.

make sweep-multi30k restores from and saves to docs/positional/multi30k/runs/ around the sweep.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

RESULTS = "results.json"
HYDRA_FILES = (".hydra/config.yaml", ".hydra/overrides.yaml")
CURVE = "train_log.jsonl"


def finished_jobs(sweep: Path) -> list[Path]:
    """The job folders of `sweep` that hold results.json (finished runs), by name."""
    if not sweep.is_dir():
        return []
    return sorted(p for p in sweep.iterdir() if (p / RESULTS).is_file())


def validation_records(path: Path) -> str:
    """The "valid" lines of a train_log.jsonl, as they are."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    return "".join(ln for ln in lines if ln.strip() and json.loads(ln).get("type") == "valid")


def save_job(job: Path, dest: Path) -> None:
    """Copy one finished job's report inputs into dest (replaced whole, atomically enough: a
    temporary folder renamed over it)."""
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / ".hydra").mkdir(parents=True)
    names = [RESULTS, *HYDRA_FILES, *(p.name for p in sorted(job.glob("*.hyp")))]
    for name in names:
        if (job / name).is_file():
            shutil.copy2(job / name, tmp / name)
    if (job / CURVE).is_file():
        (tmp / CURVE).write_text(validation_records(job / CURVE), encoding="utf-8")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


def save(sweep: Path, archive: Path) -> list[str]:
    """Archive every finished job of `sweep`; the names of the jobs saved."""
    archive.mkdir(parents=True, exist_ok=True)
    jobs = finished_jobs(sweep)
    for job in jobs:
        save_job(job, archive / job.name)
    return [j.name for j in jobs]


def restore(archive: Path, sweep: Path) -> list[str]:
    """Copy archived jobs that `sweep` lacks (or holds unfinished) into it; their names."""
    done = {p.name for p in finished_jobs(sweep)}
    restored = []
    for job in finished_jobs(archive):
        if job.name in done:
            continue
        shutil.copytree(job, sweep / job.name, dirs_exist_ok=True)
        restored.append(job.name)
    return restored


def main(argv: list[str] | None = None) -> int:
    """Run `save` or `restore` and say what moved."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["save", "restore"])
    parser.add_argument("source", type=Path)
    parser.add_argument("dest", type=Path)
    args = parser.parse_args(argv)
    if args.action == "save":
        names = save(args.source, args.dest)
        print(f"sweep_archive: saved {len(names)} finished run(s) of {args.source} to {args.dest}")
    else:
        names = restore(args.source, args.dest)
        print(
            f"sweep_archive: restored {len(names)} finished run(s) from {args.source} into "
            f"{args.dest}" + (f": {', '.join(names)}" if names else "")
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
