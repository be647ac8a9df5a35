"""Tests for seq2seq.model.positional: each encoding against its paper's formula, and every variant
inside a full EncoderDecoder (gradients, incremental decoding with a cache)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from seq2seq.config.schema import PosEncodingConfig, PosKind, config_from_dict
from seq2seq.data.tokenizer import BOS_ID, PAD_ID
from seq2seq.model.absolute import Learned, Rotary, Sinusoidal, sinusoid_table
from seq2seq.model.positional import PerLayer, PositionalEncoding
from seq2seq.model.relative import (
    ALiBi,
    Fire,
    Kerple,
    ShawRelative,
    T5Bias,
    alibi_slopes,
    t5_bucket,
)
from seq2seq.model.transformer import BUILDERS, SHARED_BY_DEFAULT, EncoderDecoder, build_positional
from tests.conftest import tiny_pos_config

MakeModel = Callable[..., EncoderDecoder]
MakeSources = Callable[..., torch.Tensor]
ALL_KINDS = list(PosKind)
POS_YAMLS = sorted(
    (Path(__file__).parents[2] / "seq2seq" / "config" / "pos_encoding").glob("*.yaml")
)
Sides = tuple[PosEncodingConfig, PosEncodingConfig]


def yaml_sides(path: Path) -> Sides:
    """(encoder, decoder) settings of a seq2seq/config/pos_encoding YAML over the tiny test
    settings; a per-side mix (`@package _global_`) sets pos_encoding and encoder_pos /
    decoder_pos."""
    values = OmegaConf.to_container(OmegaConf.load(path))
    assert isinstance(values, dict)
    if "pos_encoding" not in values:
        values = {"pos_encoding": values}
    both = values["pos_encoding"]
    sides = (values.get("encoder_pos") or both, values.get("decoder_pos") or both)
    merged = (OmegaConf.merge(OmegaConf.structured(tiny_pos_config(s["kind"])), s) for s in sides)
    enc, dec = (OmegaConf.to_object(m) for m in merged)
    assert isinstance(enc, PosEncodingConfig)
    assert isinstance(dec, PosEncodingConfig)
    return enc, dec


VARIANTS = {path.stem: yaml_sides(path) for path in POS_YAMLS}
# the kinds whose parameters are position tables or functions
HAS_PARAMS = {PosKind.learned, PosKind.relative, PosKind.t5_bias, PosKind.kerple, PosKind.fire}


def test_every_kind_has_a_yaml() -> None:
    assert {enc.kind for enc, _ in VARIANTS.values()} == set(PosKind)


# --------------------------------------------------------------------------- sinusoidal


def reference_sinusoids(length: int, d_model: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))."""
    rows = []
    for pos in range(length):
        row = []
        for dim in range(d_model):
            two_i = dim - dim % 2
            angle = pos / 10000 ** (two_i / d_model)
            row.append(math.sin(angle) if dim % 2 == 0 else math.cos(angle))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float32)


@pytest.mark.parametrize("d_model", [16, 6])
def test_sinusoid_table_matches_formula(d_model: int) -> None:
    torch.testing.assert_close(sinusoid_table(60, d_model), reference_sinusoids(60, d_model))


def test_sinusoidal_embed_adds_rows_from_offset_and_grows_past_max_len() -> None:
    pe = Sinusoidal(d_model=8, max_len=4)
    x = torch.zeros(2, 5, 8)
    expected = reference_sinusoids(12, 8)
    torch.testing.assert_close(pe.embed(x, offset=0), expected[:5].expand(2, -1, -1))
    torch.testing.assert_close(pe.embed(x, offset=7), expected[7:12].expand(2, -1, -1))


# --------------------------------------------------------------------------- rotary


def _rot(rope: Rotary, vec: torch.Tensor, pos: int) -> torch.Tensor:
    return rope.rotate(vec.view(1, 1, 1, -1), offset=pos).view(-1)  # one token at `pos`


def test_rope_dot_product_depends_only_on_offset() -> None:
    rope = Rotary(head_dim=8, base=10000.0)
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(8, generator=gen), torch.randn(8, generator=gen)
    for m, n in [(0, 0), (3, 1), (2, 9), (17, 5)]:
        base = _rot(rope, q, m) @ _rot(rope, k, n)
        for shift in (1, 7, 40, 100):  # 100 is past the initial 64-row table: it grows
            shifted = _rot(rope, q, m + shift) @ _rot(rope, k, n + shift)
            torch.testing.assert_close(shifted, base, atol=1e-5, rtol=1e-5)
    # ... and it does depend on the offset (an identity "rotation" would pass the check above)
    dots = torch.stack([_rot(rope, q, 0) @ _rot(rope, k, n) for n in range(6)])
    assert (dots[1:] - dots[0]).abs().min() > 1e-3


def test_rope_preserves_norms_and_rotates_whole_sequences_by_position() -> None:
    rope = Rotary(head_dim=8, base=10000.0)
    x = torch.randn(2, 3, 5, 8, generator=torch.Generator().manual_seed(1))
    out = rope.rotate(x, offset=4)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(rope.rotate(x[:, :, :1], 0), x[:, :, :1])  # position 0: identity
    # row t of a sequence at offset 4 is rotated like a single token at position 4 + t
    torch.testing.assert_close(out[:, :, 2:3], rope.rotate(x[:, :, 2:3], offset=6))


def test_rope_rejects_odd_head_dim() -> None:
    with pytest.raises(ValueError, match="even"):
        Rotary(head_dim=7, base=10000.0)


# --------------------------------------------------------------------------- alibi


def test_alibi_slopes_power_of_two() -> None:
    assert alibi_slopes(8).tolist() == [2.0**-i for i in range(1, 9)]


def test_alibi_slopes_not_a_power_of_two() -> None:
    eight = [2.0 ** -(8 / 8 * (i + 1)) for i in range(8)]  # 2^-1 .. 2^-8
    sixteen = [2.0 ** -(8 / 16 * (i + 1)) for i in range(16)]  # 2^-0.5 .. 2^-8
    expected = eight + sixteen[0::2][:4]
    assert expected[8:] == [2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(expected))


def test_alibi_bias_is_minus_slope_times_distance() -> None:
    alibi = ALiBi(n_heads=2)
    q = torch.zeros(1, 2, 3, 4)  # 3 queries at positions 5, 6, 7 (offset 5); 8 keys
    bias = alibi.bias(q, q_offset=5, k_len=8)
    assert bias.shape == (1, 2, 3, 8)
    slopes = [2.0**-4, 2.0**-8]
    for h in range(2):
        for i in range(3):
            for j in range(8):
                assert bias[0, h, i, j].item() == pytest.approx(-slopes[h] * abs(j - (5 + i)))


# --------------------------------------------------------------------------- t5


def hf_relative_position_bucket(
    relative_position: torch.Tensor, bidirectional: bool, num_buckets: int, max_distance: int
) -> torch.Tensor:
    """T5's `_relative_position_bucket` (Mesh TensorFlow / Hugging Face), rewritten here."""
    relative_buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        relative_buckets += (relative_position > 0).to(torch.long) * num_buckets
        relative_position = torch.abs(relative_position)
    else:
        relative_position = -torch.min(relative_position, torch.zeros_like(relative_position))
    max_exact = num_buckets // 2
    is_small = relative_position < max_exact
    if_large = max_exact + (
        torch.log(relative_position.float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    if_large = torch.min(if_large, torch.full_like(if_large, num_buckets - 1))
    return relative_buckets + torch.where(is_small, relative_position, if_large)


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_buckets_match_reference(bidirectional: bool) -> None:
    rel = torch.arange(-300, 301)
    got = t5_bucket(rel, bidirectional, num_buckets=32, max_distance=128)
    want = hf_relative_position_bucket(rel, bidirectional, num_buckets=32, max_distance=128)
    assert torch.equal(got, want)
    assert int(got.max()) == 31
    assert int(got.min()) == 0
    if not bidirectional:  # keys after the query (rel > 0) are never seen: they share bucket 0
        assert torch.all(got[rel >= 0] == 0)


def test_t5_refuses_a_max_distance_inside_its_exact_buckets() -> None:
    """T5's formula with max_distance at or below the exact buckets (32 buckets: 16 exact in a
    decoder, 8 a side in an encoder) sends long distances to low buckets, then to negative ones
    (an index error at the first long test sentence): the bucketing refuses such settings."""
    rel = torch.arange(-60, 1)
    assert int(hf_relative_position_bucket(rel, False, 32, 10).min()) < 0  # the failure mode
    with pytest.raises(ValueError, match="max_distance=10 must exceed the 16 exact buckets"):
        t5_bucket(rel, bidirectional=False, num_buckets=32, max_distance=10)
    with pytest.raises(ValueError, match="max_distance=16 must exceed the 16 exact buckets"):
        T5Bias(n_heads=2, causal=True, num_buckets=32, max_distance=16, init_std=1.0)
    with pytest.raises(ValueError, match="max_distance=8 must exceed the 8 exact buckets"):
        T5Bias(n_heads=2, causal=False, num_buckets=32, max_distance=8, init_std=1.0)
    ok = t5_bucket(torch.arange(-60, 61), bidirectional=True, num_buckets=32, max_distance=9)
    assert int(ok.min()) == 0
    assert int(ok.max()) == 31
    short = t5_bucket(rel, bidirectional=False, num_buckets=16, max_distance=10)  # L = 10
    assert torch.equal(short, hf_relative_position_bucket(rel, False, 16, 10))
    within = set(short[-11:].tolist())  # distances 0..10: a source of L tokens and its EOS
    assert set(short.tolist()) == within  # every bucket a long distance uses is trained
    assert max(within) == 15


@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "decoder"])
def test_t5_bias_looks_up_its_bucket(causal: bool) -> None:
    t5 = T5Bias(n_heads=3, causal=causal, num_buckets=32, max_distance=128, init_std=1.0)
    q = torch.zeros(1, 3, 4, 8)  # 4 queries at positions 150..153, 160 keys
    bias = t5.bias(q, q_offset=150, k_len=160)
    assert bias.shape == (1, 3, 4, 160)
    rel = torch.arange(160)[None, :] - torch.arange(150, 154)[:, None]
    bucket = hf_relative_position_bucket(rel, not causal, num_buckets=32, max_distance=128)
    torch.testing.assert_close(bias[0], t5.table.weight[bucket].permute(2, 0, 1))


def test_t5_table_starts_as_t5s_unless_zero_init_is_asked() -> None:
    torch.manual_seed(0)
    cfg = PosEncodingConfig(kind=PosKind.t5_bias, num_buckets=64)
    table = build_positional(cfg, d_model=64, n_heads=8, causal=False).table.weight  # 512 draws
    assert table.mean().abs() < 0.03
    assert 0.11 < table.std() < 0.14  # N(0, 64^-0.5 = 0.125)
    cfg.t5_zero_init = True
    zeros = build_positional(cfg, d_model=64, n_heads=8, causal=False).table.weight
    assert torch.all(zeros == 0)


# --------------------------------------------------------------------------- shaw


def test_shaw_distances_beyond_clip_share_an_embedding() -> None:
    torch.manual_seed(0)
    clip = 3
    shaw = ShawRelative(head_dim=4, clip=clip)
    q = torch.randn(1, 2, 1, 4)
    # one query at position 0, keys 0..11: key j sits at distance +j
    ahead = shaw.bias(q, q_offset=0, k_len=12)[0, :, 0]  # (H, Tk)
    torch.testing.assert_close(ahead[:, clip], ahead[:, clip + 5])
    torch.testing.assert_close(ahead[:, clip], ahead[:, 11])
    # one query at position 11, keys 0..11: key j sits at distance j - 11
    behind = shaw.bias(q, q_offset=11, k_len=12)[0, :, 0]
    torch.testing.assert_close(behind[:, 11 - clip], behind[:, 11 - clip - 5])
    # within the clip every distance has its own embedding
    within = torch.cat((behind[:, 11 - clip :], ahead[:, 1 : clip + 1]), dim=1)  # -3 .. +3
    for a in range(within.size(1)):
        for b in range(a + 1, within.size(1)):
            assert not torch.allclose(within[:, a], within[:, b])
    # and the bias is q . a^K / sqrt(Dh) for the clipped distance
    torch.testing.assert_close(ahead[:, 8], q[0, :, 0] @ shaw.keys.weight[2 * clip] / 2.0)


def test_shaw_values_use_the_clipped_distance() -> None:
    torch.manual_seed(0)
    clip = 2
    shaw = ShawRelative(head_dim=4, clip=clip)
    weights = torch.zeros(1, 1, 1, 9)  # one query at position 4, keys 0..8

    def value_of_key(j: int) -> torch.Tensor:
        w = weights.clone()
        w[..., j] = 1.0
        return shaw.values(w, q_offset=4)[0, 0, 0]

    torch.testing.assert_close(value_of_key(8), value_of_key(6))  # +4 and +2 clip to +2
    torch.testing.assert_close(value_of_key(0), value_of_key(2))  # -4 and -2 clip to -2
    torch.testing.assert_close(value_of_key(5), shaw.vals.weight[clip + 1])
    assert not torch.allclose(value_of_key(5), value_of_key(6))


# --------------------------------------------------------------------------- in a model


def test_every_kind_has_a_builder() -> None:
    assert set(BUILDERS) == {k.value for k in PosKind}


@pytest.mark.parametrize("variant", VARIANTS)
def test_forward_backward_gradients(
    variant: str, make_model: MakeModel, make_sources: MakeSources
) -> None:
    model = make_model(VARIANTS[variant], layers=2).train()
    with torch.no_grad():  # make_model draws N(0, 0.5): back to where every parameter acts
        for module in model.modules():
            if isinstance(module, Fire):  # L inside the test lengths: queries before it use L
                module.threshold.fill_(4.0)
            if isinstance(module, Kerple):  # above the 1e-2 clamp
                module.r1.uniform_(0.1, 2.0)
                module.r2.uniform_(0.1, 1.0)
    src = make_sources([7, 4, 2], seed=1)  # padded: the encoder is bidirectional with a mask
    tgt = make_sources([6, 3, 5], seed=2)  # decoder: causal self-attention
    tgt_in = torch.cat((torch.full((3, 1), BOS_ID), tgt[:, :-1]), dim=1)
    logits = model.logits(src, tgt_in)
    assert logits.shape == (3, tgt_in.size(1), model.out.out_features)
    loss = F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=PAD_ID)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} received no gradient"
        assert torch.isfinite(p.grad).all(), f"{name} has a non-finite gradient"
    for stack, side in zip((model.enc_pos, model.dec_pos), VARIANTS[variant], strict=True):
        for name, p in stack.named_parameters():
            assert p.grad is not None, f"{variant}: {name}"
            assert p.grad.abs().sum() > 0, f"{variant}: {name}"
        assert bool(list(stack.parameters())) == (side.kind in HAS_PARAMS)


# Incremental decoding runs the same arithmetic in a different order (concatenated caches,
# different matmul shapes), so results agree to float32 rounding, not bit for bit:
# atol 1e-5, rtol 1e-4.
CACHE_TOL = {"atol": 1e-5, "rtol": 1e-4}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(
    "chunks", [[1] * 9, [3, 1, 1, 1, 1, 1, 1], [3, 2, 4]], ids=["1by1", "3then1by1", "3-2-4"]
)
def test_incremental_decoding_matches_full_recomputation(
    variant: str, chunks: list[int], make_model: MakeModel, make_sources: MakeSources
) -> None:
    model = make_model(VARIANTS[variant], layers=2)
    src = make_sources([8, 3], seed=3)
    tgt_in = torch.cat((torch.full((2, 1), BOS_ID), make_sources([8, 8], seed=4)[:, :8]), dim=1)
    assert tgt_in.size(1) == sum(chunks) == 9
    with torch.no_grad():
        memory, src_mask = model.encode(src)
        cache, start, parts = model.new_cache(), 0, []
        for size in chunks:  # first, so that the sinusoid table grows while decoding step by step
            parts.append(model.decode(tgt_in[:, start : start + size], memory, src_mask, cache))
            start += size
            assert cache[0].self_k is not None
            assert cache[0].self_k.size(2) == start
        full = model.decode(tgt_in, memory, src_mask)
    torch.testing.assert_close(torch.cat(parts, dim=1), full, **CACHE_TOL)


@pytest.mark.parametrize("variant", VARIANTS)
def test_training_after_decoding_in_inference_mode(
    variant: str, make_model: MakeModel, make_sources: MakeSources
) -> None:
    """Search runs under torch.inference_mode; tables it grows (sinusoid, rope) must still work
    in a later training step (validation decodes between training steps)."""
    from seq2seq.decode.search import greedy_search

    model = make_model(VARIANTS[variant], layers=1)
    src = make_sources([5, 3], seed=1)
    greedy_search(model, src, torch.tensor([60, 60]), min_len=60)  # longer than any table yet
    model.train()
    tgt_in = torch.cat((torch.full((2, 1), BOS_ID), make_sources([20, 20], seed=2)), dim=1)
    model.logits(src, tgt_in).square().mean().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_build_positional_unknown_kind() -> None:
    cfg = PosEncodingConfig(kind="foo")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="foo") as err:
        build_positional(cfg, d_model=16, n_heads=2, causal=False)
    for kind in PosKind:
        assert repr(kind.value) in str(err.value)


EXPECTED_CLASS = {
    PosKind.none: PositionalEncoding,
    PosKind.sinusoidal: Sinusoidal,
    PosKind.learned: Learned,
    PosKind.rope: Rotary,
    PosKind.alibi: ALiBi,
    PosKind.t5_bias: T5Bias,
    PosKind.relative: ShawRelative,
    PosKind.kerple: Kerple,
    PosKind.fire: Fire,
}


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
def test_build_positional_accepts_enum_and_string(kind: PosKind) -> None:
    for value in (kind, kind.value):
        cfg = PosEncodingConfig(kind=value)  # type: ignore[arg-type]
        assert (
            type(build_positional(cfg, d_model=16, n_heads=2, causal=True))
            is (EXPECTED_CLASS[kind])
        )


# --------------------------------------------------------------------------- per-layer tables


@pytest.mark.parametrize("kind", sorted(SHARED_BY_DEFAULT))
def test_share_layers_chooses_one_table_per_stack_or_per_layer(kind: str) -> None:
    cfg = tiny_pos_config(kind)
    default = build_positional(cfg, d_model=16, n_heads=2, causal=False, n_layers=3)
    assert isinstance(default, PerLayer) != SHARED_BY_DEFAULT[kind]
    for share in (True, False):
        cfg.share_layers = share
        pos = build_positional(cfg, d_model=16, n_heads=2, causal=False, n_layers=3)
        layers = [pos.layer(i) for i in range(3)]
        assert all(type(p) is type(pos.layer(0)) is not PerLayer for p in layers)
        assert len({id(p) for p in layers}) == (1 if share else 3)
        tables = {id(t) for p in layers for t in p.parameters()}
        assert len(tables) == len(list(pos.parameters()))
        assert len(list(pos.parameters())) == len(list(layers[0].parameters())) * (
            1 if share else 3
        )


def test_per_layer_shaw_tables_reach_each_layers_attention(make_model: MakeModel) -> None:
    enc, dec = tiny_pos_config("relative"), tiny_pos_config("relative")
    model = make_model((enc, dec), layers=2)
    attn = [layer.self_attn.pos for layer in [*model.encoder, *model.decoder]]
    assert all(isinstance(p, ShawRelative) for p in attn)
    assert len({id(p) for p in attn}) == 4
    assert not torch.equal(attn[0].keys.weight, attn[1].keys.weight)
    enc.share_layers = dec.share_layers = True
    shared = make_model((enc, dec), layers=2)
    assert shared.encoder[0].self_attn.pos is shared.encoder[1].self_attn.pos is shared.enc_pos


def test_per_layer_refuses_a_layer_it_was_not_built_for() -> None:
    pos = build_positional(tiny_pos_config("kerple"), 16, 2, causal=True, n_layers=2)
    with pytest.raises(ValueError, match="n_layers"):
        pos.layer(2)


def test_old_checkpoint_configs_keep_shaw_tables_shared() -> None:
    """A checkpoint written before share_layers holds one Shaw table per stack."""
    old = config_from_dict({"pos_encoding": {"kind": "relative", "clip": 8}})
    assert old.pos_encoding.share_layers is True
    side = config_from_dict({"pos_encoding": {"kind": "rope"}, "decoder_pos": {"kind": "relative"}})
    assert side.pos_encoding.share_layers is None
    assert side.decoder_pos is not None
    assert side.decoder_pos.share_layers is True
    new = config_from_dict({"pos_encoding": {"kind": "relative", "share_layers": None}})
    assert new.pos_encoding.share_layers is None


# --------------------------------------------------------------------------- directional alibi


def test_directional_alibi_uses_reversed_slopes_on_the_right_in_the_encoder_only() -> None:
    cfg = PosEncodingConfig(kind=PosKind.alibi, alibi_directional=True)
    enc = build_positional(cfg, d_model=16, n_heads=4, causal=False)
    slopes = alibi_slopes(4)  # 2^-2, 2^-4, 2^-6, 2^-8
    q = torch.zeros(1, 4, 1, 2)  # one query at position 5, keys 0..10
    bias = enc.bias(q, q_offset=5, k_len=11)[0, :, 0]  # (H, Tk)
    for d in (1, 2, 5):
        torch.testing.assert_close(bias[:, 5 - d], -slopes * d)  # left: the paper's slopes
        torch.testing.assert_close(bias[:, 5 + d], -slopes.flip(0) * d)  # right: reversed
    assert not torch.allclose(bias[:, 4], bias[:, 6])  # left and right now differ
    symmetric = build_positional(PosEncodingConfig(kind=PosKind.alibi), 16, 4, causal=False)
    sym = symmetric.bias(q, 5, 11)[0, :, 0]
    torch.testing.assert_close(sym[:, 4], sym[:, 6])  # the default cannot tell them apart
    dec = build_positional(cfg, d_model=16, n_heads=4, causal=True)  # decoder: the paper's
    torch.testing.assert_close(dec.bias(q, 5, 11), symmetric.bias(q, 5, 11))


# --------------------------------------------------------------------------- kerple


@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "decoder"])
def test_kerple_bias_is_minus_r1_log_one_plus_r2_distance(causal: bool) -> None:
    torch.manual_seed(0)
    kerple = Kerple(n_heads=3, causal=causal)
    assert kerple.r1.shape == (1 if causal else 2, 3)
    assert torch.all((kerple.r1 > 0) & (kerple.r1 < 2) & (kerple.r2 > 0) & (kerple.r2 < 1))
    with torch.no_grad():
        kerple.r2[0, 0] = -1.0  # held at 1e-2, as the authors' clamp
    bias = kerple.bias(torch.zeros(1, 3, 2, 4), q_offset=6, k_len=10)  # queries 6, 7
    assert bias.shape == (1, 3, 2, 10)
    r1, r2 = kerple.r1.detach(), kerple.r2.detach().clamp(min=1e-2)
    for h in range(3):
        for i in range(2):
            for j in range(10):
                rel = j - (6 + i)
                row = 1 if rel > 0 and not causal else 0
                want = -r1[row, h] * math.log(1 + r2[row, h] * abs(rel))
                assert bias[0, h, i, j].item() == pytest.approx(want.item(), rel=1e-5, abs=1e-6)


# --------------------------------------------------------------------------- fire


def fire_reference(fire: Fire, i: int, j: int) -> torch.Tensor:
    """The paper's f(psi(i - j) / psi(max(L, i))), psi(x) = log(c x + 1), signed for j > i."""
    c, big = fire.c.abs().item(), max(fire.threshold.abs().item(), i, 1)
    x = math.copysign(math.log(c * abs(i - j) + 1), i - j) / math.log(c * big + 1)
    return fire.mlp(torch.tensor([[x]])).view(-1)  # (H,)


def test_fire_bias_is_the_mlp_of_the_normalised_log_distance() -> None:
    torch.manual_seed(0)
    fire = Fire(n_heads=2)
    with torch.no_grad():
        fire.threshold.fill_(4.0)
        fire.c.fill_(0.5)
    bias = fire.bias(torch.zeros(1, 2, 3, 4), q_offset=2, k_len=9)  # queries 2..4, keys 0..8
    assert bias.shape == (1, 2, 3, 9)
    for i in range(3):
        for j in range(9):
            torch.testing.assert_close(bias[0, :, i, j], fire_reference(fire, 2 + i, j))


def test_fire_maps_the_farthest_key_alike_past_the_threshold() -> None:
    """Progressive interpolation: for queries past L, psi(i - 0) / psi(i) = 1, so the first key
    gets one bias whatever the length; below L the inputs stay under 1."""
    torch.manual_seed(0)
    fire = Fire(n_heads=2)
    with torch.no_grad():
        fire.threshold.fill_(8.0)
    far = [
        fire.bias(torch.zeros(1, 2, 1, 4), q_offset=i, k_len=i + 1)[0, :, 0, 0]
        for i in (8, 50, 400)
    ]
    torch.testing.assert_close(far[0], far[1])
    torch.testing.assert_close(far[0], far[2])
    near = fire.bias(torch.zeros(1, 2, 1, 4), q_offset=4, k_len=5)[0, :, 0, 0]
    assert not torch.allclose(near, far[0])


def test_an_old_shaw_checkpoint_loads_into_the_model_its_config_builds() -> None:
    """Weights saved with one Shaw table per stack (before share_layers) fit the model that
    their stored config, without the key, rebuilds."""
    from seq2seq.model.transformer import build_model

    values = {"model": {"d_model": 16, "n_heads": 2, "enc_layers": 2, "dec_layers": 2}}
    values["pos_encoding"] = {"kind": "relative", "clip": 3}
    old = build_model(
        config_from_dict(
            values | {"pos_encoding": {"kind": "relative", "clip": 3, "share_layers": True}}
        ),
        20,
        20,
    )
    rebuilt = build_model(config_from_dict(values), 20, 20)
    rebuilt.load_state_dict(old.state_dict())  # strict: the same tables
    values["pos_encoding"] = {"kind": "relative", "clip": 3, "share_layers": None}
    per_layer = build_model(config_from_dict(values), 20, 20)
    with pytest.raises(RuntimeError, match="layers"):
        per_layer.load_state_dict(old.state_dict())


@pytest.mark.parametrize("variant", ["kerple", "fire", "alibi_directional", "relative"])
def test_new_variants_draw_a_heatmap(variant: str) -> None:
    """TensorBoard's heatmap (metrics.log_positional_images): a finite 2-D picture per stack."""
    for side, causal in zip(VARIANTS[variant], (False, True), strict=True):
        image = build_positional(side, 16, 4, causal, n_layers=2).image()
        assert image is not None
        assert image.dim() == 2
        assert image.size(1) > 1
        assert torch.isfinite(image).all()
