"""epochs.py: batches of prepared corpora are data.token_batches' batches, drawn per epoch."""

from __future__ import annotations

import mmap
import random
from pathlib import Path
from typing import cast

import numpy as np
import pytest

from seq2seq.data.batching import collate, cut_batches, token_batches
from seq2seq.data.epochs import RELEASE_EVERY, TrainData
from seq2seq.data.prepared import CorpusArrays
from seq2seq.data.subword_sampling import SubwordSampler
from seq2seq.data.tokenizer import EOS_ID


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


def prepared_split(folder: Path, n: int, seed: int) -> CorpusArrays:
    """A training split of n random pairs written as seq2seq-prepare writes it, memory-mapped."""
    from seq2seq.data.prepare import SplitWriter

    gen = np.random.default_rng(seed)
    src_lens, tgt_lens = gen.integers(1, 6, n), gen.integers(1, 6, n)
    src, tgt = gen.integers(4, 1000, src_lens.sum()), gen.integers(4, 1000, tgt_lens.sum())
    writer = SplitWriter(folder, np.dtype(np.uint16), 10**4)
    writer.add(src, src_lens, tgt, tgt_lens, np.zeros(n, bool))
    return CorpusArrays.open(folder, writer.close(), np.dtype(np.uint16))


class AdviceLog:
    """Stands in for a memory map's mmap object: records the advice given to it."""

    def __init__(self, name: str, calls: list[tuple[str, int]]) -> None:
        self.name, self.calls = name, calls

    def madvise(self, advice: int, *args: int) -> None:
        assert not args  # the whole map
        self.calls.append((self.name, advice))


def test_release_unmaps_every_memory_mapped_array(tmp_path: Path) -> None:
    """release() gives MADV_DONTNEED for the whole of each of the five memory maps, so that the
    pages read leave the process's resident size (they stay in the page cache)."""
    arrays = prepared_split(tmp_path / "split", 50, seed=0)
    names = ["src_ids", "tgt_ids", "src_offsets", "tgt_offsets", "order"]
    arrays.release()  # the real maps take the advice (any OS with madvise)
    calls: list[tuple[str, int]] = []
    for name in names:
        array = getattr(arrays, name)
        assert isinstance(array, np.memmap), name
        array._mmap = AdviceLog(name, calls)
    arrays.release()
    assert sorted(calls) == sorted((name, mmap.MADV_DONTNEED) for name in names)
    CorpusArrays.from_ids([[4]], [[5]]).release()  # in memory: nothing to unmap, no error


def test_reading_batches_releases_the_rows_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Collating batches keeps few rows mapped: every corpus is released at least every
    RELEASE_EVERY rows read and after a batch's last row, so that the file-backed resident size
    does not grow with each batch (counted here, not measured: the kernel's figures depend on
    the machine and its load)."""
    corpora = {
        "a": prepared_split(tmp_path / "a", 3000, 1),
        "b": prepared_split(tmp_path / "b", 800, 2),
    }
    data = TrainData(corpora, [1.0, 2.0], 10**4, 4096, seed=0)
    which = {id(c): name for name, c in corpora.items()}
    unreleased = dict.fromkeys(corpora, 0)  # rows read since the corpus's last release
    most = {"rows": 0, "batch": 0}
    row, release = CorpusArrays.row, CorpusArrays.release

    def counted_row(self: CorpusArrays, i: int) -> tuple[np.ndarray, np.ndarray]:
        for name in unreleased:
            unreleased[name] += 1
        most["rows"] = max(most["rows"], *unreleased.values())
        return row(self, i)

    def counted_release(self: CorpusArrays) -> None:
        unreleased[which[id(self)]] = 0
        release(self)

    monkeypatch.setattr(CorpusArrays, "row", counted_row)
    monkeypatch.setattr(CorpusArrays, "release", counted_release)
    for ref in data.epoch_batches(0)[:20]:
        batch = data.collate(ref)
        most["batch"] = max(most["batch"], batch.src.size(0))
        assert unreleased == {"a": 0, "b": 0}  # nothing left mapped after a batch
    assert most["batch"] > 3 * RELEASE_EVERY  # batches long enough to need several releases
    assert 0 < most["rows"] <= RELEASE_EVERY
    data.close()


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


def test_reversed_corpus_holds_each_pair_the_other_way_round() -> None:
    src, tgt = random_pairs(random.Random(4), 200)
    back = CorpusArrays.from_ids(src, tgt).reversed()
    for i in range(200):
        s, t = back.row(i)
        assert (s.tolist(), t.tolist()) == (tgt[i], src[i])
    # each group is one run of `order` with the lengths its columns give (width, tgt, src)
    for width, t_len, s_len, start, count in back.groups.tolist():
        for i in back.order[start : start + count].tolist():
            assert (len(src[i]), len(tgt[i])) == (t_len, s_len)
            assert max(len(src[i]), len(tgt[i])) == width


def test_bidirectional_epochs_draw_each_pair_both_ways_then_plan_as_without() -> None:
    """data.bidirectional_epochs=2: epochs 0 and 1 hold every pair forward (index i) and
    reversed (index n + i, source and target exchanged), once each; from epoch 2 on the batches
    are, tensor for tensor, those of the same data without the option."""
    n = 400
    src, tgt = random_pairs(random.Random(2), n)

    def make(reversed_epochs: int) -> TrainData:
        arrays = CorpusArrays.from_ids(src, tgt)
        return TrainData({"a": arrays}, [], 30, 300, 5, reversed_epochs=reversed_epochs)

    both, plain = make(2), make(0)
    kept = len(plain)
    assert len(both) == kept < n  # max_len leaves some out, counted once
    assert both.over_long() == plain.over_long()
    for epoch in (0, 1):
        batches = [both.collate(r) for r in both.epoch_batches(epoch)]
        seen = sorted(i for b in batches for i in b.index.tolist())
        forward = [i for i in seen if i < n]
        assert forward == sorted(set(forward))
        assert len(forward) == kept
        assert [i - n for i in seen if i >= n] == forward
        assert len(batches) > 1.8 * len(plain.epoch_batches(epoch))
        for batch in batches:
            for row, i in enumerate(batch.index.tolist()):
                s, t = (src[i], tgt[i]) if i < n else (tgt[i - n], src[i - n])
                length = len(s) + 1
                assert batch.src[row, :length].tolist() == [*s, EOS_ID]
                assert batch.tgt_out[row, : len(t) + 1].tolist() == [*t, EOS_ID]
    for epoch in (2, 3):
        got, want = both.epoch_batches(epoch), plain.epoch_batches(epoch)
        assert got == want
        for a, b in zip(got, want, strict=True):
            one, other = both.collate(a), plain.collate(b)
            for name in ("src", "tgt_in", "tgt_out", "index"):
                assert getattr(one, name).equal(getattr(other, name)), name


def test_bidirectional_epochs_refuse_a_subword_sampler() -> None:
    src, tgt = random_pairs(random.Random(2), 10)
    sampler = cast(SubwordSampler, object())
    arrays = CorpusArrays.from_ids(src, tgt)
    with pytest.raises(ValueError, match="subword sampling"):
        TrainData({"a": arrays}, [], 30, 300, 5, sampler=sampler, reversed_epochs=1)
