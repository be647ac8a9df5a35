"""A checkpoint back into a model to translate with: its config, tokenizers and weights, built
through the same `build_model` as training, so translation gets exactly the model that was
trained. Imports no training or data-preparation code."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from seq2seq.config.schema import (
    TrainConfig,
    config_from_dict,
)
from seq2seq.data.tokenizer import Tokenizer, tokenizer_from_state
from seq2seq.decode.ensemble import Ensemble, check_same_vocabularies
from seq2seq.kernels import resolve_device
from seq2seq.model.transformer import EncoderDecoder, build_model
from seq2seq.train.checkpoint import load_checkpoint, load_model_state

if TYPE_CHECKING:
    pass


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
