"""Padding and batching, one place for training and evaluation.

Token-id sequences are `list[int]` without special tokens. `collate` adds BOS/EOS and padding
(`pad`); `token_batches` groups examples of similar length under a token budget (a pure function
of its arguments, so resuming and sharding are reproducible) with `cut_batches`, the greedy cut
that training's epochs (seq2seq/data/epochs.py) compute from group counts; `fit_budget` cuts
a training batch again when sampled segmentations made it too wide; `sentence_batches`
groups sentences for inference.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import groupby, pairwise

import numpy as np
import torch

from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID

# --------------------------------------------------------------------------- filtering


# --------------------------------------------------------------------------- batching


@dataclass
class Batch:
    """A padded batch of examples.

    Attributes:
        src: `(B, S)` source ids followed by EOS, right-padded with PAD.
        tgt_in: `(B, T)` BOS followed by target ids (decoder input), right-padded.
        tgt_out: `(B, T)` target ids followed by EOS (decoder labels), right-padded.
        index: `(B,)` position of each example in the dataset; -1 marks a filler row (a
            batch padded to a fixed shape, data/buckets.py: an EOS source, a BOS decoder input
            and no label), which counts as no token.
    """

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    index: torch.Tensor

    @property
    def src_tokens(self) -> int:
        """Number of non-pad source tokens (filler rows left out)."""
        return int((self.src != PAD_ID).sum() - self.index.lt(0).sum())

    @property
    def tgt_tokens(self) -> int:
        """Number of non-pad target tokens (the labels the loss is computed on)."""
        return int((self.tgt_out != PAD_ID).sum())

    def to(self, device: torch.device | str) -> Batch:
        """Return a copy with every tensor moved to `device`."""
        return Batch(
            src=self.src.to(device, non_blocking=True),
            tgt_in=self.tgt_in.to(device, non_blocking=True),
            tgt_out=self.tgt_out.to(device, non_blocking=True),
            index=self.index.to(device, non_blocking=True),
        )


def collate(index: Sequence[int], src: Sequence[list[int]], tgt: Sequence[list[int]]) -> Batch:
    """Build a `Batch` from the examples `index` of the full lists `src`/`tgt`."""
    if not index:
        raise ValueError("collate: empty batch")
    src_rows = [[*src[i], EOS_ID] for i in index]
    tgt_in = [[BOS_ID, *tgt[i]] for i in index]
    tgt_out = [[*tgt[i], EOS_ID] for i in index]
    return Batch(
        src=pad(src_rows),
        tgt_in=pad(tgt_in),
        tgt_out=pad(tgt_out),
        index=torch.tensor(list(index), dtype=torch.long),
    )


def token_batches(
    src_lens: Sequence[int],
    tgt_lens: Sequence[int],
    max_tokens: int,
    *,
    shuffle: bool,
    seed: int = 0,
    epoch: int = 0,
) -> list[list[int]]:
    """Group example indices into length-bucketed batches under a token budget.

    Examples are sorted by `(max(src_len, tgt_len), tgt_len, src_len)`: by the width that
    the budget counts, then so that a batch's targets and then sources are alike (less padding
    than sorting by `(tgt_len, src_len)`: docs/BENCHMARKS.md, kernel notes). When `shuffle`
    ties are broken by a random order drawn from `(seed, epoch)`, otherwise by index. Batches
    are cut greedily so that `len(batch) * (max(src_len, tgt_len) + 1) <= max_tokens` (the
    `+ 1` is the BOS/EOS); an example over budget on its own forms a batch by itself. With
    `shuffle` the order of the batches is then shuffled from `(seed, epoch)`.

    A pure function: the same arguments always give the same batches (only a local
    `random.Random` is used), which resuming and multi-GPU sharding rely on.
    """
    if len(src_lens) != len(tgt_lens):
        raise ValueError(f"token_batches: {len(src_lens)} source vs {len(tgt_lens)} target lengths")
    if max_tokens <= 0:
        raise ValueError(f"token_batches: max_tokens must be positive, got {max_tokens}")
    order = list(range(len(src_lens)))
    rng = random.Random(f"token_batches:{seed}:{epoch}")
    if shuffle:
        rng.shuffle(order)
    # stable: keeps the shuffled ties
    order.sort(key=lambda i: (max(src_lens[i], tgt_lens[i]), tgt_lens[i], src_lens[i]))
    widths = [max(src_lens[i], tgt_lens[i]) + 1 for i in order]  # non-decreasing
    runs = [(w, len(list(g))) for w, g in groupby(widths)]
    sizes = np.array([w for w, _ in runs], dtype=np.int64)  # (runs,)
    counts = np.array([c for _, c in runs], dtype=np.int64)  # (runs,)
    bounds = cut_batches(sizes, counts, max_tokens).tolist()  # batch starts, then the end
    batches = [order[start:end] for start, end in pairwise(bounds)]
    if shuffle:
        rng.shuffle(batches)
    return batches


def fit_budget(
    batch: Batch, max_tokens: int, padded: Callable[[int], int] | None = None
) -> list[Batch]:
    """`batch` as passes of at most `max_tokens` (token_batches' budget, over its rows' real
    lengths, or over `padded(width)` when given: the lengths the passes will be padded to,
    ShapeBuckets.width): `[batch]` itself when token_batches keeps its rows together, else its
    rows cut by token_batches (sorted by length) into batches trimmed to their own widths. A
    training batch is cut for the prepared lengths; sampled segmentations
    (subword_sampling.py) may make it wider."""
    src_lens = batch.src.ne(PAD_ID).sum(1).tolist()  # (B,) with EOS
    tgt_lens = batch.tgt_out.ne(PAD_ID).sum(1).tolist()  # (B,) with EOS
    budget_src, budget_tgt = src_lens, tgt_lens
    if padded is not None:  # the budget counts the padded width of each row
        pairs = zip(src_lens, tgt_lens, strict=True)
        budget_src = budget_tgt = [padded(max(s, t)) for s, t in pairs]
    if len(src_lens) * (max(*budget_src, *budget_tgt) + 1) <= max_tokens:
        return [batch]
    cut = token_batches(budget_src, budget_tgt, max_tokens, shuffle=False)
    if len(cut) == 1:  # one pair over the budget on its own: a batch by itself, as planned
        return [batch]
    parts = []
    for rows in cut:
        pick = torch.tensor(rows, dtype=torch.long)  # (b,)
        s, t = max(src_lens[r] for r in rows), max(tgt_lens[r] for r in rows)
        parts.append(
            Batch(
                src=batch.src[pick, :s],  # (b, s)
                tgt_in=batch.tgt_in[pick, :t],  # (b, t)
                tgt_out=batch.tgt_out[pick, :t],  # (b, t)
                index=batch.index[pick],  # (b,)
            )
        )
    return parts


def sentence_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Cut indices sorted by length (longest first) into batches of `batch_size`.

    Used for inference; callers put outputs back in input order with the indices.
    """
    if batch_size <= 0:
        raise ValueError(f"sentence_batches: batch_size must be positive, got {batch_size}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[k : k + batch_size] for k in range(0, len(order), batch_size)]


def pad(rows: list[list[int]]) -> torch.Tensor:
    """Right-pad rows with PAD into a `(len(rows), longest)` long tensor."""
    width = max(len(row) for row in rows)
    out = np.full((len(rows), width), PAD_ID, dtype=np.int64)  # (B, width)
    for r, row in enumerate(rows):
        out[r, : len(row)] = row
    return torch.from_numpy(out)


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
