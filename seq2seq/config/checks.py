"""The range checks the schemas' types cannot express, and the merge of decoding settings.

Each error is a ConfigError naming the full key, its value and the valid range, so a bad value
stops a run before it starts (seq2seq-train calls check_config first; the decoding entry points
check_decode).
"""

from __future__ import annotations

import dataclasses
import math

from seq2seq.config.commands import EvaluateConfig
from seq2seq.config.schema import (
    DataConfig,
    DecodeConfig,
    ModelConfig,
    OptimConfig,
    Schedule,
    SearchKind,
    TokenizerConfig,
    TokenizerKind,
    TrainConfig,
    TrainerConfig,
)
from seq2seq.errors import ConfigError


def check_decode(cfg: DecodeConfig, prefix: str = "decode") -> None:
    """Range checks the schema's types cannot express; errors name the key and the fix."""
    _require(cfg.beam_size >= 1, f"{prefix}.beam_size", cfg.beam_size, "at least 1")
    _require(cfg.nbest >= 1, f"{prefix}.nbest", cfg.nbest, "at least 1")
    _require(
        cfg.nbest <= cfg.beam_size or cfg.method != SearchKind.beam,
        f"{prefix}.nbest",
        cfg.nbest,
        f"at most beam_size ({cfg.beam_size})",
    )
    _require(cfg.max_len_a >= 0, f"{prefix}.max_len_a", cfg.max_len_a, "0 or more")
    _require(cfg.max_len_b >= 0, f"{prefix}.max_len_b", cfg.max_len_b, "0 or more")
    _require(
        cfg.max_len_a > 0 or cfg.max_len_b > 0,
        f"{prefix}.max_len_b",
        cfg.max_len_b,
        "above 0 when max_len_a is 0",
    )
    _require(cfg.batch_size >= 1, f"{prefix}.batch_size", cfg.batch_size, "at least 1")
    _require(cfg.temperature > 0, f"{prefix}.temperature", cfg.temperature, "above 0")
    _require(cfg.top_k >= 0, f"{prefix}.top_k", cfg.top_k, "0 (all tokens) or more")
    _require(0 < cfg.top_p <= 1, f"{prefix}.top_p", cfg.top_p, "in (0, 1]")


def check_workers(workers: int) -> None:
    """seq2seq-translate workers= (seq2seq/decode/workers.py): processes, at least one."""
    _require(workers >= 1, "workers", workers, "at least 1")


def check_comparison(cfg: EvaluateConfig) -> None:
    """Range checks of seq2seq-evaluate's comparison settings; errors name the key."""
    _require(cfg.paired_bs_n >= 1, "paired_bs_n", cfg.paired_bs_n, "at least 1")
    _require(cfg.paired_ar_n >= 1, "paired_ar_n", cfg.paired_ar_n, "at least 1")
    seed = cfg.paired_seed
    _require(seed is None or seed >= 1, "paired_seed", seed, "1 or more, or null (unseeded)")
    _require(0 < cfg.alpha < 1, "alpha", cfg.alpha, "in (0, 1)")


def check_config(cfg: TrainConfig) -> None:
    """Reject values that would fail (or silently misbehave) deep inside training."""
    m, t, d = cfg.model, cfg.trainer, cfg.data
    _require(
        m.d_model % m.n_heads == 0,
        "model.d_model",
        m.d_model,
        f"a multiple of model.n_heads ({m.n_heads})",
    )
    for key, value in [
        ("model.enc_layers", m.enc_layers),
        ("model.dec_layers", m.dec_layers),
        ("model.d_ff", m.d_ff),
        ("data.max_len", d.max_len),
        ("trainer.max_tokens", t.max_tokens),
        ("trainer.accum_steps", t.accum_steps),
        ("trainer.valid_every", t.valid_every),
        ("trainer.log_every", t.log_every),
        ("tokenizer.vocab_size", cfg.tokenizer.vocab_size),
    ]:
        _require(value >= 1, key, value, "at least 1")
    for key, share in [*dropouts(m).items(), ("trainer.label_smoothing", t.label_smoothing)]:
        _require(0.0 <= share < 1.0, key, share, "in [0, 1)")
    _require(cfg.optim.lr > 0, "optim.lr", cfg.optim.lr, "above 0")
    _require(cfg.optim.warmup_steps >= 0, "optim.warmup_steps", cfg.optim.warmup_steps, "0 or more")
    _require(cfg.optim.clip_norm >= 0, "optim.clip_norm", cfg.optim.clip_norm, "0 or more")
    check_schedule(cfg.optim, t.max_steps)
    _require(len(cfg.optim.betas) == 2, "optim.betas", cfg.optim.betas, "two numbers")
    _require(
        not m.share_embeddings or cfg.tokenizer.joint,
        "model.share_embeddings",
        True,
        "false when tokenizer.joint is false (two vocabularies)",
    )
    check_data(d, cfg.tokenizer)
    check_positional(cfg)
    check_sampling(cfg.tokenizer)
    check_trainer(t)
    check_rdrop(cfg)
    check_decode(cfg.decode)


def check_schedule(o: OptimConfig, max_steps: int) -> None:
    """The decay of a cosine or linear schedule must end after the warmup, at a learning rate
    no higher than the peak."""
    _require(o.decay_steps >= 0, "optim.decay_steps", o.decay_steps, "0 or more")
    _require(0.0 <= o.min_lr <= o.lr, "optim.min_lr", o.min_lr, f"in [0, optim.lr ({o.lr})]")
    if o.schedule == Schedule.inverse_sqrt:
        return
    key = "optim.decay_steps" if o.decay_steps else "trainer.max_steps"
    end = o.decay_steps or max_steps
    _require(
        end > o.warmup_steps,
        key,
        end,
        f"above optim.warmup_steps ({o.warmup_steps}): optim.schedule={o.schedule.value} "
        "decays from the end of the warmup to that step",
    )


def t5_exact_buckets(num_buckets: int, causal: bool) -> int:
    """The buckets T5 gives one distance each (0 to this minus 1) before its logarithmic ones:
    half of a direction's buckets, and the encoder (bidirectional) splits them in two."""
    return (num_buckets if causal else num_buckets // 2) // 2


def check_positional(cfg: TrainConfig) -> None:
    """T5's buckets grow logarithmically from the exact ones up to max_distance, so max_distance
    must pass the exact buckets on each side that uses t5_bias (else the formula maps long
    distances to other buckets, or to negative ones)."""
    sides = [("encoder_pos", cfg.encoder_pos, False), ("decoder_pos", cfg.decoder_pos, True)]
    for section, own, causal in sides:
        pos = own or cfg.pos_encoding
        key = section if own else "pos_encoding"
        if getattr(pos.kind, "value", pos.kind) != "t5_bias":
            continue
        _require(pos.num_buckets >= 4, f"{key}.num_buckets", pos.num_buckets, "at least 4")
        exact = t5_exact_buckets(pos.num_buckets, causal)
        _require(
            pos.max_distance > exact,
            f"{key}.max_distance",
            pos.max_distance,
            f"above {exact}, the {section.split('_')[0]}'s exact buckets ({key}.num_buckets="
            f"{pos.num_buckets}); lower num_buckets or raise max_distance",
        )


def check_data(d: DataConfig, tok: TokenizerConfig) -> None:
    """Range checks of the data and tokenizer settings."""
    _require(len(d.train) >= 1, "data.train", d.train, "at least one split name")
    _require(
        not d.weights or len(d.weights) == len(d.train),
        "data.weights",
        d.weights,
        f"empty or one weight per data.train split ({len(d.train)})",
    )
    _require(all(w > 0 for w in d.weights), "data.weights", d.weights, "above 0 each")
    _require(d.max_len < 1 << 16, "data.max_len", d.max_len, f"below {1 << 16}")
    _require(d.workers >= 0, "data.workers", d.workers, "0 (one per core) or more")
    _require(
        d.train_max_src_len >= 0, "data.train_max_src_len", d.train_max_src_len, "0 (off) or more"
    )
    _require(
        d.length_cap == 0 or d.train_max_src_len in (0, d.length_cap),
        "data.length_cap",
        d.length_cap,
        f"0 or data.train_max_src_len ({d.train_max_src_len}) when training is capped",
    )
    _require(tok.sample_lines >= 1, "tokenizer.sample_lines", tok.sample_lines, "at least 1")
    check_bidirectional(d, tok)


def check_bidirectional(d: DataConfig, tok: TokenizerConfig) -> None:
    """data.bidirectional_epochs: reversed pairs need one vocabulary for both sides, and take
    no subword sampling or source cap (each would apply to the wrong side)."""
    n = d.bidirectional_epochs
    _require(n >= 0, "data.bidirectional_epochs", n, "0 (off) or more")
    if n == 0:
        return
    _require(tok.joint, "data.bidirectional_epochs", n, "0 unless tokenizer.joint=true")
    sampling = tok.sampling.bpe_dropout > 0 or tok.sampling.unigram_alpha > 0
    _require(not sampling, "data.bidirectional_epochs", n, "0 with tokenizer.sampling on")
    _require(
        d.train_max_src_len == 0, "data.bidirectional_epochs", n, "0 with data.train_max_src_len"
    )


def check_sampling(tok: TokenizerConfig) -> None:
    """Range checks of subword regularization (tokenizer.sampling): each knob only for the
    SentencePiece model it applies to."""
    s, kind = tok.sampling, tok.kind
    _require(
        0.0 <= s.bpe_dropout < 1.0, "tokenizer.sampling.bpe_dropout", s.bpe_dropout, "in [0, 1)"
    )
    _require(
        0.0 <= s.unigram_alpha <= 1.0,
        "tokenizer.sampling.unigram_alpha",
        s.unigram_alpha,
        "in [0, 1] (0 = off; P(x)^alpha, so above 1 would sharpen, not smooth)",
    )
    _require(
        s.unigram_nbest == -1 or s.unigram_nbest >= 2,
        "tokenizer.sampling.unigram_nbest",
        s.unigram_nbest,
        "-1 (all segmentations) or at least 2",
    )
    subword = (TokenizerKind.bpe, TokenizerKind.unigram)
    fix = "bpe takes bpe_dropout, unigram unigram_alpha and unigram_nbest"
    if kind not in subword:
        fix = "a word or char tokenizer has a single segmentation; use tokenizer=bpe or unigram"
    for key, value, off, model in [
        ("bpe_dropout", s.bpe_dropout, 0.0, TokenizerKind.bpe),
        ("unigram_alpha", s.unigram_alpha, 0.0, TokenizerKind.unigram),
        ("unigram_nbest", s.unigram_nbest, -1, TokenizerKind.unigram),
    ]:
        _require(
            value == off or kind == model,
            f"tokenizer.sampling.{key}",
            value,
            f"{off} with tokenizer.kind={kind.value}: it samples the segmentations of a "
            f"{model.value} model ({fix})",
        )


def dropouts(m: ModelConfig) -> dict[str, float]:
    """The model's dropout rates by their keys."""
    return {
        "model.dropout": m.dropout,
        "model.attn_dropout": m.attn_dropout,
        "model.ffn_dropout": m.ffn_dropout,
        "model.src_word_dropout": m.src_word_dropout,
        "model.tgt_word_dropout": m.tgt_word_dropout,
    }


def check_rdrop(cfg: TrainConfig) -> None:
    """R-Drop's weight: 0 (off) or more, and only where dropout makes the two passes differ."""
    alpha, m = cfg.trainer.rdrop_alpha, cfg.model
    _require(math.isfinite(alpha) and alpha >= 0, "trainer.rdrop_alpha", alpha, "0 (off) or more")
    _require(
        alpha == 0.0 or max(dropouts(m).values()) > 0,
        "trainer.rdrop_alpha",
        alpha,
        "0 when model.dropout, model.attn_dropout, model.ffn_dropout and the word dropouts are "
        "all 0: the two passes would be identical (a KL of 0 at twice the cost)",
    )


def check_trainer(t: TrainerConfig) -> None:
    """Range checks of the trainer settings (counts, limits, resume mode)."""
    for key, value in [
        ("trainer.max_steps", t.max_steps),
        ("trainer.max_epochs", t.max_epochs),
        ("trainer.max_bad_steps", t.max_bad_steps),
        ("trainer.shape_buckets", t.shape_buckets),
    ]:
        _require(value >= 1, key, value, "at least 1")
    for key, amount in [
        ("trainer.max_minutes", t.max_minutes),
        ("trainer.threads", t.threads),
        ("trainer.keep_last", t.keep_last),
        ("trainer.patience", t.patience),
        ("trainer.average_last", t.average_last),
        ("trainer.valid_bleu_sentences", t.valid_bleu_sentences),
    ]:
        _require(amount >= 0, key, amount, "0 or more")
    _require(
        t.keep_last >= t.average_last,
        "trainer.keep_last",
        t.keep_last,
        f"at least trainer.average_last ({t.average_last}) so that the checkpoints to "
        "average are kept",
    )
    _require(
        t.resume.strip() != "",
        "trainer.resume",
        t.resume,
        "auto, never or the path of a checkpoint",
    )


def _require(ok: bool, key: str, value: object, expected: str) -> None:
    if not ok:
        raise ConfigError(f"config: {key}={value!r} is invalid; it must be {expected}")


def merge_decode(
    chosen: DecodeConfig, trained: DecodeConfig, overrides: list[str] | None
) -> tuple[DecodeConfig, list[str]]:
    """The decoding settings of a translation: the checkpoint's own (`trained`, those its run
    was tested with) with what the command line changed taken from `chosen` (the composed
    config). `overrides`: the command line's overrides, or None when the call came from Python
    (then `chosen` is used whole). Returns the settings, range-checked, and the keys taken from
    the command line. The Python API's Translator.settings applies keyword changes the same way.
    """
    keys = [o.split("=", 1)[0].lstrip("+~") for o in overrides or []]
    if overrides is None or "decode" in keys:  # from Python, or a whole group (decode=beam)
        merged, changed = chosen, ([] if overrides is None else ["decode"])
    else:
        fields = [k.split(".", 1)[1] for k in keys if k.startswith("decode.")]
        merged = dataclasses.replace(trained, **{k: getattr(chosen, k) for k in fields})
        changed = [f"decode.{k}" for k in fields]
    check_decode(merged)
    return merged, changed
