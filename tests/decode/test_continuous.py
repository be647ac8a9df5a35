"""Continuous batching (seq2seq/decode/schedule.py continuous_greedy): rows refilled with new
sentences mid-search decode from their own positions and give what batch-by-batch greedy
search gives, for every positional encoding."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import Tensor

from seq2seq.config.schema import DecodeConfig, PosKind, SearchKind
from seq2seq.data.tokenizer import EOS_ID
from seq2seq.decode import schedule
from seq2seq.decode.ensemble import Ensemble
from seq2seq.decode.schedule import continuous_greedy, translate_ids
from seq2seq.decode.search import Hypothesis
from seq2seq.model import layers
from seq2seq.model.positional import Offset
from seq2seq.model.transformer import EncoderDecoder

MakeModel = Callable[..., EncoderDecoder]


def random_ids(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """n sources of 1..12 word ids (no specials), in no particular order of length."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 13, (n,), generator=gen).tolist()
    return [torch.randint(4, vocab, (k,), generator=gen).tolist() for k in lengths]


def batch_by_batch(model: Ensemble | EncoderDecoder, ids: list[list[int]], cfg: DecodeConfig):
    return translate_ids(model, ids, dataclasses.replace(cfg, continuous=False))


def count_joins(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The number of sentences each start (the first rows, then each refill) puts in the rows,
    from now on."""
    joins: list[int] = []
    start = schedule._Waiting.start

    def counted(*args: Any) -> Tensor:
        started: Tensor = start(*args)
        joins.append(started.numel())
        return started

    monkeypatch.setattr(schedule._Waiting, "start", counted)
    return joins


def assert_same(got: list[list[Hypothesis]], want: list[list[Hypothesis]]) -> None:
    """The same tokens, and scores within float32 rounding."""
    assert [h[0].tokens for h in got] == [h[0].tokens for h in want]
    torch.testing.assert_close(
        torch.tensor([h[0].score for h in got], dtype=torch.float64),
        torch.tensor([h[0].score for h in want], dtype=torch.float64),
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize("kind", list(PosKind))
def test_refilled_rows_decode_as_batch_by_batch(make_model: MakeModel, kind: PosKind) -> None:
    """Every encoding (embedding, rotation, bias and Shaw's values hooks) sees each row's own
    positions: 17 sentences through 4 rows, refilled one at a time (max_len_a=2, so outputs
    end at different steps; min_len=3 masks EOS at the start of a joining row)."""
    model = make_model(kind, layers=2, seed=5).double()
    ids = random_ids(17, 24)
    cfg = DecodeConfig(method=SearchKind.greedy, batch_size=4, max_len_a=2.0, max_len_b=1)
    got = translate_ids(model, ids, cfg, min_len=3)
    want = translate_ids(model, ids, dataclasses.replace(cfg, continuous=False), min_len=3)
    assert_same(got, want)
    lengths = {len(h[0].tokens) for h in got}
    assert len(lengths) > 3  # rows really ended at different steps


def test_trained_model_stops_with_eos_and_refills(
    trained: EncoderDecoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a model that emits EOS, sentences leave at their own step and new ones join: the
    refills happen (counted), and the outputs are batch-by-batch greedy's."""
    ids = random_ids(40, 16, seed=3)
    cfg = DecodeConfig(method=SearchKind.greedy, batch_size=8)
    joins = count_joins(monkeypatch)
    got = translate_ids(trained, ids, cfg)
    assert sum(joins) == 40
    assert len(joins) > 5
    assert max(joins) == 8
    monkeypatch.undo()
    assert_same(got, batch_by_batch(trained, ids, cfg))
    assert any(h[0].tokens for h in got)


def test_refill_waits_for_a_share_of_free_rows(
    trained: EncoderDecoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """New sentences join once batch_size / REFILL rows are free (here 2 of 16), never fewer."""
    joins = count_joins(monkeypatch)
    monkeypatch.setattr(schedule, "REFILL", 8)
    ids = random_ids(60, 16, seed=4)
    translate_ids(trained, ids, DecodeConfig(method=SearchKind.greedy, batch_size=16))
    assert joins[0] == 16
    assert all(n >= 2 for n in joins[1:-1])


def test_waiting_sentences_are_encoded_a_batch_at_a_time(
    trained: EncoderDecoder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The encoder runs on batch_size sentences at a time, ahead of the refills that start them
    (more refills than encoder calls), with batch-by-batch greedy's outputs."""
    calls: list[int] = []
    encode = trained.encode
    monkeypatch.setattr(trained, "encode", lambda src: (calls.append(src.size(0)), encode(src))[1])
    joins = count_joins(monkeypatch)
    ids = random_ids(40, 16, seed=3)
    cfg = DecodeConfig(method=SearchKind.greedy, batch_size=8)
    got = translate_ids(trained, ids, cfg)
    assert calls == [8, 8, 8, 8, 8]
    assert len(joins) > len(calls)
    monkeypatch.undo()
    assert_same(got, batch_by_batch(trained, ids, cfg))


def test_ensemble_refills_every_model(make_model: MakeModel) -> None:
    """An ensemble adds the new sentences to each model's caches, with its share of memory."""
    models = [make_model(k, layers=1, seed=s).double() for k, s in (("rope", 1), ("alibi", 2))]
    ensemble = Ensemble(models)
    ids = random_ids(9, 24, seed=2)
    cfg = DecodeConfig(method=SearchKind.greedy, batch_size=3, max_len_a=1.5, max_len_b=2)
    assert_same(translate_ids(ensemble, ids, cfg), batch_by_batch(ensemble, ids, cfg))


def test_limits_and_min_len_per_row(make_model: MakeModel) -> None:
    """Each row stops at its own a * |src| + b (EOS forced there, EOS counted) and never
    before min_len."""
    model = make_model("sinusoidal", layers=1, seed=9)
    ids = random_ids(11, 24, seed=6)
    cfg = DecodeConfig(method=SearchKind.greedy, batch_size=3, max_len_a=1.0, max_len_b=0)
    found = continuous_greedy(model, ids, cfg, min_len=2)
    for src, hyp in zip(ids, found, strict=True):
        assert 2 <= len(hyp.tokens) + 1 <= len(src) + 1  # EOS counted; |src| counts EOS too
        assert EOS_ID not in hyp.tokens
    assert any(len(h.tokens) == len(src) for h, src in zip(found, ids, strict=True))


def test_empty_input_and_one_sentence(make_model: MakeModel) -> None:
    model = make_model("rope", layers=1)
    cfg = DecodeConfig(method=SearchKind.greedy, batch_size=4)
    assert continuous_greedy(model, [], cfg) == []
    one = continuous_greedy(model, [[5, 6, 7]], cfg)
    assert len(one) == 1
    assert one[0].tokens == batch_by_batch(model, [[5, 6, 7]], cfg)[0][0].tokens


@pytest.mark.parametrize("sources", [1, 4, 5])
def test_sources_that_fit_one_batch_decode_batch_by_batch(
    make_model: MakeModel, monkeypatch: pytest.MonkeyPatch, sources: int
) -> None:
    """Catches refilling rows when no sentence waits (one sentence at a time pays the ragged
    rows' cost for nothing), or never refilling once sources outnumber the batch's rows; the
    outputs are batch-by-batch greedy's either way."""
    model = make_model("sinusoidal", layers=1, seed=3)
    ids = random_ids(sources, 24, seed=sources)
    cfg = DecodeConfig(method=SearchKind.greedy, batch_size=4)
    calls: list[int] = []
    real = schedule.continuous_greedy
    monkeypatch.setattr(
        schedule, "continuous_greedy", lambda m, i, *a: calls.append(len(i)) or real(m, i, *a)
    )
    got = translate_ids(model, ids, cfg)
    assert calls == ([sources] if sources > cfg.batch_size else [])
    assert_same(got, batch_by_batch(model, ids, cfg))


@pytest.mark.parametrize("kind", list(PosKind))
def test_long_rows_attending_apart_decode_as_batch_by_batch(
    make_model: MakeModel, kind: PosKind, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows far past the others attend over all keys and the others over their own span
    (model.layers.long_rows, from LONG_ROWS_MIN_KEYS keys: lowered here so that these short
    sentences split): every encoding's outputs are still batch by batch's."""
    monkeypatch.setattr(layers, "LONG_ROWS_MIN_KEYS", 2)
    splits: list[int] = []
    find = layers.long_rows

    def counted(offset: Offset, q_len: int, k_len: int) -> tuple[torch.Tensor, int] | None:
        split = find(offset, q_len, k_len)
        splits.append(split is not None)
        return split

    monkeypatch.setattr(layers, "long_rows", counted)
    model = make_model(kind, layers=2, seed=5).double()
    ids = random_ids(17, 24)
    cfg = DecodeConfig(method=SearchKind.greedy, batch_size=4, max_len_a=2.0, max_len_b=1)
    got = translate_ids(model, ids, cfg, min_len=3)
    assert sum(splits) >= 4  # rows attended apart (each layer) at some steps
    want = translate_ids(model, ids, dataclasses.replace(cfg, continuous=False), min_len=3)
    assert_same(got, want)


def count_log_softmax(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Calls of Tensor.log_softmax from now on (one a step when the search scores)."""
    calls: list[int] = []
    original = torch.Tensor.log_softmax

    def counted(self: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "log_softmax", counted)
    return calls


@pytest.mark.parametrize("continuous", [True, False])
def test_greedy_without_scores_skips_the_softmax_and_keeps_the_tokens(
    make_model: MakeModel, monkeypatch: pytest.MonkeyPatch, continuous: bool
) -> None:
    """decode.scores=False: the same tokens as with scores (min_len and every row's own limit
    applied to the logits alike), NaN scores, and no log-softmax over the vocabulary."""
    model = make_model("rope", layers=2, seed=5).double()
    ids = random_ids(17, 24)
    cfg = DecodeConfig(
        method=SearchKind.greedy, batch_size=4, max_len_a=2.0, max_len_b=1, continuous=continuous
    )
    want = translate_ids(model, ids, cfg, min_len=3)
    calls = count_log_softmax(monkeypatch)
    got = translate_ids(model, ids, dataclasses.replace(cfg, scores=False), min_len=3)
    assert calls == []
    assert [h[0].tokens for h in got] == [h[0].tokens for h in want]
    assert all(math.isnan(h[0].score) for h in got)
    assert not any(math.isnan(h[0].score) for h in want)
    assert len({len(h[0].tokens) for h in got}) > 3  # rows ended at different steps


def test_beam_and_sampling_score_whatever_scores_says(make_model: MakeModel) -> None:
    """Their searches rank by log-probabilities: scores=False changes nothing there."""
    model = make_model("sinusoidal", layers=1, seed=2)
    ids = random_ids(5, 24, seed=1)
    for cfg in (
        DecodeConfig(method=SearchKind.beam, beam_size=3, batch_size=4),
        DecodeConfig(method=SearchKind.sample, batch_size=4, seed=3),
    ):
        want = translate_ids(model, ids, cfg)
        got = translate_ids(model, ids, dataclasses.replace(cfg, scores=False))
        assert [[(h.tokens, h.score) for h in n] for n in got] == [
            [(h.tokens, h.score) for h in n] for n in want
        ]
