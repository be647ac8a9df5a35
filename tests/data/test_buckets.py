"""buckets.py and fixed batch shapes in epochs.py: lengths that pad least, batches padded to at
most n shapes, filler rows, the budget on padded widths, and the epoch's shapes from its plan."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch

from seq2seq.data.batching import collate, fit_budget
from seq2seq.data.buckets import ShapeBuckets, choose_lengths, pad_batch
from seq2seq.data.epochs import TrainData
from seq2seq.data.prepared import CorpusArrays
from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from tests.data.test_epochs import random_pairs


def padded_cost(widths: np.ndarray, counts: np.ndarray, lengths: list[int]) -> float:
    """The padded tokens of `counts[i]` pairs of width `widths[i]` under `lengths`."""
    table = np.array(lengths)
    return float((counts * table[np.searchsorted(table, widths)]).sum())


@pytest.mark.parametrize("seed", range(12))
def test_choose_lengths_pads_least(seed: int) -> None:
    """Catches a wrong dynamic programme (an off-by-one in the bucket bounds, a greedy choice):
    its lengths pad exactly as little as the best of every set of n lengths, found by brute
    force, and cover the widest pair."""
    rng = np.random.default_rng(seed)
    widths = rng.choice(np.arange(3, 30), size=rng.integers(1, 12), replace=False)  # (m,)
    counts = rng.integers(1, 50, size=len(widths))  # (m,)
    n = int(rng.integers(1, 5))
    got = choose_lengths(widths, counts, n)
    assert got == sorted(got)
    assert got[-1] == widths.max()
    assert len(got) == min(n, len(widths))
    others = sorted(int(w) for w in widths if w != widths.max())
    best = min(
        padded_cost(widths, counts, [*sub, int(widths.max())])
        for k in range(min(n, len(widths)))
        for sub in itertools.combinations(others, k)
    )
    assert padded_cost(widths, counts, got) == best


def test_shape_buckets_widths_rows_and_shapes() -> None:
    buckets = ShapeBuckets((5, 9, 20), limit=65, max_tokens=100)
    assert [buckets.width(w) for w in (1, 5, 6, 9, 10, 20, 21, 65)] == [5, 5, 9, 9, 20, 20, 65, 65]
    assert buckets.widths(np.array([[1, 6], [21, 9]])).tolist() == [[5, 9], [65, 9]]
    assert buckets.rows(9) == 10
    assert buckets.rows(200) == 1
    assert buckets.shape(3, 7) == (10, 9, 9)
    assert buckets.shapes() == [(16, 5, 5), (10, 9, 9), (4, 20, 20), (1, 65, 65)]


def test_pad_batch_adds_padding_and_filler_rows_only() -> None:
    """Catches padding that moves or overwrites a real token, or filler rows that would carry a
    label or have no key to attend to (all-PAD: NaN attention)."""
    batch = collate([0, 1], [[4, 5, 6], [7]], [[8], [9, 10]])  # src (2, 4), tgt (2, 3)
    out = pad_batch(batch, rows=4, src_len=6, tgt_len=5)
    assert out.src.shape == (4, 6)
    assert out.tgt_in.shape == (4, 5)
    assert out.tgt_out.shape == (4, 5)
    assert out.src[:2, :4].equal(batch.src)
    assert out.src[:2, 4:].eq(PAD_ID).all()
    assert out.tgt_out[:2, :3].equal(batch.tgt_out)
    assert out.tgt_in[:2, :3].equal(batch.tgt_in)
    assert out.src[2:, 0].eq(EOS_ID).all()
    assert out.src[2:, 1:].eq(PAD_ID).all()
    assert out.tgt_in[2:, 0].eq(BOS_ID).all()
    assert out.tgt_out[2:].eq(PAD_ID).all()
    assert out.index.tolist() == [0, 1, -1, -1]
    assert (out.src_tokens, out.tgt_tokens) == (batch.src_tokens, batch.tgt_tokens)


def test_fit_budget_counts_padded_widths() -> None:
    """A batch whose real widths fit but whose padded widths do not is cut so that every pass
    fits the budget once padded."""
    src = [[4] * 3] * 4 + [[4] * 9]  # widths 4 (x4) and 10, with EOS
    batch = collate(range(5), src, [[5]] * 5)
    assert fit_budget(batch, 60) == [batch]  # 5 x (10 + 1) <= 60
    buckets = ShapeBuckets((6, 12), limit=65, max_tokens=60)
    parts = fit_budget(batch, 60, buckets.width)
    assert sorted(len(p.index) for p in parts) == [1, 4]
    for part in parts:
        rows, length, _ = buckets.shape(part.src.shape[1], part.tgt_out.shape[1])
        assert len(part.index) <= rows
        assert rows * (length + 1) <= 60


def epoch_batches(data: TrainData, epoch: int) -> list[torch.Tensor]:
    return [b for ref in data.epoch_batches(epoch) for b in data.passes(ref)]


@pytest.mark.parametrize("seed", range(6))
def test_an_epoch_takes_at_most_n_shapes(seed: int) -> None:
    """Catches a batch left at its own shape (rows or lengths), a budget that ignores the
    padded widths (more rows than the shape), or pairs lost: every batch of two epochs has
    one of the at most n shapes, holds its pairs unchanged, and every pair comes once."""
    rng = random.Random(seed)
    src, tgt = random_pairs(rng, rng.randint(50, 400))
    n = rng.choice([1, 2, 3, 5])
    arrays = CorpusArrays.from_ids(src, tgt)
    data = TrainData({"a": arrays}, [], 64, rng.choice([64, 200, 500]), seed, shape_buckets=n)
    assert data.buckets is not None
    assert len(data.buckets.lengths) <= n
    for epoch in (0, 1):
        batches = epoch_batches(data, epoch)
        shapes = {(*b.src.shape, b.tgt_out.shape[1]) for b in batches}
        assert len(shapes) <= n
        assert shapes <= set(data.buckets.shapes())
        index = [i for b in batches for i in b.index.tolist() if i >= 0]
        assert sorted(index) == list(range(len(src)))
        for b in batches:
            real = b.index.ge(0)
            want = collate(b.index[real].tolist(), src, tgt)
            assert b.src[real, : want.src.shape[1]].equal(want.src)
            assert b.tgt_out[real, : want.tgt_out.shape[1]].equal(want.tgt_out)
    data.close()


@pytest.mark.parametrize("n", [0, 3])
def test_epoch_shapes_and_padding_from_the_plan_are_the_batches(n: int) -> None:
    """Catches an epoch record (train_log.jsonl's padding_efficiency and shapes) that differs
    from the batches trained on: from the plan alone, the same shapes in plan order and the
    same real and padded tokens as the collated (and padded) batches."""
    src, tgt = random_pairs(random.Random(3), 300)
    data = TrainData({"a": CorpusArrays.from_ids(src, tgt)}, [], 64, 300, 5, shape_buckets=n)
    shapes, real = data.epoch_shapes(0)
    in_plan_order = [data.passes((0, i))[0] for i in range(len(shapes))]
    assert shapes == [(*b.src.shape, b.tgt_out.shape[1]) for b in in_plan_order]
    assert real == sum(b.src_tokens + b.tgt_tokens for b in in_plan_order)
    padded = sum(b.src.numel() + b.tgt_out.numel() for b in in_plan_order)
    stats = data.epoch_padding(0)
    assert stats["padding_efficiency"] == pytest.approx(real / padded)
    assert (stats["batches"], stats["shapes"]) == (len(shapes), len(set(shapes)))
    data.close()


def test_fixed_shapes_are_a_pure_function_of_seed_and_epoch() -> None:
    """What resuming relies on: two TrainData of the same pairs and settings give the same
    padded batches, so a resumed run trains on the uninterrupted run's (batch, shape)."""
    src, tgt = random_pairs(random.Random(4), 300)
    first, again = (
        TrainData({"a": CorpusArrays.from_ids(src, tgt)}, [], 64, 200, 7, shape_buckets=3)
        for _ in range(2)
    )
    for epoch in (0, 2):
        for a, b in zip(epoch_batches(first, epoch), epoch_batches(again, epoch), strict=True):
            assert a.src.equal(b.src)
            assert a.tgt_out.equal(b.tgt_out)
            assert a.index.equal(b.index)
    first.close()
    again.close()
