"""A checkpoint back into a model to translate with: its config, tokenizers and weights, built
through the same `build_model` as training, so translation gets exactly the model that was
trained. Imports no training or data-preparation code."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import torch

from seq2seq import kernels, mkl
from seq2seq.config.schema import (
    DecodeConfig,
    ModelConfig,
    SearchKind,
    TrainConfig,
    config_from_dict,
)
from seq2seq.data.tokenizer import (
    EOS_ID,
    SPECIAL_TOKENS,
    Tokenizer,
    tokenizer_from_state,
    write_atomic,
)
from seq2seq.decode.ensemble import Ensemble, SearchModel, check_same_vocabularies
from seq2seq.decode.schedule import decoding
from seq2seq.decode.search import decode_batch
from seq2seq.kernels import resolve_device
from seq2seq.model.transformer import EncoderDecoder, build_model
from seq2seq.train.checkpoint import load_checkpoint, load_model_state
from seq2seq.train.machine import cpu_flags, cpu_id, cpu_info

log = logging.getLogger(__name__)

# where decoding's float32 products run: the small weights' backend, then the large ones'
# (kernels.set_products(small, large); onednn.LARGE_WEIGHT: the output layer's (V, D))
Backends = tuple[str, str]
# (model sizes, vocabulary, search settings, threads) -> the fastest backends and every pair's
# timing
_PRODUCTS: dict[tuple[object, ...], tuple[Backends, dict[Backends, float]]] = {}
PROBE_STEPS = 8  # decoder steps of the timed search
PROBE_SOURCE_LEN = 16  # tokens per timed source, EOS included
PROBE_ROUNDS = 3  # timed searches per backend, after an untimed one
# where the choices timed on this machine are kept between processes (a folder; default:
# $XDG_CACHE_HOME/seq2seq, else ~/.cache/seq2seq)
CACHE_ENV = "SEQ2SEQ_CACHE_DIR"


def load_for_inference(
    ckpt: str | Path, device: str
) -> tuple[EncoderDecoder, Tokenizer, Tokenizer, TrainConfig]:
    """Model (eval mode, on device), tokenizers and config of a checkpoint."""
    state = load_checkpoint(ckpt)
    cfg = config_from_dict(state["config"])
    src_tok = tokenizer_from_state(state["tokenizers"]["src"])
    tgt_tok = tokenizer_from_state(state["tokenizers"]["tgt"])
    model = build_model(cfg, src_tok.vocab_size, tgt_tok.vocab_size)
    load_model_state(model, state["model"], Path(ckpt))
    return model.to(resolve_device(device)).eval(), src_tok, tgt_tok, cfg


def load_ensemble(
    paths: Sequence[str | Path], device: str
) -> tuple[Ensemble, Tokenizer, Tokenizer, TrainConfig]:
    """The checkpoints `paths` as one Ensemble (eval mode, on device), with the first one's
    tokenizers and config (its decoding settings and data.max_len)."""
    loaded = [load_for_inference(path, device) for path in paths]
    check_same_vocabularies(paths, [(src, tgt) for _, src, tgt, _ in loaded])
    _, src_tok, tgt_tok, cfg = loaded[0]
    return Ensemble([model for model, *_ in loaded]).eval(), src_tok, tgt_tok, cfg


def probe_rows(decode: DecodeConfig) -> int:
    """Decoder rows of a full batch: sentences x beams (beam search), x samples (sampling)."""
    per_sentence = {SearchKind.beam: decode.beam_size, SearchKind.sample: decode.nbest}
    return decode.batch_size * per_sentence.get(decode.method, 1)


def probe_settings(decode: DecodeConfig, sentences: int | None = None) -> DecodeConfig:
    """The settings the products' choice is timed and kept for: `decode`, or, for fewer
    `sentences` than a batch holds, `decode` with its batch cut to them, rounded up to a power
    of two (a few choices, not one per count). A search holds that many sentences side by side:
    their fewer rows may run faster on another backend, and time sooner (one sentence, the
    first call of an interactive session: 1 row, not a batch's)."""
    if sentences is None or sentences >= decode.batch_size:
        return decode
    rounded = 1 << max(0, sentences - 1).bit_length()  # (0,) 1 -> 1, 2 -> 2, 3 -> 4, 5 -> 8
    return dataclasses.replace(decode, batch_size=min(rounded, decode.batch_size))


def backend_pairs() -> list[Backends]:
    """Every (small weights', large weights') pair of kernels.product_backends()."""
    backends = kernels.product_backends()
    return [(small, large) for small in backends for large in backends]


def time_decoding(model: SearchModel, decode: DecodeConfig, vocab: int) -> dict[Backends, float]:
    """Median seconds, per pair of `backend_pairs()`, of the search `decode` over one batch of
    random sources of PROBE_SOURCE_LEN tokens for PROBE_STEPS steps: the model's own products,
    at its batch's rows, through every check they pass in decoding (kernels.time_alternating:
    alternating, after an untimed round). The products in use before are put back."""
    gen = torch.Generator().manual_seed(0)
    shape = (decode.batch_size, PROBE_SOURCE_LEN)
    src = torch.randint(len(SPECIAL_TOKENS), vocab, shape, generator=gen)  # (B, S)
    src[:, -1] = EOS_ID
    src = src.to(next(model.parameters()).device)
    probe = dataclasses.replace(decode, max_len_a=0.0, max_len_b=PROBE_STEPS)

    def search(backends: Backends, _: int) -> None:
        kernels.set_products(*backends)
        decode_batch(model, src, probe, min_len=PROBE_STEPS)  # no sentence ends early

    before = (kernels.products(), kernels.large_products())
    try:
        with decoding(model):  # as translate_ids runs the searches
            return kernels.time_alternating(backend_pairs(), search, PROBE_ROUNDS)
    finally:
        kernels.set_products(*before)


def products_key(config: ModelConfig, decode: DecodeConfig, vocab: int) -> tuple[object, ...]:
    """What choose_products' answer depends on: the model's sizes, the search's settings and
    this process's torch threads."""
    search = (decode.method, decode.beam_size, decode.nbest, decode.batch_size)
    sizes = (config.d_model, config.d_ff, config.enc_layers, config.dec_layers, vocab)
    return (*sizes, search, torch.get_num_threads())


def choices_file() -> Path:
    """The file of product choices timed on this machine: decode_products.json in $CACHE_ENV,
    else in $XDG_CACHE_HOME/seq2seq, else in ~/.cache/seq2seq."""
    root = os.environ.get(CACHE_ENV)
    if not root:
        root = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "seq2seq")
    return Path(root).expanduser() / "decode_products.json"


def machine_key(key: tuple[object, ...]) -> str:
    """products_key on this machine: with the CPU (model, family and model numbers, speed
    flags), torch's version and whether MKL takes its Intel code path here (seq2seq/mkl.py:
    ATen's products change speed with it), whose oneDNN and ATen products the timing
    measured."""
    cpu = [cpu_info()["cpu_model"], cpu_id(), *cpu_flags()]
    intel_path = "mkl intel path" if mkl.is_on(mkl.STATE) else "mkl as shipped"
    return json.dumps([cpu, torch.__version__, intel_path, [str(k) for k in key]])


def _read_choices(path: Path) -> dict[str, object]:
    """The choices file's entries; none where it is missing or unreadable (timed anew)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def stored_products(key: tuple[object, ...]) -> Backends | None:
    """The choice timed for `key` on this machine by an earlier process, if any (an entry that
    names no pair of kernels.product_backends() is ignored)."""
    got = _read_choices(choices_file()).get(machine_key(key))
    if isinstance(got, list) and tuple(got) in backend_pairs():
        return got[0], got[1]
    return None


def store_products(key: tuple[object, ...], chosen: Backends) -> None:
    """Keep `chosen` for `key` in the choices file (written atomically); a folder that cannot
    be written leaves the next process to time it again."""
    path = choices_file()
    data = _read_choices(path)
    data[machine_key(key)] = list(chosen)
    try:
        write_atomic(path, json.dumps(data, indent=1).encode())
    except OSError as err:
        log.info("could not keep the products' choice in %s (%s): timed again next time", path, err)


def remember_products(
    config: ModelConfig,
    decode: DecodeConfig,
    vocab: int,
    chosen: Backends,
    sentences: int | None = None,
) -> None:
    """Take `chosen` as choose_products' answer here for these sizes, settings and sentences,
    untimed: a translation worker given the choice its parent timed at the worker's threads
    (seq2seq/decode/workers.py)."""
    _PRODUCTS[products_key(config, probe_settings(decode, sentences), vocab)] = (chosen, {})


def choose_products(
    model: SearchModel,
    config: ModelConfig,
    decode: DecodeConfig,
    vocab: int,
    sentences: int | None = None,
) -> tuple[Backends | None, dict[Backends, float]]:
    """Where decoding's float32 products run, the small weights' and the large ones', and the
    seconds timed for each pair: the fastest for `model` (of sizes `config`) searching with
    the settings `decode` at this process's threads (`time_decoding`, 0.1-5 s), set
    process-wide; for `sentences` fewer than a batch, at the batch they fill (probe_settings).
    Timed once a machine: the choice is kept in choices_file() for the next processes (their
    times: {}); delete that file to time again. (None, {}) where nothing is timed: another
    device, or the reference kernels."""
    decode = probe_settings(decode, sentences)
    device, rows = next(model.parameters()).device, probe_rows(decode)
    if device.type != "cpu" or kernels.get_mode() != "auto":
        return None, {}
    key = products_key(config, decode, vocab)
    if key not in _PRODUCTS and (stored := stored_products(key)) is not None:
        _PRODUCTS[key] = (stored, {})
        log.info(
            "float32 decoding products: %s, the large weights' %s (%s)", *stored, choices_file()
        )
    if key not in _PRODUCTS:
        times = time_decoding(model, decode, vocab)
        small, large = min(times, key=times.__getitem__)  # ties: the first pair, oneDNN's
        _PRODUCTS[key] = ((small, large), times)
        store_products(key, (small, large))
        shown = ", ".join(f"{'/'.join(pair)} {s * 1e3:.1f} ms" for pair, s in times.items())
        how = f"{decode.method.value}, {rows} rows, {PROBE_STEPS} steps; small/large weights"
        log.info(
            "float32 decoding products: %s, the large weights' %s here (%s: %s)",
            small,
            large,
            how,
            shown,
        )
    chosen, times = _PRODUCTS[key]
    kernels.set_products(*chosen)
    return chosen, times
