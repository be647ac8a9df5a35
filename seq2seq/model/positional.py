"""Positional encodings behind three hooks that attention always calls.

1. `embed(x, offset)`: added to the scaled token embeddings (absolute encodings).
2. `rotate(x, offset)`: applied to queries and keys before the dot product (rotary).
3. `bias(q, q_offset, k_len)`: added to the attention logits (relative encodings). A variant whose
   relative term also reaches the values (Shaw et al.) sets `needs_weights` and adds `values`.

The base class does nothing in every hook: it *is* the `none` variant. Attention never looks at a
variant's name; it calls the hooks. A stack (encoder or decoder) has one encoding; the
self-attention of its layer i calls `encoding.layer(i)`, the encoding itself unless the variant
keeps parameters per layer (`PerLayer`, pos_encoding.share_layers=false). Cross-attention gets
the base class, so it carries no positional terms. Positions count from `offset`, so incremental
decoding with a key/value cache sees the same positions as full recomputation.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from seq2seq.config.schema import PosEncodingConfig
from seq2seq.errors import ConfigError


class PositionalEncoding(nn.Module):
    """No positional information ("none"): a bag-of-tokens baseline; every hook is the identity."""

    needs_weights = False  # True when `values` must see the attention weights

    def embed(self, x: Tensor, offset: int = 0) -> Tensor:
        return x  # (B, T, D)

    def rotate(self, x: Tensor, offset: int = 0) -> Tensor:
        return x  # (B, H, T, Dh)

    def bias(self, q: Tensor, q_offset: int, k_len: int) -> Tensor | None:
        return None  # else (B or 1, H or 1, Tq, Tk)

    def values(self, weights: Tensor, q_offset: int) -> Tensor | None:
        return None  # else (B, H, Tq, Dh), added to the attention output

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
        return self.layers[0]  # type: ignore[return-value]

    def layer(self, i: int) -> PositionalEncoding:
        if not 0 <= i < len(self.layers):
            raise ValueError(
                f"this encoding holds {len(self.layers)} per-layer tables but layer {i} asked "
                "for one: build it with n_layers = the stack's layer count"
            )
        return self.layers[i]  # type: ignore[return-value]

    def embed(self, x: Tensor, offset: int = 0) -> Tensor:
        return self.first.embed(x, offset)  # (B, T, D)

    def rotate(self, x: Tensor, offset: int = 0) -> Tensor:
        return self.first.rotate(x, offset)  # (B, H, T, Dh)

    def bias(self, q: Tensor, q_offset: int, k_len: int) -> Tensor | None:
        return self.first.bias(q, q_offset, k_len)  # (B or 1, H, Tq, Tk) or None

    def values(self, weights: Tensor, q_offset: int) -> Tensor | None:
        return self.first.values(weights, q_offset)  # (B, H, Tq, Dh) or None

    def image(self) -> Tensor | None:
        return self.first.image()


def sinusoid_table(length: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))."""
    pos = torch.arange(length, dtype=torch.float64)[:, None]  # (T, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (D/2,)
    angle = pos / torch.pow(10000.0, two_i / d_model)  # (T, D/2)
    table = torch.zeros(length, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.float()  # (T, D)


class Sinusoidal(PositionalEncoding):
    """Fixed sinusoids added to the embeddings (Vaswani et al. 2017)."""

    table: Tensor  # (max_len, D), a buffer

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.d_model = d_model
        self.register_buffer("table", sinusoid_table(max_len, d_model), persistent=False)

    def embed(self, x: Tensor, offset: int = 0) -> Tensor:
        end = offset + x.size(1)
        if end > self.table.size(0):  # grow on demand: the formula has no length limit
            with torch.inference_mode(False):  # a table grown while decoding serves training too
                self.table = sinusoid_table(2 * end, self.d_model).to(x.device)
        return x + self.table[offset:end].to(x.dtype)  # (B, T, D)

    def image(self) -> Tensor:
        return self.table[:128]  # (T, D)


class Learned(PositionalEncoding):
    """A trained embedding per absolute position (Gehring et al. 2017; Devlin et al. 2019)."""

    def __init__(self, d_model: int, max_len: int) -> None:
        super().__init__()
        self.table = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.table.weight, std=d_model**-0.5)

    def embed(self, x: Tensor, offset: int = 0) -> Tensor:
        end = offset + x.size(1)
        if end > self.table.num_embeddings:  # a UserError: the CLIs print it as one line
            raise ConfigError(
                f"learned positions stop at {self.table.num_embeddings} but position {end - 1} "
                "was asked for: raise pos_encoding.max_len or lower data.max_len"
            )
        return x + self.table.weight[offset:end].to(x.dtype)  # (B, T, D)

    def image(self) -> Tensor:
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

    def _tables(self, end: int, device: torch.device) -> tuple[Tensor, Tensor]:
        if self._cos.size(0) < end or self._cos.device != device:
            # outside inference mode: tables grown while decoding are saved for backward later
            with torch.inference_mode(False):
                pos = torch.arange(max(end, 2 * self._cos.size(0), 64), dtype=torch.float64)
                angle = pos[:, None] * self.inv_freq.to(pos.device)[None]  # (T, Dh/2)
                angle = torch.cat((angle, angle), dim=-1)  # (T, Dh)
                self._cos = angle.cos().float().to(device)
                self._sin = angle.sin().float().to(device)
        return self._cos, self._sin

    def rotate(self, x: Tensor, offset: int = 0) -> Tensor:
        end = offset + x.size(-2)
        cos, sin = self._tables(end, x.device)
        cos, sin = cos[offset:end].to(x.dtype), sin[offset:end].to(x.dtype)  # (T, Dh)
        return x * cos + _rotate_half(x) * sin  # (B, H, T, Dh)


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


def relative_positions(q_offset: int, q_len: int, k_len: int, device: torch.device) -> Tensor:
    """Key position minus query position for every query/key pair."""
    q_pos = torch.arange(q_offset, q_offset + q_len, device=device)  # (Tq,)
    k_pos = torch.arange(k_len, device=device)  # (Tk,)
    return k_pos[None, :] - q_pos[:, None]  # (Tq, Tk)


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

    def bias(self, q: Tensor, q_offset: int, k_len: int) -> Tensor:
        rel = relative_positions(q_offset, q.size(-2), k_len, q.device)  # (Tq, Tk)
        slope = torch.where(
            rel[None] > 0, self.right_slopes[:, None, None], self.slopes[:, None, None]
        )
        return (-slope * rel.abs()[None]).to(q.dtype)[None]  # (1, H, Tq, Tk)

    def image(self) -> Tensor:
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
        self.table = nn.Embedding(num_buckets, n_heads)
        # init_std = d_model^-0.5 as Hugging Face's T5 (_init_weights, factor 1); 0 = zeros
        nn.init.normal_(self.table.weight, std=init_std)

    def bias(self, q: Tensor, q_offset: int, k_len: int) -> Tensor:
        rel = relative_positions(q_offset, q.size(-2), k_len, q.device)  # (Tq, Tk)
        bucket = t5_bucket(rel, self.bidirectional, self.num_buckets, self.max_distance)
        return self.table(bucket).permute(2, 0, 1)[None].to(q.dtype)  # (1, H, Tq, Tk)

    def image(self) -> Tensor:
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

    def index(self, q_offset: int, q_len: int, k_len: int, device: torch.device) -> Tensor:
        rel = relative_positions(q_offset, q_len, k_len, device)  # (Tq, Tk)
        return rel.clamp(-self.clip, self.clip) + self.clip  # (Tq, Tk) in [0, 2k]

    def bias(self, q: Tensor, q_offset: int, k_len: int) -> Tensor:
        idx = self.index(q_offset, q.size(-2), k_len, q.device)  # (Tq, Tk)
        per_dist = q @ self.keys.weight.to(q.dtype).t()  # (B, H, Tq, 2k+1)
        scores = per_dist.gather(-1, idx.expand(*q.shape[:2], -1, -1))  # (B, H, Tq, Tk)
        return scores / math.sqrt(q.size(-1))

    def values(self, weights: Tensor, q_offset: int) -> Tensor:
        idx = self.index(q_offset, weights.size(-2), weights.size(-1), weights.device)
        per_dist = weights.new_zeros(*weights.shape[:3], 2 * self.clip + 1)  # (B, H, Tq, 2k+1)
        per_dist.scatter_add_(-1, idx.expand(*weights.shape[:2], -1, -1), weights)
        return per_dist @ self.vals.weight.to(weights.dtype)  # (B, H, Tq, Dh)

    def image(self) -> Tensor:
        return self.keys.weight.detach()  # (2k+1, Dh)


class Kerple(PositionalEncoding):
    """KERPLE, logarithmic variant (Chi et al. 2022, "KERPLE: Kernelized Relative Positional
    Embedding for Length Extrapolation"): bias = -r1 * log(1 + r2 * |i - j|) per head, r1, r2 > 0
    learned.

    As the authors' GPT-NeoX code: r1 ~ U(0, 2), r2 ~ U(0, 1), both held above 1e-2, and one
    pair per layer. The paper is causal; in the (bidirectional) encoder each head learns one pair
    for keys on its left and one for keys on its right, so it can tell the two sides apart.
    """

    EPS = 1e-2  # the smallest r1, r2 (the authors' clamp)

    def __init__(self, n_heads: int, causal: bool) -> None:
        super().__init__()
        sides = 1 if causal else 2  # row 0: keys on the left (or the only side), row 1: right
        self.r1 = nn.Parameter(torch.rand(sides, n_heads) * 2)  # (sides, H)
        self.r2 = nn.Parameter(torch.rand(sides, n_heads))  # (sides, H)

    def _bias(self, rel: Tensor) -> Tensor:
        r1 = self.r1.clamp(min=self.EPS)[:, :, None, None]  # (sides, H, 1, 1)
        r2 = self.r2.clamp(min=self.EPS)[:, :, None, None]
        per_side = -r1 * torch.log1p(r2 * rel.abs().float())  # (sides, H, Tq, Tk)
        return torch.where(rel > 0, per_side[-1], per_side[0])  # (H, Tq, Tk)

    def bias(self, q: Tensor, q_offset: int, k_len: int) -> Tensor:
        rel = relative_positions(q_offset, q.size(-2), k_len, q.device)  # (Tq, Tk)
        return self._bias(rel)[None].to(q.dtype)  # (1, H, Tq, Tk)

    def image(self) -> Tensor:
        return self._bias(torch.arange(-63, 64)[None]).detach()[:, 0]  # (H, distance)


class Fire(PositionalEncoding):
    """FIRE (Li et al. 2024, "Functional Interpolation for Relative Positions Improves Long
    Context Transformers"): bias = f(psi(i - j) / psi(max(L, i))) with psi(x) = log(c * x + 1).

    f is a small MLP from the scalar to one bias per head (one hidden layer of 32 ReLU units);
    c > 0 and the threshold L > 0 are learned. Dividing by psi(max(L, i)) is the paper's
    progressive interpolation: past L, distances shrink into the range seen in training.
    Our starting values: c = 0.1 and L = 32 tokens (about the longest training sentence here).
    The paper is causal (i >= j); in the encoder a key on the right gets the negated input
    -psi(j - i) / psi(max(L, i)), so the MLP sees which side a key is on.
    """

    def __init__(self, n_heads: int, hidden: int = 32) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, n_heads))
        self.c = nn.Parameter(torch.tensor(0.1))
        self.threshold = nn.Parameter(torch.tensor(32.0))

    def _bias(self, q_offset: int, q_len: int, k_len: int, device: torch.device) -> Tensor:
        dist = -relative_positions(q_offset, q_len, k_len, device).float()  # (Tq, Tk): i - j
        c = self.c.abs().clamp(min=1e-4)  # c and max(L, i) held away from 0: no 0 / 0
        q_pos = torch.arange(q_offset, q_offset + q_len, device=device).float()  # (Tq,)
        norm = torch.log(c * torch.maximum(q_pos, self.threshold.abs()).clamp(min=1) + 1)
        x = dist.sign() * torch.log(c * dist.abs() + 1) / norm[:, None]  # (Tq, Tk)
        return self.mlp(x[..., None]).permute(2, 0, 1)  # (H, Tq, Tk)

    def bias(self, q: Tensor, q_offset: int, k_len: int) -> Tensor:
        return self._bias(q_offset, q.size(-2), k_len, q.device)[None].to(q.dtype)  # (1, H, ..)

    def image(self) -> Tensor:
        return self._bias(63, 1, 127, self.c.device).detach()[:, 0]  # (H, distance)


Builder = Callable[[PosEncodingConfig, int, int, bool], PositionalEncoding]

# kind -> builder(cfg, d_model, n_heads, causal)
BUILDERS: dict[str, Builder] = {
    "none": lambda c, d, h, causal: PositionalEncoding(),
    "sinusoidal": lambda c, d, h, causal: Sinusoidal(d, c.max_len),
    "learned": lambda c, d, h, causal: Learned(d, c.max_len),
    "rope": lambda c, d, h, causal: Rotary(d // h, c.rope_base),
    "alibi": lambda c, d, h, causal: ALiBi(h, directional=c.alibi_directional and not causal),
    "t5_bias": lambda c, d, h, causal: T5Bias(
        h, causal, c.num_buckets, c.max_distance, 0.0 if c.t5_zero_init else d**-0.5
    ),
    "relative": lambda c, d, h, causal: ShawRelative(d // h, c.clip),
    "kerple": lambda c, d, h, causal: Kerple(h, causal),
    "fire": lambda c, d, h, causal: Fire(h),
}

# kinds with parameters in attention: one set per layer unless pos_encoding.share_layers says
# otherwise (the value here is each paper's choice: True = shared by the stack)
SHARED_BY_DEFAULT = {"relative": False, "t5_bias": True, "kerple": False, "fire": False}


def build_positional(
    cfg: PosEncodingConfig, d_model: int, n_heads: int, causal: bool, n_layers: int = 1
) -> PositionalEncoding:
    """The encoding named by `cfg.kind`, for a stack of n_layers layers of width d_model with
    n_heads heads: one instance for the stack, or `PerLayer` ones (see SHARED_BY_DEFAULT)."""
    kind = getattr(cfg.kind, "value", cfg.kind)
    if kind not in BUILDERS:
        raise ValueError(f"unknown pos_encoding.kind {kind!r}; choose one of {sorted(BUILDERS)}")
    shared = SHARED_BY_DEFAULT.get(kind, True) if cfg.share_layers is None else cfg.share_layers
    if shared or kind not in SHARED_BY_DEFAULT or n_layers == 1:
        return BUILDERS[kind](cfg, d_model, n_heads, causal)
    return PerLayer([BUILDERS[kind](cfg, d_model, n_heads, causal) for _ in range(n_layers)])
