"""seq2seq.train.machine: the CPU, cores and torch version that figures are stamped with."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from seq2seq.train import machine


def test_describe_names_the_cpu_cores_and_torch() -> None:
    info = machine.describe()
    assert info["cores"] == os.cpu_count()
    assert info["torch"] == torch.__version__
    assert isinstance(info["cpu_model"], str)
    assert info["cpu_model"]
    if Path("/proc/cpuinfo").exists():
        text = Path("/proc/cpuinfo").read_text()
        assert f": {info['cpu_model']}" in text
        assert f": {info['cpu_vendor']}" in text
    line = machine.summary(info)
    assert str(info["cpu_model"]) in line
    assert f"{info['cores']} cores" in line


def test_importing_it_loads_no_torch() -> None:
    """The CTranslate2 benchmark worker imports it and must not load torch."""
    code = "import sys, seq2seq.train.machine; print('torch' in sys.modules)"
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "False"
