"""Scoring references with a model: the teacher-forced log-probability of each reference token
(EOS included, no label smoothing), corpus perplexity, and perplexity by target position.

`seq2seq-evaluate ckpt=... split=... score_refs=true` writes one JSON line per sentence and
reports the perplexities. Corpus perplexity is exp(total NLL / total target tokens), the EOS of
each sentence counted as a token, as validation's `valid/ppl` is (on all sentences).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

import torch

from seq2seq.data.batching import collate, token_batches
from seq2seq.data.tokenizer import EOS_ID, Tokenizer
from seq2seq.model.transformer import EncoderDecoder

EXACT_POSITIONS = 32  # positions 0-31 are reported one by one, later ones in doubling ranges


@torch.no_grad()
def reference_logprobs(
    model: EncoderDecoder,
    src_ids: Sequence[list[int]],
    tgt_ids: Sequence[list[int]],
    max_tokens: int,
) -> list[list[float]]:
    """log p(y_t | y_<t, x) of every target token, EOS last: len(tgt_ids[i]) + 1 values for
    sentence i, in input order. Batches under a `max_tokens` budget, as validation's."""
    device = next(model.parameters()).device
    out: list[list[float]] = [[] for _ in src_ids]
    lens = [max(len(a), len(b)) + 1 for a, b in zip(src_ids, tgt_ids, strict=True)]
    for index in token_batches(lens, lens, max_tokens, shuffle=False):
        batch = collate(index, src_ids, tgt_ids).to(device)
        lprobs = model.logits(batch.src, batch.tgt_in).float().log_softmax(-1)  # (B, T, V)
        picked = lprobs.gather(-1, batch.tgt_out[..., None]).squeeze(-1)  # (B, T)
        for row, i in enumerate(index):
            out[i] = picked[row, : len(tgt_ids[i]) + 1].tolist()
    return out


def position_bucket(position: int) -> str:
    """ "0" ... "31", then "32-63", "64-127", ...: later positions are rarer, so they share."""
    if position < EXACT_POSITIONS:
        return str(position)
    low = 1 << (position.bit_length() - 1)
    return f"{low}-{2 * low - 1}"


def perplexity(logprobs: Sequence[Sequence[float]]) -> dict[str, object]:
    """Corpus NLL, token count and perplexity, and the same for each target position bucket."""
    buckets: dict[str, list[float]] = {}  # bucket -> [nll, tokens]
    for sentence in logprobs:
        for position, lp in enumerate(sentence):
            totals = buckets.setdefault(position_bucket(position), [0.0, 0.0])
            totals[0] -= lp
            totals[1] += 1
    nll, tokens = sum(b[0] for b in buckets.values()), sum(b[1] for b in buckets.values())
    return {
        "tokens": int(tokens),
        "nll": nll,
        "ppl": math.exp(nll / tokens) if tokens else math.nan,
        "by_position": [
            {"position": name, "tokens": int(n), "nll": s, "ppl": math.exp(s / n)}
            for name, (s, n) in buckets.items()
        ],
    }


def write_logprobs(
    path: Path, logprobs: Sequence[list[float]], tgt_ids: Sequence[list[int]], tgt_tok: Tokenizer
) -> None:
    """One JSON line per sentence: its index (0-based line of the split), summed NLL, token
    count (EOS included), the tokens and their log-probabilities."""
    with path.open("w", encoding="utf-8") as f:
        for i, (lps, ids) in enumerate(zip(logprobs, tgt_ids, strict=True)):
            tokens = [tgt_tok.id_to_token(t) for t in [*ids, EOS_ID]]
            line = {"index": i, "nll": -sum(lps), "tokens": len(lps), "pieces": tokens}
            f.write(json.dumps({**line, "logprobs": [round(x, 5) for x in lps]}) + "\n")


def format_perplexity(report: dict[str, object]) -> str:
    """Corpus perplexity, then a table of perplexity by target position."""
    lines = [f"reference perplexity {report['ppl']:.3f} ({report['tokens']} tokens, EOS included)"]
    lines.append(f"{'target position':>16} {'tokens':>8} {'ppl':>9}")
    for row in report["by_position"]:  # type: ignore[attr-defined]
        lines.append(f"{row['position']:>16} {row['tokens']:>8} {row['ppl']:>9.3f}")
    return "\n".join(lines)
