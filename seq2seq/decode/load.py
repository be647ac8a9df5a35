"""A checkpoint back into a model to translate with: its config, tokenizers and weights, built
through the same `build_model` as training, so translation gets exactly the model that was
trained. Imports no training or data-preparation code."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import torch

from seq2seq import kernels
from seq2seq.config.schema import (
    DecodeConfig,
    ModelConfig,
    SearchKind,
    TrainConfig,
    config_from_dict,
)
from seq2seq.data.tokenizer import Tokenizer, tokenizer_from_state
from seq2seq.decode.ensemble import Ensemble, check_same_vocabularies
from seq2seq.kernels import resolve_device
from seq2seq.model.transformer import EncoderDecoder, build_model
from seq2seq.train.checkpoint import load_checkpoint, load_model_state

log = logging.getLogger(__name__)

# (step's products, row counts) -> the faster backend and the seconds timed, once a process
_PRODUCTS: dict[tuple[tuple[tuple[int, int], ...], tuple[int, ...]], tuple[str, dict[str, float]]]
_PRODUCTS = {}
MAX_ROWS = 1024  # at most this many rows timed


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


def decode_product_shapes(
    model: ModelConfig, vocab: int, decode: DecodeConfig
) -> tuple[tuple[tuple[int, int], ...], tuple[int, ...]]:
    """A decoding step's float32 products, (in, out) each: per decoder layer the self-attention's
    query, key-value and output projections, the cross-attention's query and output ones and the
    feed-forward layers, then the output layer; and the row counts to time them at: the
    hypotheses of a full batch (sentences x beams, or samples) and half of them (sentences
    leave the batch as they end). The encoder's products, once per batch, are left out."""
    d, f = model.d_model, model.d_ff
    layer = ((d, d), (d, 2 * d), (d, d), (d, d), (d, d), (d, f), (f, d))
    per_sentence = {SearchKind.beam: decode.beam_size, SearchKind.sample: decode.nbest}
    rows = min(decode.batch_size * per_sentence.get(decode.method, 1), MAX_ROWS)
    return layer * model.dec_layers + ((d, vocab),), tuple(sorted({rows, rows // 2}, reverse=True))


def choose_products(
    model: ModelConfig, decode: DecodeConfig, vocab: int, device: torch.device
) -> tuple[str, dict[str, float]]:
    """Where decoding's float32 products run, and the seconds timed for each backend: the
    faster of oneDNN and ATen on the products of `model` decoding with the settings `decode`
    (`decode_product_shapes`, kernels.time_decode_products, ~0.1 s for model=tiny), timed once
    a process and set process-wide. ("", {}) where nothing is timed: another device, the
    reference kernels, or at most kernels.cpu.SMALL_ROWS rows (those always take F.linear)."""
    step, rows = decode_product_shapes(model, vocab, decode)
    if device.type != "cpu" or kernels.get_mode() != "auto" or rows[0] <= kernels.SMALL_ROWS:
        return "", {}
    if (step, rows) not in _PRODUCTS:
        times = kernels.time_decode_products(step, rows)
        _PRODUCTS[step, rows] = (kernels.faster_products(times), times)
    chosen, times = _PRODUCTS[step, rows]
    kernels.set_products(chosen)
    shown = ", ".join(f"{name} {s * 1e3:.1f} ms" for name, s in times.items())
    log.info("float32 decoding products: %s on this CPU (a step's products: %s)", chosen, shown)
    return chosen, times
