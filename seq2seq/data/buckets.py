"""Fixed shapes for the training batches (trainer.batch_shapes=fixed), so that a compiled model
(torch.compile with dynamic=False) reuses one graph per shape instead of compiling for every batch.

A batch's width is the longer side's tensor length (source + EOS, or BOS + target). Training
pairs are bucketed by width: `choose_lengths` picks the n lengths L_1 < ... < L_n that pad the
training pairs least (an exact dynamic programme over the distinct widths, the optimal
partition of a sorted histogram), and a pair of width w is padded to the smallest L >= w. The
token budget then counts the padded width (token_batches' rule, `rows(L) * (L + 1) <=
max_tokens`), so that every batch of bucket L becomes (rows(L), L, L) once padded: the source
and the target both to L, and the rows the budget's cut left short filled with a filler pair
(an EOS source, a BOS decoder input, no label). A filler row and the padding add nothing to the
loss or the gradients: padded keys are masked, padded labels are PAD, which the loss skips
(tests/data/test_buckets.py). The shapes of an epoch are thus at most n; a pair wider than every
length (only sampled segmentations can be: tokenizer.sampling) is padded to `limit`
(data.max_len + 1), one more shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from seq2seq.data.batching import Batch
from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID

Shape = tuple[int, int, int]  # (rows, source length, target length) of a padded batch


def choose_lengths(widths: np.ndarray, counts: np.ndarray, n: int) -> list[int]:
    """The at most `n` lengths, the largest of them max(widths), that minimise the padded
    tokens sum(counts[i] * L(widths[i])), L(w) the smallest length >= w: counts[i] pairs of
    width widths[i]. Exact: best[k, j], the least cost of the j narrowest distinct widths in k
    buckets, is min over i of best[k-1, i] + (their counts from i to j) x the j-th width."""
    keep = counts > 0
    xs, inverse = np.unique(widths[keep], return_inverse=True)  # (m,) distinct widths
    weight = np.bincount(inverse, weights=counts[keep].astype(np.float64))  # (m,)
    m = len(xs)
    if m == 0:
        return []
    n = min(n, m)
    cum = np.concatenate([[0.0], np.cumsum(weight)])  # (m + 1,)
    best = np.full((n + 1, m + 1), np.inf)  # (n + 1, m + 1)
    best[0, 0] = 0.0
    arg = np.zeros((n + 1, m + 1), dtype=np.int64)  # (n + 1, m + 1) where bucket k starts
    for k in range(1, n + 1):
        for j in range(k, m + 1):
            cost = best[k - 1, :j] + (cum[j] - cum[:j]) * xs[j - 1]  # (j,)
            arg[k, j] = int(np.argmin(cost))
            best[k, j] = cost[arg[k, j]]
    lengths, j = [], m
    for k in range(n, 0, -1):  # n buckets is never worse than fewer
        lengths.append(int(xs[j - 1]))
        j = int(arg[k, j])
    return sorted(lengths)


@dataclass(frozen=True)
class ShapeBuckets:
    """The padded lengths of training batches and the rows each length holds."""

    lengths: tuple[int, ...]  # increasing padded widths (tensor lengths, BOS/EOS included)
    limit: int  # the width of a batch wider than every length (data.max_len + 1)
    max_tokens: int  # the token budget (trainer.max_tokens)

    @classmethod
    def fit(
        cls, widths: np.ndarray, counts: np.ndarray, n: int, limit: int, max_tokens: int
    ) -> ShapeBuckets:
        """`n` lengths chosen for `counts[i]` pairs of width `widths[i]` (choose_lengths)."""
        lengths = [w for w in choose_lengths(widths, counts, n) if w < limit]
        return cls(tuple(lengths), limit, max_tokens)

    def width(self, width: int) -> int:
        """The padded length of a batch `width` wide."""
        i = int(np.searchsorted(self.lengths, width))
        return self.lengths[i] if i < len(self.lengths) else max(self.limit, width)

    def widths(self, widths: np.ndarray) -> np.ndarray:
        """`width` of each entry of `widths` (any shape)."""
        table = np.array([*self.lengths, self.limit], dtype=np.int64)  # (n + 1,)
        padded: np.ndarray = np.maximum(table[np.searchsorted(table[:-1], widths)], widths)
        return padded

    def rows(self, length: int) -> int:
        """The rows of a batch padded to `length`: the token budget's (token_batches' rule)."""
        return max(1, self.max_tokens // (length + 1))

    def shape(self, src_len: int, tgt_len: int) -> Shape:
        """The padded shape of a batch whose longest source and target are this long."""
        length = self.width(max(src_len, tgt_len))
        return self.rows(length), length, length

    def shapes(self) -> list[Shape]:
        """Every shape a batch can take (the last only for pairs wider than every length)."""
        return [(self.rows(w), w, w) for w in (*self.lengths, self.limit)]

    def pad(self, batch: Batch) -> Batch:
        """`batch` padded to its shape: PAD to the length on both sides, and filler rows (an
        EOS source, a BOS decoder input, no label; index -1) up to the rows. A batch with more
        rows than its shape holds (not cut by this budget) keeps its rows."""
        rows, width, _ = self.shape(batch.src.shape[1], batch.tgt_out.shape[1])
        return pad_batch(batch, max(rows, batch.src.shape[0]), width, width)


def pad_batch(batch: Batch, rows: int, src_len: int, tgt_len: int) -> Batch:
    """`batch` right-padded to `rows` rows, sources of `src_len` and targets of `tgt_len`
    (at least its own); the added rows are filler pairs that carry no label."""
    b, s = batch.src.shape
    t = batch.tgt_out.shape[1]
    if (rows, src_len, tgt_len) == (b, s, t):
        return batch
    src = batch.src.new_full((rows, src_len), PAD_ID)  # (R, S)
    tgt_in = batch.tgt_in.new_full((rows, tgt_len), PAD_ID)  # (R, T)
    tgt_out = batch.tgt_out.new_full((rows, tgt_len), PAD_ID)  # (R, T)
    src[:b, :s], tgt_in[:b, :t], tgt_out[:b, :t] = batch.src, batch.tgt_in, batch.tgt_out
    src[b:, 0], tgt_in[b:, 0] = EOS_ID, BOS_ID  # filler rows: one key, one query, no label
    index = batch.index.new_full((rows,), -1)  # (R,)
    index[:b] = batch.index
    return Batch(src=src, tgt_in=tgt_in, tgt_out=tgt_out, index=index)
