"""Positional encodings behind three hooks that attention always calls.

1. `embed(x, offset)`: added to the scaled token embeddings (absolute encodings).
2. `rotate(x, offset)`: applied to queries and keys before the dot product (rotary).
3. `bias(q, q_offset, k_len)`: added to the attention logits (relative encodings). A variant whose
   relative term also reaches the values (Shaw et al.) sets `needs_weights` and adds `values`.

The base class does nothing in every hook: it *is* the `none` variant. The variants are in
absolute.py (sinusoidal, learned, rotary) and relative.py (ALiBi, T5, Shaw, KERPLE, FIRE);
transformer.py's build_positional builds one from its config. Attention never looks at a
variant's name; it calls the hooks. A stack (encoder or decoder) has one encoding; the
self-attention of its layer i calls `encoding.layer(i)`, the encoding itself unless the variant
keeps parameters per layer (`PerLayer`, pos_encoding.share_layers=false). Cross-attention gets
the base class, so it carries no positional terms. Positions count from `offset`, so incremental
decoding with a key/value cache sees the same positions as full recomputation. `offset` is one
int for every row, or a tensor (N,) with each row's own (greedy decoding with continuous
batching decodes sentences that started at different steps side by side); the hooks' outputs
then have one row per row of x where they would have had one for all.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

Offset = int | Tensor  # the position of the first token: one for all rows, or (N,) one per row


class PositionalEncoding(nn.Module):
    """No positional information ("none"), and the three hooks every encoding overrides: here each
    is the identity. The encoder then sees a bag of tokens; a causal decoder can still infer
    positions from its mask (Haviv et al. 2022, "Transformer Language Models without Positional
    Encodings Still Learn Positional Information", Findings of EMNLP)."""

    needs_weights = False  # True when `values` must see the attention weights

    def embed(self, x: Tensor, offset: Offset = 0) -> Tensor:
        """x (B, T, D) plus the encoding of positions from `offset` (here: x)."""
        return x  # (B, T, D)

    def rotate(self, x: Tensor, offset: Offset = 0) -> Tensor:
        """Queries or keys x (B, H, T, Dh) of positions from `offset`, rotated (here: x)."""
        return x  # (B, H, T, Dh)

    def bias(self, q: Tensor, q_offset: Offset, k_len: int) -> Tensor | None:
        """The term added to the attention logits of queries q (B, H, Tq, Dh) at positions from
        `q_offset` over k_len keys (here: None)."""
        return None  # else (B or 1, H or 1, Tq, Tk)

    def values(self, weights: Tensor, q_offset: Offset) -> Tensor | None:
        """The term added to the output, from the attention weights (B, H, Tq, Tk) (here: None)."""
        return None  # else (B, H, Tq, Dh), added to the attention output

    def untrained(self, length: int) -> str | None:
        """What training on positions 0 .. length - 1 cannot train of this encoding's parameters
        (or a mechanism of it that never acts there), in words; None when it trains it all."""
        return None

    def image(self) -> Tensor | None:
        """A 2-D picture of the learned or fixed table, for TensorBoard (None if there is none)."""
        return None

    def layer(self, i: int) -> PositionalEncoding:
        """The encoding the self-attention of layer i calls: this one, shared by the stack."""
        return self


class PerLayer(PositionalEncoding):
    """One encoding per layer of a stack, each with its own parameters (Shaw et al. 2018's
    tensor2tensor code creates the relative tables inside every layer's attention).

    Meant for variants whose hooks live in attention (bias, values); `layer(i)` gives layer i's.
    Called directly, the hooks are those of layer 0.
    """

    def __init__(self, layers: list[PositionalEncoding]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.needs_weights = layers[0].needs_weights

    @property
    def first(self) -> PositionalEncoding:
        """Layer 0's encoding, whose hooks this one calls when called directly."""
        return self.layers[0]  # type: ignore[return-value]

    def layer(self, i: int) -> PositionalEncoding:
        """Layer i's own encoding."""
        if not 0 <= i < len(self.layers):
            raise ValueError(
                f"this encoding holds {len(self.layers)} per-layer tables but layer {i} asked "
                "for one: build it with n_layers = the stack's layer count"
            )
        return self.layers[i]  # type: ignore[return-value]

    def embed(self, x: Tensor, offset: Offset = 0) -> Tensor:
        """Layer 0's `embed`."""
        return self.first.embed(x, offset)  # (B, T, D)

    def rotate(self, x: Tensor, offset: Offset = 0) -> Tensor:
        """Layer 0's `rotate`."""
        return self.first.rotate(x, offset)  # (B, H, T, Dh)

    def bias(self, q: Tensor, q_offset: Offset, k_len: int) -> Tensor | None:
        """Layer 0's `bias`."""
        return self.first.bias(q, q_offset, k_len)  # (B or 1, H, Tq, Tk) or None

    def values(self, weights: Tensor, q_offset: Offset) -> Tensor | None:
        """Layer 0's `values`."""
        return self.first.values(weights, q_offset)  # (B, H, Tq, Dh) or None

    def untrained(self, length: int) -> str | None:
        """Layer 0's note, said of every layer (they are built alike)."""
        note = self.first.untrained(length)
        return None if note is None else f"{note} (in each of the {len(self.layers)} layers)"

    def image(self) -> Tensor | None:
        """Layer 0's `image`."""
        return self.first.image()


def positions(offset: Offset, length: int, device: torch.device) -> Tensor:
    """The positions of `length` tokens from `offset`: (1, T) for an int, (N, T) per row."""
    steps = torch.arange(length, device=device)  # (T,)
    if isinstance(offset, Tensor):
        return offset[:, None] + steps  # (N, T)
    return (steps + offset)[None]  # (1, T)


def relative_positions(q_offset: Offset, q_len: int, k_len: int, device: torch.device) -> Tensor:
    """Key position minus query position for every query/key pair, (1 or N, Tq, Tk); keys sit
    at positions 0 .. k_len - 1 in every row."""
    q_pos = positions(q_offset, q_len, device)  # (1|N, Tq)
    k_pos = torch.arange(k_len, device=device)  # (Tk,)
    return k_pos - q_pos[:, :, None]  # (1|N, Tq, Tk)
