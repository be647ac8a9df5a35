"""An ensemble of two different models under beam search with a length penalty, against a beam
search written out here: each step recomputes both models from scratch, averages their
log-probabilities, renormalises the mean (a log-softmax: the ensemble's scores stay
log-probabilities), and finished hypotheses are ranked by their summed log-probability over the
length penalty, its formula written out below."""

from __future__ import annotations

import math

import pytest
import torch

from seq2seq.config.schema import DecodeConfig, LengthPenaltyKind, PosKind, SearchKind
from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from seq2seq.decode.ensemble import Ensemble
from seq2seq.decode.search import Hypothesis, beam_search, max_lengths
from seq2seq.model.transformer import EncoderDecoder
from tests.conftest import REV_VOCAB, MakeModel, reverse_batch

INF = float("-inf")


def penalty(length: int, kind: LengthPenaltyKind, alpha: float) -> float:
    """The divisor of a finished hypothesis' log-probability; `length` counts its EOS."""
    if kind == LengthPenaltyKind.gnmt:  # Wu et al. 2016, eq. 14
        return ((5 + length) / (5 + 1)) ** alpha
    if kind == LengthPenaltyKind.average:
        return length**alpha
    return 1.0


def ensemble_logprobs(
    models: list[EncoderDecoder], src: torch.Tensor, ys: torch.Tensor
) -> torch.Tensor:
    """log p(next token) (K, V) of the K prefixes ys (K, t): the models' log-probabilities
    averaged, then renormalised."""
    with torch.no_grad():
        each = [m.logits(src.expand(ys.size(0), -1), ys)[:, -1].log_softmax(-1) for m in models]
    mean = torch.stack(each).mean(0)  # (K, V): not a distribution (it sums to less than 1)
    return mean - torch.logsumexp(mean, -1, keepdim=True)


def reference_beam(
    models: list[EncoderDecoder], src: torch.Tensor, max_len: int, cfg: DecodeConfig
) -> list[Hypothesis]:
    """Beam search of one sentence (1, S): K live prefixes re-decoded from scratch at every
    step; the 2K best continuations, those ending in EOS among the first K finish (scored over
    the penalty), the first K others go on; done with K finished or no live prefix left. PAD and
    BOS are never output; at max_len - 1 tokens only EOS is left."""
    k = cfg.beam_size
    beams: list[tuple[list[int], float]] = [([], 0.0)] + [([], INF)] * (k - 1)
    finished: list[Hypothesis] = []
    for step in range(max_len):
        ys = torch.tensor([[BOS_ID, *tokens] for tokens, _ in beams])  # (K, step + 1)
        logprobs = ensemble_logprobs(models, src, ys)  # (K, V)
        vocab = logprobs.size(1)
        logprobs[:, [PAD_ID, BOS_ID]] = INF
        if step + 1 >= max_len:
            logprobs[:, [t for t in range(vocab) if t != EOS_ID]] = INF
        cand = torch.tensor([score for _, score in beams])[:, None] + logprobs  # (K, V)
        top_score, top_index = cand.flatten().topk(2 * k)
        alive: list[tuple[list[int], float]] = []
        for rank, (score, index) in enumerate(zip(top_score.tolist(), top_index.tolist())):
            tokens, token = beams[index // vocab][0], index % vocab
            if token == EOS_ID and rank < k and score > INF:
                norm = penalty(step + 1, cfg.length_penalty, cfg.alpha)
                finished.append(Hypothesis(tokens, score / norm))
            elif token != EOS_ID and len(alive) < k:
                alive.append(([*tokens, token], score))
        finished = sorted(finished, key=lambda h: -h.score)[:k]
        if len(finished) == k or not alive or alive[0][1] == INF:
            break
        beams = alive + [([], INF)] * (k - len(alive))
    return finished[: cfg.nbest]


def sequence_score(
    models: list[EncoderDecoder], src: torch.Tensor, tokens: list[int], cfg: DecodeConfig
) -> float:
    """A hypothesis' score recomputed by teacher forcing: the renormalised mean log-probability
    of each of its tokens and EOS, summed, over the penalty of its length."""
    ys = torch.tensor([[BOS_ID, *tokens]])
    total = 0.0
    for t, token in enumerate([*tokens, EOS_ID]):
        total += float(ensemble_logprobs(models, src, ys[:, : t + 1])[0, token])
    return total / penalty(len(tokens) + 1, cfg.length_penalty, cfg.alpha)


@pytest.mark.parametrize(
    ("kind", "alpha"),
    [(LengthPenaltyKind.gnmt, 0.8), (LengthPenaltyKind.average, 0.6)],
    ids=["gnmt", "average"],
)
def test_ensemble_beam_search_with_a_length_penalty(
    trained: EncoderDecoder, make_model: MakeModel, kind: LengthPenaltyKind, alpha: float
) -> None:
    """The trained reversal model with a random one of another width, depth and positional
    encoding: the batched, cached search returns the written-out search's hypotheses, token for
    token, and their scores."""
    other = make_model(PosKind.rope, vocab=REV_VOCAB, layers=1, d_model=16, n_heads=2, seed=4)
    models = [trained, other]
    src = reverse_batch(torch.Generator().manual_seed(9), 8)[0]  # (8, S): 1-6 words and EOS
    cfg = DecodeConfig(
        method=SearchKind.beam, beam_size=3, nbest=3, length_penalty=kind, alpha=alpha
    )
    max_len = max_lengths(src, 1.0, 2)
    got = beam_search(Ensemble(models), src, max_len, cfg)
    lengths = set()
    for i, hyps in enumerate(got):
        one = src[i : i + 1, : int(src[i].ne(PAD_ID).sum())]  # (1, S_i)
        want = reference_beam(models, one, int(max_len[i]), cfg)
        assert [h.tokens for h in hyps] == [h.tokens for h in want], f"sentence {i}"
        assert [h.score for h in hyps] == pytest.approx([h.score for h in want], abs=1e-4)
        for h in hyps:  # and each score is that hypothesis' own, recomputed
            assert h.score == pytest.approx(sequence_score(models, one, h.tokens, cfg), abs=1e-4)
            assert math.isfinite(h.score)
            lengths.add(len(h.tokens))
    assert len(lengths) > 2  # hypotheses of several lengths: the penalty took part
    # the ensemble's search is neither model's
    alone = [beam_search(m, src, max_len, cfg) for m in models]
    tokens = [[h.tokens for h in hyps] for hyps in got]
    assert all(tokens != [[h.tokens for h in hyps] for hyps in a] for a in alone)
