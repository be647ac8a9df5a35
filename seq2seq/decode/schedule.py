"""Many sentences through the searches: batch by batch, or greedy with continuous batching.

`translate_ids` decodes sources sorted by length (longest first) in batches of
decode.batch_size and gives the results back in input order. Greedy search goes further when
decode.continuous is on (the default): the batch's rows are refilled with the next sentences
as soon as a share of them (1 / REFILL) has finished, each row decoding from its own position
(the iteration-level scheduling of Yu et al. 2022, "Orca: A Distributed Serving System for
Transformer-Based Generative Models"), so a batch's long tail (a sentence looping to its
length limit) runs beside new sentences instead of alone. Rows that finished wait for the
refill (their steps are not read); with no sentence left to start, they leave the batch. The
sentences waiting to start are encoded decode.batch_size at a time, ahead of the refills.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from seq2seq.config.schema import DecodeConfig, SearchKind
from seq2seq.data.batching import sentence_batches
from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from seq2seq.decode.ensemble import SearchModel
from seq2seq.decode.search import (
    Bounds,
    Hypothesis,
    decode_batch,
    keep_rows,
    length_limits,
    most_probable,
    pad_sources,
    step_logprobs,
    strip_eos,
)
from seq2seq.model.cache import LayerCache
from seq2seq.model.lookup import direct_attributes

# finished rows are refilled (or, with no sentence left, dropped) once they are this share
# (1 / REFILL) of the rows: each refill encodes the new sentences in one call
REFILL = 8


def translate_ids(
    model: SearchModel,
    src_ids: list[list[int]],
    cfg: DecodeConfig,
    max_src_len: int = 1024,
    min_len: int = 0,
    numbers: Sequence[int] | None = None,
) -> list[list[Hypothesis]]:
    """Decode many sources in length-sorted batches (greedy: continuously, when
    cfg.continuous and there are more sources than one batch holds); results come back in
    input order. `numbers`: each source's index in the whole input, which seeds its samples
    (default: its index in src_ids; a share of an input keeps the whole input's draws).

    Sources that fit in one batch leave no sentence to start once it is under way: refilling
    has nothing to do, and batch-by-batch search drops finished rows the same way, at a lower
    cost a step (one sentence at a time on an AVX2-only AMD EPYC: 78.2 against 95.3 ms a
    sentence, docs/BENCHMARKS.md)."""
    device = next(model.parameters()).device
    results: list[list[Hypothesis]] = [[] for _ in src_ids]
    refills = len(src_ids) > cfg.batch_size
    with decoding(model):
        if cfg.method == SearchKind.greedy and cfg.continuous and refills:
            best = continuous_greedy(model, src_ids, cfg, max_src_len, min_len)
            return [[h] for h in best]
        for index in sentence_batches([len(s) for s in src_ids], cfg.batch_size):
            src = pad_sources([src_ids[i] for i in index], max_src_len, device)  # (B, S)
            seeds = index if numbers is None else [numbers[i] for i in index]
            found = decode_batch(model, src, cfg, min_len, seeds)
            for i, hyps in zip(index, found, strict=True):
                results[i] = hyps
    return results


@contextmanager
def decoding(model: SearchModel) -> Iterator[None]:
    """The model in eval mode, its attributes read directly (seq2seq/model/lookup.py: ~1.7 us
    a read saved, ~180 reads a decoder step), for the block; its mode is restored after. A model
    already in eval mode is left alone: setting the mode of every module twice took ~1.9 ms a
    call on an AVX2-only AMD EPYC, ~3% of a sentence translated alone."""
    was_training = model.training
    switch = any(module.training for module in model.modules())
    if switch:
        model.eval()
    try:
        with direct_attributes(model):
            yield
    finally:
        if switch:
            model.train(was_training)


@dataclass
class _Rows:
    """The rows continuous greedy search decodes side by side, each holding a sentence or
    (`sentence` -1) waiting for one."""

    sentence: Tensor  # (N,) each row's index in the input, -1 once it has finished
    length: Tensor  # (N,) tokens out so far
    score: Tensor  # (N,) summed log-probabilities
    tokens: Tensor  # (N, L) ids so far, PAD after them
    token: Tensor  # (N, 1) the next decoder input
    bounds: Bounds

    @staticmethod
    def start(sentence: Tensor, limit: int, max_len: Tensor, min_len: Tensor) -> _Rows:
        """The first sentences (B,), a row each, at BOS; outputs of at most `limit` tokens."""
        n, device = sentence.numel(), sentence.device
        tokens = torch.full((n, limit), PAD_ID, dtype=torch.long, device=device)  # (N, L)
        token = torch.full((n, 1), BOS_ID, dtype=torch.long, device=device)  # (N, 1)
        zeros = torch.zeros(n, dtype=torch.long, device=device)
        return _Rows(sentence, zeros, zeros.float(), tokens, token, Bounds(max_len, min_len))

    def fill(self, slots: Tensor, sentence: Tensor, max_len: Tensor, min_len: Tensor) -> None:
        """New sentences (B',) in the rows `slots` (B',), at BOS."""
        self.sentence[slots], self.length[slots], self.score[slots] = sentence, 0, 0.0
        self.tokens[slots], self.token[slots] = PAD_ID, BOS_ID
        limits, floors = self.bounds.max_len.clone(), self.bounds.min_len.clone()
        limits[slots], floors[slots] = max_len, min_len
        self.bounds = Bounds(limits, floors)

    def advance(self, best: Tensor, logprob: Tensor) -> Tensor:
        """Each row takes its token best (N,) of log-probability logprob (N,). Returns which
        rows' sentences it ends (N,): EOS ends each sentence in time; a free row ends nothing."""
        self.tokens[torch.arange(best.numel(), device=best.device), self.length] = best
        self.score += logprob
        self.length += 1
        self.token = best[:, None]  # (N, 1)
        return best.eq(EOS_ID) & self.sentence.ge(0)  # (N,)

    def keep(self, rows: Tensor) -> None:
        """Only the rows `rows` (N',)."""
        self.sentence, self.length = self.sentence[rows], self.length[rows]
        self.score, self.tokens, self.token = self.score[rows], self.tokens[rows], self.token[rows]
        self.bounds = self.bounds.select(rows)


@torch.inference_mode()
def continuous_greedy(
    model: SearchModel,
    src_ids: list[list[int]],
    cfg: DecodeConfig,
    max_src_len: int = 1024,
    min_len: int = 0,
) -> list[Hypothesis]:
    """Greedy search over all of src_ids, cfg.batch_size rows at a time, longest sources first,
    with continuous batching (see the module docstring). The caches hold every row's
    cross-attention keys, so decode never reads the memory it is passed. The same hypotheses
    as `greedy_search` batch by batch, up to float rounding."""
    device, width = next(model.parameters()).device, cfg.batch_size
    order = [i for batch in sentence_batches([len(s) for s in src_ids], 1) for i in batch]
    src_len = torch.tensor([min(len(s), max_src_len) + 1 for s in src_ids], device=device)
    limits = length_limits(src_len, cfg.max_len_a, cfg.max_len_b)  # (n,) EOS included
    found: list[Hypothesis | None] = [None] * len(src_ids)
    if not src_ids:
        return []
    cache = model.new_cache(int(limits.max()))
    waiting = _Waiting(model, src_ids, order, width, max_src_len)
    first = waiting.start(cache, width, None)  # (N,)
    rows = _Rows.start(first, int(limits.max()), limits[first], torch.full_like(first, min_len))
    memory, src_mask = waiting.memory[:0], waiting.src_mask[:0]  # never read: the caches hold it
    idle = 0  # rows waiting for a sentence
    while rows.sentence.numel():
        logits = model.decode(rows.token, memory, src_mask, cache)[:, -1]  # (N, V)
        logprobs = step_logprobs(logits, rows.length, rows.bounds, 1, cfg.scores)[:, 0]  # (N, V)
        logprob, best = most_probable(logprobs, rows.sentence, 0)  # (N,) each
        ended = rows.advance(best, logprob)  # (N,)
        if bool(ended.any()):
            done = ended.nonzero().squeeze(1)  # (R,)
            _record(found, rows, done, cfg.scores)
            rows.sentence[done], rows.length[done] = -1, 0
            for layer_cache in cache:
                layer_cache.reset_rows(done)
            idle += done.numel()
        if idle < max(1, rows.sentence.numel() // REFILL):
            continue
        free = rows.sentence.lt(0).nonzero().squeeze(1)  # (idle,)
        if waiting.left:  # the next sentences take the free rows
            join = waiting.start(cache, free.numel(), free)  # (J,)
            rows.fill(free[: join.numel()], join, limits[join], torch.full_like(join, min_len))
            idle -= join.numel()
        else:  # nothing left to start: the free rows leave
            kept = rows.sentence.ge(0).nonzero().squeeze(1)  # (N',)
            rows.keep(kept)
            keep_rows(cache, kept, kept)
            idle = 0
    return [h for h in found if h is not None]


class _Waiting:
    """The sentences yet to start, in `order`, encoded `width` at a time ahead of the refills
    that start them: one encoder call a batch's worth of sentences, not one a refill (the
    refills start ~1/REFILL of the rows each; encoding 1,000 Multi30k sentences 8 at a time
    took twice as long as 64 at a time on an AVX2-only AMD EPYC)."""

    def __init__(
        self,
        model: SearchModel,
        src_ids: list[list[int]],
        order: list[int],
        width: int,
        max_src_len: int,
    ) -> None:
        self.model, self.src_ids, self.order = model, src_ids, order
        self.width, self.max_src_len = width, max_src_len
        self.taken = 0  # sentences of `order` started
        self.device = next(model.parameters()).device
        self.sentences = torch.zeros(0, dtype=torch.long, device=self.device)  # (C,) encoded
        self.used = 0  # of them started
        self.memory, self.src_mask = torch.zeros(0), torch.zeros(0, dtype=torch.bool)

    @property
    def left(self) -> int:
        """How many sentences are yet to start."""
        return len(self.order) - self.taken

    def start(self, cache: list[LayerCache], n: int, slots: Tensor | None) -> Tensor:
        """Start the next n sentences (fewer if fewer are left): put them in the rows `slots`
        of the caches (None: after their rows), the share of each encoder call with its memory
        cut to its own longest source; returns them (B',)."""
        started: list[Tensor] = []
        done = 0  # of the n started
        while done < n and self.left:
            if self.used == self.sentences.numel():
                self._encode()
            k = min(n - done, self.sentences.numel() - self.used)
            rows = slice(self.used, self.used + k)
            span = int(self.src_mask[rows].sum(1).max())  # real tokens lead every row
            memory, src_mask = self.memory[rows, :span], self.src_mask[rows, :span]
            where = None if slots is None else slots[done : done + k]
            self.model.add_sentences(cache, memory, src_mask, where)
            started.append(self.sentences[rows])
            self.used, self.taken, done = self.used + k, self.taken + k, done + k
        return torch.cat(started)

    def _encode(self) -> None:
        """Encode the next `width` sentences of `order`."""
        chunk = self.order[self.taken : self.taken + self.width]
        src = pad_sources([self.src_ids[i] for i in chunk], self.max_src_len, self.device)
        self.memory, self.src_mask = self.model.encode(src)  # (C, S, D), (C, S)
        self.sentences = torch.tensor(chunk, device=self.device)  # (C,)
        self.used = 0


def _record(found: list[Hypothesis | None], rows: _Rows, done: Tensor, scored: bool) -> None:
    """The hypotheses of the rows `done` (R,), which have just output EOS, in `found` (scored:
    the rows' scores are log-probabilities, else NaN)."""
    sentences, tokens = rows.sentence[done].tolist(), rows.tokens[done].tolist()
    scores = rows.score[done].tolist() if scored else [math.nan] * len(sentences)
    for i, ids, score in zip(sentences, tokens, scores, strict=True):
        found[i] = Hypothesis(strip_eos(ids), score)
