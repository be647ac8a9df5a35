"""What machine a figure was measured on: CPU model and vendor, cores, torch version, date.

Every speed figure depends on the CPU (bf16 pays on some and not on others; MKL is slow on AMD), so
results.json and every benchmark JSON carry this. torch is imported only inside `describe`, so a
process that must not load torch can import this module.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
from pathlib import Path

from seq2seq import mkl


def _lscpu() -> dict[str, str]:
    """lscpu's "Key: value" lines (empty where lscpu is missing or fails)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return {}
    pairs = (line.split(":", 1) for line in out.stdout.splitlines() if ":" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def _cpuinfo() -> dict[str, str]:
    """The first processor's entries of /proc/cpuinfo (empty off Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    pairs = (line.split(":", 1) for line in text.split("\n\n")[0].splitlines() if ":" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def cpu_info() -> dict[str, str]:
    """{"cpu_model": ..., "cpu_vendor": ...}: lscpu first, /proc/cpuinfo as the fallback (lscpu
    also names ARM cores, whose /proc/cpuinfo has no "model name")."""
    lscpu, info = _lscpu(), _cpuinfo()
    model = lscpu.get("Model name") or info.get("model name") or platform.processor()
    vendor = lscpu.get("Vendor ID") or info.get("vendor_id") or ""
    return {"cpu_model": model or platform.machine(), "cpu_vendor": vendor}


# the CPU flags that decide which kernels pay (bf16, AMX, Inductor's GEMM templates)
SPEED_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


def cpu_flags() -> list[str]:
    """Which of SPEED_FLAGS this CPU has (/proc/cpuinfo; empty off Linux)."""
    have = set(_cpuinfo().get("flags", "").split())
    return [flag for flag in SPEED_FLAGS if flag in have]


def cpu_id() -> str:
    """'family 25 model 17': which CPU of its line this is, as /proc/cpuinfo numbers it (boxes
    sold under one model name, "AMD EPYC", can differ); empty where it does not say."""
    info = _cpuinfo()
    if "cpu family" not in info or "model" not in info:
        return ""
    return f"family {info['cpu family']} model {info['model']}"


def describe() -> dict[str, object]:
    """CPU model, vendor, family/model numbers and speed flags, cores, torch version and
    threads, GPU (or None), Python, date."""
    import torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {
        **cpu_info(),
        "cpu_id": cpu_id(),
        "cpu_flags": cpu_flags(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "gpu": gpu,
        "python": platform.python_version(),
        "date": dt.date.today().isoformat(),
        "mkl_intel_path": mkl.STATE,  # MKL's Intel code paths on an AMD CPU (seq2seq/mkl.py)
    }


def summary(info: dict[str, object]) -> str:
    """One line: 'AMD EPYC (AuthenticAMD, family 25 model 17; avx2, avx512f), 2 cores, torch
    2.13.0+cpu (2 threads), Python 3.11.7' (and the GPU, and MKL's Intel path where it is on:
    seq2seq/mkl.py); the parts it lacks left out."""
    about = ", ".join(str(info[k]) for k in ("cpu_vendor", "cpu_id") if info.get(k))
    flags = info.get("cpu_flags")
    if isinstance(flags, list) and flags:
        about += ("; " if about else "") + ", ".join(map(str, flags))
    vendor = f" ({about})" if about else ""
    extra = f", {info['gpu']}" if info.get("gpu") else ""
    if mkl.is_on(str(info.get("mkl_intel_path", ""))):
        extra += ", MKL's Intel path"
    return (
        f"{info['cpu_model']}{vendor}, {info['cores']} cores, torch {info['torch']} "
        f"({info['threads']} threads){extra}, Python {info['python']}"
    )
