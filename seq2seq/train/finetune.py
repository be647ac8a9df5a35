"""Fine-tuning (trainer.init_from): a new run that starts from another run's checkpoint.

Unlike resuming, which continues the same run exactly, a fine-tuning run starts at step 0 on
its own data with the source checkpoint's weights and tokenizers (never trained again); its
optimizer starts afresh unless trainer.init_reset=false (then it keeps the AdamW moments), and
its schedule, step counter, best score and early stopping always start afresh. The model
settings (model, positional encodings, tokenizer) are the checkpoint's: an override of them on
the command line that disagrees is refused, naming the key. Subword regularization
(tokenizer.sampling) trains and fixes nothing in the model: the fine-tuning run sets its own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from seq2seq.config.schema import TrainConfig, config_from_dict, resolve_path
from seq2seq.errors import ConfigError
from seq2seq.train.checkpoint import load_checkpoint

# the settings a checkpoint's weights and tokenizers fix (but tokenizer.sampling: see adopted)
SECTIONS = ("model", "pos_encoding", "encoder_pos", "decoder_pos", "tokenizer")


@dataclass
class Source:
    """The checkpoint a fine-tuning run starts from."""

    path: Path
    state: dict[str, Any]
    cfg: TrainConfig


def load_source(init_from: str) -> Source:
    """The checkpoint trainer.init_from names (a CheckpointError names a bad one)."""
    path = resolve_path(init_from)
    state = load_checkpoint(path)
    return Source(path, state, config_from_dict(state["config"]))


def check_overrides(cfg: TrainConfig, source: Source, overrides: list[str]) -> None:
    """Refuse a command-line override of a model setting that differs from the checkpoint's."""
    ours, theirs = OmegaConf.structured(cfg), OmegaConf.structured(adopted(cfg, source))
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key.split(".", 1)[0] not in SECTIONS:
            continue
        mine, source_value = OmegaConf.select(ours, key), OmegaConf.select(theirs, key)
        if mine != source_value:
            raise ConfigError(
                f"config: {key} is {_show(mine)} on the command line but {_show(source_value)} "
                f"in trainer.init_from={source.path}: a fine-tuning run keeps the checkpoint's "
                f"model and tokenizer. Drop the override, or train a new model without init_from"
            )


def _show(value: Any) -> str:
    if OmegaConf.is_config(value):
        return str(OmegaConf.to_container(value, enum_to_str=True))
    return repr(getattr(value, "value", value))


def adopted(cfg: TrainConfig, source: Source) -> TrainConfig:
    """The checkpoint's model settings with cfg's training-only tokenizer.sampling (subword
    regularization fixes nothing in the model: a fine-tuning run chooses its own)."""
    tok = dataclasses.replace(source.cfg.tokenizer, sampling=cfg.tokenizer.sampling)
    return dataclasses.replace(source.cfg, tokenizer=tok)


def adopt(cfg: TrainConfig, source: Source) -> None:
    """Take the checkpoint's model settings into `cfg` (`adopted`'s)."""
    model = adopted(cfg, source)
    for section in SECTIONS:
        setattr(cfg, section, getattr(model, section))
