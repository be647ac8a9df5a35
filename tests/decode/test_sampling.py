"""Tests for seq2seq.decode.sampling and search.sample_search: the draws follow the model's
(tempered, cut) distribution, are seeded per sentence, and the limits of greedy and top-k hold."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from seq2seq.config.checks import check_decode
from seq2seq.config.schema import DecodeConfig, SearchKind
from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from seq2seq.decode.sampling import Sampler, uniform_table
from seq2seq.decode.schedule import translate_ids
from seq2seq.decode.search import greedy_search, max_lengths, sample_search
from seq2seq.errors import ConfigError
from seq2seq.model.transformer import EncoderDecoder
from tests.conftest import REV_VOCAB
from tests.decode.test_search import sequence_logprob, sources

SAMPLE = DecodeConfig(method=SearchKind.sample, max_len_a=1.0, max_len_b=3)


def sample_cfg(**changes: object) -> DecodeConfig:
    return dataclasses.replace(SAMPLE, **changes)  # type: ignore[arg-type]


def empirical(logprobs: torch.Tensor, cfg: DecodeConfig, draws: int = 20000) -> torch.Tensor:
    """Frequencies (V,) of the Sampler's tokens for one row of logprobs (V,) over `draws`
    evenly spread uniform numbers (a deterministic stand-in for many random ones)."""
    uniforms = ((torch.arange(draws) + 0.5) / draws)[:, None]  # (draws, 1)
    sampler = Sampler(cfg, uniforms)
    _, tokens = sampler(logprobs.expand(draws, -1).clone(), torch.arange(draws), 0)
    return torch.bincount(tokens, minlength=logprobs.numel()).float() / draws


def test_sampler_draws_from_the_tempered_distribution() -> None:
    logprobs = torch.tensor([-0.5, -1.0, -2.0, -3.0, float("-inf"), -4.0]).log_softmax(-1)
    for temperature in (1.0, 0.5, 2.0):
        want = (logprobs / temperature).softmax(-1)
        got = empirical(logprobs, sample_cfg(temperature=temperature))
        torch.testing.assert_close(got, want, atol=3e-4, rtol=0)
    assert empirical(logprobs, SAMPLE)[4] == 0  # an impossible token is never drawn


def test_sampler_top_k_and_top_p_keep_the_best_tokens() -> None:
    logprobs = torch.tensor([-3.0, -0.5, -2.0, -1.0, -4.0, -1.5]).log_softmax(-1)
    probs = logprobs.exp()
    top3 = empirical(logprobs, sample_cfg(top_k=3))
    assert set(top3.nonzero().squeeze(1).tolist()) == {1, 3, 5}  # the 3 most probable
    kept = probs[[1, 3, 5]] / probs[[1, 3, 5]].sum()
    torch.testing.assert_close(top3[[1, 3, 5]], kept, atol=3e-4, rtol=0)
    # nucleus 0.75: tokens 1 (p .43) and 3 (p .26) hold .70 < .75, so 5 (p .16) joins them
    assert probs[1] + probs[3] < 0.75 < probs[1] + probs[3] + probs[5]
    nucleus = empirical(logprobs, sample_cfg(top_p=0.75))
    assert set(nucleus.nonzero().squeeze(1).tolist()) == {1, 3, 5}
    assert set(empirical(logprobs, sample_cfg(top_p=0.3)).nonzero().squeeze(1).tolist()) == {1}
    assert empirical(logprobs, sample_cfg(top_k=2, top_p=0.99)).nonzero().numel() == 2


def ranks(model: EncoderDecoder, src: torch.Tensor, tokens: list[int]) -> list[int]:
    """Rank (0 = most probable) of each token of tokens + EOS in the model's distribution at its
    step, recomputed teacher-forced (PAD and BOS excluded, as the search does)."""
    with torch.no_grad():
        logprobs = model.logits(src, torch.tensor([[BOS_ID, *tokens]]))[0].log_softmax(-1)  # (T, V)
    logprobs[:, [PAD_ID, BOS_ID]] = float("-inf")
    out = []
    for step, token in enumerate([*tokens, EOS_ID]):
        out.append(int((logprobs[step] > logprobs[step, token]).sum()))
    return out


def test_top_k_never_emits_outside_the_k_best(trained: EncoderDecoder) -> None:
    src = sources(seed=2, n=8)
    max_len = max_lengths(src, 2.0, 3)
    cfg = sample_cfg(top_k=2, nbest=6, temperature=3.0)  # flat: the 2nd best is drawn often
    seen = set()
    for i, samples in enumerate(sample_search(trained, src, max_len, cfg, list(range(8)))):
        one = src[i : i + 1, : int(src[i].ne(PAD_ID).sum())]
        for h in samples:
            at = ranks(trained, one, h.tokens)
            at = at if len(h.tokens) + 1 < int(max_len[i]) else at[:-1]  # EOS forced at the end
            assert max(at) <= 1, (i, h.tokens, at)
            seen.update(at)
    assert seen == {0, 1}  # both were drawn


def test_a_samples_score_is_its_log_probability(trained: EncoderDecoder) -> None:
    src = sources(seed=4, n=4)
    max_len = max_lengths(src, 2.0, 3)
    cfg = sample_cfg(nbest=3, temperature=1.5, top_p=0.9)
    for i, samples in enumerate(sample_search(trained, src, max_len, cfg, list(range(4)))):
        one = src[i : i + 1, : int(src[i].ne(PAD_ID).sum())]
        for h in samples:
            assert len(h.tokens) + 1 < int(max_len[i])  # ended by EOS, not by the limit
            assert h.score == pytest.approx(sequence_logprob(trained, one, h.tokens), abs=1e-4)


def test_temperature_near_zero_is_greedy(trained: EncoderDecoder) -> None:
    src = sources(seed=9, n=12)
    max_len = max_lengths(src, 1.5, 3)
    greedy = greedy_search(trained, src, max_len)
    cold = sample_search(trained, src, max_len, sample_cfg(temperature=1e-4, nbest=3), [0] * 12)
    for g, samples in zip(greedy, cold, strict=True):
        assert [h.tokens for h in samples] == [g.tokens] * 3
        assert [h.score for h in samples] == pytest.approx([g.score] * 3, abs=1e-5)


def test_samples_are_seeded_per_sentence_not_per_batch(trained: EncoderDecoder) -> None:
    gen = torch.Generator().manual_seed(3)
    src_ids = [torch.randint(4, REV_VOCAB, (n,), generator=gen).tolist() for n in [3, 6, 1, 5] * 4]
    src_ids[4] = src_ids[0]
    cfg = sample_cfg(nbest=3, temperature=2.0, seed=5)

    def tokens(**changes: object) -> list[list[list[int]]]:
        results = translate_ids(trained, src_ids, dataclasses.replace(cfg, **changes))  # type: ignore[arg-type]
        return [[h.tokens for h in samples] for samples in results]

    together = tokens(batch_size=16)
    assert tokens(batch_size=1) == together == tokens(batch_size=5)
    assert [s[:2] for s in tokens(nbest=2)] == [s[:2] for s in together]  # sample j: same draws
    assert tokens(seed=6) != together
    assert sum(len({tuple(t) for t in s}) > 1 for s in together) >= 8  # the samples differ
    # a sentence's samples depend on its index in the input, not on its text alone
    assert together[0] != together[4]


def test_uniform_table_rows_are_the_sentences_draws() -> None:
    table = uniform_table(1, [7, 3], 2, [4, 2])
    assert table.shape == (4, 4)
    assert torch.equal(table[2:, 2:], torch.zeros(2, 2))  # past the 2nd sentence's limit
    alone = uniform_table(1, [3], 2, [2])
    assert torch.equal(table[2:, :2], alone)
    assert float(table.min()) >= 0
    assert float(table.max()) < 1


@pytest.mark.parametrize(
    ("key", "value", "words"),
    [
        ("temperature", 0.0, "above 0"),
        ("top_k", -1, "0 (all tokens) or more"),
        ("top_p", 0.0, "in (0, 1]"),
        ("top_p", 1.5, "in (0, 1]"),
    ],
)
def test_bad_sampling_settings_are_refused(key: str, value: float, words: str) -> None:
    with pytest.raises(
        ConfigError, match=re.escape(f"decode.{key}={value!r} is invalid; it must be {words}")
    ):
        check_decode(sample_cfg(**{key: value}))
    check_decode(sample_cfg(nbest=20))  # any number of samples (beam search: at most beam)
