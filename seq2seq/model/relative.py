"""Relative positional encodings: the `bias` hook on the attention logits (ALiBi, T5, KERPLE,
FIRE), and Shaw et al.'s keys and values (`bias` + `values`); each a function of the distance
between query and key (seq2seq/model/positional.py has the hooks)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from seq2seq.model.positional import Offset, PositionalEncoding, positions, relative_positions


def alibi_slopes(n_heads: int) -> Tensor:
    """Head slopes from Press et al. 2022: a geometric sequence starting at 2^(-8/n).

    For a head count that is not a power of two, take the slopes of the closest smaller power of
    two, then every other slope of the next power of two (the paper's reference code).
    """

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    closest = 2 ** math.floor(math.log2(n_heads))
    slopes = power_of_two(closest)
    if closest != n_heads:
        slopes += power_of_two(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes)  # (H,)


class ALiBi(PositionalEncoding):
    """Attention with linear biases: -slope * distance on the logits (Press et al. 2022).

    The paper covers causal attention only, where the distance is i - j >= 0. For the encoder
    (bidirectional), its author's note (ofirpress/attention_with_linear_biases, issue #5) uses
    the symmetric |i - j|, as MosaicBERT and data2vec 2.0 do; every head then scores a key d to
    the left exactly like one d to the right, so attention cannot tell the two sides apart.
    `directional` (encoder only) gives each head a second slope for keys on its right: head h
    keeps slope m_h to the left and takes m_{H-1-h} to the right (the slopes in reverse order),
    so steep-left heads look far right and the other way round; the biases stay fixed.
    """

    slopes: Tensor  # (H,), a buffer: keys on the left (and in the causal decoder)
    right_slopes: Tensor  # (H,), a buffer: keys on the right

    def __init__(self, n_heads: int, directional: bool = False) -> None:
        super().__init__()
        slopes = alibi_slopes(n_heads)  # (H,)
        self.register_buffer("slopes", slopes, persistent=False)
        right = slopes.flip(0) if directional else slopes
        self.register_buffer("right_slopes", right, persistent=False)

    def bias(self, q: Tensor, q_offset: Offset, k_len: int) -> Tensor:
        """-slope * |i - j| per head (1|B, H, Tq, Tk); keys on the right take right_slopes."""
        rel = relative_positions(q_offset, q.size(-2), k_len, q.device)[:, None]  # (1|B, 1, Tq, Tk)
        slope = torch.where(rel > 0, self.right_slopes[:, None, None], self.slopes[:, None, None])
        return (-slope * rel.abs()).to(q.dtype)  # (1|B, H, Tq, Tk)

    def image(self) -> Tensor:
        """Each head's bias for key-minus-query distances -63 to 63 (H, distance)."""
        dist = torch.arange(-63.0, 64.0)  # key minus query
        slope = torch.where(dist[None] > 0, self.right_slopes[:, None], self.slopes[:, None])
        return -slope * dist.abs()[None]  # (H, distance)


def t5_bucket(relative: Tensor, bidirectional: bool, num_buckets: int, max_distance: int) -> Tensor:
    """Map key-minus-query offsets to buckets (Raffel et al. 2020, T5's reference function).

    Half the buckets are exact small distances, the rest grow logarithmically up to max_distance.
    Bidirectional: separate halves for keys before and after the query.
    """
    buckets = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative > 0).long() * num_buckets
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)
    max_exact = num_buckets // 2
    if max_distance <= max_exact:  # the log would run backwards: long distances, low buckets
        raise ValueError(
            f"t5_bias: max_distance={max_distance} must exceed the {max_exact} exact buckets "
            f"(num_buckets={num_buckets * (2 if bidirectional else 1)}, "
            f"{'bi' if bidirectional else 'uni'}directional)"
        )
    is_small = distance < max_exact
    log_ratio = torch.log(distance.float().clamp(min=1) / max_exact) / math.log(
        max_distance / max_exact
    )
    large = max_exact + (log_ratio * (num_buckets - max_exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return buckets + torch.where(is_small, distance, large)


class T5Bias(PositionalEncoding):
    """A learned scalar per head and relative-position bucket (Raffel et al. 2020, T5).

    T5 shares one table across the layers of a stack (the first layer computes the bias and the
    others reuse it) and draws it from N(0, d_model^-0.5), as Hugging Face's T5 initialises
    `relative_attention_bias`.
    """

    def __init__(
        self, n_heads: int, causal: bool, num_buckets: int, max_distance: int, init_std: float
    ) -> None:
        super().__init__()
        self.bidirectional = not causal
        self.num_buckets, self.max_distance = num_buckets, max_distance
        t5_bucket(torch.zeros(1, dtype=torch.long), self.bidirectional, num_buckets, max_distance)
        self.table = nn.Embedding(num_buckets, n_heads)
        # init_std = d_model^-0.5 as Hugging Face's T5 (_init_weights, factor 1); 0 = zeros
        nn.init.normal_(self.table.weight, std=init_std)

    def bias(self, q: Tensor, q_offset: Offset, k_len: int) -> Tensor:
        """Each head's learned scalar for the bucket of each query/key pair (1|B, H, Tq, Tk)."""
        rel = relative_positions(q_offset, q.size(-2), k_len, q.device)  # (1|B, Tq, Tk)
        bucket = t5_bucket(rel, self.bidirectional, self.num_buckets, self.max_distance)
        table: Tensor = self.table(bucket)  # (1|B, Tq, Tk, H)
        return table.permute(0, 3, 1, 2).to(q.dtype)  # (1|B, H, Tq, Tk)

    def _reached(self, length: int) -> set[int]:
        """The buckets of the distances within `length` positions."""
        rel = torch.arange(-(length - 1), length if self.bidirectional else 1)
        return set(t5_bucket(rel, self.bidirectional, self.num_buckets, self.max_distance).tolist())

    def untrained(self, length: int) -> str | None:
        """The buckets longer sentences reach and training ones do not."""
        unused = len(self._reached(4 * self.max_distance) - self._reached(length))
        if unused == 0:
            return None
        return (
            f"t5_bias: {unused} of {self.num_buckets} buckets are for distances over {length - 1} "
            f"and keep their initial values (max_distance={self.max_distance})"
        )

    def image(self) -> Tensor:
        """The table (H, buckets)."""
        return self.table.weight.detach().t()  # (H, buckets)


class ShawRelative(PositionalEncoding):
    """Relative keys and values for clipped distances (Shaw et al. 2018).

    e_ij = q_i . (k_j + a^K_{clip(j-i)}) / sqrt(Dh) and z_i = sum_j w_ij (v_j + a^V_{clip(j-i)}),
    with distances beyond +-clip sharing one embedding; the tables are shared across heads. The
    paper's tensor2tensor code gives every layer its own tables: build one instance per layer
    (`PerLayer`, the default) or one for the stack (pos_encoding.share_layers=true).
    """

    needs_weights = True

    def __init__(self, head_dim: int, clip: int) -> None:
        super().__init__()
        self.clip = clip
        self.keys = nn.Embedding(2 * clip + 1, head_dim)
        self.vals = nn.Embedding(2 * clip + 1, head_dim)
        for table in (self.keys, self.vals):
            nn.init.normal_(table.weight, std=head_dim**-0.5)

    def index(self, q_offset: Offset, q_len: int, k_len: int, device: torch.device) -> Tensor:
        """The table row of each query/key pair (1|B, 1, Tq, Tk): the clipped distance + clip."""
        rel = relative_positions(q_offset, q_len, k_len, device)[:, None]  # (1|B, 1, Tq, Tk)
        return rel.clamp(-self.clip, self.clip) + self.clip  # in [0, 2k]

    def bias(self, q: Tensor, q_offset: Offset, k_len: int) -> Tensor:
        """q_i . a^K_{clip(j-i)} / sqrt(Dh) for each query/key pair (B, H, Tq, Tk)."""
        idx = self.index(q_offset, q.size(-2), k_len, q.device)  # (1|B, 1, Tq, Tk)
        per_dist = q @ self.keys.weight.to(q.dtype).t()  # (B, H, Tq, 2k+1)
        scores = per_dist.gather(-1, idx.expand(*q.shape[:2], -1, -1))  # (B, H, Tq, Tk)
        return scores / math.sqrt(q.size(-1))

    def values(self, weights: Tensor, q_offset: Offset) -> Tensor:
        """sum_j w_ij a^V_{clip(j-i)} for the attention weights w: (B, H, Tq, Dh)."""
        idx = self.index(q_offset, weights.size(-2), weights.size(-1), weights.device)
        per_dist = weights.new_zeros(*weights.shape[:3], 2 * self.clip + 1)  # (B, H, Tq, 2k+1)
        per_dist.scatter_add_(-1, idx.expand(*weights.shape[:2], -1, -1), weights)
        return per_dist @ self.vals.weight.to(weights.dtype)  # (B, H, Tq, Dh)

    def untrained(self, length: int) -> str | None:
        """The distances between the longest training one and `clip`."""
        if self.clip < length:
            return None
        return (
            f"relative: the key and value embeddings of distances {length}..{self.clip} (clip="
            f"{self.clip}) never get a gradient"
        )

    def image(self) -> Tensor:
        """The relative key table (2 * clip + 1, Dh)."""
        return self.keys.weight.detach()  # (2k+1, Dh)


class Kerple(PositionalEncoding):
    """KERPLE, logarithmic variant (Chi et al. 2022, "KERPLE: Kernelized Relative Positional
    Embedding for Length Extrapolation"): bias = -r1 * log(1 + r2 * |i - j|) per head, r1, r2 > 0
    learned.

    As the authors' GPT-NeoX code (ParallelKerpleLog): r1 ~ U(0, 2), r2 ~ U(0, 1), and the
    stored values are clamped to at least 1e-2 before each use in training, so a value pushed
    below the bound comes back to it and keeps its gradient (a clamp inside the graph would
    freeze it there); in evaluation the values are only read (clamped, not written). The module
    is built once and shared by the stack's layers, as theirs (pos_encoding.share_layers=false:
    one pair per layer). The paper is causal; in the (bidirectional) encoder each head learns one
    pair for keys on its left and one for keys on its right, so it can tell the two sides apart.
    """

    EPS = 1e-2  # the smallest r1, r2 (the authors' clamp)

    def __init__(self, n_heads: int, causal: bool) -> None:
        super().__init__()
        sides = 1 if causal else 2  # row 0: keys on the left (or the only side), row 1: right
        self.r1 = nn.Parameter(torch.rand(sides, n_heads) * 2)  # (sides, H)
        self.r2 = nn.Parameter(torch.rand(sides, n_heads))  # (sides, H)

    def _bias(self, rel: Tensor) -> Tensor:
        """The bias (1|B, H, Tq, Tk) of key-minus-query distances rel (1|B, Tq, Tk)."""
        if self.training:
            with torch.no_grad():  # the stored values (the authors' `.data = .data.clamp`),
                for r in (self.r1, self.r2):  # only when out of bounds: a layer sharing this
                    if bool((r < self.EPS).any()):  # module may have saved r for its backward
                        r.clamp_(min=self.EPS)
            r1: Tensor = self.r1  # (sides, H)
            r2: Tensor = self.r2
        else:
            r1, r2 = self.r1.clamp(min=self.EPS), self.r2.clamp(min=self.EPS)
        r1, r2 = r1[:, None, :, None, None], r2[:, None, :, None, None]  # (sides, 1, H, 1, 1)
        rel = rel[:, None]  # (1|B, 1, Tq, Tk)
        per_side = -r1 * torch.log1p(r2 * rel.abs().float())  # (sides, 1|B, H, Tq, Tk)
        return torch.where(rel > 0, per_side[-1], per_side[0])  # (1|B, H, Tq, Tk)

    def bias(self, q: Tensor, q_offset: Offset, k_len: int) -> Tensor:
        """-r1 * log(1 + r2 * |i - j|) per head (1|B, H, Tq, Tk)."""
        rel = relative_positions(q_offset, q.size(-2), k_len, q.device)  # (1|B, Tq, Tk)
        return self._bias(rel).to(q.dtype)  # (1|B, H, Tq, Tk)

    def image(self) -> Tensor:
        """Each head's bias for key-minus-query distances -63 to 63 (H, distance)."""
        return self._bias(torch.arange(-63, 64)[None, None]).detach()[0, :, 0]  # (H, distance)


class Fire(PositionalEncoding):
    """FIRE (Li et al. 2024, "Functional Interpolation for Relative Positions Improves Long
    Context Transformers"): bias = f(psi(i - j) / psi(max(L, i))) with psi(x) = log(c * x + 1).

    f is a small MLP from the scalar to one bias per head (one hidden layer of 32 ReLU units);
    c > 0 and the threshold L > 0 are learned. Dividing by psi(max(L, i)) is the paper's
    progressive interpolation: past L, distances shrink into the range seen in training.
    Our starting values: c = 0.1 and L = pos_encoding.fire_threshold (32 tokens by default);
    L must start below the longest training position for the interpolation to act in training
    (`untrained` reports it otherwise).
    The paper is causal (i >= j); in the encoder a key on the right gets the negated input
    -psi(j - i) / psi(max(L, i)), so the MLP sees which side a key is on.
    """

    def __init__(self, n_heads: int, threshold: float = 32.0, hidden: int = 32) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, n_heads))
        self.c = nn.Parameter(torch.tensor(0.1))
        self.threshold = nn.Parameter(torch.tensor(float(threshold)))

    def _bias(self, q_offset: Offset, q_len: int, k_len: int, device: torch.device) -> Tensor:
        """The bias (1|B, H, Tq, Tk) of queries from q_offset (int or (B,)) over k_len keys."""
        dtype = self.c.dtype  # the MLP's (float32, or float64 in a double model)
        dist = -relative_positions(q_offset, q_len, k_len, device).to(dtype)  # (1|B, Tq, Tk): i - j
        c = self.c.abs().clamp(min=1e-4)  # c and max(L, i) held away from 0: no 0 / 0
        q_pos = positions(q_offset, q_len, device).to(dtype)  # (1|B, Tq)
        norm = torch.log(c * torch.maximum(q_pos, self.threshold.abs()).clamp(min=1) + 1)
        x = dist.sign() * torch.log(c * dist.abs() + 1) / norm[..., None]  # (1|B, Tq, Tk)
        bias: Tensor = self.mlp(x[..., None])  # (1|B, Tq, Tk, H)
        return bias.permute(0, 3, 1, 2)  # (1|B, H, Tq, Tk)

    def bias(self, q: Tensor, q_offset: Offset, k_len: int) -> Tensor:
        """f(psi(i - j) / psi(max(L, i))) per head (1|B, H, Tq, Tk)."""
        return self._bias(q_offset, q.size(-2), k_len, q.device).to(q.dtype)  # (1|B, H, Tq, Tk)

    def untrained(self, length: int) -> str | None:
        """The interpolation, when L is not below the longest training position."""
        threshold = float(self.threshold.detach().abs())
        if threshold < length - 1:
            return None
        return (
            f"fire: L = {threshold:g} is not below the longest training position {length - 1}, "
            "so the progressive interpolation never acts in training (lower "
            "pos_encoding.fire_threshold)"
        )

    def image(self) -> Tensor:
        """Each head's bias for key-minus-query distances -63 to 63 (H, distance)."""
        return self._bias(63, 1, 127, self.c.device).detach()[0, :, 0]  # (H, distance)
