"""translator.py: the Python API decodes as the run tested, takes changes, is thread-safe."""

from __future__ import annotations

import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from seq2seq.train import train
from seq2seq.translator import Translator
from tests.tiny_run import compose_train, tiny_overrides, write_slice


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny run (greedy test decoding) whose test split hypotheses are in test.hyp."""
    root = tmp_path_factory.mktemp("translator")
    data = write_slice(root / "data")
    train(compose_train(tiny_overrides(data, root / "cache", "trainer.max_steps=12")), root / "run")
    return root


def test_translate_decodes_as_the_run_tested(run: Path) -> None:
    from seq2seq import Translator as Exported  # the package's name for it

    translator = Exported.from_checkpoint(run / "run" / "checkpoints" / "best.pt", device="cpu")
    src = (run / "data" / "test.en").read_text(encoding="utf-8").splitlines()
    want = (run / "run" / "test.hyp").read_text(encoding="utf-8").splitlines()
    assert translator.decode.method.value == "greedy"
    assert translator.translate(src) == want
    assert translator.translate([src[0], "", src[1]]) == [want[0], "", want[1]]


def test_changes_and_nbest(run: Path) -> None:
    translator = Translator.from_checkpoint(run / "run" / "checkpoints" / "best.pt", "cpu")
    src = (run / "data" / "test.en").read_text(encoding="utf-8").splitlines()[:5]
    assert translator.settings(beam_size=3).method.value == "beam"
    assert translator.settings(beam_size=1).method.value == "greedy"
    nbest = translator.translate_nbest(src, beam_size=3, nbest=3)
    assert [len(n) for n in nbest] == [3] * 5
    for n in nbest:
        assert [t.score for t in n] == sorted((t.score for t in n), reverse=True)
    assert translator.translate(src, beam_size=3) == [n[0].text for n in nbest]
    with pytest.raises(TypeError, match="unknown decoding settings \\['beam'\\]; they are: method"):
        translator.translate(src, beam=3)
    with pytest.raises(ValueError, match="decode.beam_size=0 is invalid"):
        translator.translate(src, beam_size=0)


def test_threads_share_one_translator(run: Path) -> None:
    translator = Translator.from_checkpoint(run / "run" / "checkpoints" / "best.pt", "cpu")
    src = (run / "data" / "test.en").read_text(encoding="utf-8").splitlines()
    alone = [translator.translate(src[k::4]) for k in range(4)]
    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(lambda k: translator.translate(src[k::4]), range(4)))
    assert together == alone


def test_importing_the_package_loads_no_torch() -> None:
    code = "import sys, seq2seq; assert 'torch' not in sys.modules; seq2seq.Translator"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
