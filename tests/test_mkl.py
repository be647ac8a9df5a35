"""seq2seq.mkl: MKL's Intel code paths on AMD CPUs, switched on before torch loads."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from seq2seq import mkl
from tests.tiny_run import checkout_pythonpath, child_env

ON_X86_LINUX = platform.system() == "Linux" and platform.machine() == "x86_64"

# a child that imports seq2seq (or torch first), then checks MKL's float32 products against
# float64 ones and prints the path's state
CHILD = """
import sys
from pathlib import Path
if sys.argv[1] == "torch_first":
    import torch
import seq2seq, torch
from seq2seq import mkl
torch.manual_seed(0)
worst = 0.0
for rows, inner, out in ((1, 128, 128), (64, 128, 8000), (320, 512, 128), (700, 700, 700)):
    x, w = torch.randn(rows, inner), torch.randn(out, inner)
    exact = x.double() @ w.double().t()
    for got in (torch.nn.functional.linear(x, w), torch.mm(x, w.t())):
        worst = max(worst, float(((got.double() - exact).abs() / exact.abs().clamp_min(1)).max()))
print(mkl.STATE)
print(worst)
"""


def run_child(setting: str, order: str = "seq2seq_first") -> tuple[str, float]:
    """The state and the worst relative error of a child's products under `setting`."""
    env = child_env(SEQ2SEQ_MKL_INTEL_PATH=setting, PYTHONPATH=checkout_pythonpath())
    out = subprocess.run(
        [sys.executable, "-c", CHILD, order], env=env, capture_output=True, text=True, check=True
    )
    state, worst = out.stdout.strip().splitlines()[-2:]
    return state, float(worst)


@pytest.mark.parametrize(
    ("setting", "vendor", "system", "machine", "torch_loaded", "why"),
    [
        ("auto", "AuthenticAMD", "Linux", "x86_64", False, ""),
        ("1", "GenuineIntel", "Linux", "x86_64", False, ""),
        ("auto", "GenuineIntel", "Linux", "x86_64", False, "off: not an AMD CPU"),
        ("auto", "", "Linux", "x86_64", False, "off: not an AMD CPU (vendor unknown"),
        ("0", "AuthenticAMD", "Linux", "x86_64", False, "off: SEQ2SEQ_MKL_INTEL_PATH=0"),
        ("auto", "AuthenticAMD", "Linux", "x86_64", True, "off: torch was imported before"),
        ("auto", "AuthenticAMD", "Darwin", "x86_64", False, "off: not Linux on x86-64"),
        ("1", "ARM", "Linux", "aarch64", False, "off: not Linux on x86-64"),
    ],
)
def test_decide(
    setting: str, vendor: str, system: str, machine: str, torch_loaded: bool, why: str
) -> None:
    got = mkl.decide(setting, vendor, system, machine, torch_loaded)
    assert got.startswith(why)
    assert (got == "") == (why == "")


def test_decide_refuses_an_unknown_setting() -> None:
    with pytest.raises(ValueError, match="SEQ2SEQ_MKL_INTEL_PATH='yes': use auto, 1 or 0"):
        mkl.decide("yes", "AuthenticAMD", "Linux", "x86_64", False)


@pytest.mark.skipif(not ON_X86_LINUX, reason="the library is built and loaded on x86-64 Linux")
def test_the_library_is_built_where_a_compiler_is() -> None:
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler here: the optional library is skipped at install")
    assert mkl.library() is not None, "seq2seq._mkl_intel was not built: rerun make install"


@pytest.mark.skipif(mkl.library() is None, reason="seq2seq._mkl_intel is not built here")
def test_forced_on_the_products_stay_exact_to_float_tolerance() -> None:
    state, worst = run_child("1")
    assert state.startswith("on")
    assert worst < 1e-4  # float32 products of unit-variance data against float64


def test_off_when_asked_or_when_torch_came_first() -> None:
    assert run_child("0")[0] == "off: SEQ2SEQ_MKL_INTEL_PATH=0"
    if ON_X86_LINUX:
        assert run_child("1", order="torch_first")[0] == "off: torch was imported before seq2seq"


def test_a_library_that_does_not_load_leaves_mkl_as_shipped(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A damaged build is reported in the state, never raised from `import seq2seq`."""
    broken = tmp_path / "_mkl_intel.so"
    broken.write_text("not a shared library")
    monkeypatch.setattr(mkl, "library", lambda: broken)
    monkeypatch.setattr(mkl, "decide", lambda *args: "")
    monkeypatch.setattr(mkl, "STATE", "not tried")
    assert mkl.use_intel_path().startswith("off: _mkl_intel.so did not load (")
    monkeypatch.setattr(mkl, "library", lambda: None)
    state, here = mkl.use_intel_path(), Path(mkl.__file__).resolve().parent
    assert state.startswith(f"off: seq2seq._mkl_intel is not built in {here}")
    assert "C compiler" in state
