"""Shared by the benchmark scripts: machine description, medians, JSON results, and the
section of docs/BENCHMARKS.md that each benchmark owns (between its two marker comments).

torch is imported only inside the functions that need it: decode.py's CTranslate2 worker
imports this module, and loading torch there brings a second OpenMP runtime into the process,
which slows CTranslate2 down."""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOC = ROOT / "docs" / "BENCHMARKS.md"
# oneDNN's own cache sizes, for the engines we compare against: kernels.setup_process() caps
# ours for training, and a child process inherits the cap unless its environment sets these back
ONEDNN_DEFAULT_CACHES = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024", "LRU_CACHE_CAPACITY": "1024"}


def machine_fields() -> dict[str, Any]:
    """Structured description of this machine (seq2seq.train.machine: CPU model and vendor, cores,
    torch version, threads, GPU, Python, date), and `machine`, the same as one line."""
    from seq2seq.train.machine import describe, summary

    fields = describe()
    return {"machine": summary(fields), **fields}


def machine() -> str:
    """CPU model (vendor), cores, torch version, threads (and the GPU when there is one)."""
    return str(machine_fields()["machine"])


def child_pythonpath() -> str:
    """A child process's PYTHONPATH: this checkout first, then the caller's (where carried
    dependencies may sit, as on a lent GPU machine)."""
    return os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)


def measure_this_checkout() -> None:
    """Make this checkout's seq2seq the one imported, here and in every child process, when
    the running script is one of its benchmarks: a benchmark run from a git worktree of a fixed
    commit measures that commit, not the checkout an editable install points at (which may be
    edited while the benchmark runs). Another program importing this module (pytest) keeps its
    own path and environment."""
    if Path(sys.argv[0]).resolve().parent != ROOT / "benchmarks":
        return
    if sys.path[:1] != [str(ROOT)]:
        sys.path.insert(0, str(ROOT))
    if not os.environ.get("PYTHONPATH", "").startswith(str(ROOT)):
        os.environ["PYTHONPATH"] = child_pythonpath()
    code_version()  # read now, before the benchmark writes its own results into the tree


# what benchmarks write into the checkout: not code, so a change there leaves the code as committed
OUTPUTS = ("docs", "benchmarks/results")


@functools.cache
def code_version() -> str:
    """The commit of this checkout (short hash), "+changes" when tracked files other than the
    benchmarks' own outputs (OUTPUTS: the documents and results they write) differ from it;
    "unknown" outside a git checkout (an installed copy). Read once, as the benchmark starts, so
    that one benchmark after another on a fixed commit records that commit."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "unknown"
    outputs = [f":(exclude){path}" for path in OUTPUTS]
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", *outputs)
    return commit + ("+changes" if changed else "")


measure_this_checkout()
# MKL's Intel code paths on an AMD CPU (seq2seq/mkl.py) for every engine a benchmark times, as
# the product's own processes have them: scripts import this module before torch
import seq2seq  # noqa: F401


def peak_rss_mb() -> float:
    """Peak resident memory of this process, in MB. getrusage's ru_maxrss survives execve, so a
    worker process would report its parent's peak if larger: read the kernel's VmHWM where
    there is one."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def multi30k_root(arg: str | None = None) -> Path:
    """Where the Multi30k files are: --data, else $MULTI30K_ROOT, else ../shared/data/multi30k
    beside the repository."""
    return Path(arg or os.environ.get("MULTI30K_ROOT") or ROOT.parent / "shared/data/multi30k")


def split_file(root: Path, name: str) -> Path:
    """root/name or root/name.gz (e.g. name "train.en")."""
    for candidate in (root / name, root / f"{name}.gz"):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"{root}: no {name}[.gz]; pass --data or set MULTI30K_ROOT")


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def command() -> str:
    script = Path(sys.argv[0]).resolve().relative_to(ROOT)
    return "python " + " ".join([str(script), *sys.argv[1:]])


def run_json(cmd: list[str], env: dict[str, str], what: str, cwd: Path | None = None) -> Any:
    """Run a worker process; its last stdout line is JSON, returned decoded. A failure raises
    RuntimeError with `what` and the end of its stderr."""
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def write_json(name: str, payload: dict) -> Path:
    """benchmarks/results/<name>.json with the machine (CPU model, vendor, cores, torch version,
    threads), date and command added."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {
        **machine_fields(),
        "date": dt.date.today().isoformat(),
        "command": command(),
        "code": code_version(),
        **payload,
    }
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def update_doc(name: str, title: str, body: str) -> None:
    """Replace (or append) the section of docs/BENCHMARKS.md owned by benchmark `name`."""
    start, end = f"<!-- bench:{name} start -->", f"<!-- bench:{name} end -->"
    header = (
        f"## {title}\n\nCommand: `{command()}`  \n"
        f"Date: {dt.date.today().isoformat()}, code: {code_version()}, machine: {machine()}\n\n"
    )
    from seq2seq.evaluation.markdown import write_section  # here: the CT2 worker imports no seq2seq

    empty = "# Benchmarks\n\nWritten by `make bench`.\n"
    write_section(DOC, start, end, header + body, empty=empty)
