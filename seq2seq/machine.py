"""What machine a figure was measured on: CPU model and vendor, cores, torch version, date.

Every speed figure depends on the CPU (bf16 pays on some and not on others; MKL is slow on AMD), so
results.json and every benchmark JSON carry this. torch is imported only inside `describe`, so a
process that must not load torch (the CTranslate2 benchmark worker) can import this module.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
from pathlib import Path


def cpu_info() -> dict[str, str]:
    """{"cpu_model": ..., "cpu_vendor": ...} from /proc/cpuinfo (lscpu's source), else from
    the platform module."""
    found = {"model name": platform.processor() or platform.machine(), "vendor_id": "unknown"}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    seen: set[str] = set()
    for line in text.splitlines():  # the first processor's values
        key, _, value = line.partition(":")
        key = key.strip()
        if key in found and key not in seen:
            found[key] = value.strip()
            seen.add(key)
    return {"cpu_model": found["model name"], "cpu_vendor": found["vendor_id"]}


def describe() -> dict[str, object]:
    """CPU model and vendor, cores, torch version and threads, GPU (or None), Python, date."""
    import torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {
        **cpu_info(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "gpu": gpu,
        "python": platform.python_version(),
        "date": dt.date.today().isoformat(),
    }


def summary(info: dict[str, object]) -> str:
    """One line: 'AMD EPYC, 2 cores, torch 2.13.0+cpu (2 threads)' (and the GPU)."""
    gpu = f", {info['gpu']}" if info.get("gpu") else ""
    return (f"{info['cpu_model']}, {info['cores']} cores, torch {info['torch']} "
            f"({info['threads']} threads){gpu}")  # fmt: skip
