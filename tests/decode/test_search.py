"""Tests for seq2seq.decode.search: greedy and beam search against independent reference
searches."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable

import pytest
import torch
from torch import nn

from seq2seq.config.schema import DecodeConfig, LengthPenaltyKind, PosKind, SearchKind
from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from seq2seq.decode.schedule import translate_ids
from seq2seq.decode.search import (
    Hypothesis,
    beam_search,
    decode_batch,
    greedy_search,
    length_penalty,
    max_lengths,
)
from seq2seq.model.transformer import EncoderDecoder
from tests import search_golden
from tests.conftest import REV_VOCAB, reverse_batch

MakeModel = Callable[..., EncoderDecoder]
MakeSources = Callable[..., torch.Tensor]


@pytest.fixture(params=["random", "trained"])
def model(request: pytest.FixtureRequest, make_model: MakeModel) -> EncoderDecoder:
    if request.param == "trained":
        return request.getfixturevalue("trained")
    return make_model(PosKind.rope, vocab=REV_VOCAB, layers=2, seed=3)


def sources(seed: int = 7, n: int = 6) -> torch.Tensor:
    return reverse_batch(torch.Generator().manual_seed(seed), n)[0]


def beam_cfg(
    k: int, penalty: LengthPenaltyKind = LengthPenaltyKind.none, **kw: object
) -> DecodeConfig:
    return DecodeConfig(method=SearchKind.beam, beam_size=k, length_penalty=penalty, **kw)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- greedy


def naive_greedy(
    model: EncoderDecoder, src: torch.Tensor, max_len: int, min_len: int = 0
) -> Hypothesis:
    """One sentence (1, S): recompute the whole decoder every step, no cache, no batching."""
    ys, score = [BOS_ID], 0.0
    with torch.no_grad():
        for step in range(max_len):
            logprobs = model.logits(src, torch.tensor([ys]))[0, -1].log_softmax(-1)
            logprobs[[PAD_ID, BOS_ID]] = float("-inf")  # never output
            if step + 1 < min_len:
                logprobs[EOS_ID] = float("-inf")
            token = EOS_ID if step + 1 >= max_len else int(logprobs.argmax())
            score += float(logprobs[token])
            if token == EOS_ID:
                break
            ys.append(token)
    return Hypothesis(ys[1:], score)


@pytest.mark.parametrize("min_len", [0, 3])
def test_greedy_matches_naive_loop(model: EncoderDecoder, min_len: int) -> None:
    src = sources()
    max_len = max_lengths(src, 1.0, 2)
    got = greedy_search(model, src, max_len, min_len)
    for i, hyp in enumerate(got):
        length = int(src[i].ne(PAD_ID).sum())
        want = naive_greedy(model, src[i : i + 1, :length], int(max_len[i]), min_len)
        assert hyp.tokens == want.tokens, f"sentence {i}"
        assert hyp.score == pytest.approx(want.score, abs=1e-4)
    assert len({len(h.tokens) for h in got}) > 1  # lengths differ inside the batch


def test_greedy_trained_model_stops_with_eos(trained: EncoderDecoder) -> None:
    src = sources(n=16)
    max_len = max_lengths(src, 2.0, 5)
    hyps = greedy_search(trained, src, max_len)
    assert sum(len(h.tokens) + 1 < m for h, m in zip(hyps, max_len.tolist())) >= 12
    for h in hyps:
        assert EOS_ID not in h.tokens
        assert PAD_ID not in h.tokens


def test_greedy_respects_the_length_limit(model: EncoderDecoder) -> None:
    src = sources()
    max_len = torch.tensor([1, 2, 3, 1, 4, 2])
    for hyp, limit in zip(greedy_search(model, src, max_len), max_len.tolist()):
        assert len(hyp.tokens) + 1 <= limit  # EOS counts


# --------------------------------------------------------------------------- beam


def test_beam_size_one_equals_greedy(model: EncoderDecoder) -> None:
    src, at_limit = sources(), 0
    for max_len in (max_lengths(src, 1.0, 2), max_lengths(src, 0.0, 2)):  # the 2nd cuts most
        greedy = greedy_search(model, src, max_len)
        beam = beam_search(model, src, max_len, beam_cfg(1))
        for g, (b,), limit in zip(greedy, beam, max_len.tolist(), strict=True):
            assert b.tokens == g.tokens
            # also when EOS is forced at the limit: both charge its real log-probability
            assert b.score == pytest.approx(g.score, abs=1e-4)
            at_limit += len(g.tokens) + 1 == limit
    assert at_limit > 0  # the forced-EOS case was checked


@pytest.mark.parametrize(("k", "nbest"), [(4, 4), (5, 2)])
def test_beam_nbest_sorted_and_within_length(model: EncoderDecoder, k: int, nbest: int) -> None:
    src = sources(n=5)
    cfg = beam_cfg(k, LengthPenaltyKind.gnmt, nbest=nbest, max_len_a=1.0, max_len_b=2)
    max_len = max_lengths(src, cfg.max_len_a, cfg.max_len_b)
    results = beam_search(model, src, max_len, cfg)
    assert len(results) == 5
    for hyps, limit in zip(results, max_len.tolist()):
        assert len(hyps) == nbest
        scores = [h.score for h in hyps]
        assert all(math.isfinite(s) for s in scores)
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in hyps}) == nbest  # distinct hypotheses
        for h in hyps:
            assert len(h.tokens) + 1 <= limit
            assert EOS_ID not in h.tokens


def sequence_logprob(model: EncoderDecoder, src: torch.Tensor, tokens: list[int]) -> float:
    """log p(tokens + EOS | src) by teacher forcing."""
    ys = torch.tensor([[BOS_ID, *tokens]])
    with torch.no_grad():
        logprobs = model.logits(src, ys)[0].log_softmax(-1)  # (T, V)
    return float(logprobs.gather(1, torch.tensor([*tokens, EOS_ID])[:, None]).sum())


def test_beam_scores_are_normalized_model_scores(model: EncoderDecoder) -> None:
    """Each returned score is the sequence's log-probability over the GNMT penalty of its length
    (EOS included), also for a hypothesis cut at the length limit."""
    src = sources(n=4)
    cfg = beam_cfg(3, LengthPenaltyKind.gnmt, alpha=0.6, nbest=3)
    max_len = max_lengths(src, 1.0, 2)
    for i, hyps in enumerate(beam_search(model, src, max_len, cfg)):
        one = src[i : i + 1, : int(src[i].ne(PAD_ID).sum())]
        for h in hyps:
            length = len(h.tokens) + 1
            logprob = sequence_logprob(model, one, h.tokens)
            assert h.score == pytest.approx(logprob / ((5 + length) / 6) ** 0.6, abs=1e-4)


def forbid_specials(model: EncoderDecoder, bias: float = float("-inf")) -> None:
    """Give the output layer a bias on PAD and BOS (-inf: they can never be emitted)."""
    out = nn.Linear(model.out.in_features, model.out.out_features, bias=True)
    out.weight = model.out.weight
    with torch.no_grad():
        out.bias.zero_()
        out.bias[[PAD_ID, BOS_ID]] = bias
    model.out = out


def brute_force(
    model: EncoderDecoder,
    src: torch.Tensor,
    words: list[int],
    max_len: int,
    penalty: LengthPenaltyKind,
) -> list[tuple[float, list[int]]]:
    """Every output over `words` of at most max_len tokens (EOS included), scored like beam
    search, best first."""
    scored = []
    for length in range(max_len):
        for tokens in itertools.product(words, repeat=length):
            logprob = sequence_logprob(model, src, list(tokens))  # log p(EOS) at the limit too
            norm = float(length_penalty(torch.tensor(length + 1), penalty, 0.8))
            scored.append((logprob / norm, list(tokens)))
    return sorted(scored, key=lambda x: -x[0])


@pytest.mark.parametrize("penalty", list(LengthPenaltyKind), ids=lambda p: p.value)
def test_wide_beam_is_exact_search(make_model: MakeModel, penalty: LengthPenaltyKind) -> None:
    """With 4 possible words (UNK and 4-6; PAD and BOS are made impossible) and outputs of at most
    3 tokens there are 1 + 4 + 16 = 21 hypotheses; a beam of 24 never stops early nor prunes, so
    it must return all of them, in the exact order. Greedy can only be as good as the best."""
    vocab, limit = 7, 3
    model = make_model(PosKind.alibi, vocab=vocab, seed=1)
    forbid_specials(model)
    src = torch.tensor([[4, 5, 4, EOS_ID]])
    words = [UNK_ID, 4, 5, 6]
    want = brute_force(model, src, words, limit, penalty)
    assert len(want) == 1 + 4 + 16
    cfg = beam_cfg(24, penalty, alpha=0.8, nbest=24)
    (got,) = beam_search(model, src, torch.tensor([limit]), cfg)
    assert all(math.isinf(h.score) for h in got[len(want) :])
    got = got[: len(want)]
    assert [h.tokens for h in got] == [t for _, t in want]
    torch.testing.assert_close(
        torch.tensor([h.score for h in got]), torch.tensor([s for s, _ in want]), atol=1e-4, rtol=0
    )
    if penalty == LengthPenaltyKind.none:
        (greedy,) = greedy_search(model, src, torch.tensor([limit]))
        assert got[0].score >= greedy.score - 1e-5
        assert greedy.tokens in [t for _, t in want]


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_search_never_emits_pad_or_bos(make_model: MakeModel, method: str) -> None:
    model = make_model(PosKind.sinusoidal, seed=2)
    forbid_specials(model, bias=20.0)  # BOS and PAD now dominate every step
    src = torch.tensor([[4, 5, EOS_ID]])
    cfg = beam_cfg(2, nbest=2) if method == "beam" else DecodeConfig()
    for hyp in decode_batch(model, src, cfg)[0]:
        assert PAD_ID not in hyp.tokens, hyp.tokens
        assert BOS_ID not in hyp.tokens, hyp.tokens


def test_beam_is_not_worse_than_greedy_on_a_trained_model(trained: EncoderDecoder) -> None:
    """Beam search stops once it holds `beam_size` finished hypotheses, so in general it can end
    below greedy's score (we have seen it on half-trained models). On the trained reversal model
    it must not: this guards against pruning bugs rather than stating a theorem."""
    src = sources(seed=11, n=16)
    max_len = max_lengths(src, 1.0, 2)
    greedy = greedy_search(trained, src, max_len)
    for k in (2, 4):
        beam = beam_search(trained, src, max_len, beam_cfg(k))
        for g, (b,) in zip(greedy, beam):
            assert b.score >= g.score - 1e-4


@pytest.mark.parametrize("penalty", list(LengthPenaltyKind), ids=lambda p: p.value)
def test_beam_batch_equals_one_by_one(model: EncoderDecoder, penalty: LengthPenaltyKind) -> None:
    """Sentences of a batch do not interact (beam bookkeeping uses per-sentence offsets, and a
    sentence that is done stops while the others go on)."""
    src = sources(n=16)
    cfg = beam_cfg(2, penalty, nbest=2, alpha=1.0)
    max_len = max_lengths(src, 1.0, 2)
    batched = beam_search(model, src, max_len, cfg)
    for i in range(16):
        one = src[i : i + 1, : int(src[i].ne(PAD_ID).sum())]
        (alone,) = beam_search(model, one, max_len[i : i + 1], cfg)
        assert [h.tokens for h in batched[i]] == [h.tokens for h in alone]
        assert [h.score for h in batched[i]] == pytest.approx([h.score for h in alone], abs=1e-4)


def reference_beam(
    model: EncoderDecoder, src: torch.Tensor, max_len: int, cfg: DecodeConfig, min_len: int = 0
) -> list[Hypothesis]:
    """The beam search of one sentence (1, S) spelled out: every step re-decodes the K prefixes
    from scratch (no cache), and the bookkeeping is Python lists (no batching, no shrinking)."""
    k, inf = cfg.beam_size, float("-inf")
    beams: list[tuple[list[int], float]] = [([], 0.0)] + [([], inf)] * (k - 1)
    finished: list[Hypothesis] = []
    for step in range(max_len):
        with torch.no_grad():
            ys = torch.tensor([[BOS_ID, *tokens] for tokens, _ in beams])  # (K, t + 1)
            logprobs = model.logits(src.expand(k, -1), ys)[:, -1].log_softmax(-1)  # (K, V)
        logprobs[:, [PAD_ID, BOS_ID]] = inf
        if step + 1 < min(min_len, max_len):
            logprobs[:, EOS_ID] = inf
        if step + 1 >= max_len:  # only EOS is left
            logprobs[:, [t for t in range(logprobs.size(1)) if t != EOS_ID]] = inf
        cand = torch.tensor([score for _, score in beams])[:, None] + logprobs  # (K, V)
        top_score, top_index = cand.flatten().topk(2 * k)
        alive: list[tuple[list[int], float]] = []
        for rank, (score, index) in enumerate(zip(top_score.tolist(), top_index.tolist())):
            tokens, token = beams[index // logprobs.size(1)][0], index % logprobs.size(1)
            if token == EOS_ID and rank < k and score > inf:
                norm = float(length_penalty(torch.tensor(step + 1), cfg.length_penalty, cfg.alpha))
                finished.append(Hypothesis(tokens, score / norm))
            elif token != EOS_ID and len(alive) < k:
                alive.append(([*tokens, token], score))
        finished = sorted(finished, key=lambda h: -h.score)[:k]
        if len(finished) == k or not alive or alive[0][1] == inf:
            break
        beams = alive + [([], inf)] * (k - len(alive))
    return finished[: cfg.nbest]


@pytest.mark.parametrize("min_len", [0, 6])
@pytest.mark.parametrize("penalty", list(LengthPenaltyKind), ids=lambda p: p.value)
def test_beam_matches_reference_search(
    model: EncoderDecoder, penalty: LengthPenaltyKind, min_len: int
) -> None:
    """The batched, cached, shrinking search returns exactly the reference's hypotheses."""
    src = sources(seed=5, n=8)
    cfg = beam_cfg(3, penalty, nbest=3, alpha=0.8)
    max_len = max_lengths(src, 1.0, 2)
    got = beam_search(model, src, max_len, cfg, min_len)
    for i, hyps in enumerate(got):
        one = src[i : i + 1, : int(src[i].ne(PAD_ID).sum())]
        want = reference_beam(model, one, int(max_len[i]), cfg, min_len)
        assert [h.tokens for h in hyps] == [h.tokens for h in want], f"sentence {i}"
        assert [h.score for h in hyps] == pytest.approx([h.score for h in want], abs=1e-4)
        assert all(len(h.tokens) + 1 >= min(min_len, int(max_len[i])) for h in hyps)


class DecodeSpy:
    """Wraps model.decode and records the number of decoder rows of every step."""

    def __init__(self, model: EncoderDecoder) -> None:
        self.rows: list[int] = []
        self.decode = model.decode

    def __call__(self, tgt_in: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        self.rows.append(tgt_in.size(0))
        return self.decode(tgt_in, *args, **kwargs)


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_finished_sentences_leave_the_batch(
    trained: EncoderDecoder, method: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows of finished sentences are dropped step by step, the search stops when all are done,
    and every sentence gets what it gets when decoded alone."""
    src = sources(seed=3, n=12)
    cfg = beam_cfg(3, nbest=2) if method == "beam" else DecodeConfig(max_len_a=2.0)
    spy = DecodeSpy(trained)
    monkeypatch.setattr(trained, "decode", spy)
    batched = decode_batch(trained, src, cfg)
    rows = spy.rows
    monkeypatch.undo()
    width = cfg.beam_size if method == "beam" else 1
    assert rows[0] == 12  # the first step decodes each sentence once (its beams are identical)
    assert rows[1] == 12 * width
    assert rows[1:] == sorted(rows[1:], reverse=True)
    assert len(set(rows)) >= 4  # sentences ended at several different steps
    assert len(rows) < int(max_lengths(src, cfg.max_len_a, cfg.max_len_b).max())
    for i in range(12):
        one = src[i : i + 1, : int(src[i].ne(PAD_ID).sum())]
        assert [h.tokens for h in decode_batch(trained, one, cfg)[0]] == [
            h.tokens for h in batched[i]
        ]


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_min_len_equal_to_max_len_forces_the_length(model: EncoderDecoder, method: str) -> None:
    """min_len = max_len (the benchmarks' forced length): every output has exactly max_len - 1
    tokens and EOS; a min_len beyond the max length cannot stop the search."""
    src = sources(n=4)
    cfg = beam_cfg(3, nbest=3) if method == "beam" else DecodeConfig()
    for min_len, max_len in [(7, 7), (20, 5)]:
        limit = torch.full((4,), max_len)
        search = beam_search if method == "beam" else greedy_search
        args = (cfg,) if method == "beam" else ()
        results = search(model, src, limit, *args, min_len=min_len)  # type: ignore[operator]
        for hyps in results:
            for h in hyps if isinstance(hyps, list) else [hyps]:
                assert len(h.tokens) == max_len - 1
                assert math.isfinite(h.score)


# --------------------------------------------------------------------------- helpers


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_length_penalty_formulas(alpha: float) -> None:
    lengths = [1, 2, 7, 20]
    t = torch.tensor(lengths)
    gnmt = length_penalty(t, LengthPenaltyKind.gnmt, alpha).tolist()
    assert gnmt == pytest.approx([((5 + n) / 6) ** alpha for n in lengths])
    average = length_penalty(t, LengthPenaltyKind.average, alpha).tolist()
    assert average == pytest.approx([n**alpha for n in lengths])
    assert length_penalty(t, LengthPenaltyKind.none, alpha).tolist() == [1.0] * 4


def test_max_lengths_counts_non_pad_tokens() -> None:
    src = torch.tensor([[5, 6, EOS_ID, PAD_ID, PAD_ID], [5, EOS_ID, PAD_ID, PAD_ID, PAD_ID]])
    assert max_lengths(src, 1.5, 3).tolist() == [7, 6]  # floor(1.5 * 3 + 3), 1.5 * 2 + 3
    assert max_lengths(src, 2.0, 0).tolist() == [6, 4]
    assert max_lengths(src, 0.0, 0).tolist() == [1, 1]  # at least EOS


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_translate_ids_keeps_input_order(trained: EncoderDecoder, method: str) -> None:
    gen = torch.Generator().manual_seed(5)
    src_ids = [
        torch.randint(4, REV_VOCAB, (n,), generator=gen).tolist() for n in [2, 6, 1, 4, 5, 3, 6]
    ]
    cfg = DecodeConfig(method=SearchKind(method), beam_size=3, batch_size=3)
    results = translate_ids(trained, src_ids, cfg)
    assert trained.training is False
    assert len(results) == len(src_ids)
    for ids, hyps in zip(src_ids, results):
        (alone,) = translate_ids(trained, [ids], cfg)
        assert [h.tokens for h in hyps] == [h.tokens for h in alone]
    # the outputs differ, so a mix-up of the order would show
    assert len({tuple(hyps[0].tokens) for hyps in results}) >= 5


def test_translate_ids_restores_training_mode(trained: EncoderDecoder) -> None:
    trained.train()
    try:
        translate_ids(trained, [[4, 5]], DecodeConfig())
        assert trained.training
    finally:
        trained.eval()


def test_decode_batch_dispatches_on_method(model: EncoderDecoder) -> None:
    src = sources(n=3)
    greedy = decode_batch(
        model, src, DecodeConfig(method=SearchKind.greedy, max_len_a=1.0, max_len_b=2)
    )
    assert all(len(h) == 1 for h in greedy)
    beam = decode_batch(model, src, beam_cfg(3, nbest=3, max_len_a=1.0, max_len_b=2))
    assert all(len(h) == 3 for h in beam)
    assert [g[0].tokens for g in greedy] == [
        h[0].tokens for h in decode_batch(model, src, beam_cfg(1, max_len_a=1.0, max_len_b=2))
    ]


# --------------------------------------------------------------------------- unchanged outputs


@pytest.mark.parametrize("case", sorted(search_golden.CASES))
def test_greedy_and_beam_outputs_are_as_recorded(case: str) -> None:
    """The searches return the tokens (and scores, to float rounding) that they returned when
    tests/fixtures/search_golden.json was written, before sampling, ensembles and alignments;
    a sentence may differ only where its search meets a near-tie, which another CPU's rounding
    can flip (search_golden.compare)."""
    want = json.loads(search_golden.GOLDEN.read_text(encoding="utf-8"))
    got = search_golden.outputs([case])
    for key, results in got.items():
        model = search_golden.model_of(PosKind(key.split("/")[0]))
        search_golden.compare(model, search_golden.sources(), case, results, want[key])
