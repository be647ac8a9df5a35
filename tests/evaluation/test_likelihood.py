"""Tests for seq2seq.evaluation.likelihood: reference log-probabilities agree with the training
loss, and perplexity by target position adds up to the corpus perplexity."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from seq2seq.data.batching import collate
from seq2seq.data.tokenizer import SPECIAL_TOKENS, tokenizer_from_state
from seq2seq.evaluation.likelihood import (
    format_perplexity,
    perplexity,
    position_bucket,
    reference_logprobs,
    write_logprobs,
)
from tests.conftest import VOCAB, MakeModel


def random_pairs(n: int, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 40, (n, 2), generator=gen).tolist()
    ids = lambda k: torch.randint(4, VOCAB, (k,), generator=gen).tolist()  # noqa: E731
    return [ids(a) for a, _ in lengths], [ids(b) for _, b in lengths]


def test_sentence_nll_is_the_training_loss_without_smoothing(make_model: MakeModel) -> None:
    """Per sentence, -sum(logprobs) is the NLL that training's fused output layer and loss
    (kernels.output_loss with label smoothing 0) computes on that sentence alone; batching and
    padding (a small token budget mixes lengths) change nothing beyond float rounding."""
    model = make_model("rope", layers=2)
    src, tgt = random_pairs(12)
    logprobs = reference_logprobs(model, src, tgt, max_tokens=90)
    assert [len(lp) for lp in logprobs] == [len(t) + 1 for t in tgt]  # EOS included
    for i in range(len(src)):
        batch = collate([i], src, tgt)
        with torch.no_grad():
            _, nll = model(batch.src, batch.tgt_in, batch.tgt_out, 0.0)
        assert -sum(logprobs[i]) == pytest.approx(float(nll), rel=1e-4)


def test_perplexity_by_position_adds_up_to_the_corpus_perplexity() -> None:
    gen = torch.Generator().manual_seed(1)
    logprobs = [(-torch.rand(n, generator=gen) * 3).tolist() for n in (1, 5, 40, 70, 33)]
    report = perplexity(logprobs)
    rows = report["by_position"]
    assert isinstance(rows, list)
    tokens = sum(r["tokens"] for r in rows)
    assert tokens == report["tokens"] == 149
    nll = -sum(sum(lp) for lp in logprobs)
    assert report["ppl"] == pytest.approx(math.exp(nll / tokens))
    pooled = sum(r["tokens"] * math.log(r["ppl"]) for r in rows) / tokens  # token-weighted
    assert math.exp(pooled) == pytest.approx(report["ppl"])
    assert [r["position"] for r in rows][:2] == ["0", "1"]
    assert rows[0]["tokens"] == 5
    assert [r["position"] for r in rows][-2:] == ["32-63", "64-127"]
    assert rows[-1]["tokens"] == 70 - 64
    assert "reference perplexity" in format_perplexity(report)


def test_position_buckets() -> None:
    assert [position_bucket(p) for p in (0, 31, 32, 63, 64, 200)] == [
        "0",
        "31",
        "32-63",
        "32-63",
        "64-127",
        "128-255",
    ]


def test_json_lines_name_each_token(tmp_path: Path) -> None:
    tok = tokenizer_from_state({"kind": "word", "tokens": [*SPECIAL_TOKENS, "a", "b"]})
    ids = [tok.encode("a b"), tok.encode("b")]
    path = tmp_path / "x.jsonl"
    write_logprobs(path, [[-0.5, -1.0, -0.25], [-2.0, -0.125]], ids, tok)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows[0] == {
        "index": 0,
        "nll": 1.75,
        "tokens": 3,
        "pieces": ["a", "b", tok.id_to_token(2)],
        "logprobs": [-0.5, -1.0, -0.25],
    }
    assert rows[1]["nll"] == 2.125
    assert rows[1]["pieces"][0] == "b"
