"""Tests for seq2seq.decode.ensemble: an ensemble decodes like its mean log-probabilities recomputed
from scratch, an ensemble of one model (or of a model with itself) like the model, and
checkpoints with other vocabularies are refused."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from seq2seq.config.schema import DecodeConfig, LengthPenaltyKind, PosKind, SearchKind
from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, VocabTokenizer
from seq2seq.decode.ensemble import Ensemble, check_same_vocabularies
from seq2seq.decode.schedule import translate_ids
from seq2seq.decode.search import Hypothesis, decode_batch, max_lengths
from seq2seq.model.transformer import EncoderDecoder
from seq2seq.train.checkpoint import CheckpointError
from tests.conftest import REV_VOCAB, MakeModel
from tests.decode.test_search import sources

CONFIGS = {
    "greedy": DecodeConfig(method=SearchKind.greedy, max_len_a=1.0, max_len_b=3),
    "beam": DecodeConfig(method=SearchKind.beam, beam_size=3, nbest=3, max_len_a=1.0),
    "sample": DecodeConfig(method=SearchKind.sample, nbest=2, temperature=1.5, max_len_a=1.0),
}


def same(got: list[list[Hypothesis]], want: list[list[Hypothesis]]) -> None:
    assert [[h.tokens for h in n] for n in got] == [[h.tokens for h in n] for n in want]
    scores = [h.score for n in got for h in n]
    assert scores == pytest.approx([h.score for n in want for h in n], abs=1e-4)


@pytest.mark.parametrize("method", sorted(CONFIGS))
def test_an_ensemble_of_one_and_of_a_model_with_itself_equal_the_model(
    trained: EncoderDecoder, method: str
) -> None:
    src, cfg = sources(seed=6, n=10), CONFIGS[method]
    alone = decode_batch(trained, src, cfg)
    same(decode_batch(Ensemble([trained]), src, cfg), alone)
    same(decode_batch(Ensemble([trained, trained]), src, cfg), alone)
    assert not Ensemble([trained]).training  # decoding with it leaves the model in eval mode


def naive_ensemble_greedy(
    models: list[EncoderDecoder], src: torch.Tensor, max_len: int
) -> list[int]:
    """One sentence (1, S): every step recomputes each model's whole decoder, no cache, and
    takes the best token of the mean log-probabilities."""
    ys = [BOS_ID]
    with torch.no_grad():
        for step in range(max_len):
            logprobs = torch.stack(
                [m.logits(src, torch.tensor([ys]))[0, -1].log_softmax(-1) for m in models]
            ).mean(0)
            logprobs[[PAD_ID, BOS_ID]] = float("-inf")
            token = EOS_ID if step + 1 >= max_len else int(logprobs.argmax())
            if token == EOS_ID:
                break
            ys.append(token)
    return ys[1:]


def test_an_ensemble_decodes_with_the_mean_of_its_models(
    trained: EncoderDecoder, make_model: MakeModel
) -> None:
    """Two different models (other widths, depths and positional encodings): each keeps its
    own cache, and the outputs are those of the averaged distributions recomputed from scratch;
    they differ from either model's own."""
    other = make_model(PosKind.rope, vocab=REV_VOCAB, layers=1, d_model=16, n_heads=2, seed=4)
    ensemble = Ensemble([trained, other])
    src = sources(seed=8, n=10)
    max_len = max_lengths(src, 1.0, 3)
    cfg = CONFIGS["greedy"]
    got = decode_batch(ensemble, src, cfg)
    for i, (hyp,) in enumerate(got):
        one = src[i : i + 1, : int(src[i].ne(PAD_ID).sum())]
        assert hyp.tokens == naive_ensemble_greedy([trained, other], one, int(max_len[i]))
    assert got != decode_batch(trained, src, cfg)
    assert got != decode_batch(other, src, cfg)
    beam = DecodeConfig(method=SearchKind.beam, beam_size=3, length_penalty=LengthPenaltyKind.none)
    ids = [row[row.ne(PAD_ID) & row.ne(EOS_ID)].tolist() for row in src]
    one_by_one = dataclasses.replace(beam, batch_size=1)  # batched beams: caches reordered
    same(translate_ids(ensemble, ids, beam), translate_ids(ensemble, ids, one_by_one))
    assert not trained.training
    assert not other.training


def score_checkpoints_with_other_vocabularies_are_refused() -> None:
    words = VocabTokenizer("word", [*SPECIAL_TOKENS, "one", "two"])
    other = VocabTokenizer("word", [*SPECIAL_TOKENS, "two", "one"])
    check_same_vocabularies(["a.pt", "b.pt"], [(words, words), (words, words)])
    with pytest.raises(
        CheckpointError, match=r"c\.pt: its target vocabulary differs from that of a\.pt"
    ):
        check_same_vocabularies(["a.pt", "b.pt", "c.pt"], [(words, words)] * 2 + [(words, other)])
    with pytest.raises(CheckpointError, match=r"b\.pt: its source vocabulary differs"):
        check_same_vocabularies(["a.pt", "b.pt"], [(words, words), (other, words)])
