"""load.py: decoding's float32 products go to the faster backend on this CPU, timed once."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

import seq2seq.decode.load
from seq2seq import kernels
from seq2seq.config.schema import DecodeConfig, ModelConfig, SearchKind
from seq2seq.decode.load import choose_products, decode_product_shapes
from seq2seq.decode.translator import Translator
from seq2seq.kernels import onednn
from seq2seq.train.run import train
from tests.tiny_run import compose_train, tiny_overrides, write_slice

MODEL = ModelConfig(d_model=16, n_heads=2, enc_layers=1, dec_layers=2, d_ff=24)
CPU = torch.device("cpu")


@pytest.fixture
def fresh_products(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """No choice of this process remembered; time_decode_products scripted (oneDNN 2 ms, ATen
    1 ms) and its calls recorded."""
    monkeypatch.setattr(seq2seq.decode.load, "_PRODUCTS", {})
    timed: list[tuple] = []

    def time_decode_products(step: tuple, rows: tuple) -> dict[str, float]:
        timed.append((step, rows))
        return {"onednn": 0.002, "aten": 0.001}

    monkeypatch.setattr(kernels, "time_decode_products", time_decode_products)
    return timed


def test_shapes_are_a_steps_products_at_a_full_and_a_half_batch() -> None:
    """Per decoder layer: self-attention q, kv, out; cross-attention q, out; feed-forward up,
    down; then the output layer. Beam search has batch x beam rows, sampling batch x samples."""
    layer = ((16, 16), (16, 32), (16, 16), (16, 16), (16, 16), (16, 24), (24, 16))
    step = layer * 2 + ((16, 50),)
    beam = DecodeConfig(method=SearchKind.beam, beam_size=5, batch_size=64)
    assert decode_product_shapes(MODEL, 50, beam) == (step, (320, 160))
    greedy = DecodeConfig(method=SearchKind.greedy, beam_size=5, batch_size=33)
    assert decode_product_shapes(MODEL, 50, greedy)[1] == (33, 16)
    sample = DecodeConfig(method=SearchKind.sample, nbest=3, batch_size=10)
    assert decode_product_shapes(MODEL, 50, sample)[1] == (30, 15)
    huge = DecodeConfig(method=SearchKind.beam, beam_size=12, batch_size=1000)
    assert decode_product_shapes(MODEL, 50, huge)[1] == (1024, 512)


def test_the_faster_is_kept_once_a_process(
    fresh_products: list[tuple], caplog: pytest.LogCaptureFixture
) -> None:
    """Catches keeping oneDNN where ATen was faster, timing other shapes than the model's, or
    timing again in the same process."""
    decode = DecodeConfig(method=SearchKind.beam, beam_size=4, batch_size=8)
    with caplog.at_level(logging.INFO, logger="seq2seq"):
        chosen = choose_products(MODEL, decode, 50, CPU)
    assert chosen == ("aten", {"onednn": 0.002, "aten": 0.001})
    assert fresh_products == [decode_product_shapes(MODEL, 50, decode)]
    assert onednn.products() == "aten"
    assert "float32 decoding products: aten on this CPU (a step's products: onednn 2.0 ms" in (
        caplog.text
    )
    onednn.set_products("onednn")
    assert choose_products(MODEL, decode, 50, CPU)[0] == "aten"
    assert len(fresh_products) == 1
    assert onednn.products() == "aten"  # set again from the remembered choice


@pytest.mark.parametrize("case", ["cuda", "reference", "one sentence"])
def test_nothing_is_timed_where_no_choice_matters(fresh_products: list[tuple], case: str) -> None:
    """Another device, the reference kernels, or at most SMALL_ROWS rows (F.linear always)."""
    decode = DecodeConfig(method=SearchKind.beam, beam_size=4, batch_size=8)
    device = torch.device("cuda") if case == "cuda" else CPU
    if case == "one sentence":
        decode = DecodeConfig(method=SearchKind.beam, beam_size=kernels.SMALL_ROWS, batch_size=1)
    with kernels.use("reference" if case == "reference" else "auto"):
        assert choose_products(MODEL, decode, 50, device) == ("", {})
    assert fresh_products == []
    assert onednn.products() == "onednn"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("load")
    data = write_slice(root / "data")
    train(compose_train(tiny_overrides(data, root / "cache", "trainer.max_steps=2")), root / "run")
    return root / "run" / "checkpoints" / "last.pt"


def test_translator_chooses_float32_products_not_int8_ones(
    checkpoint: Path, fresh_products: list[tuple]
) -> None:
    """from_checkpoint times the model's decoding products at its settings; int8 has none."""
    Translator.from_checkpoint(checkpoint, device="cpu", quantize="int8")
    assert fresh_products == []
    translator = Translator.from_checkpoint(checkpoint, device="cpu")
    cfg, vocab = translator.cfg, translator.tgt_tok.vocab_size
    assert fresh_products == [decode_product_shapes(cfg.model, vocab, cfg.decode)]
    assert onednn.products() == "aten"
