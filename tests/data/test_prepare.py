"""prepare.py and prepared.py: a corpus prepared once, checked when opened, trained from."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from seq2seq.config.schema import TrainConfig
from seq2seq.data.prepare import Reservoir, cache_key, prepare, settings
from seq2seq.data.prepared import open_prepared, read_manifest
from seq2seq.data.text import DataError
from seq2seq.train.corpus import load_corpus
from tests.tiny_run import compose_train, tiny_overrides, write_slice

SIZES = {"train": 300, "valid": 20, "test": 20}


@pytest.fixture
def data(tmp_path: Path) -> Path:
    """A slice of the numbers data with an empty pair (line 3) and an over-long one (line 10)."""
    folder = write_slice(tmp_path / "data", SIZES)
    src = (folder / "train.en").read_text(encoding="utf-8").splitlines()
    tgt = (folder / "train.de").read_text(encoding="utf-8").splitlines()
    src[2], src[9] = "  ", " ".join(["seven"] * 100)
    (folder / "train.en").write_text("\n".join(src) + "\n", encoding="utf-8")
    (folder / "train.de").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    return folder


def config(data: Path, tmp_path: Path, *extra: str) -> TrainConfig:
    return compose_train(tiny_overrides(data, tmp_path / "tokenizers", *extra))


def test_prepared_arrays_hold_every_kept_pair(data: Path, tmp_path: Path) -> None:
    cfg = config(data, tmp_path)
    out = prepare(cfg.data, cfg.tokenizer, tmp_path / "prep")
    manifest = read_manifest(out)
    entry = manifest["train"]["train"]
    assert (entry["pairs"], entry["kept"], entry["dropped"]) == (
        300,
        298,
        {"empty": 1, "too_long": 1},
    )
    assert manifest["id_dtype"] == "uint16"
    dropped = (out / "train" / "train" / "dropped.tsv").read_text().splitlines()
    assert dropped == ["line\treason", "3\tempty", "10\ttoo_long"]
    prepared = open_prepared(out, ["train"])
    src_tok, tgt_tok = prepared.tokenizers
    arrays = prepared.train["train"]
    src = (data / "train.en").read_text(encoding="utf-8").splitlines()
    tgt = (data / "train.de").read_text(encoding="utf-8").splitlines()
    kept = [i for i in range(300) if i not in (2, 9)]
    for row, line in enumerate(kept):
        s, t = arrays.row(row)
        assert s.tolist() == src_tok.encode(src[line])
        assert t.tolist() == tgt_tok.encode(tgt[line])
    order = np.asarray(arrays.order)
    width = [max(len(arrays.row(i)[0]), len(arrays.row(i)[1])) for i in order.tolist()]
    assert width == sorted(width)
    assert sorted(order.tolist()) == list(range(298))
    assert (out / "eval" / "valid.en").read_text() == (data / "valid.en").read_text()


def test_workers_and_chunks_do_not_change_the_arrays(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = config(data, tmp_path)
    one = prepare(cfg.data, cfg.tokenizer, tmp_path / "one")
    monkeypatch.setattr("seq2seq.data.prepare.CHUNK", 7)  # many chunks, out of order if unordered
    cfg.data.workers = 2
    two = prepare(cfg.data, cfg.tokenizer, tmp_path / "two")
    for name in ("src.ids", "tgt.ids", "src.offsets", "order", "dropped.tsv", "groups.npy"):
        a, b = (p / "train" / "train" / name for p in (one, two))
        assert a.read_bytes() == b.read_bytes(), name


def test_the_tokenizer_sample_is_bounded_seeded_and_in_file_order() -> None:
    src = [f"s{i}" if i % 10 else " " for i in range(1000)]
    tgt = [f"t{i}" for i in range(1000)]

    def sample(size: int, seed: int) -> list[str]:
        reservoir = Reservoir(size, seed)
        for k in range(0, 1000, 64):
            reservoir.add(src[k : k + 64], tgt[k : k + 64])
        return reservoir.sample()[0]

    assert sample(5000, 1) == [s for s in src if s.strip()]  # all non-blank, in order
    small = sample(100, 1)
    assert len(small) == 100
    assert small == sorted(small, key=lambda s: int(s[1:]))
    assert small == sample(100, 1)
    assert small != sample(100, 2)
    assert " " not in small


def test_a_damaged_or_stale_prepared_corpus_is_refused(data: Path, tmp_path: Path) -> None:
    cfg = config(data, tmp_path)
    out = prepare(cfg.data, cfg.tokenizer, tmp_path / "prep")
    ids = out / "train" / "train" / "src.ids"
    whole = ids.read_bytes()
    ids.write_bytes(whole[:-2])
    with pytest.raises(DataError, match=r"src.ids: the prepared corpus is damaged .* fix"):
        open_prepared(out, ["train"])
    ids.write_bytes(whole)
    open_prepared(out, ["train"])
    with pytest.raises(DataError, match=r"no training split \['other'\]"):
        open_prepared(out, ["other"])
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "format": 0}))
    with pytest.raises(DataError, match=r"format 0; this version reads format 1\. fix"):
        open_prepared(out, ["train"])
    (out / "manifest.json").write_text(json.dumps(manifest))
    with (data / "train.de").open("a", encoding="utf-8") as f:
        f.write("noch eine Zeile\n")
    with pytest.raises(DataError, match=r"train\.de changed after it was prepared"):
        open_prepared(out, ["train"])


def test_a_copied_source_with_a_new_time_is_checked_by_content(data: Path, tmp_path: Path) -> None:
    """Catches a prepared corpus refused for a source's modification time alone (a copy, a
    checkout): open_prepared raises if the unchanged bytes under a new time are not accepted."""
    cfg = config(data, tmp_path)
    out = prepare(cfg.data, cfg.tokenizer, tmp_path / "prep")
    os.utime(data / "train.en", ns=(1, 1))
    open_prepared(out, ["train"])  # same size and bytes: accepted


def test_a_failed_prepare_leaves_the_old_directory(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = config(data, tmp_path)
    out = prepare(cfg.data, cfg.tokenizer, tmp_path / "prep")
    before = read_manifest(out)

    def fail(*_: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("seq2seq.data.prepare.write_manifest", fail)
    with pytest.raises(OSError, match="disk full"):
        prepare(cfg.data, cfg.tokenizer, out)
    assert read_manifest(out) == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".prep")) == []


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"eins\nzwei\n", "line counts differ: .*train.en has 300 lines but .*train.de has 2"),
        (b"eins\n\xffzwei\n", r"train.de:2: invalid UTF-8 \(byte 0xff at column 1\)"),
        (b"", "train.de: file is empty"),
    ],
)
def test_bad_input_is_a_clear_error(
    data: Path, tmp_path: Path, content: bytes, message: str
) -> None:
    (data / "train.de").write_bytes(content)
    cfg = config(data, tmp_path)
    with pytest.raises(DataError, match=message):
        prepare(cfg.data, cfg.tokenizer, tmp_path / "prep")
    assert not (tmp_path / "prep").exists()


def test_training_data_is_prepared_once_and_reused(
    data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    cfg = config(data, tmp_path)
    first = load_corpus(cfg)
    assert sum("preparing the data into" in r.getMessage() for r in caplog.records) == 1
    caplog.clear()
    again = load_corpus(cfg)
    assert not any("preparing the data" in r.getMessage() for r in caplog.records)
    assert again.fingerprint == first.fingerprint
    assert len(again.train) == 298
    (data / "valid.en").write_text((data / "valid.en").read_text() + "")  # same bytes, new time
    os.utime(data / "train.en", ns=(10**18, 10**18))
    moved = load_corpus(cfg)  # prepared again (the key holds the time), same fingerprint
    assert moved.fingerprint == first.fingerprint


def test_training_from_an_explicit_prepared_directory(data: Path, tmp_path: Path) -> None:
    cfg = config(data, tmp_path)
    out = prepare(cfg.data, cfg.tokenizer, tmp_path / "prep")
    cfg.data.prepared = str(out)
    cfg.data.root = str(tmp_path / "nowhere")  # everything comes from the prepared directory
    corpus = load_corpus(cfg)
    assert sorted(corpus.evals) == ["test", "valid"]
    assert len(corpus.train) == 298
    cfg.data.src_lang, cfg.data.tgt_lang = "de", "en"
    with pytest.raises(DataError, match=r"holds en-de but data\.src_lang/tgt_lang are de-en"):
        load_corpus(cfg)


def test_several_training_splits_mix_with_weights(data: Path, tmp_path: Path) -> None:
    for lang in ("en", "de"):
        lines = (data / f"train.{lang}").read_text().splitlines()
        (data / f"extra.{lang}").write_text("\n".join(lines[:50]) + "\n")
    cfg = config(data, tmp_path, "data.train=[train,extra]", "data.weights=[1,2]")
    corpus = load_corpus(cfg)
    assert corpus.train.names == ["train", "extra"]
    assert len(corpus.train) == 298 + 48  # lines 3 and 10 left out
    corpus.train.epoch_batches(0)
    assert corpus.train.plan is not None
    assert corpus.train.plan.drawn == [298, 96]


def test_lowercase_is_in_the_cache_key_only_when_set(data: Path, tmp_path: Path) -> None:
    """tokenizer.lowercase=true prepares its own corpus; off, the key is what it was before the
    option existed (the settings have no `lowercase` entry), so earlier caches stay valid."""
    plain, folded = config(data, tmp_path), config(data, tmp_path, "tokenizer.lowercase=true")
    assert "lowercase" not in settings(plain.data, plain.tokenizer)["tokenizer"]
    assert settings(folded.data, folded.tokenizer)["tokenizer"]["lowercase"] is True
    assert cache_key(plain.data, plain.tokenizer) != cache_key(folded.data, folded.tokenizer)
