"""The batches of each training epoch, over one or several prepared corpora (prepared.py).

An epoch is the batching of data.token_batches, computed from the corpora's group tables rather
than from a list of every pair: pairs are sorted by (width, tgt len, src len) with ties in a random
order, cut greedily into batches under the token budget, and the batches shuffled. Because the
cut depends only on the lengths, the batch boundaries come from the group counts alone, in
O(groups + batches); which pairs fill a batch is drawn when the batch is collated. Everything is
a pure function of (seed, epoch), so resuming and torchrun sharding are exact. The random order
within a block is a seeded pseudo-random permutation (`permute`), evaluated only at the positions
a batch takes, and the next batch is read in a background thread while the model computes.

Several training splits are mixed: a key's group is the union of the splits' groups of that
key, and data.weights scales each split's share of every group (stochastic rounding, so an
epoch draws weight x pairs of a split in expectation, stratified by length).

With subword regularization (tokenizer.sampling, subword_sampling.py), the pairs are segmented
anew each epoch, from (seed, epoch, pair). plan=sampled: the epoch's segmentations are drawn
before its first batch (`sampled_epoch`; the next epoch's in a background thread) and the
epoch is planned on them as on prepared corpora (`EpochData`). plan=prepared: a batch's pairs
are segmented as it is read, the plan stays that of the prepared lengths, and
batching.fit_budget cuts a batch that sampling made too wide.

Bidirectional training (data.bidirectional_epochs; Ding et al. 2021, BiT) adds each split's
pairs reversed, target -> source (`CorpusArrays.reversed`, views of the same arrays), as further
corpora of their split's weight in the first epochs and 0 after them, when the plan is exactly
the one without them.

With fixed shapes (trainer.batch_shapes, buckets.py) the budget counts each pair's padded width,
and every batch is padded to its bucket's shape as it is passed on (`passes`).
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from seq2seq.data.batching import Batch, cut_batches, fit_budget, pad
from seq2seq.data.buckets import Shape, ShapeBuckets
from seq2seq.data.prepared import CorpusArrays
from seq2seq.data.subword_sampling import Row, SubwordSampler
from seq2seq.data.tokenizer import BOS_ID, EOS_ID

log = logging.getLogger(__name__)

# rows read between two CorpusArrays.release(): a page fault maps up to 16 pages (the kernel's
# fault-around), so a batch's rows would otherwise map tens of MB at once
RELEASE_EVERY = 32
# a batch of an epoch: (epoch, its number in the epoch's plan)
BatchRef = tuple[int, int]
# rows read between two CorpusArrays.release() when a whole epoch is segmented
SAMPLE_RELEASE_EVERY = 4096


def copy_rows(corpora: list[CorpusArrays], at: list[tuple[int, int]], every: int) -> list[Row]:
    """The (source, target) ids of row `i` of corpus `c` for each (c, i) of `at`, copied out of
    the arrays, whose mapped pages are released after every `every` rows."""
    rows: list[Row] = []
    for start in range(0, len(at), every):
        for c, i in at[start : start + every]:
            src, tgt = corpora[c].row(i)
            rows.append((src.tolist(), tgt.tolist()))
        for arrays in corpora:  # copied: their pages need not stay mapped
            arrays.release()
    return rows


@dataclass
class EpochData:
    """The pairs an epoch is planned over: the prepared corpora, or (plan=sampled) in-memory
    corpora of their segmentations drawn for that epoch."""

    corpora: list[CorpusArrays]  # their rows: every pair, or those trained on (sampled)
    groups: list[np.ndarray]  # per corpus: (groups, 5) the groups trained on
    pairs: list[np.ndarray | None]  # per corpus: the pair of each row (None: row i is pair i)

    @property
    def sampled(self) -> bool:
        """Whether the rows hold the epoch's segmentations already (sampled_epoch's data)."""
        return any(p is not None for p in self.pairs)

    def pair_ids(self, corpus: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The corpus pair (prepared row) of each of `rows` (n,) of `corpus` (n,)."""
        out: np.ndarray = rows.copy()  # (n,)
        for c, pairs in enumerate(self.pairs):
            if pairs is not None:
                here = corpus == c
                out[here] = pairs[rows[here]]
        return out


@dataclass
class EpochPlan:
    """One epoch: blocks of pairs of equal lengths and the batches cut over them."""

    epoch: int
    data: EpochData  # the rows the blocks and batches refer to
    keys: np.ndarray  # (blocks,) sort key of each block
    members: list[list[tuple[int, int, int, int]]]  # per block: (corpus, start, count, drawn)
    block_starts: np.ndarray  # (blocks + 1,) first position of each block, then the end
    batch_starts: np.ndarray  # (batches + 1,) first position of each batch, then the end
    order: np.ndarray  # (batches,) the epoch's batch order
    drawn: list[int]  # pairs drawn from each corpus


class TrainData:
    """The training pairs of a run: one or several CorpusArrays, batched per epoch."""

    def __init__(
        self,
        corpora: dict[str, CorpusArrays],
        weights: list[float],
        max_len: int,
        max_tokens: int,
        seed: int,
        max_src_len: int = 0,
        sampler: SubwordSampler | None = None,
        shape_buckets: int = 0,
        reversed_epochs: int = 0,
    ) -> None:
        """`corpora` by split name, drawn with `weights` (one each, or empty = 1); pairs with a
        side over `max_len` tokens, or a source over `max_src_len` (when above 0;
        data.train_max_src_len) are left out; batches of at most `max_tokens` padded tokens
        (data.token_batches' budget); shuffled from `seed` and the epoch. `sampler`: segments
        each batch's pairs anew (tokenizer.sampling), None: the prepared ids. `shape_buckets`
        > 0: batches padded to that many fixed shapes (buckets.py), 0: as long as their pairs.
        `reversed_epochs` > 0: epochs 0 to reversed_epochs - 1 also draw every split's pairs
        reversed (bidirectional training; needs one vocabulary for both sides, and no sampler)."""
        if reversed_epochs > 0 and sampler is not None:
            raise ValueError("bidirectional training and subword sampling do not combine")
        self.sampler, self.reversed_epochs = sampler, reversed_epochs
        self.names, self.corpora = list(corpora), list(corpora.values())
        self.weights = weights or [1.0] * len(self.corpora)
        self.splits = len(self.corpora)  # the training splits; then their reversed copies
        if reversed_epochs > 0:
            self.names += [f"{name} reversed" for name in self.names]
            self.corpora += [arrays.reversed() for arrays in self.corpora]
            self.weights = self.weights * 2
        self.max_len, self.max_tokens, self.seed = max_len, max_tokens, seed
        self.base = np.cumsum([0] + [len(c) for c in self.corpora])  # (corpora + 1,)
        src_cap = max_src_len or max_len  # groups: (width, tgt len, src len, start, count)
        self.groups = [
            g[(np.maximum(g[:, 1], g[:, 2]) <= max_len) & (g[:, 2] <= src_cap)]
            for g in (c.groups for c in self.corpora)
        ]
        self.buckets = self.fit_buckets(shape_buckets) if shape_buckets > 0 else None
        self.prepared = EpochData(self.corpora, self.groups, [None] * len(self.corpora))
        self.plan: EpochPlan | None = None
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch")
        self.pending: dict[BatchRef, Future[Batch]] = {}
        self.drawing = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sampling")
        self.next_epoch: tuple[int, Future[EpochData]] | None = None

    def __len__(self) -> int:
        """Pairs within max_len, over every split (each counted once; not their reversed copies)."""
        return int(sum(int(g[:, 4].sum()) for g in self.groups[: self.splits]))

    def longest(self) -> tuple[int, int]:
        """The longest source and target (tokens, no specials) among the pairs trained on
        (reversed pairs included)."""
        kept = [g for g in self.groups if len(g)]
        if not kept:
            return 0, 0
        return max(int(g[:, 2].max()) for g in kept), max(int(g[:, 1].max()) for g in kept)

    def over_long(self) -> list[int]:
        """Pairs of each split left out for a side over max_len (or a source over max_src_len)."""
        kept = [int(g[:, 4].sum()) for g in self.groups[: self.splits]]
        return [len(c) - k for c, k in zip(self.corpora[: self.splits], kept, strict=True)]

    def fit_buckets(self, n: int) -> ShapeBuckets:
        """`n` fixed lengths for the pairs trained on (each split's pairs counted by its weight),
        the widest pair possible (data.max_len + 1) as the limit."""
        widths = np.concatenate([g[:, 0] + 1 for g in self.groups])  # (groups,) tensor widths
        counts = np.concatenate(
            [g[:, 4] * w for g, w in zip(self.groups, self.weights, strict=True)]
        )  # (groups,)
        buckets = ShapeBuckets.fit(widths, counts, n, self.max_len + 1, self.max_tokens)
        *shapes, last = (f"({b}, {s}, {t})" for b, s, t in buckets.shapes())
        log.info(
            "fixed batch shapes (rows, source, target): %s; %s for a pair wider than these",
            ", ".join(shapes),
            last,
        )
        return buckets

    def epoch_plan(self, epoch: int) -> EpochPlan:
        """The plan of `epoch` (the last one is kept; the prefetch thread asks too)."""
        with self.lock:
            plan = self.plan
            if plan is None or plan.epoch != epoch:
                self.plan = plan = self.make_plan(epoch)
                drawn = zip(self.names, plan.drawn, strict=True)
                shares = ", ".join(f"{n} {d}" for n, d in drawn)
                log.info("epoch %d: %d batches; pairs drawn: %s", epoch, len(plan.order), shares)
            return plan

    def prefetch(self, refs: list[BatchRef]) -> None:
        """Start collating `refs` in a background thread, so that their rows are read from disk
        while the model computes; `collate` then takes them from there."""
        self.pending = {ref: self.pool.submit(self.read, ref) for ref in refs}

    def close(self) -> None:
        """Stop the prefetch and sampling threads."""
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.drawing.shutdown(wait=True, cancel_futures=True)

    def epoch_data(self, epoch: int) -> EpochData:
        """The pairs `epoch` is planned over: the prepared corpora, or with plan=sampled their
        segmentations of `epoch` (drawn in the background while the epoch before trained, when
        it did; the next epoch's drawing starts now)."""
        if self.sampler is None or not self.sampler.plans_sampled:
            return self.prepared
        ahead = self.next_epoch
        data = ahead[1].result() if ahead and ahead[0] == epoch else self.sampled_epoch(epoch)
        self.next_epoch = (epoch + 1, self.drawing.submit(self.sampled_epoch, epoch + 1))
        return data

    def sampled_epoch(self, epoch: int) -> EpochData:
        """Every pair trained on, segmented for `epoch` by the sampler, as in-memory corpora
        (the same pairs as the prepared groups hold: a draw over a cap keeps its prepared ids)."""
        assert self.sampler is not None
        corpora, groups, pairs = [], [], list[np.ndarray | None]()
        for c, (arrays, kept_groups) in enumerate(zip(self.corpora, self.groups, strict=True)):
            runs = [arrays.order[s : s + n] for s, n in kept_groups[:, 3:5].tolist()]
            kept = np.concatenate([np.zeros(0, np.int64), *runs]).astype(np.int64)  # (pairs,)
            rows = copy_rows([arrays], [(0, i) for i in kept.tolist()], SAMPLE_RELEASE_EVERY)
            rows = self.sampler.resample(epoch, self.base[c] + kept, rows)
            dtype = arrays.src_ids.dtype
            sampled = CorpusArrays.from_ids([r[0] for r in rows], [r[1] for r in rows], dtype)
            corpora.append(sampled)
            groups.append(sampled.groups)
            pairs.append(kept)
        return EpochData(corpora, groups, pairs)

    def make_plan(self, epoch: int) -> EpochPlan:
        """Blocks (one per length triple, the corpora's groups merged, each corpus's share
        drawn by its weight), the batches cut over them, and their shuffled order."""
        data = self.epoch_data(epoch)
        rows: list[tuple[int, int, int, int, int]] = []  # (key, corpus, start, count, drawn)
        for c, (groups, weight) in enumerate(
            zip(data.groups, self.epoch_weights(epoch), strict=True)
        ):
            counts = groups[:, 4]
            drawn = counts
            if weight != 1.0:  # 0: a reversed copy after the bidirectional epochs draws none
                rng = np.random.default_rng([self.seed, epoch, c, 1])
                exact = counts * weight  # (groups,)
                drawn = np.floor(exact).astype(np.int64) + (rng.random(len(counts)) < exact % 1)
            sort_key = (groups[:, 0] << 32) | (groups[:, 1] << 16) | groups[:, 2]  # (groups,)
            rows += zip(
                sort_key.tolist(),
                [c] * len(groups),
                groups[:, 3].tolist(),
                counts.tolist(),
                drawn.tolist(),
            )
        rows.sort()
        keys: list[int] = []
        members: list[list[tuple[int, int, int, int]]] = []
        for key, c, start, count, taken in rows:
            if taken == 0:
                continue
            if not keys or keys[-1] != key:
                keys.append(key)
                members.append([])
            members[-1].append((c, start, count, taken))
        # token_batches' size of a pair: max(src + 1, tgt + 1) + 1, the + 1s for BOS and EOS
        widths = np.array([(k >> 32) + 1 for k in keys], dtype=np.int64)  # (blocks,)
        sizes = (widths if self.buckets is None else self.buckets.widths(widths)) + 1
        totals = np.array([sum(m[3] for m in ms) for ms in members], dtype=np.int64)
        batch_starts = cut_batches(sizes, totals, self.max_tokens)
        rng = np.random.default_rng([self.seed, epoch, 0])
        drawn_by = [
            sum(m[3] for ms in members for m in ms if m[0] == c) for c in range(len(self.corpora))
        ]
        return EpochPlan(
            epoch,
            data,
            np.array(keys, dtype=np.int64),
            members,
            np.concatenate([[0], np.cumsum(totals)]).astype(np.int64),
            batch_starts,
            rng.permutation(len(batch_starts) - 1),
            drawn_by,
        )

    def epoch_weights(self, epoch: int) -> list[float]:
        """Each corpus's weight in `epoch`: data.weights, the reversed copies 0 from epoch
        reversed_epochs on."""
        if epoch < self.reversed_epochs:
            return self.weights
        return self.weights[: self.splits] + [0.0] * (len(self.weights) - self.splits)

    def epoch_batches(self, epoch: int) -> list[BatchRef]:
        """The batches of `epoch` in training order (a pure function of seed and epoch)."""
        plan = self.epoch_plan(epoch)
        return [(epoch, int(b)) for b in plan.order]

    def block_slice(self, plan: EpochPlan, j: int, lo: int, hi: int) -> tuple[Any, Any]:
        """Corpus and row (in plan.data) of positions [lo, hi) of block j in the epoch's random
        order, without laying out the whole block (at 20M pairs one holds up to millions)."""
        members, key = plan.members[j], int(plan.keys[j])
        slots = permute(
            np.arange(lo, hi),
            int(plan.block_starts[j + 1] - plan.block_starts[j]),
            (self.seed, plan.epoch, 3, key),
        )
        ends = np.cumsum([m[3] for m in members])  # (members,) each corpus's drawn slots
        which = np.searchsorted(ends, slots, side="right")  # (hi - lo,) the member of each
        corpus = np.empty(len(slots), dtype=np.int64)
        index = np.empty(len(slots), dtype=np.int64)
        for k, (c, start, count, drawn) in enumerate(members):
            here = np.flatnonzero(which == k)
            # the d-th draw of a corpus is its (d mod count)-th pair in a random order: weights
            # under 1 take a random part of the group, over 1 every pair that many times
            draw = (slots[here] - (ends[k] - drawn)) % count
            local = permute(draw, count, (self.seed, plan.epoch, c, 2, key))
            corpus[here] = c
            index[here] = plan.data.corpora[c].order[start + local]
        return corpus, index

    def members_of(self, ref: BatchRef) -> tuple[np.ndarray, np.ndarray]:
        """Corpus and row (in its plan's data) of each pair of batch `ref`."""
        plan = self.epoch_plan(ref[0])
        start, end = plan.batch_starts[ref[1]], plan.batch_starts[ref[1] + 1]
        j = int(np.searchsorted(plan.block_starts, start, side="right")) - 1
        corpus, index = [], []
        while plan.block_starts[j] < end:
            lo = max(start - plan.block_starts[j], 0)
            hi = min(end, plan.block_starts[j + 1]) - plan.block_starts[j]
            c, i = self.block_slice(plan, j, int(lo), int(hi))
            corpus.append(c)
            index.append(i)
            j += 1
        return np.concatenate(corpus), np.concatenate(index)

    def passes(self, ref: BatchRef) -> list[Batch]:
        """The Batch of `ref` as the passes of one training step: one, unless sampled
        segmentations made it wider than the budget (fit_budget), each padded to its fixed
        shape when there are shape buckets."""
        if self.buckets is None:
            return fit_budget(self.collate(ref), self.max_tokens)
        parts = fit_budget(self.collate(ref), self.max_tokens, self.buckets.width)
        return [self.buckets.pad(b) for b in parts]

    def epoch_shapes(self, epoch: int) -> tuple[list[Shape], int]:
        """The shape of every batch of `epoch` in plan order (as `passes` pads it, or as
        collated) and the real (non-pad) source + target tokens of them all, from the
        lengths planned on alone (with plan=prepared, sampled segmentations differ)."""
        plan = self.epoch_plan(epoch)
        cuts = np.union1d(plan.block_starts, plan.batch_starts)  # (segments + 1,)
        block = np.searchsorted(plan.block_starts, cuts[:-1], side="right") - 1  # (segments,)
        batch = np.searchsorted(plan.batch_starts, cuts[:-1], side="right") - 1  # (segments,)
        src = (plan.keys[block] & 0xFFFF) + 1  # (segments,) with EOS
        tgt = ((plan.keys[block] >> 16) & 0xFFFF) + 1  # (segments,) with BOS / EOS
        first = np.searchsorted(batch, np.arange(len(plan.batch_starts) - 1))  # (batches,)
        longest = zip(np.maximum.reduceat(src, first), np.maximum.reduceat(tgt, first))
        rows = np.diff(plan.batch_starts).tolist()  # (batches,)
        real = int((np.diff(cuts) * (src + tgt)).sum())
        if self.buckets is None:
            return [(r, int(s), int(t)) for r, (s, t) in zip(rows, longest, strict=True)], real
        shapes = [self.buckets.shape(int(s), int(t)) for s, t in longest]
        return [(max(r, sh[0]), sh[1], sh[2]) for r, sh in zip(rows, shapes, strict=True)], real

    def epoch_padding(self, epoch: int) -> dict[str, float]:
        """`epoch`'s batches, distinct shapes and share of real tokens among the padded
        (padding_efficiency), from the lengths planned on (epoch_shapes); logged."""
        shapes, real = self.epoch_shapes(epoch)
        padded = sum(b * (s + t) for b, s, t in shapes)
        out = {
            "batches": len(shapes),
            "shapes": len(set(shapes)),
            "padding_efficiency": real / padded,
        }
        log.info(
            "epoch %d: %d batches of %d shapes; %.1f%% of their padded tokens are real",
            epoch,
            out["batches"],
            out["shapes"],
            100 * out["padding_efficiency"],
        )
        return out

    def collate(self, ref: BatchRef) -> Batch:
        """The padded Batch of `ref` (data.collate's layout): prefetched, or read now."""
        future = self.pending.pop(ref, None)
        return future.result() if future is not None else self.read(ref)

    def read(self, ref: BatchRef) -> Batch:
        """The padded Batch of `ref`, read from its epoch's data (its pairs' segmentations
        sampled for ref's epoch now when plan=prepared: it may then exceed the token budget)."""
        data = self.epoch_plan(ref[0]).data
        corpus, at_rows = self.members_of(ref)
        at = list(zip(corpus.tolist(), at_rows.tolist(), strict=True))
        rows = copy_rows(data.corpora, at, RELEASE_EVERY)
        index = self.base[corpus] + data.pair_ids(corpus, at_rows)  # (B,)
        if self.sampler is not None and not data.sampled:
            rows = self.sampler.resample(ref[0], index, rows)
        return Batch(
            src=pad([[*s, EOS_ID] for s, _ in rows]),
            tgt_in=pad([[BOS_ID, *t] for _, t in rows]),
            tgt_out=pad([[*t, EOS_ID] for _, t in rows]),
            index=torch.from_numpy(index),
        )


def permute(index: np.ndarray, n: int, seed: tuple[int, ...]) -> np.ndarray:
    """pi(index) for a pseudo-random permutation pi of range(n) drawn from `seed`: a four-round
    Feistel network (Luby & Rackoff 1988) on the smallest even power of two >= n, walked back
    into range(n) (Black & Rogaway 2002). Any slice of pi costs its length, not n."""
    half = max(1, (max(n - 1, 1).bit_length() + 1) // 2)
    mask = np.uint64((1 << half) - 1)
    keys = np.random.default_rng(list(seed)).integers(0, 1 << 63, 4, dtype=np.uint64)

    def rounds(x: np.ndarray) -> np.ndarray:
        left, right = x >> np.uint64(half), x & mask
        for key in keys:
            f = right * np.uint64(0x9E3779B97F4A7C15) + key  # splitmix64's mixing, wrapping
            f ^= f >> np.uint64(31)
            f *= np.uint64(0xBF58476D1CE4E5B9)
            f ^= f >> np.uint64(29)
            left, right = right, left ^ (f & mask)
        joined: np.ndarray = (left << np.uint64(half)) | right
        return joined

    out = rounds(index.astype(np.uint64))
    while (outside := out >= n).any():  # cycle walking: a bijection on range(n)
        out[outside] = rounds(out[outside])
    return out.astype(np.int64)
