"""Synthetic translation systems with known truths, for the significance tests: references drawn
from a small vocabulary, hypotheses the references with each word replaced by a random word at
some rate. Two systems with the same rate differ only by noise; a lower rate is a truly better
system. Every draw takes a seeded generator."""

from __future__ import annotations

import numpy as np

VOCAB = np.array([f"w{i}" for i in range(40)])


def make_references(rng: np.random.Generator, n: int) -> list[str]:
    """N reference sentences of 8 to 15 words."""
    return [" ".join(rng.choice(VOCAB, size=int(rng.integers(8, 16)))) for _ in range(n)]


def corrupt(rng: np.random.Generator, references: list[str], rate: float) -> list[str]:
    """Each reference with every word replaced by a random word with probability ``rate``."""
    out = []
    for ref in references:
        words = ref.split()
        replace = rng.random(len(words)) < rate
        substitutes = rng.choice(VOCAB, size=len(words))
        out.append(
            " ".join(s if r else w for w, s, r in zip(words, substitutes, replace, strict=True))
        )
    return out
