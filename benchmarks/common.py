"""Shared by the benchmark scripts: machine description, medians, JSON results, and the
section of docs/BENCHMARKS.md that each benchmark owns (between its two marker comments)."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import resource
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOC = ROOT / "docs" / "BENCHMARKS.md"
# oneDNN's own cache sizes, for the engines we compare against: importing seq2seq.onednn caps
# ours, and a child process inherits the cap unless its environment sets these back
ONEDNN_DEFAULT_CACHES = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "1024", "LRU_CACHE_CAPACITY": "1024"}


def machine() -> str:
    """CPU model, cores, threads, torch version (and the GPU when there is one)."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    threads = torch.get_num_threads()
    python = platform.python_version()
    torch_version = f"torch {torch.__version__} ({threads} threads)"
    return f"{cpu}, {os.cpu_count()} cores, {torch_version}{gpu}, Python {python}"


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def command() -> str:
    script = Path(sys.argv[0]).resolve().relative_to(ROOT)
    return "python " + " ".join([str(script)] + sys.argv[1:])


def write_json(name: str, payload: dict) -> Path:
    """benchmarks/results/<name>.json with the machine, date and command added."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {"machine": machine(), "date": dt.date.today().isoformat(), "command": command(),
               **payload}  # fmt: skip
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def update_doc(name: str, title: str, body: str) -> None:
    """Replace (or append) the section of docs/BENCHMARKS.md owned by benchmark `name`."""
    start, end = f"<!-- bench:{name} start -->", f"<!-- bench:{name} end -->"
    header = (f"## {title}\n\nCommand: `{command()}`  \nMachine: {machine()}  \n"
              f"Date: {dt.date.today().isoformat()}\n\n")  # fmt: skip
    section = f"{start}\n{header}{body.strip()}\n{end}"
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n\nWritten by `make bench`.\n"
    if start in text and end in text:
        before, rest = text.split(start, 1)
        text = before + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    DOC.write_text(text)
