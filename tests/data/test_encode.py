"""bulk.py: the word-cached SentencePiece encoding equals SentencePiece's own, line for line."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np
import pytest

from seq2seq.data.encode import MAX_CACHED_WORDS, WordCache, encode_chunk, encode_flat, init_worker
from seq2seq.data.tokenizer import SentencePieceTokenizer, build_vocab, train_sentencepiece

REPO = Path(__file__).resolve().parents[2]
MULTI30K = Path(os.environ.get("MULTI30K_ROOT", REPO / ".." / "shared" / "data" / "multi30k"))
# text whose normalisation adds, removes or moves a word boundary, or that has no words
ODD = [
    "a\u00a0b",  # no-break space: a space after NFKC
    "ﬁne day",  # ligature: "fi" after NFKC
    " x  y ",  # extra spaces
    "\tz\tw",
    "",
    "   ",
    "a\u200bb c",  # zero-width space
    "e\u0301 f",  # combining accent
    "½ 3",
    "\u3000x",  # ideographic space
    "Ｈｅｌｌｏ world",  # noqa: RUF001 - full-width letters, on purpose
    "a\x01b",  # control character
    "x \u0301y",  # a combining mark starting a word
    "ŉ ǆ",
    "a\x00b",  # the cache's own line break
    "Straße übermäßig Œuvre",
]


def lines_of(split: str) -> list[str]:
    """Multi30k's first 3000 lines in English, German and French, or the numbers data."""
    if MULTI30K.is_dir():
        found = []
        for lang in ("en", "de", "fr"):
            with gzip.open(MULTI30K / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                found += f.read().split("\n")[:3000]
        return found
    split = {"val": "valid"}.get(split, split)  # the numbers data's name of it
    with gzip.open(
        REPO / "seq2seq" / "data" / "numbers" / f"{split}.en.gz", "rt", encoding="utf-8"
    ) as f:
        return f.read().split("\n")[:3000]


@pytest.fixture(scope="module")
def tokenizer() -> SentencePieceTokenizer:
    tok = train_sentencepiece("bpe", lines_of("train") + ODD, vocab_size=500)
    assert isinstance(tok, SentencePieceTokenizer)
    return tok


def split_rows(flat: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
    return [row.tolist() for row in np.split(flat, np.cumsum(lengths)[:-1])] if len(lengths) else []


@pytest.mark.parametrize("extra", [[], ODD, ODD * 3])
def test_word_cache_equals_sentencepiece(
    tokenizer: SentencePieceTokenizer, extra: list[str]
) -> None:
    cache = WordCache(tokenizer)
    for batch in (lines_of("train")[:2000] + extra, extra + lines_of("val"), extra):
        flat, lengths = cache.encode(batch)
        assert len(lengths) == len(batch)
        assert split_rows(flat, lengths) == tokenizer.encode_batch(batch)


@pytest.fixture(scope="module")
def folding() -> SentencePieceTokenizer:
    tok = train_sentencepiece("bpe", lines_of("train") + ODD, vocab_size=500, lowercase=True)
    assert isinstance(tok, SentencePieceTokenizer)
    return tok


# capitals whose folding is not one-to-one, or not str.lower's
CAPITALS = ["ÖFFNET die TÜR", "İstanbul ǅemal", "ΣΟΦΟΣ ﬁNE", "Straße STRASSE", "ＡＢＣ x"]  # noqa: RUF001


@pytest.mark.parametrize("extra", [[], ODD + CAPITALS])
def test_word_cache_equals_sentencepiece_when_it_folds_case(
    folding: SentencePieceTokenizer, extra: list[str]
) -> None:
    cache = WordCache(folding)
    assert folding.lowercase
    assert cache.is_plain("A")
    assert cache.is_plain("Ä")
    for batch in (lines_of("train")[:2000] + extra, extra + lines_of("val")):
        flat, lengths = cache.encode(batch)
        assert split_rows(flat, lengths) == folding.encode_batch(batch)


def test_odd_lines_are_encoded_whole(tokenizer: SentencePieceTokenizer) -> None:
    cache = WordCache(tokenizer)
    assert cache.is_plain("é")
    assert cache.is_plain("ß")
    assert cache.is_plain(" ")
    assert not any(cache.is_plain(c) for c in "\u00a0\t\u3000ﬁ\x00\x01\u200b")


def test_cache_is_emptied_when_full(
    tokenizer: SentencePieceTokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("seq2seq.data.encode.MAX_CACHED_WORDS", 50)
    cache = WordCache(tokenizer)
    batch = lines_of("train")[:300]
    for _ in range(2):
        flat, lengths = cache.encode(batch)
        assert split_rows(flat, lengths) == tokenizer.encode_batch(batch)
        assert len(cache.index) <= len(set(" ".join(batch).split())) + 1
    assert MAX_CACHED_WORDS > 50


def test_encode_chunk_marks_blank_pairs_and_handles_vocab_tokenizers() -> None:
    tok = build_vocab("char", ["abc", "de f"], vocab_size=20)
    init_worker({"src": tok.state(), "tgt": tok.state()})
    src, tgt = ["ab", "  ", "f d", ""], ["c", "x", "\t", "e"]
    src_ids, src_lens, tgt_ids, tgt_lens, blank = encode_chunk((src, tgt))
    assert split_rows(src_ids, src_lens) == tok.encode_batch(src)
    assert split_rows(tgt_ids, tgt_lens) == tok.encode_batch(tgt)
    assert blank.tolist() == [False, True, True, True]
    flat, lengths = encode_flat(tok, [])
    assert len(flat) == len(lengths) == 0
