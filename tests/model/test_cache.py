"""Tests for seq2seq.model.cache: appending, reordering, and rows at their own positions
(continuous batching: new sentences added after or in place of finished rows)."""

from __future__ import annotations

import math

import pytest
import torch

from seq2seq.model.cache import LayerCache


def filled_cache(rows: int, steps: int, capacity: int = 0) -> LayerCache:
    """A cache whose key at (row r, step t) is 10 * r + t and whose value is its negative."""
    cache = LayerCache(capacity)
    for t in range(steps):
        k = (10.0 * torch.arange(rows) + t).view(rows, 1, 1, 1)  # (N, H=1, 1, Dh=1)
        cache.append(torch.stack((k, -k)))  # (2, N, H, 1, Dh)
    return cache


@pytest.mark.parametrize("capacity", [0, 2, 8], ids=["grow-from-empty", "grow", "preallocated"])
def test_layer_cache_append_keeps_every_step(capacity: int) -> None:
    cache = filled_cache(rows=2, steps=5, capacity=capacity)
    assert cache.length == 5
    assert cache.self_k is not None
    assert cache.self_v is not None
    assert cache.self_k.shape == (2, 1, 5, 1)
    assert cache.self_k.flatten(1).tolist() == [[0, 1, 2, 3, 4], [10, 11, 12, 13, 14]]
    torch.testing.assert_close(cache.self_v, -cache.self_k)


def test_layer_cache_append_returns_the_whole_history() -> None:
    cache = filled_cache(rows=1, steps=2, capacity=4)
    new = torch.stack((torch.full((1, 1, 2, 1), 7.0), torch.zeros(1, 1, 2, 1)))
    new_k, k, v = cache.append(new)
    assert k.flatten().tolist() == [0.0, 1.0, 7.0, 7.0]
    assert v.flatten().tolist() == [0.0, -1.0, 0.0, 0.0]
    new_k.mul_(2)  # the new keys are the cache's own: rotated in place there
    assert cache.self_k is not None
    assert cache.self_k.flatten().tolist() == [0.0, 1.0, 14.0, 14.0]


def test_layer_cache_reorder_rows_and_sentences() -> None:
    """Hypothesis rows are reordered (repeated, dropped); cross-attention rows are per sentence
    and only change when sentences are dropped; later appends land after the reordered rows."""
    cache = filled_cache(rows=3, steps=2, capacity=4)
    cache.cross_k = torch.arange(2.0).view(2, 1, 1, 1) * 100  # 2 sentences
    cache.cross_v = -cache.cross_k
    cache.cross_bias = torch.tensor([[0.0, -math.inf], [0.0, 0.0]])[:, None, None, :]
    cache.reorder(torch.tensor([2, 2, 0]))
    assert cache.self_k is not None
    assert cache.cross_k is not None
    assert cache.self_k.flatten(1).tolist() == [[20, 21], [20, 21], [0, 1]]
    assert cache.cross_k.flatten().tolist() == [0.0, 100.0]
    cache.reorder(torch.tensor([1]), sentences=torch.tensor([1]))
    assert cache.cross_k.flatten().tolist() == [100.0]
    assert cache.cross_v is not None
    assert cache.cross_v.flatten().tolist() == [-100.0]
    assert cache.cross_bias is not None
    assert cache.cross_bias.flatten().tolist() == [0.0, 0.0]
    cache.append(torch.stack((torch.full((1, 1, 1, 1), 5.0), torch.zeros(1, 1, 1, 1))))
    assert cache.self_k.flatten().tolist() == [20.0, 21.0, 5.0]


def test_rows_at_their_own_positions() -> None:
    """add_rows puts sentences with no token beside rows under way; append_rows writes each
    row's key at its own position and hides the positions a row has not reached; the shorter
    source's cross-attention keys are padded and hidden with -inf."""
    cache = filled_cache(rows=1, steps=2, capacity=4)  # one row at position 2
    cache.cross_k = torch.ones(1, 1, 3, 1)  # (B, H, S=3, Dh)
    cache.cross_v = torch.ones(1, 1, 3, 1)
    cache.cross_bias = torch.zeros(1, 1, 1, 3)
    cache.add_rows(2 * torch.ones(1, 1, 2, 1), torch.ones(1, 1, 2, 1), torch.zeros(1, 1, 1, 2))
    assert cache.offset.tolist() == [2, 0]  # type: ignore[union-attr]
    assert cache.cross_k.flatten(1).tolist() == [[1, 1, 1], [2, 2, 0]]
    assert cache.cross_bias.flatten(1).tolist() == [[0, 0, 0], [0, 0, -math.inf]]
    k = torch.tensor([7.0, 8.0]).view(2, 1, 1, 1)  # (N, H, 1, Dh)
    keys, values, hide = cache.append_rows(k, -k)
    assert keys.flatten(1)[:, :3].tolist() == [[0, 1, 7], [8, 0, 0]]
    assert values.flatten(1)[0, :3].tolist() == [0, -1, -7]
    assert hide.flatten(1).tolist() == [[0, 0, 0], [0, -math.inf, -math.inf]]
    assert cache.offset.tolist() == [3, 1]  # type: ignore[union-attr]


def test_rows_are_refilled_in_place_and_reset() -> None:
    """A finished row starts again from position 0 (reset_rows); add_rows with `slots` puts a
    new sentence in it, its cross-attention keys in that row only."""
    cache = LayerCache(4)
    cache.add_rows(torch.ones(2, 1, 2, 1), torch.ones(2, 1, 2, 1), torch.zeros(2, 1, 1, 2))
    for step in range(3):
        k = torch.full((2, 1, 1, 1), float(step))
        cache.append_rows(k, k)
    cache.reset_rows(torch.tensor([1]))
    assert cache.offset.tolist() == [3, 0]  # type: ignore[union-attr]
    cache.add_rows(
        5 * torch.ones(1, 1, 3, 1),
        torch.ones(1, 1, 3, 1),
        torch.zeros(1, 1, 1, 3),
        torch.tensor([1]),
    )
    assert cache.cross_k is not None
    assert cache.cross_bias is not None
    assert cache.cross_k.flatten(1).tolist() == [[1, 1, 0], [5, 5, 5]]
    assert cache.cross_bias.flatten(1).tolist() == [[0, 0, -math.inf], [0, 0, 0]]
    with pytest.raises(ValueError, match="own lengths"):
        LayerCache().append_rows(torch.ones(1, 1, 1, 1), torch.ones(1, 1, 1, 1))


def test_a_refill_cuts_the_sources_to_the_rows_longest() -> None:
    """The longest source's row gets a shorter sentence: the cross-attention keys, values and
    bias shrink to the longest source left (the padding past it is never attended to), every
    row's own keys kept."""
    cache = LayerCache(4)
    keys = torch.arange(8.0).view(2, 1, 4, 1)  # (N=2, H=1, S=4, Dh=1)
    bias = torch.tensor([[0.0] * 4, [0.0, 0.0, -math.inf, -math.inf]])[:, None, None, :]
    cache.add_rows(keys, -keys, bias)  # sources of 4 and 2 tokens
    cache.reset_rows(torch.tensor([0]))
    short = torch.full((1, 1, 1, 1), 9.0)  # a source of one token
    cache.add_rows(short, -short, torch.zeros(1, 1, 1, 1), torch.tensor([0]))
    assert cache.cross_k is not None
    assert cache.cross_v is not None
    assert cache.cross_bias is not None
    assert cache.cross_k.flatten(1).tolist() == [[9, 0], [4, 5]]
    assert cache.cross_v.flatten(1).tolist() == [[-9, 0], [-4, -5]]
    assert cache.cross_bias.flatten(1).tolist() == [[0, -math.inf], [0, 0]]
    assert cache.cross_k.is_contiguous()


def test_buffers_that_start_at_zero_start_small_and_grow() -> None:
    """Rows at their own positions zero their buffer: it starts with ZEROED_START positions, not
    the capacity asked for (the length limit), and doubles as a row passes its end, keeping
    every key; a cache of rows at one position takes the capacity at once (unwritten memory)."""
    from seq2seq.model import cache as cache_module

    start = cache_module.ZEROED_START
    cache = LayerCache(4 * start)
    cache.add_rows(torch.ones(1, 1, 2, 1), torch.ones(1, 1, 2, 1), torch.zeros(1, 1, 1, 2))
    for step in range(start + 1):
        keys, _, _ = cache.append_rows(
            torch.full((1, 1, 1, 1), float(step)), torch.zeros(1, 1, 1, 1)
        )
        assert cache._full is not None
        assert cache._full.size(3) == (start if step < start else 2 * start)
    assert keys.flatten().tolist() == [float(t) for t in range(start + 1)]
    full = cache._full
    assert full is not None
    assert full[0, 0, 0, start + 1 :].eq(0).all()  # the room past the row's keys: zeros
    plain = filled_cache(rows=1, steps=1, capacity=4 * start)
    assert plain._full is not None
    assert plain._full.size(3) == 4 * start
