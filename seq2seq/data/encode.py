"""Encoding many lines at once into flat token arrays: the worker side of seq2seq-prepare.

`encode_flat(tokenizer, lines)` returns every line's ids concatenated into one numpy array and
the lines' lengths: the layout of a prepared corpus (prepared.py), with no Python list per line.

SentencePiece segments each whitespace-separated word on its own (pieces never span a word
boundary: `split_by_whitespace`, its default and ours), so a line's ids are the concatenation
of its words' ids. `WordCache` encodes each distinct word once and reuses it: on real text most
words repeat, and this is several times faster than encoding whole lines. It is exact only when
SentencePiece's normalisation neither adds, removes nor moves a word boundary, so a line takes
the cached path only when every character in it is *plain*: a space, or a character that the
model's normaliser leaves unchanged between two letters (`x?x` -> `x?x`), or turns into one
other letter there (a case-folding model's `xAx` -> `xax`). Other lines (tabs,
no-break spaces, ligatures, control or zero-width characters, ...) are encoded whole by
SentencePiece. tests/data/test_encode.py checks the two agree on Multi30k and on adversarial text.

The worker functions (`init_worker`, `encode_chunk`) run in seq2seq-prepare's process pool; they
import numpy and the tokenizer only (no torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np

from seq2seq.data.tokenizer import SentencePieceTokenizer, Tokenizer, tokenizer_from_state

# the line break between words; never plain, so the lines that hold one are encoded whole
BREAK = "\x00"
MAX_CACHED_WORDS = 2_000_000  # a worker's cache is emptied when it grows past this many words


class WordCache:
    """Word-level memo of a SentencePiece model's encoding (Kudo & Richardson 2018: pieces are
    found within whitespace-delimited words, so a line is the concatenation of its words).

    Words get numbers (`index`; 0 is BREAK, the line break, with no pieces); word `w`'s pieces are
    `pieces[start[w] : start[w] + count[w]]`. A chunk of lines then becomes one `str.split`, one
    dictionary lookup per word and a numpy gather."""

    def __init__(self, tokenizer: SentencePieceTokenizer) -> None:
        self.sp = tokenizer.processor
        self.plain: dict[str, bool] = {" ": True, BREAK: False}
        self.clear()

    def clear(self) -> None:
        """Forget every word (the cache starts again when it grows past MAX_CACHED_WORDS)."""
        self.index: dict[str, int] = {BREAK: 0}
        self.pieces: list[int] = []
        self.counts: list[int] = [0]
        self.tables = (np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(1, np.int64))

    def is_plain(self, char: str) -> bool:
        """Whether `char` can be cut around: not whitespace other than a space, and unchanged by
        the model's normaliser between two letters, or made one other letter (case folding)."""
        known = self.plain.get(char)
        if known is None:
            out = self.sp.normalize(f"x{char}x")  # "▁x" + what char became + "x"
            kept = out[2:-1] == char or (len(out) == 4 and out[2].isalpha())  # or case-folded
            known = not char.isspace() and out[:2] == "\u2581x" and out[-1] == "x" and kept
            self.plain[char] = known
        return known

    def add(self, words: list[str]) -> None:
        """Encode the words not cached yet, in one SentencePiece call."""
        missing = list(set(words).difference(self.index))
        if len(self.index) + len(missing) > MAX_CACHED_WORDS:
            self.clear()
            missing = list(set(words).difference(self.index))
        for word, ids in zip(missing, self.sp.encode(missing, out_type=int), strict=True):
            self.index[word] = len(self.counts)
            self.pieces += ids
            self.counts.append(len(ids))
        counts = np.asarray(self.counts, dtype=np.int64)  # (words,)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])  # (words,)
        self.tables = (np.asarray(self.pieces, dtype=np.int64), starts, counts)

    def word_numbers(self, words: list[str]) -> np.ndarray:
        """The cache's number of every word, encoding the new ones first."""
        try:
            return np.fromiter(map(self.index.__getitem__, words), np.int64, len(words))
        except KeyError:
            self.add(words)
            return np.fromiter(map(self.index.__getitem__, words), np.int64, len(words))

    def encode(self, lines: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(flat ids, per-line lengths) of `lines`, as int64 arrays."""
        if not lines:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        odd = {c for c in set("".join(lines)) if not self.is_plain(c)}
        whole = [i for i, line in enumerate(lines) if odd and not odd.isdisjoint(line)]
        kept = list(lines)
        for i in whole:
            kept[i] = ""
        words = f" {BREAK} ".join(kept).split()  # lines apart by BREAK words
        number = self.word_numbers(words)  # (W,)
        pieces, starts, counts = self.tables
        n = counts[number]  # (W,) pieces of each word
        ends = np.cumsum(n)  # (W,)
        gather = np.repeat(starts[number] - (ends - n), n) + np.arange(ends[-1] if len(n) else 0)
        flat = pieces[gather]  # (tokens,)
        breaks = ends[number == 0]  # (lines - 1,) tokens before each line break
        bounds = np.concatenate([[0], breaks, [len(flat)]])  # (lines + 1,)
        lengths = np.diff(bounds)  # (lines,)
        if whole:
            return splice(flat, lengths, whole, self.sp.encode([lines[i] for i in whole]))
        return flat, lengths


def splice(
    flat: np.ndarray, lengths: np.ndarray, rows: list[int], encoded: list[list[int]]
) -> tuple[np.ndarray, np.ndarray]:
    """Put `encoded[k]` as the ids of line `rows[k]` (empty in `flat` so far)."""
    starts = np.concatenate([[0], np.cumsum(lengths)])  # (lines + 1,)
    parts, prev = [], 0
    for row, ids in zip(rows, encoded, strict=True):
        parts += [flat[prev : starts[row]], np.asarray(ids, dtype=np.int64)]
        prev = starts[row]
        lengths[row] = len(ids)
    parts.append(flat[prev:])
    return np.concatenate(parts), lengths


def encode_flat(
    tokenizer: Tokenizer, lines: Sequence[str], cache: WordCache | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(flat ids, per-line lengths) of `lines` (int64): `cache` for SentencePiece models, else
    the tokenizer's own batch encoding."""
    if cache is not None:
        return cache.encode(lines)
    rows = tokenizer.encode_batch(lines)
    flat = np.fromiter(chain.from_iterable(rows), dtype=np.int64)
    return flat, np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))


# --------------------------------------------------------------------------- worker processes

_WORKER: dict[str, tuple[Tokenizer, WordCache | None]] = {}


def init_worker(states: dict[str, dict[str, object]]) -> None:
    """Pool initializer: build the tokenizers of `states` ("src", "tgt") once per process."""
    for side, state in states.items():
        tok = tokenizer_from_state(state)
        cache = WordCache(tok) if isinstance(tok, SentencePieceTokenizer) else None
        _WORKER[side] = (tok, cache)


def encode_chunk(chunk: tuple[list[str], list[str]]) -> tuple[np.ndarray, ...]:
    """Source ids, source lengths, target ids, target lengths of a chunk of line pairs, and
    which pairs are blank (a side with no text but whitespace)."""
    src, tgt = chunk
    src_ids, src_lens = encode_flat(_WORKER["src"][0], src, _WORKER["src"][1])
    tgt_ids, tgt_lens = encode_flat(_WORKER["tgt"][0], tgt, _WORKER["tgt"][1])
    blank = np.fromiter((not (s.strip() and t.strip()) for s, t in zip(src, tgt)), bool, len(src))
    return src_ids, src_lens, tgt_ids, tgt_lens, blank
