"""batching.fit_budget: a batch too wide for the token budget (sampled segmentations) becomes
passes that fit, cut by token_batches' rule; a batch that fits is left as it is."""

from __future__ import annotations

import random

import torch

from seq2seq.data.batching import collate, fit_budget, token_batches


def pairs(rng: random.Random, n: int) -> tuple[list[list[int]], list[list[int]]]:
    src = [[rng.randint(4, 50) for _ in range(rng.randint(1, 30))] for _ in range(n)]
    tgt = [[rng.randint(4, 50) for _ in range(rng.randint(1, 30))] for _ in range(n)]
    return src, tgt


def test_a_batch_within_the_budget_is_itself() -> None:
    src, tgt = pairs(random.Random(1), 8)
    batch = collate(list(range(8)), src, tgt)
    width = max(batch.src.shape[1], batch.tgt_out.shape[1])
    assert fit_budget(batch, 8 * (width + 1))[0] is batch
    alone = collate([0], [[5] * 40], [[6] * 3])  # one pair over the budget: a batch by itself
    assert fit_budget(alone, 10) == [alone]


def test_a_wide_batch_is_cut_by_token_batches_rule() -> None:
    for seed in range(20):
        rng = random.Random(seed)
        src, tgt = pairs(rng, rng.randint(2, 40))
        index = list(range(len(src)))
        rng.shuffle(index)
        batch = collate(index, src, tgt)
        budget = rng.choice([16, 40, 100, 300])
        parts = fit_budget(batch, budget)
        lens = [len(src[i]) + 1 for i in index], [len(tgt[i]) + 1 for i in index]
        want = token_batches(*lens, budget, shuffle=False)
        if len(want) == 1:
            assert parts == [batch]
            continue
        assert [sorted(index[r] for r in rows) for rows in want] == [
            sorted(p.index.tolist()) for p in parts
        ]
        for part in parts:
            width = max(part.src.shape[1], part.tgt_out.shape[1])
            assert len(part.index) == 1 or len(part.index) * (width + 1) <= budget
            again = collate(part.index.tolist(), src, tgt)  # rows intact, trimmed to the part
            for name in ("src", "tgt_in", "tgt_out"):
                assert torch.equal(getattr(part, name), getattr(again, name)), name
