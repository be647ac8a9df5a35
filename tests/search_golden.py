"""Greedy and beam outputs of seeded tiny models, recorded before sampling, ensembles and
alignments were added (commit e189102): tests/decode/test_search.py checks that the searches still
return exactly these tokens (and these scores to float rounding).

    python -m tests.search_golden   # rewrite tests/fixtures/search_golden.json (only on purpose)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from seq2seq.config.schema import DecodeConfig, LengthPenaltyKind, PosKind, SearchKind
from seq2seq.data.tokenizer import EOS_ID
from seq2seq.decode.search import translate_ids
from seq2seq.model.transformer import EncoderDecoder
from tests.conftest import _make_model

GOLDEN = Path(__file__).resolve().parent / "fixtures" / "search_golden.json"
CASES = {
    "greedy": DecodeConfig(method=SearchKind.greedy, batch_size=5),
    "greedy-min-len": DecodeConfig(method=SearchKind.greedy, batch_size=3, max_len_a=1.0),
    "beam-gnmt": DecodeConfig(method=SearchKind.beam, beam_size=4, nbest=3, batch_size=4),
    "beam-none": DecodeConfig(
        method=SearchKind.beam, beam_size=3, length_penalty=LengthPenaltyKind.none, batch_size=16
    ),
}


def sources() -> list[list[int]]:
    """16 sources of 1-9 random words (ids 4-23)."""
    gen = torch.Generator().manual_seed(42)
    lengths = torch.randint(1, 10, (16,), generator=gen).tolist()
    return [torch.randint(4, 24, (n,), generator=gen).tolist() for n in lengths]


def model_of(pos: PosKind) -> EncoderDecoder:
    """A random 2-layer model whose output layer has a random bias (EOS raised), so that its
    outputs vary in length and words."""
    model = _make_model(pos, layers=2, seed=5, tie_output=False, d_model=64)
    out = torch.nn.Linear(model.out.in_features, model.out.out_features)
    out.weight = model.out.weight
    with torch.no_grad():
        out.bias.copy_(torch.randn(out.bias.shape, generator=torch.Generator().manual_seed(1)))
        out.bias[EOS_ID] += 1.5
    model.out = out
    return model


def outputs(names: list[str] | None = None) -> dict[str, Any]:
    """ "<pos>/<case>" -> per source, its hypotheses as [tokens, score], for the cases `names`
    (default: all) and two models."""
    found: dict[str, Any] = {}
    for pos in (PosKind.sinusoidal, PosKind.rope):
        model = model_of(pos)
        for name in names or list(CASES):
            cfg = CASES[name]
            min_len = 4 if name.endswith("min-len") else 0
            results = translate_ids(model, sources(), cfg, min_len=min_len)
            found[f"{pos.value}/{name}"] = [[[h.tokens, h.score] for h in n] for n in results]
    return found


if __name__ == "__main__":
    torch.set_num_threads(1)
    GOLDEN.write_text(json.dumps(outputs()) + "\n", encoding="utf-8")
    print(f"wrote {GOLDEN}")
