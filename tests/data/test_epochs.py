"""epochs.py: batches of prepared corpora are data.token_batches' batches, drawn per epoch."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from seq2seq.data.batching import collate, cut_batches, token_batches
from seq2seq.data.epochs import TrainData
from seq2seq.data.prepared import CorpusArrays


def random_pairs(rng: random.Random, n: int) -> tuple[list[list[int]], list[list[int]]]:
    src = [[rng.randint(4, 50) for _ in range(rng.choice([0, 1, 2, 5, 9, 20]))] for _ in range(n)]
    tgt = [[rng.randint(4, 50) for _ in range(rng.choice([0, 1, 3, 8, 21, 39]))] for _ in range(n)]
    return src, tgt


@pytest.mark.parametrize("seed", range(20))
def test_batches_are_those_of_token_batches(seed: int) -> None:
    """Same cut (sizes and widths of the batches), every pair once, same padded layout."""
    rng = random.Random(seed)
    src, tgt = random_pairs(rng, rng.randint(1, 300))
    budget = rng.choice([10, 30, 64, 100, 500])
    old = token_batches([len(s) + 1 for s in src], [len(t) + 1 for t in tgt], budget, shuffle=False)
    data = TrainData({"train": CorpusArrays.from_ids(src, tgt)}, [], 10**4, budget, seed)
    refs = data.epoch_batches(0)
    width = lambda ids: max(max(len(src[i]), len(tgt[i])) for i in ids)  # noqa: E731
    new = [data.collate(r) for r in refs]
    assert sorted((len(b), width(b)) for b in old) == sorted(
        (len(b.index), width(b.index.tolist())) for b in new
    )
    assert sorted(i for b in new for i in b.index.tolist()) == list(range(len(src)))
    for batch in new:
        want = collate(batch.index.tolist(), src, tgt)
        for name in ("src", "tgt_in", "tgt_out"):
            assert getattr(batch, name).equal(getattr(want, name)), name


def test_cut_batches_by_arithmetic() -> None:
    # sizes 3 (x5) then 4 (x3), budget 12: [3,3,3,3] [3,4,4] [4]
    assert cut_batches(np.array([3, 4]), np.array([5, 3]), 12).tolist() == [0, 4, 7, 8]
    # an item over budget forms a batch by itself
    assert cut_batches(np.array([2, 50]), np.array([2, 2]), 10).tolist() == [0, 2, 3, 4]
    assert cut_batches(np.array([5]), np.array([0]), 10).tolist() == [0]


def test_epochs_are_pure_and_differ() -> None:
    src, tgt = random_pairs(random.Random(1), 500)
    make = lambda: TrainData({"a": CorpusArrays.from_ids(src, tgt)}, [], 64, 200, seed=7)  # noqa: E731
    first, again = make(), make()
    batches = lambda d, e: [d.collate(r).index.tolist() for r in d.epoch_batches(e)]  # noqa: E731
    assert batches(first, 0) == batches(again, 0)
    assert batches(first, 1) == batches(again, 1)
    assert batches(first, 0) != batches(first, 1)
    other = TrainData({"a": CorpusArrays.from_ids(src, tgt)}, [], 64, 200, seed=8)
    assert batches(other, 0) != batches(first, 0)


def test_max_len_leaves_long_pairs_out() -> None:
    src, tgt = [[5] * n for n in (1, 4, 9)], [[6] * n for n in (2, 4, 3)]
    data = TrainData({"a": CorpusArrays.from_ids(src, tgt)}, [], 4, 100, seed=0)
    assert len(data) == 2
    assert data.over_long() == [1]
    seen = [i for r in data.epoch_batches(0) for i in data.collate(r).index.tolist()]
    assert sorted(seen) == [0, 1]


def test_weights_draw_shares_of_each_corpus() -> None:
    rng = random.Random(3)
    a = CorpusArrays.from_ids(*random_pairs(rng, 3000))
    b = CorpusArrays.from_ids(*random_pairs(rng, 1000))
    data = TrainData({"a": a, "b": b}, [0.5, 3.0], 10**4, 300, seed=1)
    for epoch in range(2):
        index = np.concatenate([data.collate(r).index.numpy() for r in data.epoch_batches(epoch)])
        from_a, from_b = index[index < 3000], index[index >= 3000] - 3000
        assert data.plan is not None
        assert data.plan.drawn == [len(from_a), len(from_b)]
        assert abs(len(from_a) - 1500) < 100
        assert len(np.unique(from_a)) == len(from_a)
        assert abs(len(from_b) - 3000) < 100
        assert len(np.unique(from_b)) == 1000
        # every pair of b at least twice, at most four times
        assert np.bincount(from_b).min() >= 2
        assert np.bincount(from_b).max() <= 4


def test_reading_batches_keeps_the_resident_size_flat(tmp_path: Path) -> None:
    """Collated rows are unmapped again: reading a prepared corpus does not grow the process's
    file-backed resident memory (RssFile) with every batch."""
    from seq2seq.data.prepare import SplitWriter

    gen = np.random.default_rng(0)
    n = 2_000_000  # 100 MB of arrays: a batch's rows lie far apart
    src_lens, tgt_lens = gen.integers(1, 20, n), gen.integers(1, 20, n)
    src, tgt = gen.integers(4, 1000, src_lens.sum()), gen.integers(4, 1000, tgt_lens.sum())
    writer = SplitWriter(tmp_path / "split", np.dtype(np.uint16), 10**4)
    writer.add(src, src_lens, tgt, tgt_lens, np.zeros(n, bool))
    arrays = CorpusArrays.open(tmp_path / "split", writer.close(), np.dtype(np.uint16))
    data = TrainData({"a": arrays}, [], 10**4, 4096, seed=0)

    def file_kb() -> int:
        status = Path("/proc/self/status").read_text().splitlines()
        return int(next(line.split()[1] for line in status if line.startswith("RssFile:")))

    refs = data.epoch_batches(0)
    data.collate(refs[0])
    before = file_kb()
    for ref in refs[1:50]:
        data.collate(ref)
    assert file_kb() - before < 2048  # without release(): tens of MB (pages of every row read)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64, 1000, 4097])
def test_permute_is_a_seeded_bijection_evaluated_by_slices(n: int) -> None:
    from seq2seq.data.epochs import permute

    whole = permute(np.arange(n), n, (1, 2))
    assert sorted(whole.tolist()) == list(range(n))
    parts = [permute(np.arange(a, min(a + 5, n)), n, (1, 2)) for a in range(0, n, 5)]
    assert np.concatenate(parts).tolist() == whole.tolist()
    if n > 7:
        assert whole.tolist() != permute(np.arange(n), n, (1, 3)).tolist()
        assert whole.tolist() != list(range(n))


def test_prefetched_batches_are_the_batches() -> None:
    src, tgt = random_pairs(random.Random(2), 400)
    data = TrainData({"a": CorpusArrays.from_ids(src, tgt)}, [], 64, 120, seed=4)
    refs = data.epoch_batches(0)
    data.prefetch(refs[:3])
    for ref in refs[:4]:  # three from the thread, one read now
        got, want = data.collate(ref), data.read(ref)
        assert got.index.equal(want.index)
        assert got.src.equal(want.src)
        assert got.tgt_in.equal(want.tgt_in)
        assert got.tgt_out.equal(want.tgt_out)
    assert not data.pending
    data.close()


def test_max_src_len_leaves_out_long_sources_only() -> None:
    """data.train_max_src_len: pairs whose source is over the cap are never drawn; long targets
    of short sources stay; the left-out pairs are counted."""
    src, tgt = random_pairs(random.Random(3), 400)
    arrays = {"a": CorpusArrays.from_ids(src, tgt)}
    data = TrainData(arrays, [], 64, 300, seed=1, max_src_len=5)
    drawn = sorted(i for r in data.epoch_batches(0) for i in data.collate(r).index.tolist())
    assert drawn == [i for i, s in enumerate(src) if len(s) <= 5]
    assert any(len(tgt[i]) > 5 for i in drawn)  # targets are not capped
    assert len(data) == len(drawn)
    assert data.over_long() == [len(src) - len(drawn)]
    everything = TrainData(arrays, [], 64, 300, seed=1)  # 0 = no cap
    assert len(everything) == len(src)
