"""load.py: decoding's float32 products go to the faster backend on this CPU, timed once, on a
few decoding steps of the model itself."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

import seq2seq.decode.load
from seq2seq import kernels
from seq2seq.config.schema import DecodeConfig, SearchKind
from seq2seq.decode import search
from seq2seq.decode.load import (
    PROBE_STEPS,
    Backends,
    backend_pairs,
    choose_products,
    probe_rows,
    probe_settings,
    time_decoding,
)
from seq2seq.decode.translator import Translator
from seq2seq.kernels import onednn
from seq2seq.model.transformer import EncoderDecoder
from seq2seq.train.run import train
from tests.conftest import MakeModel
from tests.tiny_run import compose_train, tiny_overrides, write_slice

BEAM = DecodeConfig(method=SearchKind.beam, beam_size=4, batch_size=8)
SCRIPTED = {  # (small weights', large weights') backends: seconds
    ("onednn", "onednn"): 0.004,
    ("onednn", "aten"): 0.003,
    ("aten", "onednn"): 0.001,
    ("aten", "aten"): 0.002,
}


@pytest.fixture
def fresh_products(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """No choice of this process remembered; time_decoding scripted (ATen for the small
    weights and oneDNN for the large ones the fastest) and its calls recorded."""
    monkeypatch.setattr(seq2seq.decode.load, "_PRODUCTS", {})
    timed: list[tuple] = []

    def scripted(model: object, decode: DecodeConfig, vocab: int) -> dict[Backends, float]:
        timed.append((model, decode, vocab))
        return dict(SCRIPTED)

    monkeypatch.setattr(seq2seq.decode.load, "time_decoding", scripted)
    return timed


def test_probe_rows_are_a_full_batchs_hypotheses() -> None:
    assert probe_rows(DecodeConfig(method=SearchKind.beam, beam_size=5, batch_size=64)) == 320
    assert probe_rows(DecodeConfig(method=SearchKind.greedy, beam_size=5, batch_size=33)) == 33
    assert probe_rows(DecodeConfig(method=SearchKind.sample, nbest=3, batch_size=10)) == 30


def test_fewer_sentences_than_a_batch_are_timed_at_the_batch_they_fill() -> None:
    """The batch is cut to the sentences, rounded up to a power of two; a batch or more, or an
    unknown count, keeps the settings' batch."""
    decode = DecodeConfig(method=SearchKind.beam, beam_size=5, batch_size=12)
    cut = {n: probe_settings(decode, n).batch_size for n in (0, 1, 2, 3, 4, 5, 8, 9, 11, 12, 40)}
    assert cut == {0: 1, 1: 1, 2: 2, 3: 4, 4: 4, 5: 8, 8: 8, 9: 12, 11: 12, 12: 12, 40: 12}
    assert probe_settings(decode) is decode
    assert probe_settings(decode, 12) is decode
    want = DecodeConfig(method=SearchKind.beam, beam_size=5, batch_size=4)
    assert probe_settings(decode, 3) == want


def test_time_decoding_runs_the_search_on_each_backend(
    make_model: MakeModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Catches timing one pair of backends twice or not at all, a search that ends early or
    has another batch than the settings', or leaving the last pair timed in place of the one
    in use."""
    model = make_model()
    seen: list[tuple[Backends, tuple[int, ...], int, int]] = []
    real = search.decode_batch

    def recorded(m: EncoderDecoder, src: torch.Tensor, cfg: DecodeConfig, min_len: int) -> list:
        found = real(m, src, cfg, min_len)
        steps = {len(h.tokens) + 1 for hyps in found for h in hyps}  # EOS included
        pair = (onednn.products(), onednn.large_products())
        seen.append((pair, tuple(src.shape), min_len, *steps))
        return found

    monkeypatch.setattr(seq2seq.decode.load, "decode_batch", recorded)
    onednn.set_products("aten", "onednn")
    times = time_decoding(model, BEAM, 24)
    backends = onednn.product_backends()
    pairs = [(small, large) for small in backends for large in backends]
    assert backend_pairs() == pairs
    assert list(times) == pairs
    assert min(times.values()) > 0
    assert [pair for pair, *_ in seen] == pairs * 4  # an untimed round, then 3
    shape = (8, seq2seq.decode.load.PROBE_SOURCE_LEN)
    assert {tuple(rest) for _, *rest in seen} == {(shape, PROBE_STEPS, PROBE_STEPS)}
    assert (onednn.products(), onednn.large_products()) == ("aten", "onednn")


def test_the_faster_is_kept_once_a_process(
    make_model: MakeModel, fresh_products: list[tuple], caplog: pytest.LogCaptureFixture
) -> None:
    """Catches keeping oneDNN where ATen was faster, one choice for both sizes of weights
    where a pair was faster, or timing again in the same process."""
    model = make_model()
    with caplog.at_level(logging.INFO, logger="seq2seq"):
        chosen = choose_products(model, model.cfg, BEAM, 24)
    assert chosen == (("aten", "onednn"), SCRIPTED)
    assert fresh_products == [(model, BEAM, 24)]
    assert (onednn.products(), onednn.large_products()) == ("aten", "onednn")
    assert (
        "float32 decoding products: aten, the large weights' onednn here (beam, 32 rows, 8 "
        "steps; small/large weights: onednn/onednn 4.0 ms, onednn/aten 3.0 ms, aten/onednn"
    ) in caplog.text
    onednn.set_products("onednn", "aten")
    assert choose_products(model, model.cfg, BEAM, 24)[0] == ("aten", "onednn")
    assert len(fresh_products) == 1
    assert (onednn.products(), onednn.large_products()) == ("aten", "onednn")  # remembered
    greedy = DecodeConfig(method=SearchKind.greedy, batch_size=16)
    choose_products(model, model.cfg, greedy, 24)
    assert len(fresh_products) == 2  # other settings: timed again


def test_a_choice_is_timed_once_a_machine(
    make_model: MakeModel,
    fresh_products: list[tuple],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The next process (this one's memory emptied) takes the choice from the choices file,
    untimed; other threads, another CPU or a corrupt file are timed anew. Catches a choice
    kept without the thread count or the CPU, or a bad file taken as a choice."""
    model = make_model()
    choose_products(model, model.cfg, BEAM, 24)
    assert len(fresh_products) == 1
    assert seq2seq.decode.load.choices_file().exists()
    monkeypatch.setattr(seq2seq.decode.load, "_PRODUCTS", {})  # a new process
    onednn.set_products("onednn", "onednn")
    with caplog.at_level(logging.INFO, logger="seq2seq"):
        assert choose_products(model, model.cfg, BEAM, 24) == (("aten", "onednn"), {})
    assert len(fresh_products) == 1  # not timed
    assert (onednn.products(), onednn.large_products()) == ("aten", "onednn")
    assert "decode_products.json" in caplog.text
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        choose_products(model, model.cfg, BEAM, 24)
    finally:
        torch.set_num_threads(threads)
    assert len(fresh_products) == 2  # other threads: timed
    monkeypatch.setattr(seq2seq.decode.load, "_PRODUCTS", {})
    monkeypatch.setattr(seq2seq.decode.load, "cpu_id", lambda: "family 1 model 2")
    choose_products(model, model.cfg, BEAM, 24)
    assert len(fresh_products) == 3  # another CPU: timed
    monkeypatch.setattr(seq2seq.decode.load, "_PRODUCTS", {})
    seq2seq.decode.load.choices_file().write_text("{not json")
    choose_products(model, model.cfg, BEAM, 24)
    assert len(fresh_products) == 4  # a corrupt file: timed, and written anew
    monkeypatch.setattr(seq2seq.decode.load, "_PRODUCTS", {})
    choose_products(model, model.cfg, BEAM, 24)
    assert len(fresh_products) == 4


def test_a_choice_that_names_no_backends_is_timed_anew(
    make_model: MakeModel, fresh_products: list[tuple]
) -> None:
    model = make_model()
    key = seq2seq.decode.load.products_key(model.cfg, BEAM, 24)
    seq2seq.decode.load.store_products(key, ("mkl", "onednn"))
    assert seq2seq.decode.load.stored_products(key) is None
    assert choose_products(model, model.cfg, BEAM, 24)[0] == ("aten", "onednn")
    assert len(fresh_products) == 1
    assert seq2seq.decode.load.stored_products(key) == ("aten", "onednn")


def test_a_choice_timed_with_mkls_intel_path_holds_only_with_it(
    make_model: MakeModel, fresh_products: list[tuple], monkeypatch: pytest.MonkeyPatch
) -> None:
    """ATen's products change speed with MKL's Intel code path (seq2seq/mkl.py): a choice timed
    with it on is not read by a process with it off, nor the other way round."""
    from seq2seq import mkl

    model = make_model()
    key = seq2seq.decode.load.products_key(model.cfg, BEAM, 24)
    monkeypatch.setattr(mkl, "STATE", "on (MKL's vendor check answered by seq2seq._mkl_intel)")
    seq2seq.decode.load.store_products(key, ("aten", "onednn"))
    assert seq2seq.decode.load.stored_products(key) == ("aten", "onednn")
    monkeypatch.setattr(mkl, "STATE", "off: SEQ2SEQ_MKL_INTEL_PATH=0")
    assert seq2seq.decode.load.stored_products(key) is None
    seq2seq.decode.load.store_products(key, ("onednn", "onednn"))
    assert seq2seq.decode.load.stored_products(key) == ("onednn", "onednn")
    monkeypatch.setattr(mkl, "STATE", "on (MKL's vendor check answered by seq2seq._mkl_intel)")
    assert seq2seq.decode.load.stored_products(key) == ("aten", "onednn")


def test_an_unwritable_cache_folder_only_costs_a_timing(
    make_model: MakeModel,
    fresh_products: list[tuple],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("SEQ2SEQ_CACHE_DIR", str(tmp_path / "a-file" / "cache"))
    model = make_model()
    assert choose_products(model, model.cfg, BEAM, 24)[0] == ("aten", "onednn")
    monkeypatch.setattr(seq2seq.decode.load, "_PRODUCTS", {})
    assert choose_products(model, model.cfg, BEAM, 24)[0] == ("aten", "onednn")
    assert len(fresh_products) == 2


def test_nothing_is_timed_with_the_reference_kernels(
    make_model: MakeModel, fresh_products: list[tuple]
) -> None:
    model = make_model()
    with kernels.use("reference"):
        assert choose_products(model, model.cfg, BEAM, 24) == (None, {})
    assert fresh_products == []
    assert onednn.products() == "onednn"


def test_one_sentence_is_timed_too(make_model: MakeModel, fresh_products: list[tuple]) -> None:
    """At most SMALL_ROWS rows the small weights take F.linear, but the output layer's product
    (a large weight) and the encoder's (a sentence's tokens) still run on the backends: a
    choice that matters."""
    model = make_model()
    decode = DecodeConfig(method=SearchKind.beam, beam_size=kernels.SMALL_ROWS, batch_size=1)
    assert choose_products(model, model.cfg, decode, 24)[0] == ("aten", "onednn")
    assert len(fresh_products) == 1


def test_a_few_sentences_are_timed_at_their_own_rows(
    make_model: MakeModel, fresh_products: list[tuple]
) -> None:
    """One sentence is timed at one sentence's rows (not a full batch's), once; a batch's worth
    is timed again at the batch, and 3 sentences at 4's rows. Catches timing a full batch for one
    sentence, or one sentence's choice taken for a batch."""
    model = make_model()
    choose_products(model, model.cfg, BEAM, 24, sentences=1)
    choose_products(model, model.cfg, BEAM, 24, sentences=1)
    assert [d.batch_size for _, d, _ in fresh_products] == [1]
    choose_products(model, model.cfg, BEAM, 24, sentences=8)
    choose_products(model, model.cfg, BEAM, 24)
    choose_products(model, model.cfg, BEAM, 24, sentences=3)
    choose_products(model, model.cfg, BEAM, 24, sentences=4)
    assert [d.batch_size for _, d, _ in fresh_products] == [1, 8, 4]
    assert fresh_products[2][1] == probe_settings(BEAM, 3)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("load")
    data = write_slice(root / "data")
    train(compose_train(tiny_overrides(data, root / "cache", "trainer.max_steps=2")), root / "run")
    return root / "run" / "checkpoints" / "last.pt"


def test_translator_times_float32_products_at_each_searchs_settings(
    checkpoint: Path, fresh_products: list[tuple]
) -> None:
    """The first translation with some settings times the model at those settings (greedy and
    beam differ), once; int8 has no float32 products to time."""
    int8 = Translator.from_checkpoint(checkpoint, device="cpu", quantize="int8")
    int8.translate(["a b c"], beam_size=4, batch_size=8)
    assert fresh_products == []
    translator = Translator.from_checkpoint(checkpoint, device="cpu")
    assert fresh_products == []  # loading times nothing
    vocab = translator.tgt_tok.vocab_size
    beam = translator.settings(beam_size=4, batch_size=8, scores=False)  # as translate() asks
    translator.translate(["a b", "c"], beam_size=4, batch_size=8)
    translator.translate(["c", "a b c"], beam_size=4, batch_size=8)
    assert fresh_products == [(translator.model, probe_settings(beam, 2), vocab)]
    assert onednn.products() == "aten"
    translator.translate(["a b c"] * 9, beam_size=4, batch_size=8)
    assert fresh_products[1][1] == beam  # a batch's worth: timed at the batch
    translator.translate(["a b c"] * 20, beam_size=1, batch_size=16)
    assert fresh_products[2][1] == translator.settings(beam_size=1, batch_size=16, scores=False)
