"""translator.py: the Python API decodes as the run tested, takes changes, is thread-safe."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from seq2seq.data.tokenizer import SPECIAL_TOKENS, VocabTokenizer
from seq2seq.decode.translator import Translator
from seq2seq.train.checkpoint import CheckpointError, load_checkpoint
from seq2seq.train.run import train
from tests.tiny_run import (
    checkout_pythonpath,
    child_env,
    compose_train,
    tiny_overrides,
    write_slice,
)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny run (greedy test decoding) whose test split hypotheses are in test.hyp."""
    root = tmp_path_factory.mktemp("translator")
    data = write_slice(root / "data")
    train(compose_train(tiny_overrides(data, root / "cache", "trainer.max_steps=12")), root / "run")
    return root


def test_translate_decodes_as_the_run_tested(run: Path) -> None:
    from seq2seq.decode.translator import Translator as Exported

    translator = Exported.from_checkpoint(run / "run" / "checkpoints" / "best.pt", device="cpu")
    src = (run / "data" / "test.en").read_text(encoding="utf-8").splitlines()
    want = (run / "run" / "test.hyp").read_text(encoding="utf-8").splitlines()
    assert translator.decode.method.value == "greedy"
    assert translator.translate(src) == want
    assert translator.translate([src[0], "", src[1]]) == [want[0], "", want[1]]


def test_an_int8_translator_quantizes_every_linear_layer(run: Path) -> None:
    """Catches quantize=int8 ignored by from_checkpoint, or an unknown weight type accepted."""
    from seq2seq.decode.quantize import Int8Linear
    from seq2seq.model.layers import Linear

    ckpt = run / "run" / "checkpoints" / "best.pt"
    translator = Translator.from_checkpoint(ckpt, "cpu", quantize="int8")
    modules = list(translator.model.modules())
    assert any(isinstance(m, Int8Linear) for m in modules)
    assert not any(isinstance(m, Linear) for m in modules)
    src = (run / "data" / "test.en").read_text(encoding="utf-8").splitlines()[:4]
    assert len(translator.translate(src)) == 4
    with pytest.raises(ValueError, match="'int4' is not a valid WeightType"):
        Translator.from_checkpoint(ckpt, "cpu", quantize="int4")


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
    with pytest.raises(ValueError, match=r"decode\.beam_size=0 is invalid"):
        translator.translate(src, beam_size=0)


def test_translate_skips_greedy_scores_that_translate_nbest_keeps(
    run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """translate() returns text only: its greedy search runs without scores (no log-softmax a
    step), with translate_nbest's texts; translate_nbest scores unless told not to."""
    translator = Translator.from_checkpoint(run / "run" / "checkpoints" / "best.pt", "cpu")
    src = (run / "data" / "test.en").read_text(encoding="utf-8").splitlines()[:5]
    nbest = translator.translate_nbest(src)
    assert all(math.isfinite(n[0].score) for n in nbest)
    assert all(math.isnan(n[0].score) for n in translator.translate_nbest(src, scores=False))
    calls: list[int] = []
    original = torch.Tensor.log_softmax

    def counted(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.Tensor, "log_softmax", counted)
    assert translator.translate(src) == [n[0].text for n in nbest]
    assert calls == []
    translator.translate(src, scores=True)
    assert calls


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


def test_sampling_from_python_is_seeded(run: Path) -> None:
    translator = Translator.from_checkpoint(run / "run" / "checkpoints" / "best.pt", "cpu")
    src = (run / "data" / "test.en").read_text(encoding="utf-8").splitlines()[:6]
    drawn = translator.translate_nbest(src, method="sample", nbest=3, temperature=2.0, seed=3)
    assert [len(n) for n in drawn] == [3] * 6
    again = translator.translate_nbest(src[::-1], method="sample", nbest=3, temperature=2.0, seed=3)
    assert [[t.text for t in n] for n in again] != [[t.text for t in n] for n in drawn[::-1]]
    same = translator.translate_nbest(src, method="sample", nbest=3, temperature=2.0, seed=3)
    assert same == drawn
    assert len({t.text for n in drawn for t in n}) > 6  # the samples differ


def test_ensembles_and_alignments_from_python(run: Path, tmp_path: Path) -> None:
    best = run / "run" / "checkpoints" / "best.pt"
    single = Translator.from_checkpoint(best, "cpu")
    pair = Translator.from_checkpoint([best, best], "cpu")
    src = (run / "data" / "test.en").read_text(encoding="utf-8").splitlines()[:6]
    assert pair.translate(src, beam_size=3) == single.translate(src, beam_size=3)
    found = single.translate_nbest(src, attention=True, beam_size=3)
    for text, (t,) in zip(src, found, strict=True):
        assert t.attention is not None
        assert t.attention.shape[0] == 1  # one decoder layer
        pairs = t.alignment()
        assert [j for _, j in pairs] == list(range(len(t.tokens)))
        assert all(0 <= i < len(single.src_tok.encode(text)) for i, _ in pairs)
    with pytest.raises(ValueError, match="no attention: translate with attention=True"):
        single.translate_nbest(src[:1])[0][0].alignment()
    # a checkpoint whose target vocabulary is another (same size: the weights load) is refused
    state = load_checkpoint(best)
    tokens = [*SPECIAL_TOKENS, *(f"w{i}" for i in range(single.tgt_tok.vocab_size - 4))]
    state["tokenizers"]["tgt"] = VocabTokenizer("word", tokens).state()
    torch.save(state, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match=r"other\.pt: its target vocabulary differs from"):
        Translator.from_checkpoint([best, tmp_path / "other.pt"], "cpu")


def test_translate_cli_samples_ensembles_aligns_and_plots(run: Path, tmp_path: Path) -> None:
    """seq2seq-translate (python -m, this checkout) with every new setting at once."""
    best = run / "run" / "checkpoints" / "best.pt"
    (tmp_path / "in.txt").write_text("seven\n\ntwelve thousand\n", encoding="utf-8")
    args = [
        f"ckpt=[{best},{best}]",
        "input=in.txt",
        "device=cpu",
        "decode=sample",
        "decode.nbest=2",
        "align=true",
        "attention_dir=att",
        "attention_layers=all",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "seq2seq.cli.translate", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        env=child_env(PYTHONPATH=checkout_pythonpath()),
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 6
    assert lines[2:4] == [" ||| ", " ||| "]  # 2 samples a line, blank kept
    for line in lines[:2] + lines[4:]:
        _text, pairs = line.split(" ||| ")
        assert all(re.fullmatch(r"\d+-\d+", p) for p in pairs.split()), line
    assert "sample, 2 a sentence, temperature 1.0" in done.stderr
    assert sorted(p.name for p in (tmp_path / "att").iterdir()) == ["line-1.png", "line-3.png"]
    assert (tmp_path / "att" / "line-1.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
