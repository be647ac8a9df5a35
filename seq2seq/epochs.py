"""The batches of each training epoch, over one or several prepared corpora (prepared.py).

An epoch is the batching of data.token_batches, computed from the corpora's group tables rather
than from a list of every pair: pairs are sorted by (width, tgt len, src len) with ties in a random
order, cut greedily into batches under the token budget, and the batches shuffled. Because the
cut depends only on the lengths, the batch boundaries come from the group counts alone, in
O(groups + batches); which pairs fill a batch is drawn when the batch is collated. Everything is
a pure function of (seed, epoch), so resuming and torchrun sharding are exact.

Several training splits are mixed: a key's group is the union of the splits' groups of that
key, and data.weights scales each split's share of every group (stochastic rounding, so an
epoch draws weight x pairs of a split in expectation, stratified by length).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from seq2seq.data import BOS_ID, EOS_ID, PAD_ID, Batch
from seq2seq.prepared import CorpusArrays

log = logging.getLogger(__name__)

# a batch of an epoch: (epoch, its number in the epoch's plan)
BatchRef = tuple[int, int]


def cut_batches(sizes: np.ndarray, counts: np.ndarray, max_tokens: int) -> np.ndarray:
    """Start of every batch, then the end, over runs of `counts[j]` items of size `sizes[j]`
    (non-decreasing): data.token_batches' greedy cut (a batch holds items while
    `len * size <= max_tokens`; an item over budget forms a batch by itself), by arithmetic."""
    starts: list[int] = []
    pos = n = 0  # items placed so far; items in the open batch
    for size, count in zip(sizes.tolist(), counts.tolist(), strict=True):
        cap = max(1, max_tokens // size)
        if n:  # the open batch takes what still fits at this width
            take = min(max(max_tokens // size - n, 0), count)
            n, pos, count = n + take, pos + take, count - take
            if count == 0:
                continue
        full, rest = divmod(count, cap)
        starts.extend(range(pos, pos + full * cap, cap))
        pos += full * cap
        n = cap if full else 0
        if rest:
            starts.append(pos)
            pos, n = pos + rest, rest
    return np.array([*starts, pos], dtype=np.int64)


@dataclass
class EpochPlan:
    """One epoch: blocks of pairs of equal lengths and the batches cut over them."""

    epoch: int
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
    ) -> None:
        """`corpora` by split name, drawn with `weights` (one each, or empty = 1); pairs with a
        side over `max_len` tokens are left out; batches of at most `max_tokens` padded tokens
        (data.token_batches' budget); shuffled from `seed` and the epoch."""
        self.names, self.corpora = list(corpora), list(corpora.values())
        self.weights = weights or [1.0] * len(self.corpora)
        self.max_len, self.max_tokens, self.seed = max_len, max_tokens, seed
        self.base = np.cumsum([0] + [len(c) for c in self.corpora])  # (corpora + 1,)
        self.groups = [
            g[np.maximum(g[:, 1], g[:, 2]) <= max_len] for g in (c.groups for c in self.corpora)
        ]
        self.plan: EpochPlan | None = None
        self.cached: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def __len__(self) -> int:
        """Pairs within max_len, over every corpus (each counted once)."""
        return int(sum(int(g[:, 4].sum()) for g in self.groups))

    def over_long(self) -> list[int]:
        """Pairs of each corpus left out for a side over max_len."""
        kept = [int(g[:, 4].sum()) for g in self.groups]
        return [len(c) - k for c, k in zip(self.corpora, kept, strict=True)]

    def epoch_plan(self, epoch: int) -> EpochPlan:
        """The plan of `epoch` (the last one is kept)."""
        if self.plan is None or self.plan.epoch != epoch:
            self.plan, self.cached = self.make_plan(epoch), {}
            shares = ", ".join(f"{n} {d}" for n, d in zip(self.names, self.plan.drawn, strict=True))
            log.info("epoch %d: %d batches; pairs drawn: %s", epoch, len(self.plan.order), shares)
        return self.plan

    def make_plan(self, epoch: int) -> EpochPlan:
        """Blocks (one per length triple, the corpora's groups merged, each corpus's share
        drawn by its weight), the batches cut over them, and their shuffled order."""
        rows: list[tuple[int, int, int, int, int]] = []  # (key, corpus, start, count, drawn)
        for c, (groups, weight) in enumerate(zip(self.groups, self.weights, strict=True)):
            counts = groups[:, 4]
            drawn = counts
            if weight != 1.0:
                rng = np.random.default_rng([self.seed, epoch, c, 1])
                exact = counts * weight  # (groups,)
                drawn = np.floor(exact).astype(np.int64) + (rng.random(len(counts)) < exact % 1)
            key = (groups[:, 0] << 32) | (groups[:, 1] << 16) | groups[:, 2]
            rows += zip(
                key.tolist(),
                [c] * len(groups),
                groups[:, 3].tolist(),
                counts.tolist(),
                drawn.tolist(),
            )
        rows.sort()
        keys: list[int] = []
        members: list[list[tuple[int, int, int, int]]] = []
        for key, c, start, count, drawn in rows:
            if drawn == 0:
                continue
            if not keys or keys[-1] != key:
                keys.append(key)
                members.append([])
            members[-1].append((c, start, count, drawn))
        # token_batches' size of a pair: max(src + 1, tgt + 1) + 1, the + 1s for BOS and EOS
        sizes = np.array([(k >> 32) + 2 for k in keys], dtype=np.int64)
        totals = np.array([sum(m[3] for m in ms) for ms in members], dtype=np.int64)
        batch_starts = cut_batches(sizes, totals, self.max_tokens)
        rng = np.random.default_rng([self.seed, epoch, 0])
        drawn_by = [
            sum(m[3] for ms in members for m in ms if m[0] == c) for c in range(len(self.corpora))
        ]
        return EpochPlan(
            epoch,
            np.array(keys, dtype=np.int64),
            members,
            np.concatenate([[0], np.cumsum(totals)]).astype(np.int64),
            batch_starts,
            rng.permutation(len(batch_starts) - 1),
            drawn_by,
        )

    def epoch_batches(self, epoch: int) -> list[BatchRef]:
        """The batches of `epoch` in training order (a pure function of seed and epoch)."""
        plan = self.epoch_plan(epoch)
        return [(epoch, int(b)) for b in plan.order]

    def block(self, plan: EpochPlan, j: int) -> tuple[np.ndarray, np.ndarray]:
        """Corpus and pair index of every member of block j, in the epoch's random order."""
        if j not in self.cached:
            corpus, index = [], []
            for c, start, count, drawn in plan.members[j]:
                pairs = np.asarray(self.corpora[c].order[start : start + count], dtype=np.int64)
                rng = np.random.default_rng([self.seed, plan.epoch, c, 2, int(plan.keys[j])])
                picks = np.concatenate([rng.permutation(count) for _ in range(-(-drawn // count))])[
                    :drawn
                ]
                index.append(pairs[picks])
                corpus.append(np.full(drawn, c, dtype=np.int64))
            mix = np.random.default_rng([self.seed, plan.epoch, 3, int(plan.keys[j])])
            shuffle = mix.permutation(int(plan.block_starts[j + 1] - plan.block_starts[j]))
            if len(self.cached) > 8:
                self.cached.clear()
            self.cached[j] = (np.concatenate(corpus)[shuffle], np.concatenate(index)[shuffle])
        return self.cached[j]

    def members_of(self, ref: BatchRef) -> tuple[np.ndarray, np.ndarray]:
        """Corpus and pair index of each pair of batch `ref`."""
        plan = self.epoch_plan(ref[0])
        start, end = plan.batch_starts[ref[1]], plan.batch_starts[ref[1] + 1]
        first = int(np.searchsorted(plan.block_starts, start, side="right")) - 1
        corpus, index = [], []
        j = first
        while plan.block_starts[j] < end:
            c, i = self.block(plan, j)
            lo = max(start - plan.block_starts[j], 0)
            hi = min(end, plan.block_starts[j + 1]) - plan.block_starts[j]
            corpus.append(c[lo:hi])
            index.append(i[lo:hi])
            j += 1
        return np.concatenate(corpus), np.concatenate(index)

    def collate(self, ref: BatchRef) -> Batch:
        """The padded Batch of `ref` (data.collate's layout), read from the corpora."""
        corpus, index = self.members_of(ref)
        rows = [self.corpora[c].row(i) for c, i in zip(corpus.tolist(), index.tolist())]
        batch = Batch(
            src=pad([[*s.tolist(), EOS_ID] for s, _ in rows]),
            tgt_in=pad([[BOS_ID, *t.tolist()] for _, t in rows]),
            tgt_out=pad([[*t.tolist(), EOS_ID] for _, t in rows]),
            index=torch.from_numpy(self.base[corpus] + index),
        )
        for c in self.corpora:  # the rows are copied: their pages need not stay mapped
            c.release()
        return batch


def pad(rows: list[list[int]]) -> torch.Tensor:
    """Right-pad rows with PAD into a `(len(rows), longest)` long tensor."""
    width = max(len(row) for row in rows)
    out = np.full((len(rows), width), PAD_ID, dtype=np.int64)  # (B, width)
    for r, row in enumerate(rows):
        out[r, : len(row)] = row
    return torch.from_numpy(out)
