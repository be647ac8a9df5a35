"""Greedy and beam outputs of seeded tiny models, recorded before sampling, ensembles and
alignments were added (commit e189102): tests/decode/test_search.py checks that the searches still
return these tokens (and these scores to float rounding), with `compare`.

The models are untrained and random, and the recording was made on one CPU: another CPU rounds
the same float32 sums differently (by ~1e-6), so where two candidates of a step are nearly tied
its search may choose the other one, and everything after that differs. `compare` therefore
accepts a sentence whose tokens differ from the recording only where the search of that sentence
ranks two candidates within TIE of each other (`decision_margin`, recomputed on this machine);
and there the recorded hypotheses must still get their recorded scores from the model. Anywhere
else, a token that differs is a regression, and every score must agree within 1e-4.
tests/decode/test_search_golden.py checks that comparison.

    python -m tests.search_golden   # rewrite tests/fixtures/search_golden.json (only on purpose)
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from seq2seq.config.schema import DecodeConfig, LengthPenaltyKind, PosKind, SearchKind
from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from seq2seq.decode.schedule import translate_ids
from seq2seq.decode.search import length_penalty, max_lengths, pad_sources
from seq2seq.model.transformer import EncoderDecoder
from tests.conftest import _make_model

GOLDEN = Path(__file__).resolve().parent / "fixtures" / "search_golden.json"
TIE = 1e-4  # log-probability gap under which two CPUs may rank two candidates differently
SCORE_TOLERANCE = 1e-4  # float32 rounding of a recorded score
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


def min_len_of(name: str) -> int:
    return 4 if name.endswith("min-len") else 0


def search(model: EncoderDecoder, name: str) -> list[list[list[Any]]]:
    """Per source, the hypotheses of case `name` as [tokens, score]."""
    results = translate_ids(model, sources(), CASES[name], min_len=min_len_of(name))
    return [[[h.tokens, h.score] for h in n] for n in results]


def outputs(names: list[str] | None = None) -> dict[str, Any]:
    """ "<pos>/<case>" -> per source, its hypotheses as [tokens, score], for the cases `names`
    (default: all) and two models."""
    found: dict[str, Any] = {}
    for pos in (PosKind.sinusoidal, PosKind.rope):
        model = model_of(pos)
        for name in names or list(CASES):
            found[f"{pos.value}/{name}"] = search(model, name)
    return found


# --------------------------------------------------------------------------- comparing


def step_logprobs(
    model: EncoderDecoder,
    src: torch.Tensor,
    prefixes: list[list[int]],
    step: int,
    limits: tuple[int, int],
) -> torch.Tensor:
    """log p(next token) (K, V) of K prefixes of one source (1, S), recomputed from scratch, as
    the searches mask them: never PAD or BOS, no EOS before min_len, only EOS at max_len."""
    min_len, max_len = limits
    ys = torch.tensor([[BOS_ID, *p] for p in prefixes])  # (K, step + 1)
    with torch.no_grad():
        logprobs = model.logits(src.expand(len(prefixes), -1), ys)[:, -1].log_softmax(-1)
    logprobs[:, [PAD_ID, BOS_ID]] = -math.inf
    if step + 1 < min(min_len, max_len):
        logprobs[:, EOS_ID] = -math.inf
    if step + 1 >= max_len:
        logprobs[:, [t for t in range(logprobs.size(1)) if t != EOS_ID]] = -math.inf
    return logprobs


def smallest_gap(scores: list[float]) -> float:
    """The smallest difference between two of `scores` (finite ones; inf when fewer than 2)."""
    finite = sorted((x for x in scores if math.isfinite(x)), reverse=True)
    return min((a - b for a, b in itertools.pairwise(finite)), default=math.inf)


def decision_margin(
    model: EncoderDecoder, ids: list[int], cfg: DecodeConfig, min_len: int
) -> float:
    """The smallest log-probability gap between two candidates that the search of source `ids`
    ranks against each other, over all its steps (greedy: the best token and the next; beam: the
    2K + 1 best continuations, and the finished hypotheses kept against the next). Where it is
    above TIE, every CPU makes the same choices, so the outputs must be the recorded ones."""
    src = pad_sources([ids], 1024, torch.device("cpu"))  # (1, S)
    max_len = int(max_lengths(src, cfg.max_len_a, cfg.max_len_b)[0])
    limits, gap = (min_len, max_len), math.inf
    if cfg.method == SearchKind.greedy:
        tokens: list[int] = []
        for step in range(max_len):
            logprobs = step_logprobs(model, src, [tokens], step, limits)[0]  # (V,)
            gap = min(gap, smallest_gap(logprobs.topk(2).values.tolist()))
            token = int(logprobs.argmax())
            if token == EOS_ID:
                break
            tokens.append(token)
        return gap
    k = cfg.beam_size
    beams: list[tuple[list[int], float]] = [([], 0.0)] + [([], -math.inf)] * (k - 1)
    finished: list[float] = []
    for step in range(max_len):
        logprobs = step_logprobs(model, src, [t for t, _ in beams], step, limits)  # (K, V)
        vocab = logprobs.size(1)
        cand = torch.tensor([score for _, score in beams])[:, None] + logprobs  # (K, V)
        top_score, top_index = cand.flatten().topk(2 * k + 1)
        gap = min(gap, smallest_gap(top_score.tolist()))
        alive: list[tuple[list[int], float]] = []
        for rank, (score, index) in enumerate(zip(top_score[:-1].tolist(), top_index.tolist())):
            tokens, token = beams[index // vocab][0], index % vocab
            if token == EOS_ID and rank < k and math.isfinite(score):
                norm = float(length_penalty(torch.tensor(step + 1), cfg.length_penalty, cfg.alpha))
                finished.append(score / norm)
            elif token != EOS_ID and len(alive) < k:
                alive.append(([*tokens, token], score))
        finished = sorted(finished, reverse=True)
        gap = min(gap, smallest_gap(finished[: k + 1]))
        finished = finished[:k]
        if len(finished) == k or not alive or not math.isfinite(alive[0][1]):
            break
        beams = alive + [([], -math.inf)] * (k - len(alive))
    return gap


def rescore(model: EncoderDecoder, ids: list[int], tokens: list[int], cfg: DecodeConfig) -> float:
    """A hypothesis' score recomputed by teacher forcing: its log-probability (EOS included),
    over the length penalty for beam search."""
    src = pad_sources([ids], 1024, torch.device("cpu"))  # (1, S)
    with torch.no_grad():
        logprobs = model.logits(src, torch.tensor([[BOS_ID, *tokens]]))[0].log_softmax(-1)
    total = float(logprobs.gather(1, torch.tensor([*tokens, EOS_ID])[:, None]).sum())
    if cfg.method == SearchKind.greedy:
        return total
    length = torch.tensor(len(tokens) + 1)
    return total / float(length_penalty(length, cfg.length_penalty, cfg.alpha))


def compare(
    model: EncoderDecoder,
    srcs: list[list[int]],
    case: str,
    got: list[list[list[Any]]],
    want: list[list[list[Any]]],
) -> list[int]:
    """Assert that `got` (per source, its hypotheses as [tokens, score]) is the recording `want`
    of `case` for `model`, as the module docstring says; returns the sentences accepted on a
    near-tie."""
    cfg, min_len, tied = CASES[case], min_len_of(case), []
    assert len(got) == len(want) == len(srcs)
    for i, (mine, theirs) in enumerate(zip(got, want, strict=True)):
        if [h[0] for h in mine] == [h[0] for h in theirs]:
            scores = [h[1] for h in mine]
            assert scores == pytest.approx([h[1] for h in theirs], abs=SCORE_TOLERANCE), i
            continue
        margin = decision_margin(model, srcs[i], cfg, min_len)
        assert margin < TIE, (
            f"sentence {i}: the outputs differ from the recording, but no two candidates of its "
            f"search are within {TIE} (the closest: {margin:.3g}): {mine} != {theirs}"
        )
        for tokens, score in theirs:  # the model still gives the recorded hypotheses their scores
            assert rescore(model, srcs[i], tokens, cfg) == pytest.approx(
                score, abs=SCORE_TOLERANCE
            ), (i, tokens)
        tied.append(i)
    return tied


if __name__ == "__main__":
    torch.set_num_threads(1)
    GOLDEN.write_text(json.dumps(outputs()) + "\n", encoding="utf-8")
    print(f"wrote {GOLDEN}")
