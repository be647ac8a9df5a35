"""The key/value cache of incremental decoding: what each decoder layer has computed so far.

Shapes: N rows (hypotheses), B sentences, H heads, S source length, Dh = D / H.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from seq2seq import kernels

# buffers that start at zero (rows at their own positions) start with room for at most this many
# positions and double as rows pass it: room for a length limit of 256 that no row reaches was
# 16.8 MB a layer at 64 rows, zeroed in ~12 ms (a profile; whole searches showed no gain: docs/
# BENCHMARKS.md, "Decoding against CTranslate2")
ZEROED_START = 64


class LayerCache:
    """Keys and values one decoder layer has already computed during incremental decoding.

    Self-attention keys/values have one row per hypothesis (sentences x beams, sentence-major)
    and live in one buffer preallocated for `capacity` positions (at most ZEROED_START where it
    starts at zero; doubled when a step goes past it): a step writes its keys and values in one
    copy instead of concatenating the whole history, and a reorder copies into a second buffer
    kept for that, so steps allocate no new memory. Cross-attention keys/values are computed
    once per sentence and have one row per sentence: the hypotheses of a sentence share them
    (see `DecoderLayer`); so does the source's padding, kept as a bias on the logits
    (kernels.key_bias) made once.

    Rows decode side by side from position `length`, all at once; or, once `add_rows` has put
    new sentences beside rows already under way (continuous batching), each from its own
    position `lengths` (N,): then a step writes each row's new key at its own position and
    attention masks the positions a row has not reached.
    """

    def __init__(self, capacity: int = 0) -> None:
        self.capacity, self.length = capacity, 0  # length: the longest row's
        self.lengths: Tensor | None = None  # (N,) each row's length, once rows differ
        self.rows = 0  # N
        self._full: Tensor | None = None  # (2, >= N, H, capacity, Dh): keys, values; N in use
        self._spare: Tensor | None = None  # the same: reorder writes here
        self.cross_k: Tensor | None = None  # (B, H, S, Dh): encoder keys, computed once
        self.cross_v: Tensor | None = None  # (B, H, S, Dh)
        self.cross_bias: Tensor | None = None  # (B, 1, 1, S): 0 at source tokens, -inf at pads
        # with rows at their own positions, buffers start at zero: the positions a row has not
        # reached are masked, but read (a masked NaN from uninitialized memory would still make
        # NaN: 0 x NaN); rows at one position never read past it (and a beam's large buffers
        # are not written through)

    @property
    def _kv(self) -> Tensor | None:
        """The rows in use (2, N, H, capacity, Dh)."""
        return None if self._full is None else self._full[:, : self.rows]

    @property
    def offset(self) -> int | Tensor:
        """The position of the next token: one int for all rows, or (N,) one per row."""
        return self.length if self.lengths is None else self.lengths

    @property
    def self_k(self) -> Tensor | None:
        """Keys of the tokens decoded so far, (N, H, t, Dh); None before the first step."""
        kv = self._kv
        return None if kv is None else kv[0, :, :, : self.length]

    @property
    def self_v(self) -> Tensor | None:
        """Values of the tokens decoded so far, (N, H, t, Dh)."""
        kv = self._kv
        return None if kv is None else kv[1, :, :, : self.length]

    def append(self, kv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Add the keys and values kv (2, N, H, t, Dh) of t new tokens, in one copy. Returns the
        new keys as they lie in the cache (N, H, t, Dh), to be rotated in place, and all the
        keys and values so far (N, H, end, Dh) each."""
        start, end = self.length, self.length + kv.size(3)
        buf = self._buffer(kv, end)  # (2, N, H, capacity, Dh)
        new = buf[:, :, :, start:end]  # (2, N, H, t, Dh)
        new.copy_(kv)
        self.length = end
        history = buf.narrow(3, 0, end)  # (2, N, H, end, Dh)
        return new[0], history[0], history[1]

    def append_rows(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Add one token's key and value k, v (N, H, 1, Dh) to each row at its own position
        `lengths`. Returns the keys and values so far (N, H, end, Dh) and a bias on their logits
        (N, 1, 1, end): 0 at the positions each row has reached, -inf past them (a bias, not a
        mask, keeps one query's attention on two matmuls: see kernels.attention)."""
        if self.lengths is None:
            raise ValueError("append_rows needs rows with their own lengths (add_rows)")
        kv = torch.stack((k[:, :, 0], v[:, :, 0]), 1)  # (N, 2, H, Dh)
        buf = self._buffer(kv.transpose(0, 1)[:, :, :, None], self.length + 1)  # (2, N, H, C, Dh)
        rows = torch.arange(kv.size(0), device=kv.device)  # (N,)
        buf.permute(1, 3, 0, 2, 4).index_put_((rows, self.lengths), kv)  # a (N, C, 2, H, Dh) view
        self.lengths = self.lengths + 1
        self.length += 1
        history = buf.narrow(3, 0, self.length)  # (2, N, H, end, Dh)
        reached = torch.arange(self.length, device=kv.device) < self.lengths[:, None]  # (N, end)
        return history[0], history[1], kernels.key_bias(reached, k.dtype)

    def _buffer(self, kv: Tensor, end: int) -> Tensor:
        """The rows in use (2, N, H, capacity, Dh), grown to hold `end` positions (kv, new keys
        and values (2, N, H, t, Dh), gives the sizes)."""
        old = self._full
        if old is not None and end <= old.size(3):
            return old[:, : self.rows]
        start = self.capacity if self.lengths is None else min(self.capacity, ZEROED_START)
        size = max(end, start, 0 if old is None else 2 * old.size(3))
        _, n, h, _, dh = kv.shape
        full = self._alloc(
            kv, 2, n if old is None else old.size(1), h, size, dh
        )  # (2, R, H, C, Dh)
        if old is not None:
            full[:, : self.rows, :, : self.length] = old[:, : self.rows, :, : self.length]
        self._full, self._spare, self.rows = full, None, n
        return full[:, :n]

    def _alloc(self, like: Tensor, *shape: int) -> Tensor:
        """A new buffer like `like`: zeros once rows have their own lengths, else unwritten."""
        return like.new_zeros(shape) if self.lengths is not None else like.new_empty(shape)

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Keep the hypotheses `rows` (beam search continues some, several times or not at all)
        and, when given, the cross-attention rows of the sentences `sentences` (sentences that
        are finished leave the batch)."""
        full, n, t = self._full, rows.numel(), self.length
        if full is not None:
            spare = self._spare
            if spare is None or spare.size(1) < n:
                spare = self._alloc(full, 2, max(n, full.size(1)), *full.shape[2:])
            out = spare[:, :n, :, :t]  # (2, N', H, t, Dh)
            torch.index_select(full[:, : self.rows, :, :t], 1, rows, out=out)
            self._full, self._spare = spare, full
        self.rows = n
        if self.lengths is not None:
            self.lengths = self.lengths[rows]
            self.length = int(self.lengths.max()) if n else 0
        if sentences is not None and self.cross_k is not None and self.cross_v is not None:
            self.cross_k = self.cross_k.index_select(0, sentences)
            self.cross_v = self.cross_v.index_select(0, sentences)
            if self.cross_bias is not None:
                self.cross_bias = self.cross_bias.index_select(0, sentences)

    def reset_rows(self, rows: Tensor) -> None:
        """Rows `rows` (R,) start again from position 0 (their sentences ended; what they
        decode until new ones take them is not read)."""
        assert self.lengths is not None, "reset_rows needs rows with their own lengths"
        self.lengths[rows] = 0
        self.length = int(self.lengths.max())

    def add_rows(
        self, cross_k: Tensor, cross_v: Tensor, cross_bias: Tensor, slots: Tensor | None = None
    ) -> None:
        """Put B' new sentences, with no token yet, in the rows `slots` (B',) or, if None, after
        the rows (continuous batching): their memory's keys and values (B', H, S', Dh) and
        padding bias (B', 1, 1, S'). The longer of S and S' wins: the shorter keys are padded,
        with -inf on their logits."""
        if slots is not None:
            self._fill_rows(slots, cross_k, cross_v, cross_bias)
            return
        n, new = self.rows, cross_k.size(0)
        if self.lengths is None:
            self.lengths = torch.full((n,), self.length, dtype=torch.long, device=cross_k.device)
        self.lengths = torch.cat((self.lengths, self.lengths.new_zeros(new)))  # (N + B',)
        if self.cross_k is None or self.cross_v is None or self.cross_bias is None or n == 0:
            self.cross_k, self.cross_v, self.cross_bias = cross_k, cross_v, cross_bias
        else:  # (N + B', H, S, Dh) each, (N + B', 1, 1, S)
            self.cross_k, self.cross_v, self.cross_bias = (
                torch.cat((old, part), 0)
                for old, part in _same_source_length(self._cross(), (cross_k, cross_v, cross_bias))
            )
        full = self._full
        if full is not None and full.size(1) < n + new:  # room for the new rows, masked
            room = full.new_zeros(2, max(n + new, 2 * full.size(1)), *full.shape[2:])
            room[:, :n, :, : self.length] = full[:, :n, :, : self.length]
            self._full, self._spare = room, None
        self.rows = n + new
        if n == 0:
            self.length = 0

    def _fill_rows(self, slots: Tensor, k: Tensor, v: Tensor, bias: Tensor) -> None:
        if self.lengths is None:
            raise ValueError("rows are filled after add_rows has put sentences in them")
        self.reset_rows(slots)
        pairs = _same_source_length(self._cross(), (k, v, bias))
        self.cross_k, self.cross_v, self.cross_bias = (old for old, _ in pairs)
        for old, new in pairs:
            old.index_copy_(0, slots, new)
        self._cut_sources()

    def _cut_sources(self) -> None:
        """The cross-attention keys, values and bias cut to the rows' longest source. Sentences
        start longest first (seq2seq/decode/schedule.py): without the cut, the rows' later,
        shorter sentences would attend over the first ones' length, padding and all (the
        attention's time grows with its keys: 1,000 Multi30k sentences decoded 1.09x faster
        with the cut on an AMD EPYC family 25 model 1, docs/BENCHMARKS.md)."""
        k, v, bias = self._cross()
        span = int(bias.eq(0).flatten(1).sum(1).max())  # real tokens lead every row
        if span < k.size(-2):  # (N, H, span, Dh) each, (N, 1, 1, span)
            self.cross_k, self.cross_v = k[:, :, :span].contiguous(), v[:, :, :span].contiguous()
            self.cross_bias = bias[..., :span].contiguous()

    def _cross(self) -> tuple[Tensor, Tensor, Tensor]:
        """The cross-attention keys, values and padding bias, once sentences are in."""
        if self.cross_k is None or self.cross_v is None or self.cross_bias is None:
            raise ValueError("the cache holds no sentence yet (add_rows)")
        return self.cross_k, self.cross_v, self.cross_bias


def _same_source_length(
    old: tuple[Tensor, Tensor, Tensor], new: tuple[Tensor, Tensor, Tensor]
) -> list[tuple[Tensor, Tensor]]:
    """Cross-attention keys, values (B, H, S, Dh) and padding bias (B, 1, 1, S), of the rows
    already in and of new sentences, each pair padded to the longer source: keys and values
    with zeros, the bias with -inf (the padded keys are never attended to)."""
    size = max(old[0].size(-2), new[0].size(-2))
    pairs = []
    for a, b, dim, fill in zip(old, new, (-2, -2, -1), (0.0, 0.0, float("-inf")), strict=True):
        pairs.append((_pad_to(a, size, dim, fill), _pad_to(b, size, dim, fill)))
    return pairs


def _pad_to(t: Tensor, size: int, dim: int, fill: float) -> Tensor:
    """t padded with `fill` along `dim` (-1 or -2) to `size` there (t itself if it is)."""
    pad = size - t.size(dim)
    if pad == 0:
        return t
    return F.pad(t, (0, pad) if dim == -1 else (0, 0, 0, pad), value=fill)
