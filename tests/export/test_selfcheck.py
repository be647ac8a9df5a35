"""seq2seq-export's self-check and its folder (seq2seq/export/writer.py): a float32 CTranslate2
export that does not compute our model fails with ExportError and leaves nothing behind, neither
`out` nor its temporary folder, and an old `out` survives it; an existing `out` is refused
without force=true and replaced with it."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import seq2seq.export.writer as writer
from seq2seq.config.commands import ExportConfig
from seq2seq.data.tokenizer import EOS_ID
from seq2seq.decode.translator import Translator
from seq2seq.export.ctranslate2 import ExportError
from seq2seq.export.selfcheck import CHECK_TOLERANCE
from seq2seq.export.writer import export_checkpoint as export
from seq2seq.train.run import train
from tests.tiny_run import compose_train, tiny_overrides, write_slice

pytest.importorskip("ctranslate2")

LINES = 8  # validation sentences the self-check translates


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """best.pt of a tiny run trained for 4 steps: any weights do, the check compares the export
    with our own model, not with the references."""
    root = tmp_path_factory.mktemp("selfcheck")
    data = write_slice(root / "data", {"train": 60, "valid": LINES, "test": 4})
    extra = ("trainer.max_steps=4", "model.dropout=0")
    train(compose_train(tiny_overrides(data, root / "cache", *extra)), root / "run")
    return root / "run" / "checkpoints" / "best.pt"


def leftovers(folder: Path) -> list[str]:
    """Hidden entries of `folder`: the writer's temporary folders are named `.<out>.*`."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


Write = Callable[[Translator, ExportConfig, Path], None]


def perturbed_writer(original: Write, delta: float) -> Write:
    """write_folder, but the folder gets the model with one weight moved by `delta` (the EOS
    row's first entry of the output layer): our model, which the check compares with, is left
    as it was."""

    def write(t: Translator, cfg: ExportConfig, out: Path) -> None:
        weight = t.single("test").out.weight
        with torch.no_grad():
            before = weight[EOS_ID, 0].item()
            weight[EOS_ID, 0] += delta
            try:
                original(t, cfg, out)
            finally:
                weight[EOS_ID, 0] = before

    return write


def test_an_export_that_computes_another_model_fails_and_leaves_nothing(
    ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out, original = tmp_path / "ct2", writer.write_folder
    monkeypatch.setattr(writer, "write_folder", perturbed_writer(original, 5.0))
    with pytest.raises(ExportError) as err:
        export(ExportConfig(ckpt=str(ckpt), out=str(out), check_lines=LINES))
    message = str(err.value)
    assert "the ctranslate2 export does not compute our model" in message
    assert f"(> {CHECK_TOLERANCE})" in message
    assert float(message.split("differ by ")[1].split(" ")[0]) > 10 * CHECK_TOLERANCE
    assert not out.exists()
    assert leftovers(tmp_path) == []  # no temporary folder either

    # force=true over an old export: the failed one leaves the old folder as it was
    out.mkdir()
    (out / "old.txt").write_text("the previous export\n")
    with pytest.raises(ExportError, match="does not compute our model"):
        export(ExportConfig(ckpt=str(ckpt), out=str(out), check_lines=LINES, force=True))
    assert sorted(p.name for p in out.iterdir()) == ["old.txt"]
    assert (out / "old.txt").read_text() == "the previous export\n"
    assert leftovers(tmp_path) == []

    # the same weight moved by float rounding only: the check lets it through
    monkeypatch.setattr(writer, "write_folder", perturbed_writer(original, 1e-6))
    export(ExportConfig(ckpt=str(ckpt), out=str(tmp_path / "close"), check_lines=LINES))
    assert (tmp_path / "close" / "model.bin").is_file()


def test_an_existing_out_is_refused_without_force_and_replaced_with_it(
    ckpt: Path, tmp_path: Path
) -> None:
    out = tmp_path / "ct2"
    out.mkdir()
    (out / "old.txt").write_text("the previous export\n")
    (out / "model.bin").write_bytes(b"an older model")
    with pytest.raises(ExportError, match="ct2 exists: choose another out= or pass force=true"):
        export(ExportConfig(ckpt=str(ckpt), out=str(out), check_lines=LINES))
    assert sorted(p.name for p in out.iterdir()) == ["model.bin", "old.txt"]
    assert (out / "model.bin").read_bytes() == b"an older model"
    assert leftovers(tmp_path) == []

    check = export(ExportConfig(ckpt=str(ckpt), out=str(out), check_lines=LINES, force=True))
    # the new folder was loaded back and computes our model
    assert check is not None
    assert check.sentences == LINES
    assert check.max_logprob_diff < CHECK_TOLERANCE
    assert not (out / "old.txt").exists()  # the old contents are gone, not merged
    assert (out / "model.bin").read_bytes() != b"an older model"
    manifest = json.loads((out / writer.MANIFEST).read_text())
    assert manifest["check"]["sentences"] == LINES
    assert manifest["quantization"] == "float32"
    assert leftovers(tmp_path) == []


def test_the_exported_folder_has_the_permissions_of_the_umask(ckpt: Path, tmp_path: Path) -> None:
    """Like every other folder written (a run, a prepared corpus), not private to its owner as
    the temporary folder it is written in: a server running as another user can read it."""
    out = tmp_path / "ct2"
    before = os.umask(0o022)
    try:
        export(ExportConfig(ckpt=str(ckpt), out=str(out), check_lines=0))
    finally:
        os.umask(before)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert all(stat.S_IMODE(p.stat().st_mode) & 0o044 == 0o044 for p in out.iterdir())
    assert leftovers(tmp_path) == []
