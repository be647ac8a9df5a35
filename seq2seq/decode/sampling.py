"""Random sampling of the next token: temperature, top-k (Fan et al. 2018) and nucleus (top-p,
Holtzman et al. 2020) sampling, with draws that depend on the seed and the sentence only.

Each sample of a sentence reads its random numbers from a table drawn up front by a generator
seeded with (seed, the sentence's index in the input): one uniform number per step, turned into a
token by inverting the cumulative distribution of the step. A sentence's samples are therefore
the same whatever else is in its batch, and whatever the batch size.
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor

from seq2seq.config.schema import DecodeConfig


def sentence_generator(seed: int, sentence: int) -> torch.Generator:
    """A CPU generator seeded by (seed, sentence), unrelated to its neighbours' seeds."""
    digest = hashlib.blake2b(f"{seed}/{sentence}".encode(), digest_size=8).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)


def uniform_table(seed: int, sentences: list[int], n: int, max_len: list[int]) -> Tensor:
    """Uniform numbers in [0, 1), (B*n, L) with L = max(max_len): row i*n + j holds the draws of
    sample j of sentence i (its first max_len[i] steps; the rest of the row is unused). Sample j
    draws the same numbers whatever n is."""
    table = torch.zeros(len(sentences) * n, max(max_len))  # (B*n, L)
    for i, (sentence, length) in enumerate(zip(sentences, max_len, strict=True)):
        gen = sentence_generator(seed, sentence)
        table[i * n : (i + 1) * n, :length] = torch.rand(n, length, generator=gen)
    return table


class Sampler:
    """Draws the next token of each row from the model's distribution, sharpened or flattened by
    the temperature and restricted to the top_k tokens and to the nucleus holding top_p of the
    mass. The token's log-probability under the model itself (temperature 1, no cut) is what
    the hypothesis' score adds up."""

    def __init__(self, cfg: DecodeConfig, uniforms: Tensor) -> None:
        """uniforms (N, L): the draw of each row at each step (`uniform_table`)."""
        self.temperature, self.top_k, self.top_p = cfg.temperature, cfg.top_k, cfg.top_p
        self.uniforms = uniforms

    def __call__(self, logprobs: Tensor, rows: Tensor, step: int) -> tuple[Tensor, Tensor]:
        """Tokens (N,) for logprobs (N, V) of the rows `rows` (N,) of the table, and their
        log-probabilities (N,)."""
        probs, order = self.distribution(logprobs)  # (N, V) each, most probable first
        cumulative = probs.cumsum(-1)  # (N, V)
        target = self.uniforms[rows, step, None] * cumulative[:, -1:]  # (N, 1)
        # the first position whose cumulative mass exceeds the draw: never a zero-mass one
        position = torch.searchsorted(cumulative, target, right=True).clamp(max=probs.size(1) - 1)
        token = order.gather(1, position).squeeze(1)  # (N,)
        return logprobs.gather(1, token[:, None]).squeeze(1), token

    def distribution(self, logprobs: Tensor) -> tuple[Tensor, Tensor]:
        """Unnormalized sampling probabilities (N, V) sorted from the most probable down, zero
        outside top_k and the nucleus, and the token of each position (N, V)."""
        probs = (logprobs / self.temperature).softmax(-1)  # (N, V)
        probs, order = probs.sort(dim=-1, descending=True, stable=True)  # (N, V) each
        if 0 < self.top_k < probs.size(1):
            probs[:, self.top_k :] = 0.0
        if self.top_p < 1.0:  # keep a token while the mass before it is below top_p
            probs = probs / probs.sum(-1, keepdim=True)  # (N, V) of the top_k
            before = probs.cumsum(-1) - probs  # (N, V)
            probs = probs.masked_fill(before >= self.top_p, 0.0)
        return probs, order
