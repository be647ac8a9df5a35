"""Absolute positional encodings: the `embed` hook (sinusoidal, learned) and the `rotate` hook
(rotary), each position encoded by itself (seq2seq/model/positional.py has the hooks)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from seq2seq.errors import ConfigError
from seq2seq.model.positional import Offset, PositionalEncoding, positions


def sinusoid_table(length: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))."""
    pos = torch.arange(length, dtype=torch.float64)[:, None]  # (T, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (D/2,)
    angle = pos / torch.pow(10000.0, two_i / d_model)  # (T, D/2)
    table = torch.zeros(length, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.float()  # (T, D)


def _end(offset: Offset, length: int) -> int:
    """One past the last position of `length` tokens from `offset` (the largest, per row)."""
    return (int(offset.max()) if isinstance(offset, Tensor) else offset) + length


def _rows(table: Tensor, offset: Offset, length: int) -> Tensor:
    """The rows of a per-position table (P, E) for `length` tokens from `offset`: (T, E) for
    an int offset, (N, T, E) for one per row."""
    if isinstance(offset, Tensor):
        return table[positions(offset, length, table.device)]  # (N, T, E)
    return table[offset : offset + length]  # (T, E)


class Sinusoidal(PositionalEncoding):
    """Fixed sinusoids added to the embeddings (Vaswani et al. 2017)."""

    table: Tensor  # (max_len, D), a buffer

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.d_model = d_model
        self.register_buffer("table", sinusoid_table(max_len, d_model), persistent=False)

    def embed(self, x: Tensor, offset: Offset = 0) -> Tensor:
        """x (B, T, D) plus the sinusoids of positions from `offset` (the table grows)."""
        end = _end(offset, x.size(1))
        if end > self.table.size(0):  # grow on demand: the formula has no length limit
            with torch.inference_mode(False):  # a table grown while decoding serves training too
                self.table = sinusoid_table(2 * end, self.d_model).to(x.device)
        return x + _rows(self.table, offset, x.size(1)).to(x.dtype)  # (B, T, D)

    def image(self) -> Tensor:
        """The sinusoids of the first 128 positions (T, D)."""
        return self.table[:128]  # (T, D)


class Learned(PositionalEncoding):
    """A trained embedding per absolute position (Gehring et al. 2017; Devlin et al. 2019)."""

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.table = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.table.weight, std=d_model**-0.5)

    def embed(self, x: Tensor, offset: Offset = 0) -> Tensor:
        """x (B, T, D) plus the learned embeddings of positions from `offset`."""
        end = _end(offset, x.size(1))
        if end > self.table.num_embeddings:  # a UserError: the CLIs print it as one line
            raise ConfigError(
                f"learned positions stop at {self.table.num_embeddings} but position {end - 1} "
                "was asked for: raise pos_encoding.max_len or lower data.max_len"
            )
        return x + _rows(self.table.weight, offset, x.size(1)).to(x.dtype)  # (B, T, D)

    def untrained(self, length: int) -> str | None:
        """The rows past the longest training position."""
        n = self.table.num_embeddings
        if length >= n:
            return None
        return f"learned: rows {length}..{n - 1} ({n - length} of {n}) never get a gradient"

    def image(self) -> Tensor:
        """The embeddings of the first 128 positions (T, D)."""
        return self.table.weight.detach()[:128]  # (T, D)


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)  # (..., Dh/2) each
    return torch.cat((-x2, x1), dim=-1)  # (..., Dh)


class Rotary(PositionalEncoding):
    """Rotary position embedding on queries and keys (Su et al. 2021, "RoFormer").

    Channel i is paired with channel i + Dh/2 (the GPT-NeoX layout), so q.k depends only on the
    offset between the two positions.
    """

    inv_freq: Tensor  # (Dh/2,), a buffer
    _cos: Tensor  # (T, Dh) cached cosines
    _sin: Tensor  # (T, Dh) cached sines

    def __init__(self, head_dim: int, base: float) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rope needs an even head dimension, got {head_dim}")
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # (Dh/2,)
        self._cos = self._sin = torch.empty(0)

    def tables(self, end: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """The cosines and sines (P, Dh) of positions 0 .. P - 1, P >= end (grown as needed)."""
        if self._cos.size(0) < end or self._cos.device != device:
            # outside inference mode: tables grown while decoding are saved for backward later
            with torch.inference_mode(False):
                pos = torch.arange(max(end, 2 * self._cos.size(0), 64), dtype=torch.float64)
                angle = pos[:, None] * self.inv_freq.to(pos.device)[None]  # (T, Dh/2)
                angle = torch.cat((angle, angle), dim=-1)  # (T, Dh)
                self._cos = angle.cos().float().to(device)
                self._sin = angle.sin().float().to(device)
        return self._cos, self._sin

    def rotate(self, x: Tensor, offset: Offset = 0) -> Tensor:
        """Queries or keys x (B, H, T, Dh) rotated by the angles of their positions."""
        length = x.size(-2)
        cos, sin = self.tables(_end(offset, length), x.device)
        cos = _rows(cos, offset, length).to(x.dtype)  # (T, Dh) or (B, T, Dh)
        sin = _rows(sin, offset, length).to(x.dtype)
        if isinstance(offset, Tensor):  # one row of angles per row of x, for all its heads
            cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, Dh)
        return x * cos + _rotate_half(x) * sin  # (B, H, T, Dh)
