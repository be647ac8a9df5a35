"""benchmarks/: the CTranslate2 worker of decode.py never loads torch (two OpenMP runtimes in
one process slow CTranslate2 down), the length-cap rule of the natural modes, and the machine
fields every result file records.

The worker test runs the real worker path (decode.main with --worker) in a fresh interpreter,
with a stand-in ctranslate2 module: CI installs only the dev extra, and a real CTranslate2 would
need a converted model. Where ctranslate2 is installed, a second test imports it for real."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
HEAVY = ("torch", "seq2seq", "transformers")  # what the CTranslate2 worker must not import

FAKE_CT2 = """
import sys, types

class Translator:  # returns "a </s>" for every sentence
    def __init__(self, path, **kwargs):
        self.kwargs = kwargs

    def translate_batch(self, batch, **kwargs):
        return [types.SimpleNamespace(hypotheses=[["a", "</s>"]]) for _ in batch]

fake = types.ModuleType("ctranslate2")
fake.Translator = Translator
sys.modules["ctranslate2"] = fake
"""

CHECK = """
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r})
assert not heavy, f"loaded: {{heavy[:10]}}"
"""


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter with benchmarks/ on sys.path."""
    prelude = f"import sys\nsys.path.insert(0, {str(BENCH)!r})\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + code],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_ct2_worker_never_imports_torch(tmp_path: Path) -> None:
    """decode.py --worker ct2_float32 greedy_forced, end to end up to CTranslate2's calls."""
    inputs = {
        "src_ids": [[4, 5], [5]],
        "batches": [[0, 1]],
        "threads": 1,
        "vocab": ["<pad>", "<s>", "</s>", "<unk>", "a", "b"],
        "paths": {"ct2_float32": str(tmp_path)},
    }
    path = tmp_path / "inputs.json"
    path.write_text(json.dumps(inputs))
    argv = ["decode.py", "--worker", "ct2_float32", "greedy_forced", str(path)]
    code = FAKE_CT2 + f"sys.argv = {argv!r}\nimport decode\ndecode.main()\n"
    done = run_python(code + CHECK.format(heavy=HEAVY))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["outputs"] == [[4], [4]]  # EOS stripped, input order kept
    assert result["lengths"] == [2, 2]
    assert result["alone_step_ms"] is not None


@pytest.mark.skipif(importlib.util.find_spec("ctranslate2") is None, reason="no ctranslate2")
def test_real_ctranslate2_import_brings_no_torch() -> None:
    """With the real ctranslate2: it, and every module the worker imports, leave torch out."""
    code = (
        "import ctranslate2, common, decode, decode_engines\n"
        "run = decode_engines.runner('ct2_int8')\n"
    )
    done = run_python(code + CHECK.format(heavy=HEAVY))
    assert done.returncode == 0, done.stderr


@pytest.fixture
def decode(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))
    import decode as module

    return module


def test_at_cap_is_the_same_rule_for_every_engine(decode: ModuleType) -> None:
    # limit 4: ours ends with a forced EOS after 3 tokens, the others stop at 4 without one
    outputs = [[5, 6, 7], [5, 6, 7, 8], [5, 6], []]
    assert decode.at_cap(outputs, 4) == 0.5


def test_natural_mode_over_the_cap_share_fails_loudly(decode: ModuleType) -> None:
    table = {
        "greedy_forced": {"ours": {"at_cap": 1.0}},  # forced: at the cap by design
        "beam5_natural": {"ours": {"at_cap": 0.05}, "hf_sdpa": {"at_cap": 0.5}},
    }
    decode.check_natural_lengths(table)
    table["greedy_natural"] = {"ours": {"at_cap": 0.25}}
    with pytest.raises(SystemExit, match=r"greedy_natural: 25\.0%"):
        decode.check_natural_lengths(table)


def test_versus_faster_hf_takes_the_faster_attention(decode: ModuleType) -> None:
    table = {
        "greedy_forced": {
            "ours": {"ours_speedup": 1.0},
            "hf_sdpa": {"sent_per_s": 10.0, "ours_speedup": 3.0},
            "hf_eager": {"sent_per_s": 15.0, "ours_speedup": 2.0},
        }
    }
    faster = decode.versus_faster_hf(table)
    assert faster == {"greedy_forced": {"engine": "hf_eager", "ours_speedup": 2.0}}


def test_machine_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import common

    fields = common.machine_fields()
    for key in ("cpu_model", "cpu_vendor", "cores", "torch", "threads", "machine"):
        assert key in fields
    assert fields["cpu_model"] in fields["machine"]
    assert fields["torch"] in fields["machine"]
