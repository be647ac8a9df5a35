"""Shared by the tests that compare two ways of decoding (tests/decode/test_fast_path_parity.py,
tests/cuda/test_cuda.py): the three searches' settings, a random model whose sentences end at
different lengths, and random sources."""

from __future__ import annotations

import torch

from seq2seq.config.schema import DecodeConfig, LengthPenaltyKind, PosKind, SearchKind
from seq2seq.data.tokenizer import EOS_ID
from seq2seq.model.transformer import EncoderDecoder
from tests.conftest import MakeModel

SEARCHES = {
    "greedy": DecodeConfig(method=SearchKind.greedy, max_len_a=1.0, max_len_b=6),
    "beam": DecodeConfig(
        method=SearchKind.beam,
        beam_size=4,
        nbest=2,
        length_penalty=LengthPenaltyKind.average,
        alpha=1.0,
        max_len_a=1.0,
        max_len_b=6,
    ),
    "sample": DecodeConfig(method=SearchKind.sample, nbest=2, top_p=0.9, max_len_a=1.0, seed=3),
}


def eos_biased_model(
    make_model: MakeModel, kind: PosKind, vocab: int, norm_first: bool = True
) -> EncoderDecoder:
    """A random 2-layer model whose output layer has a bias favouring EOS, so that its
    sentences end at different lengths (rows leave the batch with their caches)."""
    model = make_model(kind, layers=2, vocab=vocab, tie_output=False, norm_first=norm_first)
    out = torch.nn.Linear(model.out.in_features, vocab)
    out.weight = model.out.weight
    with torch.no_grad():
        out.bias.copy_(torch.randn(vocab, generator=torch.Generator().manual_seed(2)))
        out.bias[EOS_ID] += 4.0
    model.out = out
    return model


def random_sources(vocab: int, n: int = 7) -> list[list[int]]:
    """n sources of 1-8 random word ids (seeded)."""
    gen = torch.Generator().manual_seed(11)
    lengths = torch.randint(1, 9, (n,), generator=gen).tolist()
    return [torch.randint(4, vocab, (length,), generator=gen).tolist() for length in lengths]
