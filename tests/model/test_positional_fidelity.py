"""The positional encodings held to their authors' code where a detail decides what a length
experiment measures: KERPLE's shared module and clamped stored values (Chi et al. 2022's
GPT-NeoX code), FIRE's starting threshold, and `untrained`, which names what training on short
sentences cannot train (learned rows, T5 buckets, Shaw distances, FIRE's interpolation)."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf

from seq2seq.config.schema import CONFIG_DIR, PosEncodingConfig, PosKind
from seq2seq.model.absolute import Learned
from seq2seq.model.positional import PerLayer
from seq2seq.model.relative import Fire, Kerple, ShawRelative, T5Bias
from seq2seq.model.transformer import build_positional


def kerple_yaml() -> PosEncodingConfig:
    values = OmegaConf.to_container(OmegaConf.load(f"{CONFIG_DIR}/pos_encoding/kerple.yaml"))
    assert isinstance(values, dict)
    return PosEncodingConfig(kind=PosKind.kerple, share_layers=values.get("share_layers"))


def test_kerple_is_one_module_for_the_stack_as_the_authors_build_it() -> None:
    """Catches: one (r1, r2) per layer where the authors share one module."""
    shared = build_positional(kerple_yaml(), 32, 4, causal=True, n_layers=3)
    assert isinstance(shared, Kerple)
    assert all(shared.layer(i) is shared for i in range(3))
    cfg = kerple_yaml()
    cfg.share_layers = False
    assert isinstance(build_positional(cfg, 32, 4, causal=True, n_layers=3), PerLayer)


def test_kerple_clamps_its_stored_values_and_keeps_their_gradient() -> None:
    """Catches: a clamp inside the graph, which freezes a value pushed below the bound (its
    gradient is zero there for ever); the authors clamp the stored value instead."""
    kerple = Kerple(n_heads=2, causal=True).train()
    with torch.no_grad():
        kerple.r2[0, 0] = -0.5  # an optimizer step pushed it below the bound
    q = torch.zeros(1, 2, 5, 4)  # (B, H, Tq, Dh)
    kerple.bias(q, 0, 5).sum().backward()
    assert kerple.r2[0, 0].item() == pytest.approx(Kerple.EPS)  # the stored value: at the bound
    assert kerple.r2.grad is not None  # and still learns
    assert kerple.r2.grad[0, 0].item() != 0.0
    rel = torch.arange(5)[:, None] - torch.arange(5)[None, :]  # i - j >= 0 below the diagonal
    r1 = kerple.r1.detach()[0, 0]
    want = -r1 * torch.log1p(Kerple.EPS * rel.abs().float())  # the paper's formula, head 0
    torch.testing.assert_close(kerple.bias(q, 0, 5)[0, 0].tril(), want.tril())


def test_a_shared_kerple_trains_when_a_value_starts_below_the_bound() -> None:
    """Catches: the stored-value clamp running again in a later layer of the same forward,
    after an earlier layer saved the value for its backward (autograd's in-place check)."""
    kerple = Kerple(n_heads=2, causal=False).train()
    with torch.no_grad():
        kerple.r1[1, 1] = -1.0
    q = torch.randn(2, 2, 4, 8)
    total = sum(kerple.bias(q, 0, 4).sum() for _ in range(3))  # three layers share it
    total.backward()  # raises if a saved value was modified in place
    assert kerple.r1.grad is not None


def test_kerple_in_evaluation_reads_without_writing() -> None:
    kerple = Kerple(n_heads=2, causal=True).eval()
    with torch.no_grad():
        kerple.r1[0, 1] = -0.2
    bias = kerple.bias(torch.zeros(1, 2, 3, 4), 0, 3)
    assert kerple.r1[0, 1].item() == pytest.approx(-0.2)  # untouched
    assert torch.isfinite(bias).all()


def test_fire_starts_its_threshold_from_the_config() -> None:
    cfg = PosEncodingConfig(kind=PosKind.fire, fire_threshold=8.0, share_layers=True)
    fire = build_positional(cfg, 32, 4, causal=True)
    assert isinstance(fire, Fire)
    assert fire.threshold.item() == 8.0


@pytest.mark.parametrize(("threshold", "length", "reported"), [(32, 17, True), (8, 17, False)])
def test_fire_reports_an_interpolation_that_never_acts(
    threshold: float, length: int, reported: bool
) -> None:
    """max(L, i) = L for every training position i <= length - 1 when L >= length - 1."""
    note = Fire(n_heads=2, threshold=threshold).untrained(length)
    assert (note is not None) == reported
    if note:
        assert "fire_threshold" in note


def test_learned_rows_past_the_training_length_are_reported() -> None:
    note = Learned(d_model=8, max_len=100).untrained(17)
    assert note is not None
    assert "17..99" in note
    assert "83 of 100" in note
    assert Learned(d_model=8, max_len=17).untrained(17) is None


def t5_side_bucket(d: int, side: int, max_distance: int) -> int:
    """Raffel et al.'s bucket of a distance d >= 0 within one side of `side` buckets: half of
    them exact, the rest log-spaced up to max_distance (written out)."""
    exact = side // 2
    if d < exact:
        return d
    return min(exact + int(math.log(d / exact) / math.log(max_distance / exact) * exact), side - 1)


def t5_unused(num_buckets: int, max_distance: int, length: int) -> int:
    """Buckets that some longer sentence reaches but no distance below `length` does: keys on
    the left (distance 0 too) and on the right (1 and more) each have num_buckets / 2."""
    side = num_buckets // 2

    def reached(n: int) -> set[tuple[str, int]]:
        left = {("left", t5_side_bucket(d, side, max_distance)) for d in range(n)}
        right = {("right", t5_side_bucket(d, side, max_distance)) for d in range(1, n)}
        return left | right

    return len(reached(4 * max_distance) - reached(length))


@pytest.mark.parametrize(("max_distance", "length"), [(128, 17), (16, 17), (64, 9)])
def test_t5_reports_the_buckets_short_sentences_never_reach(max_distance: int, length: int) -> None:
    """The default max_distance of 128 on sources of at most 16 tokens leaves buckets at their
    random starting values; the count matches the bucketing written out."""
    t5 = T5Bias(n_heads=2, causal=False, num_buckets=32, max_distance=max_distance, init_std=1.0)
    unused = t5_unused(32, max_distance, length)
    note = t5.untrained(length)
    if unused == 0:
        assert note is None
    else:
        assert note is not None
        assert f"{unused} of 32 buckets" in note


def test_shaw_reports_distances_past_the_training_length() -> None:
    assert ShawRelative(head_dim=4, clip=16).untrained(17) is None
    note = ShawRelative(head_dim=4, clip=16).untrained(10)
    assert note is not None
    assert "10..16" in note


def test_per_layer_tables_say_so() -> None:
    cfg = PosEncodingConfig(kind=PosKind.relative, clip=16, share_layers=False)
    note = build_positional(cfg, 32, 4, causal=False, n_layers=3).untrained(5)
    assert note is not None
    assert "each of the 3 layers" in note
