"""seq2seq.train.machine: the CPU, cores and torch version that figures are stamped with."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from seq2seq.train import machine

# The machine is never read: /proc/cpuinfo and lscpu's output are injected, as they read on an
# x86 server, on an ARM server (no "model name" in /proc/cpuinfo) and where they are missing.
X86_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model name\t: AMD EPYC 7763 64-Core Processor
flags\t\t: fpu vme avx2

processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7763 64-Core Processor (the second core)
"""
ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics
CPU implementer\t: 0x41
CPU architecture: 8
CPU part\t: 0xd0c

processor\t: 1
BogoMIPS\t: 243.75
"""
ARM_LSCPU = """Architecture:                    aarch64
CPU op-mode(s):                  32-bit, 64-bit
Vendor ID:                       ARM
Model name:                      Neoverse-N1
Thread(s) per core:              1
"""


def machine_reads(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    cpuinfo: str | None,
    lscpu: str | None,
    processor: str = "",
) -> None:
    """/proc/cpuinfo reads `cpuinfo` (None: absent, as off Linux), lscpu prints `lscpu` (None:
    not installed), platform.processor() returns `processor` (empty on Linux) and
    platform.machine() "aarch64"."""
    fake = tmp_path / "cpuinfo"
    if cpuinfo is not None:
        fake.write_text(cpuinfo)
    real_path = machine.Path
    monkeypatch.setattr(
        machine, "Path", lambda p: fake if str(p) == "/proc/cpuinfo" else real_path(p)
    )

    def run(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        assert args == ["lscpu"]
        if lscpu is None:
            raise FileNotFoundError(2, "No such file or directory", "lscpu")
        return subprocess.CompletedProcess(args, 0, lscpu, "")

    monkeypatch.setattr(machine.subprocess, "run", run)
    monkeypatch.setattr(machine.platform, "processor", lambda: processor)
    monkeypatch.setattr(machine.platform, "machine", lambda: "aarch64")


@pytest.mark.parametrize(
    ("cpuinfo", "lscpu", "processor", "want"),
    [
        pytest.param(
            X86_CPUINFO,
            None,
            "",
            {"cpu_model": "AMD EPYC 7763 64-Core Processor", "cpu_vendor": "AuthenticAMD"},
            id="x86-cpuinfo-no-lscpu",
        ),
        pytest.param(
            ARM_CPUINFO,
            ARM_LSCPU,
            "",
            {"cpu_model": "Neoverse-N1", "cpu_vendor": "ARM"},
            id="arm-lscpu",
        ),
        pytest.param(
            ARM_CPUINFO, None, "", {"cpu_model": "aarch64", "cpu_vendor": ""}, id="arm-no-lscpu"
        ),
        pytest.param(
            None, None, "arm", {"cpu_model": "arm", "cpu_vendor": ""}, id="no-cpuinfo-no-lscpu"
        ),
    ],
)
def test_cpu_info_falls_back_where_the_cpu_is_not_named(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    cpuinfo: str | None,
    lscpu: str | None,
    processor: str,
    want: dict[str, str],
) -> None:
    """lscpu first, then the first processor of /proc/cpuinfo, then the platform module: an ARM
    /proc/cpuinfo without "model name" still gives a name, never an empty one."""
    machine_reads(monkeypatch, tmp_path, cpuinfo, lscpu, processor)
    assert machine.cpu_info() == want


def test_describe_names_the_cpu_cores_and_torch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    machine_reads(monkeypatch, tmp_path, ARM_CPUINFO, ARM_LSCPU)
    info = machine.describe()
    assert (info["cpu_model"], info["cpu_vendor"]) == ("Neoverse-N1", "ARM")
    assert info["cores"] == os.cpu_count()
    assert info["torch"] == torch.__version__
    assert info["threads"] == torch.get_num_threads()
    assert info["python"] == platform.python_version()
    line = machine.summary(info)
    assert line.startswith(f"Neoverse-N1 (ARM), {os.cpu_count()} cores, torch {torch.__version__}")
    assert (
        machine.summary(
            {
                "cpu_model": "aarch64",
                "cpu_vendor": "",
                "cores": 4,
                "torch": "2.5.0",
                "threads": 2,
                "gpu": None,
                "python": "3.11.7",
            }
        )
        == "aarch64, 4 cores, torch 2.5.0 (2 threads), Python 3.11.7"
    )


def test_summary_names_the_family_model_and_speed_flags(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Two boxes sold as "AMD EPYC" train at different speeds: the line tells them apart."""
    cpuinfo = X86_CPUINFO.replace("cpu family\t: 25\n", "cpu family\t: 25\nmodel\t\t: 17\n")
    machine_reads(monkeypatch, tmp_path, cpuinfo, None)
    info = machine.describe()
    assert info["cpu_id"] == "family 25 model 17"
    assert info["cpu_flags"] == ["avx2"]
    assert machine.summary(info).startswith(
        "AMD EPYC 7763 64-Core Processor (AuthenticAMD, family 25 model 17; avx2), "
    )
    machine_reads(monkeypatch, tmp_path, X86_CPUINFO, None)  # no model number: no id
    assert machine.cpu_id() == ""


def test_summary_says_when_mkls_intel_path_is_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A figure measured with MKL's Intel code path (seq2seq/mkl.py) says so; one without not."""
    machine_reads(monkeypatch, tmp_path, X86_CPUINFO, None)
    info = machine.describe()
    info["mkl_intel_path"] = "on (MKL's vendor check answered by seq2seq._mkl_intel)"
    assert machine.summary(info).endswith(", MKL's Intel path, Python " + str(info["python"]))
    info["mkl_intel_path"] = "off: not an AMD CPU (GenuineIntel)"
    assert "MKL" not in machine.summary(info)


def test_importing_it_loads_no_torch() -> None:
    """The CTranslate2 benchmark worker imports it and must not load torch."""
    code = "import sys, seq2seq.train.machine; print('torch' in sys.modules)"
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"
