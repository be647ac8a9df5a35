"""Subword regularization of the training pairs: each epoch segments every pair anew.

A SentencePiece model can draw a segmentation at random instead of giving its one best:
BPE-dropout (Provilkov et al. 2020) skips each merge with probability p; the unigram model
(Kudo 2018) draws a segmentation x with probability proportional to P(x)^alpha, among the l
best or all of them. Trained on many segmentations of the same text, a model learns the
compositionality of its words and is more robust to segmentation errors. Training only:
validation, test and translation use the deterministic segmentation (`Tokenizer.encode`), and
nothing here changes a tokenizer.

Where it is drawn (tokenizer.sampling.plan). A prepared corpus (prepared.py) holds every pair's
deterministic ids; each side of each pair is segmented again from them by subword_draws.py
(SentencePiece's samplers, ported so that a seed decides the draw: SentencePiece's own does not
across processes). The draw is seeded by (trainer.seed, epoch, pair, side) alone, so it does not
depend on the process, the batch, the thread, the number of ranks or the order in which pairs are
read: a resumed run draws exactly what the uninterrupted one did, and both plans draw the same
segmentations.

- plan=sampled (the default): before an epoch's first batch, every training pair of the epoch
  is segmented (`TrainData`, epochs.py: the next epoch's in a background thread while this one
  trains) and the epoch's batches are cut on those lengths, as the prepared ones are without
  sampling: each batch holds at most trainer.max_tokens padded tokens, so a step costs what a
  plain step does, and an epoch has more steps (its text is longer). It costs one epoch's ids
  and offsets in memory, twice while the next is drawn (Multi30k En-De at bpe_dropout=0.1:
  3.0 MB; some 160 bytes a pair, so ~0.7 GB for WMT14 En-De's 4.5M pairs), and the draws
  (in Python: ~90 microseconds a side for BPE-dropout, ~230 for unigram sampling, on Multi30k's
  sentences, on a 2-core AMD EPYC family 25 model 17 beside a training: ~5 s for an epoch of
  its 29,000 pairs with BPE-dropout, in the background thread).
- plan=prepared: the batches are those of the deterministic lengths, and a batch's pairs are
  segmented as it is read (in the prefetch thread): no memory, but a batch that sampling has
  pushed over the token budget is cut again by `batching.fit_budget` into passes that fit, in
  the same optimizer step. On the Multi30k En-De recipe at bpe_dropout=0.1 a step then held
  1.40x the target tokens and 1.41x the FLOPs of the plain run's, at 77% real tokens against
  94% (the sampled lengths in a batch planned on the deterministic ones differ).

The alternative, K segmentations prepared ahead, would cost K times the prepared ids on disk
and in the page cache and a K-times longer prepare, and repeat itself every K epochs.
A sampled side longer than data.max_len (or a source longer than data.train_max_src_len) keeps
its deterministic ids, as does a side holding an unknown piece (its text is lost: decoding gives
"⁇"). With data.weights above 1, the copies of a pair drawn in one epoch share its segmentation.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from seq2seq.config.schema import SamplingPlan, SubwordSamplingConfig
from seq2seq.data.subword_draws import PieceTable, bpe_dropout, nbest_sample, unigram_sample
from seq2seq.data.tokenizer import UNK_ID, SentencePieceTokenizer, Tokenizer
from seq2seq.errors import ConfigError

Row = tuple[list[int], list[int]]  # a pair's source and target ids
SEED_LIMIT = (1 << 32) - 1  # the seeds are in [0, 2**32 - 2]


@dataclass(frozen=True)
class Sampling:
    """One tokenizer kind's sampler settings, as SentencePiece's encode(enable_sampling=True,
    alpha, nbest_size) takes them: BPE-dropout's p (Provilkov et al. 2020), or the unigram
    model's smoothing and l (Kudo 2018)."""

    alpha: float  # bpe: the merge-dropout probability; unigram: the smoothing exponent
    nbest_size: int  # unigram: draw among this many best (-1: all); bpe: ignored (-1)


def sampling_of(cfg: SubwordSamplingConfig, kind: str) -> Sampling | None:
    """The sampler settings tokenizer.sampling gives a `kind` tokenizer, or None when off.
    A knob set for another kind of model is a ConfigError (as config.checks.check_sampling,
    here against the tokenizer the run really has: a fine-tuning run takes its checkpoint's)."""
    for key, value, model in [
        ("bpe_dropout", cfg.bpe_dropout, "bpe"),
        ("unigram_alpha", cfg.unigram_alpha, "unigram"),
    ]:
        if value and kind != model:
            raise ConfigError(
                f"config: tokenizer.sampling.{key}={value!r} is invalid; it must be 0 with a "
                f"{kind} tokenizer (it samples the segmentations of a {model} model)"
            )
    if kind == "bpe" and cfg.bpe_dropout > 0:
        return Sampling(cfg.bpe_dropout, -1)
    if kind == "unigram" and cfg.unigram_alpha > 0:
        return Sampling(cfg.unigram_alpha, cfg.unigram_nbest)
    return None


def pair_seeds(seed: int, epoch: int, pairs: np.ndarray) -> np.ndarray:
    """(n, 2) seeds of the source and target draws of `pairs` (n,) in `epoch`: a splitmix64
    hash (Steele et al. 2014) of the pair under a key drawn from (seed, epoch, side), in
    [0, 2**32 - 2]. Each depends on its own (seed, epoch, pair, side) only."""
    keys = np.random.default_rng([seed, epoch, 5]).integers(0, 1 << 63, 2, dtype=np.uint64)  # (2,)
    x = pairs.astype(np.uint64)[:, None] * np.uint64(0x9E3779B97F4A7C15) + keys  # (n, 2), wraps
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    seeds: np.ndarray = np.minimum(x >> np.uint64(32), np.uint64(SEED_LIMIT - 1))  # (n, 2)
    return seeds


class SubwordSampler:
    """Sampled segmentations of training pairs (BPE-dropout, Provilkov et al. 2020, "BPE-Dropout:
    Simple and Effective Subword Regularization"; unigram sampling, Kudo 2018, "Subword
    Regularization: Improving Neural Network Translation Models with Multiple Subword
    Candidates"), a pure function of (seed, epoch, pair): see the module docstring."""

    def __init__(
        self,
        tokenizers: tuple[Tokenizer, Tokenizer],
        sampling: Sampling,
        seed: int,
        caps: tuple[int, int],
        plan: SamplingPlan = SamplingPlan.sampled,
    ) -> None:
        """`tokenizers` (source, target): SentencePiece models of one kind; `caps` (source,
        target): the longest sampled segmentation kept (data.max_len, and
        data.train_max_src_len for the source when set); `plan`: the lengths TrainData cuts
        an epoch's batches on (the module docstring)."""
        self.src_tok, self.tgt_tok = (sentencepiece(tok) for tok in tokenizers)
        self.src_table = PieceTable.of(self.src_tok)
        same = self.tgt_tok is self.src_tok  # a joint vocabulary: one table
        self.tgt_table = self.src_table if same else PieceTable.of(self.tgt_tok)
        self.sampling, self.seed, self.caps, self.plan = sampling, seed, caps, plan

    @property
    def plans_sampled(self) -> bool:
        """Whether an epoch is planned on its sampled lengths (plan=sampled)."""
        return self.plan == SamplingPlan.sampled

    def resample(self, epoch: int, pairs: np.ndarray, rows: Sequence[Row]) -> list[Row]:
        """The rows of `pairs` (their ids in the corpora, (n,)) as segmented in `epoch`;
        `rows` holds their deterministic ids."""
        seeds = pair_seeds(self.seed, epoch, pairs).tolist()  # (n, 2)
        src_side = (self.src_tok, self.src_table, self.caps[0])
        tgt_side = (self.tgt_tok, self.tgt_table, self.caps[1])
        return [
            (self.side(*src_side, src, s), self.side(*tgt_side, tgt, t))
            for (src, tgt), (s, t) in zip(rows, seeds, strict=True)
        ]

    def side(
        self, tok: SentencePieceTokenizer, table: PieceTable, cap: int, ids: list[int], seed: int
    ) -> list[int]:
        """One side's segmentation drawn with `seed` (subword_draws.py): `ids` themselves when
        they hold an unknown piece or when the draw is longer than `cap`."""
        if UNK_ID in ids:
            return ids
        s, rng = self.sampling, random.Random(seed)
        drawn: list[int] | None
        if tok.kind == "bpe":
            drawn = bpe_dropout(table, table.text(ids), s.alpha, rng)
        elif s.nbest_size > 0:
            drawn = nbest_sample(tok, table, tok.decode(ids), s.alpha, s.nbest_size, rng)
        else:
            drawn = unigram_sample(table, table.text(ids), s.alpha, rng)
        return drawn if drawn is not None and len(drawn) <= cap else ids


def sentencepiece(tok: Tokenizer) -> SentencePieceTokenizer:
    """`tok` itself, which must be a SentencePiece model (a ConfigError names its kind else)."""
    if not isinstance(tok, SentencePieceTokenizer):
        raise ConfigError(
            f"config: tokenizer.sampling needs a SentencePiece tokenizer (bpe or unigram), "
            f"not {tok.kind}"
        )
    return tok


def subword_sampler(
    cfg: SubwordSamplingConfig,
    tokenizers: tuple[Tokenizer, Tokenizer],
    seed: int,
    caps: tuple[int, int],
) -> SubwordSampler | None:
    """The sampler of tokenizer.sampling for these tokenizers, or None when it is off."""
    sampling = sampling_of(cfg, tokenizers[0].kind)
    if sampling is None:
        return None
    return SubwordSampler(tokenizers, sampling, seed, caps, SamplingPlan(cfg.plan))
