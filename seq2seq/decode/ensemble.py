"""Ensembles: several checkpoints decoding as one model.

At every step of greedy, beam or sampling search the ensemble's scores are the mean of its
models' log-probabilities, each model running with its own key/value cache. `Ensemble` has the
methods the searches call on a model (encode, decode, new_cache), so the searches are the same
code for one model or several, and a single model does not go through it at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path

import torch
from torch import Tensor, nn

from seq2seq.data.tokenizer import Tokenizer, tokenizer_bytes
from seq2seq.model.cache import LayerCache
from seq2seq.model.transformer import EncoderDecoder
from seq2seq.train.checkpoint import CheckpointError


class Ensemble(nn.Module):
    """Models with one source and one target vocabulary, averaged in log space at each step
    (the log-linear ensembles of Hinton 2002's product of experts; the searches renormalize the
    mean with a log-softmax, so scores stay log-probabilities).

    The encoder outputs of the models travel through the search as one tensor (B, S, sum of
    their widths), and the per-layer caches as one list, both split here.
    """

    def __init__(self, models: Sequence[EncoderDecoder]) -> None:
        super().__init__()
        if not models:
            raise ValueError("an ensemble needs at least one model")
        self.models = nn.ModuleList(models)  # registered: parameters(), eval(), to()
        self.members: list[EncoderDecoder] = list(models)  # the same, typed
        self.widths = [m.cfg.d_model for m in models]  # each model's share of the memory
        self.depths = [len(m.decoder) for m in models]  # each model's share of the caches
        self.training = all(m.training for m in models)  # eval models make an eval ensemble

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) -> the models' memories side by side (B, S, sum D) and src_mask (B, S)."""
        encoded = [m.encode(src) for m in self.members]
        return torch.cat([memory for memory, _ in encoded], -1), encoded[0][1]

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        cache: list[LayerCache] | None = None,
    ) -> Tensor:
        """The mean of the models' log-probabilities (N, T, V), like EncoderDecoder.decode's
        logits (the searches take their log-softmax)."""
        memories = memory.split(self.widths, -1)  # (B, S, D_m) each
        caches = self._split(cache)
        total: Tensor | None = None
        for model, part, own in zip(self.members, memories, caches, strict=True):
            logprobs = model.decode(tgt_in, part, src_mask, own).float().log_softmax(-1)
            total = logprobs if total is None else total + logprobs  # (N, T, V)
        assert total is not None
        return total / len(self.models)

    def _split(self, cache: list[LayerCache] | None) -> list[list[LayerCache] | None]:
        if cache is None:
            return [None] * len(self.models)
        bounds = torch.tensor([0, *self.depths]).cumsum(0).tolist()
        return [cache[a:b] for a, b in pairwise(bounds)]

    def add_sentences(
        self,
        cache: list[LayerCache],
        memory: Tensor,
        src_mask: Tensor,
        slots: Tensor | None = None,
    ) -> None:
        """Each model's `add_sentences`, with its share of the memory and of the caches."""
        memories = memory.split(self.widths, -1)  # (B', S, D_m) each
        for model, part, own in zip(self.members, memories, self._split(cache), strict=True):
            assert own is not None
            model.add_sentences(own, part, src_mask, slots)

    def new_cache(self, capacity: int = 0) -> list[LayerCache]:
        """The models' per-layer caches, one list (first model's layers first)."""
        return [c for m in self.members for c in m.new_cache(capacity)]


SearchModel = EncoderDecoder | Ensemble  # what the searches decode with


def check_same_vocabularies(
    paths: Sequence[str | Path], tokenizers: Sequence[tuple[Tokenizer, Tokenizer]]
) -> None:
    """Refuse an ensemble whose checkpoints do not share the first one's source and target
    tokenizers (their ids would mean different words), naming the file."""
    first = [tokenizer_bytes(t) for t in tokenizers[0]]
    for path, pair in zip(paths[1:], tokenizers[1:], strict=True):
        for side, tok, want in zip(("source", "target"), pair, first, strict=True):
            if tokenizer_bytes(tok) != want:
                raise CheckpointError(
                    f"{path}: its {side} vocabulary differs from that of {paths[0]}; an "
                    "ensemble needs checkpoints trained with the same tokenizers"
                )
