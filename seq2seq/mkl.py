"""MKL's fast code paths on AMD CPUs, switched on before torch loads.

PyTorch's x86 CPU wheels link Intel's MKL, which runs float32 products (F.linear, torch.mm: the
products the kernel seam gives to ATen) on generic code paths when the CPU's vendor is not Intel:
slower than the kernels it picks for the same instruction sets on an Intel CPU. MKL asks one
function, `mkl_serv_intel_cpu_true`, whether the CPU is Intel, and libtorch_cpu calls it through
its procedure linkage table, so a library loaded into the process's global scope before torch
answers in its place. `mkl_intel.c` (built at install as `seq2seq._mkl_intel`, optional: without a
C compiler it is skipped) is that library and answers yes; MKL still chooses its kernels by the
CPU's instruction sets (CPUID), so only the vendor check changes, and products stay within
float32 rounding of exact ones (tests/test_mkl.py).

On an AVX2-only AMD EPYC (family 25 model 1, 2 threads; docs/BENCHMARKS.md, "MKL's Intel code
path on AMD"), a 2048^3 product ran at 117-134 against 100-109 GFLOP/s and the output layer's
(64 x 128) x (128 x 8,000) product in 1.1-1.2 against 2.0-2.8 ms; small weights' products of 320
rows were 1.06-1.36x slower. It is measured on that CPU only: SEQ2SEQ_MKL_INTEL_PATH=0 switches it
off where it does not pay.

`seq2seq/__init__.py` calls `use_intel_path` when the package is first imported, so it holds for
the CLI and for a program that imports seq2seq before torch. SEQ2SEQ_MKL_INTEL_PATH chooses:
"auto" (the default: on AMD CPUs under Linux), "1" (on any x86 CPU under Linux) or "0" (never).
`STATE` says what happened; training runs log it and benchmarks record it.
"""

from __future__ import annotations

import ctypes
import importlib.machinery
import os
import platform
import sys
from pathlib import Path

SETTING = "SEQ2SEQ_MKL_INTEL_PATH"
LIBRARY = "_mkl_intel"  # the extension's name next to this file (its suffix varies)
PACKAGE = Path(__file__).resolve().parent  # where the built library lives
STATE = "not tried"  # what `use_intel_path` did, in words


def _vendor() -> str:
    """/proc/cpuinfo's vendor_id of the first processor ("" off Linux or where it is missing)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        if line.startswith("vendor_id") and ":" in line:
            return line.split(":", 1)[1].strip()
    return ""


def library() -> Path | None:
    """The built library (seq2seq/_mkl_intel<suffix>), or None where it was not built."""
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = PACKAGE / f"{LIBRARY}{suffix}"
        if path.is_file():
            return path
    return None


def decide(setting: str, vendor: str, system: str, machine: str, torch_loaded: bool) -> str:
    """Why the Intel path stays off ("" when it is to be switched on), from the setting
    ("auto", "1" or "0"), the CPU's vendor, the OS and architecture, and whether torch is
    loaded already (then its MKL is bound, and loading the library would change nothing)."""
    if setting not in ("auto", "1", "0"):
        raise ValueError(f"{SETTING}={setting!r}: use auto, 1 or 0")
    if setting == "0":
        return f"off: {SETTING}=0"
    if system != "Linux" or machine not in ("x86_64", "AMD64"):
        return f"off: not Linux on x86-64 ({system} {machine})"
    if setting == "auto" and vendor != "AuthenticAMD":
        return f"off: not an AMD CPU ({vendor or 'vendor unknown'}; {SETTING}=1 forces it)"
    if torch_loaded:
        return "off: torch was imported before seq2seq"
    return ""


def is_on(state: str) -> bool:
    """Whether a STATE (now's, or one a run or a benchmark recorded) says the path was on."""
    return state.startswith("on")


def use_intel_path() -> str:
    """Load the library into the global scope if `decide` allows; set and return STATE."""
    global STATE
    setting = os.environ.get(SETTING, "auto").strip().lower() or "auto"
    why = decide(setting, _vendor(), platform.system(), platform.machine(), "torch" in sys.modules)
    path = None if why else library()
    if path is None:
        STATE = why or (
            f"off: seq2seq._mkl_intel is not built in {PACKAGE} (`make install` or `pip install .` "
            "builds it where a C compiler is found; a copied checkout or worktree lacks it)"
        )
        return STATE
    try:
        ctypes.CDLL(str(path), mode=os.RTLD_GLOBAL | os.RTLD_NOW)
    except OSError as err:  # a damaged build: MKL as shipped, and the reason in the state
        STATE = f"off: {path.name} did not load ({err})"
    else:
        STATE = "on (MKL's vendor check answered by seq2seq._mkl_intel)"
    return STATE
