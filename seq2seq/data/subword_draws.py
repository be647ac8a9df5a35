"""Seeded segmentation draws over a SentencePiece model's pieces: BPE-dropout and unigram sampling.

SentencePiece samples segmentations itself (encode(enable_sampling=True)), but its draws cannot
be reproduced from a seed: with sentencepiece 0.2.3, `set_random_generator_seed(s)` before a draw
gives the same segmentation again within a process and another one in the next process (measured:
the same model, text and seed, four processes, four draws; ASLR and PYTHONHASHSEED fixed). A
resumed run would then train on other segmentations than the uninterrupted one. So the two
samplers are written here, as SentencePiece's own algorithms, reading its pieces and scores and
drawing from a `random.Random(seed)`: the same (model, ids, settings, seed) give the same draw in
any process, thread and Python version.

- `bpe_dropout`: SentencePiece's BPE encoder (bpe_model.cc): start from the characters of the
  normalised text, repeatedly merge the adjacent pair whose merged piece scores highest (ties: the
  leftmost), each merge skipped with probability p (Provilkov et al. 2020). At p = 0 this is the
  deterministic encode, which the tests check on every pair of a corpus.
- `unigram_sample`: Kudo (2018)'s subword sampling, x drawn with probability proportional to
  P(x)^alpha: among all segmentations by forward-filtering backward-sampling on the lattice of
  every piece that matches the text (nbest_size -1, SentencePiece's Lattice::Sample), or among the
  nbest_size best, which SentencePiece lists deterministically (NBestEncode).

The text segmented is the normalised one (the pieces of the deterministic ids joined: "▁" marks a
word start), exactly what SentencePiece's encoders see after normalisation.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass

from seq2seq.data.tokenizer import SentencePieceTokenizer


@dataclass(frozen=True)
class PieceTable:
    """The pieces of a SentencePiece model that segmentations are made of (its normal pieces:
    not the control, unknown, unused or byte ones), with their scores: the merge priority of a
    BPE model (higher merges first), the log-probability of a unigram model's piece."""

    pieces: list[str]  # every id's piece
    vocab: dict[str, tuple[int, float]]  # piece -> (id, score), the normal pieces
    longest: int  # characters of the longest normal piece

    @classmethod
    def of(cls, tok: SentencePieceTokenizer) -> PieceTable:
        """The table of `tok`'s model."""
        sp = tok.processor
        pieces = [str(sp.id_to_piece(i)) for i in range(tok.vocab_size)]
        special = (sp.is_control, sp.is_unknown, sp.is_unused, sp.is_byte)
        vocab = {
            p: (i, float(sp.get_score(i)))
            for i, p in enumerate(pieces)
            if not any(bool(test(i)) for test in special)
        }
        return cls(pieces, vocab, max((len(p) for p in vocab), default=1))

    def ids(self, pieces: list[str]) -> list[int] | None:
        """The ids of `pieces`; None when one is not a normal piece."""
        hits = [self.vocab.get(p) for p in pieces]
        return None if None in hits else [hit[0] for hit in hits if hit is not None]

    def text(self, ids: list[int]) -> str:
        """The normalised text that `ids` segment."""
        return "".join(self.pieces[i] for i in ids)


def bpe_dropout(table: PieceTable, text: str, p: float, rng: random.Random) -> list[int] | None:
    """BPE-dropout's segmentation of normalised `text` (SentencePiece's BPE merge loop, each
    merge skipped with probability `p`); None when a character is not a piece."""
    piece = list(text)  # the symbol starting at each position ("" once merged into its left)
    n = len(piece)
    prev, nxt = list(range(-1, n - 1)), [*range(1, n), -1]
    agenda: list[tuple[float, int, int, int]] = []  # (-score, left, right, merged length)

    def add(left: int, right: int) -> None:
        if left < 0 or right < 0:
            return
        merged = piece[left] + piece[right]
        hit = table.vocab.get(merged)
        if hit is not None:
            heapq.heappush(agenda, (-hit[1], left, right, len(merged)))

    for i in range(1, n):
        add(i - 1, i)
    while agenda:
        _, left, right, size = heapq.heappop(agenda)
        if not piece[left] or not piece[right] or len(piece[left]) + len(piece[right]) != size:
            continue  # one of the two was merged since: the pair is gone
        if rng.random() < p:
            continue  # dropped (Provilkov et al.: the merge is not applied this time)
        piece[left] += piece[right]
        piece[right] = ""
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prev[nxt[right]] = left
        add(prev[left], left)
        add(left, nxt[left])
    return table.ids([p for p in piece if p])


def unigram_sample(
    table: PieceTable, text: str, alpha: float, rng: random.Random
) -> list[int] | None:
    """A segmentation of normalised `text` drawn with probability proportional to
    P(x)^alpha over all of them (forward-filtering backward-sampling; Kudo 2018, Scott 2002);
    None when no segmentation into pieces exists."""
    n = len(text)
    ending: list[list[tuple[int, int, float]]] = [[] for _ in range(n + 1)]  # (start, id, score)
    for start in range(n):
        for end in range(start + 1, min(n, start + table.longest) + 1):
            hit = table.vocab.get(text[start:end])
            if hit is not None:
                ending[end].append((start, hit[0], alpha * hit[1]))
    forward = [0.0] + [-math.inf] * n  # log-sum of P^alpha over the segmentations of text[:j]
    for end in range(1, n + 1):
        terms = [forward[s] + w for s, _, w in ending[end] if forward[s] > -math.inf]
        if terms:
            top = max(terms)
            forward[end] = top + math.log(sum(math.exp(t - top) for t in terms))
    if n and forward[n] == -math.inf:
        return None
    out, end = [], n
    while end > 0:  # the last piece drawn given the rest, back to the start
        weights = [math.exp(forward[s] + w - forward[end]) for s, _, w in ending[end]]
        mark, acc, pick = rng.random() * sum(weights), 0.0, len(weights) - 1
        for k, weight in enumerate(weights):
            acc += weight
            if mark < acc:
                pick = k
                break
        start, piece_id, _ = ending[end][pick]
        out.append(piece_id)
        end = start
    return out[::-1]


def nbest_sample(
    tok: SentencePieceTokenizer,
    table: PieceTable,
    text: str,
    alpha: float,
    nbest: int,
    rng: random.Random,
) -> list[int]:
    """One of the `nbest` best segmentations of (raw) `text`, drawn with probability
    proportional to P(x)^alpha (Kudo 2018's l-best sampling; the list is SentencePiece's)."""
    best = [list(ids) for ids in tok.processor.nbest_encode_as_ids(text, nbest)]
    scores = [alpha * sum(table.vocab[table.pieces[i]][1] for i in ids) for ids in best]
    top = max(scores)
    weights = [math.exp(s - top) for s in scores]
    mark, acc = rng.random() * sum(weights), 0.0
    for ids, weight in zip(best, weights, strict=True):
        acc += weight
        if mark < acc:
            return ids
    return best[-1]
