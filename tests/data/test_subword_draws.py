"""The seeded segmentation draws (seq2seq/data/subword_draws.py): BPE-dropout is SentencePiece's
BPE encoder at p = 0 and every character at p = 1; unigram sampling draws each segmentation with
probability proportional to P(x)^alpha; the same seed gives the same draw in another process."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from collections import Counter

import pytest

from seq2seq.data.subword_draws import PieceTable, bpe_dropout, nbest_sample, unigram_sample
from seq2seq.data.tokenizer import UNK_ID, SentencePieceTokenizer, train_sentencepiece
from tests.tiny_run import REPO, write_slice


@pytest.fixture(scope="module")
def lines(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    data = write_slice(tmp_path_factory.mktemp("draws") / "data")
    return [
        *(data / "train.en").read_text().splitlines(),
        *(data / "train.de").read_text().splitlines(),
    ]


@pytest.fixture(scope="module")
def models(lines: list[str]) -> dict[str, SentencePieceTokenizer]:
    return {kind: train_sentencepiece(kind, lines, vocab_size=200) for kind in ("bpe", "unigram")}


def segmentations(table: PieceTable, text: str) -> list[list[int]]:
    """Every segmentation of `text` into normal pieces (a short text: exponential)."""
    if not text:
        return [[]]
    out = []
    for end in range(1, len(text) + 1):
        hit = table.vocab.get(text[:end])
        if hit is not None:
            out += [[hit[0], *rest] for rest in segmentations(table, text[end:])]
    return out


def test_bpe_at_p0_is_sentencepieces_encode_and_at_p1_the_characters(
    lines: list[str], models: dict[str, SentencePieceTokenizer]
) -> None:
    tok = models["bpe"]
    table = PieceTable.of(tok)
    for line in lines:
        ids = tok.encode(line)
        assert UNK_ID not in ids
        text = table.text(ids)
        assert bpe_dropout(table, text, 0.0, random.Random(1)) == ids
        assert bpe_dropout(table, text, 1.0, random.Random(1)) == table.ids(list(text))


def test_bpe_dropout_draws_other_segmentations_of_the_same_text(
    lines: list[str], models: dict[str, SentencePieceTokenizer]
) -> None:
    tok = models["bpe"]
    table = PieceTable.of(tok)
    changed = 0
    for k, line in enumerate(lines):
        ids = tok.encode(line)
        drawn = bpe_dropout(table, table.text(ids), 0.3, random.Random(k))
        assert drawn is not None
        assert tok.decode(drawn) == tok.decode(ids)
        assert drawn == bpe_dropout(table, table.text(ids), 0.3, random.Random(k))
        changed += drawn != ids
        assert len(drawn) >= len(ids)  # skipped merges: never fewer pieces than the best
    assert changed > 0.9 * len(lines)


def test_unigram_draws_each_segmentation_with_probability_proportional_to_p_to_the_alpha(
    models: dict[str, SentencePieceTokenizer],
) -> None:
    """Over every segmentation of a short text, 20,000 seeded draws against the exact
    distribution (a fixed sample: the test is deterministic)."""
    tok = models["unigram"]
    table = PieceTable.of(tok)
    text = table.text(tok.encode("two hundred"))
    every = segmentations(table, text)
    assert len(every) >= 5
    for alpha in (0.2, 1.0):
        logits = [alpha * sum(table.vocab[table.pieces[i]][1] for i in ids) for ids in every]
        top = max(logits)
        z = sum(math.exp(x - top) for x in logits)
        exact = {tuple(ids): math.exp(x - top) / z for ids, x in zip(every, logits, strict=True)}
        draws = Counter(
            tuple(unigram_sample(table, text, alpha, random.Random(seed)) or [])
            for seed in range(20_000)
        )
        assert set(draws) <= set(exact)
        worst = max(abs(draws[ids] / 20_000 - p) for ids, p in exact.items())
        assert worst < 0.01, alpha  # binomial std at most 0.0035
    flat = Counter(
        tuple(unigram_sample(table, text, 0.0, random.Random(s)) or []) for s in range(2_000)
    )
    assert len(flat) > 0.6 * len(every)  # alpha 0: uniform over the segmentations


def test_nbest_sampling_draws_among_sentencepieces_best(
    models: dict[str, SentencePieceTokenizer],
) -> None:
    tok = models["unigram"]
    table = PieceTable.of(tok)
    text = "three thousand and forty"
    best = [list(ids) for ids in tok.processor.nbest_encode_as_ids(text, 4)]
    draws = [nbest_sample(tok, table, text, 0.5, 4, random.Random(s)) for s in range(200)]
    assert all(d in best for d in draws)
    assert len({tuple(d) for d in draws}) >= 2


DRAW_SCRIPT = """
import json, random, sys
from seq2seq.data.subword_draws import PieceTable, bpe_dropout, unigram_sample
from seq2seq.data.tokenizer import SentencePieceTokenizer
kind, model, texts = json.loads(sys.stdin.read())
table = PieceTable.of(SentencePieceTokenizer(kind, bytes.fromhex(model)))
draw = bpe_dropout if kind == "bpe" else unigram_sample
print(json.dumps([draw(table, t, 0.2, random.Random(1000 + k)) for k, t in enumerate(texts)]))
"""


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_the_same_seed_draws_the_same_segmentation_in_another_process(
    lines: list[str], models: dict[str, SentencePieceTokenizer], kind: str
) -> None:
    """What SentencePiece's own sampler does not do (subword_draws' docstring): a resumed run
    is a new process."""
    tok = models[kind]
    table = PieceTable.of(tok)
    texts = [table.text(tok.encode(line)) for line in lines[:40]]
    draw = bpe_dropout if kind == "bpe" else unigram_sample
    here = [draw(table, t, 0.2, random.Random(1000 + k)) for k, t in enumerate(texts)]
    model = tok.state()["model"]
    assert isinstance(model, bytes)
    payload = json.dumps([kind, model.hex(), texts])
    for _ in range(2):
        child = subprocess.run(
            [sys.executable, "-c", DRAW_SCRIPT],
            input=payload,
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
        )
        assert json.loads(child.stdout) == here


def test_a_text_with_a_character_outside_the_pieces_is_not_drawn(
    models: dict[str, SentencePieceTokenizer],
) -> None:
    for kind, draw in (("bpe", bpe_dropout), ("unigram", unigram_sample)):
        table = PieceTable.of(models[kind])
        assert draw(table, "▁two€", 0.1, random.Random(0)) is None, kind
        assert draw(table, "", 0.1, random.Random(0)) == [], kind


def test_piece_table_holds_the_normal_pieces_only(
    models: dict[str, SentencePieceTokenizer],
) -> None:
    for tok in models.values():
        table = PieceTable.of(tok)
        assert len(table.pieces) == tok.vocab_size
        assert not {"<pad>", "<s>", "</s>", "<unk>"} & set(table.vocab)
        assert all(table.pieces[i] == p for p, (i, _) in table.vocab.items())
        assert table.longest == max(len(p) for p in table.vocab)
