"""The build layer: turns typed configs into plain objects (corpus, tokenizers, model, optimizer).

Nothing below this layer sees a config container; modules get typed values or dataclasses.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.autograd.graph import increment_version

from seq2seq.checkpoint import CheckpointError, load_checkpoint
from seq2seq.config import (
    ConfigError,
    DataConfig,
    OptimConfig,
    PosEncodingConfig,
    TokenizerConfig,
    TrainConfig,
)
from seq2seq.data import drop_empty, drop_long, find_split_file, read_parallel
from seq2seq.model import EncoderDecoder
from seq2seq.positional import build_positional
from seq2seq.tokenizer import Tokenizer, build_tokenizers

log = logging.getLogger(__name__)
PROJECT_ROOT = Path(__file__).resolve().parent.parent
# AdamW(fused=True) runs on CPU tensors from torch 2.4
FUSED_ADAMW_ON_CPU = tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 4)


def resolve_path(path: str | Path) -> Path:
    """A relative path is taken from the working directory, else from the project root."""
    p = Path(path).expanduser()
    if p.is_absolute() or p.exists():
        return p
    return PROJECT_ROOT / p if (PROJECT_ROOT / p).exists() else p


@dataclass
class Split:
    """One split of a parallel corpus, as text and as token ids (no specials)."""

    name: str
    src_text: list[str]
    tgt_text: list[str]
    src_ids: list[list[int]]
    tgt_ids: list[list[int]]

    def __len__(self) -> int:
        return len(self.src_text)


def read_split(data: DataConfig, split: str) -> list[tuple[str, str]]:
    """The (source, target) line pairs of `split` under data.root."""
    root = resolve_path(data.root)
    src = find_split_file(root, split, data.src_lang)
    tgt = find_split_file(root, split, data.tgt_lang)
    return read_parallel(src, tgt)


def encode_split(
    name: str, pairs: list[tuple[str, str]], src_tok: Tokenizer, tgt_tok: Tokenizer
) -> Split:
    src_text, tgt_text = [p[0] for p in pairs], [p[1] for p in pairs]
    src_ids, tgt_ids = src_tok.encode_batch(src_text), tgt_tok.encode_batch(tgt_text)
    return Split(name, src_text, tgt_text, src_ids, tgt_ids)


def filter_train(
    name: str, pairs: list[tuple[str, str]], max_len: int, toks: tuple[Tokenizer, Tokenizer]
) -> Split:
    """Encode training pairs, dropping (and reporting) empty and over-long ones."""
    kept, report = drop_empty(pairs)
    split = encode_split(name, [pairs[i] for i in kept], *toks)
    lines = [i + 1 for i in kept]
    keep = drop_long(
        [len(s) for s in split.src_ids], [len(t) for t in split.tgt_ids], max_len, report, lines
    )
    log.info(report.summary(name))
    if not keep:
        raise ValueError(f"{name}: no training pairs left after filtering ({report.summary(name)})")
    pick = lambda xs: [xs[i] for i in keep]  # noqa: E731
    return Split(
        name, pick(split.src_text), pick(split.tgt_text), pick(split.src_ids), pick(split.tgt_ids)
    )


def load_corpus(
    data: DataConfig, tok: TokenizerConfig, tokenizers: tuple[Tokenizer, Tokenizer] | None = None
) -> tuple[Tokenizer, Tokenizer, dict[str, Split]]:
    """Read every split, train (or load cached) tokenizers on train, and encode.

    Training pairs are filtered (empty or longer than data.max_len tokens, counted in the log).
    Validation and test splits are kept whole, so scores stay comparable with other toolkits.
    `tokenizers` (a resumed checkpoint's) are used instead of building them when given.
    """
    train_pairs = read_split(data, data.train)
    kept, _ = drop_empty(train_pairs)
    if tokenizers is None:
        tokenizers = train_tokenizers(tok, train_pairs, kept)
    src_tok, tgt_tok = tokenizers
    splits = {data.train: filter_train(data.train, train_pairs, data.max_len, (src_tok, tgt_tok))}
    for name in dict.fromkeys([data.valid, *data.test]):
        splits[name] = encode_split(name, read_split(data, name), src_tok, tgt_tok)
    return src_tok, tgt_tok, splits


def train_tokenizers(
    tok: TokenizerConfig, pairs: list[tuple[str, str]], kept: list[int]
) -> tuple[Tokenizer, Tokenizer]:
    """Tokenizers trained on the kept training pairs, or loaded from the cache (JSON or a
    SentencePiece model: a cache file is never unpickled)."""
    cache = resolve_cache(tok.cache_dir)
    try:
        return build_tokenizers(
            getattr(tok.kind, "value", tok.kind),
            [pairs[i][0] for i in kept],
            [pairs[i][1] for i in kept],
            vocab_size=tok.vocab_size,
            joint=tok.joint,
            cache_dir=cache,
            min_freq=tok.min_freq,
            character_coverage=tok.character_coverage,
        )
    except (ValueError, RuntimeError, UnicodeDecodeError) as err:
        raise ValueError(
            f"cannot build the {getattr(tok.kind, 'value', tok.kind)} tokenizer ({err}). If a "
            f"cached tokenizer under {cache} is corrupt, delete it: it is trained again"
        ) from err


def resolve_cache(path: str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else PROJECT_ROOT / p


def build_model(cfg: TrainConfig, src_vocab: int, tgt_vocab: int) -> EncoderDecoder:
    """The Transformer, with the encoder and decoder positional encodings from cfg."""
    m = cfg.model
    enc_cfg: PosEncodingConfig = cfg.encoder_pos or cfg.pos_encoding
    dec_cfg: PosEncodingConfig = cfg.decoder_pos or cfg.pos_encoding
    enc_pos = build_positional(enc_cfg, m.d_model, m.n_heads, causal=False)
    dec_pos = build_positional(dec_cfg, m.d_model, m.n_heads, causal=True)
    return EncoderDecoder(m, src_vocab, tgt_vocab, enc_pos, dec_pos)


def build_optimizer(
    model: torch.nn.Module, cfg: OptimConfig, device: torch.device
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW with linear warmup then inverse-sqrt decay.

    AdamW is fused (one kernel for all parameters) on CUDA and, from torch 2.4, on the CPU: 6x
    faster there than foreach, which loops over tensors (3.7 vs 21.6 ms for 101 tensors of a
    d=256 model, 2 cores; torch's default loop takes 13.6 ms and is used on older torch).
    """
    fused = device.type == "cuda" or (device.type == "cpu" and FUSED_ADAMW_ON_CPU)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(
        params,
        lr=cfg.lr,
        betas=(cfg.betas[0], cfg.betas[1]),
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        fused=fused or None,
    )
    if fused:  # the fused kernel writes the weights without bumping their version counters,
        # by which layers.Linear knows to refresh its packed copy of a changed weight
        optimizer.register_step_post_hook(lambda *_: increment_version(params))
    warmup = max(1, cfg.warmup_steps)

    def inverse_sqrt(step: int) -> float:  # Vaswani et al. 2017, eq. 3, peak = cfg.lr
        step = max(step, 1)
        return min(step / warmup, (warmup / step) ** 0.5)

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, inverse_sqrt)


def resolve_device(name: str) -> torch.device:
    """'auto' picks CUDA when present, else the CPU. A device that does not exist here is a
    ConfigError naming it."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ConfigError(
            f"config: device={name!r} is invalid; use auto, cpu, cuda or cuda:N"
        ) from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"config: device={name!r} but torch sees no CUDA GPU; use auto or cpu")
    return device


def checkpoint_bytes(cfg: TrainConfig) -> int:
    """About how large a training checkpoint of cfg's model is (weights and two Adam moments,
    float32), with tokenizer.vocab_size as the vocabulary; built on the meta device (no memory)."""
    with torch.device("meta"):
        model = build_model(cfg, cfg.tokenizer.vocab_size, cfg.tokenizer.vocab_size)
    return 3 * 4 * sum(p.numel() for p in model.parameters()) + 2**20


def load_model_state(model: torch.nn.Module, state: dict[str, torch.Tensor], path: Path) -> None:
    """model.load_state_dict, with a CheckpointError naming the file when the weights don't fit."""
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        raise CheckpointError(
            f"{path}: its weights do not fit the model its config and vocabulary describe: "
            f"{str(err)[:300]}"
        ) from err


def config_from_dict(values: dict) -> TrainConfig:
    """A TrainConfig from the plain dict stored in a checkpoint (validated like the CLI's)."""
    from omegaconf import OmegaConf

    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), values))  # type: ignore[return-value]


def load_for_inference(
    ckpt: str | Path, device: str
) -> tuple[EncoderDecoder, Tokenizer, Tokenizer, TrainConfig]:
    """Model (eval mode, on device), tokenizers and config of a checkpoint."""
    from seq2seq.tokenizer import tokenizer_from_state

    state = load_checkpoint(ckpt)
    cfg = config_from_dict(state["config"])
    src_tok = tokenizer_from_state(state["tokenizers"]["src"])
    tgt_tok = tokenizer_from_state(state["tokenizers"]["tgt"])
    model = build_model(cfg, src_tok.vocab_size, tgt_tok.vocab_size)
    load_model_state(model, state["model"], Path(ckpt))
    return model.to(resolve_device(device)).eval(), src_tok, tgt_tok, cfg
