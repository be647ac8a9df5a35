"""quantize.py: int8 linear layers compute the float layers' function to quantization error, a
quantized model decodes as the float one on a trained task, and misuse is refused."""

from __future__ import annotations

import copy

import pytest
import torch

from seq2seq.config.schema import DecodeConfig, PosKind, SearchKind
from seq2seq.decode.quantize import Int8Linear, quantize_int8
from seq2seq.decode.schedule import translate_ids
from seq2seq.errors import ConfigError
from seq2seq.model.layers import Linear
from seq2seq.model.transformer import EncoderDecoder
from tests.conftest import REV_VOCAB, MakeModel, reverse_batch

# int8 weights per row and 7-bit inputs: a product's relative error is about 1%
REL_ERROR = 0.03


def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).norm() / want.norm())


@pytest.mark.parametrize("bias", [True, False])
def test_int8_linear_is_the_float_layer_to_quantization_error(bias: bool) -> None:
    """Catches a transposed or mis-scaled weight, a lost bias, a wrong output shape for 3-D
    inputs, and the ReLU flag ignored."""
    gen = torch.Generator().manual_seed(0)
    layer = Linear(48, 80, bias=bias)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(80, 48, generator=gen))
        layer.weight[3] *= 50  # a row of a very different scale: per-row scales handle it
        if bias:
            layer.bias.copy_(torch.randn(80, generator=gen))
    x = torch.randn(2, 7, 48, generator=gen)  # (B, T, D)
    q = Int8Linear(layer.weight, layer.bias)
    want, got = layer(x).detach(), q(x)
    assert got.shape == (2, 7, 80)
    assert rel_error(got, want) < REL_ERROR
    assert rel_error(got[..., :3], want[..., :3]) < REL_ERROR  # small rows beside the large one
    assert torch.equal(q(x, relu=True), torch.relu(got))
    assert rel_error(got, want) > 0  # it is quantized, not the float layer


def test_quantize_int8_swaps_every_linear_layer(make_model: MakeModel) -> None:
    """Catches a layer left in float (the output layer, a feed-forward layer), and logits that
    are not the float model's to quantization error."""
    model = make_model(PosKind.rope, layers=2, vocab=50)
    before = sum(isinstance(m, Linear) for m in model.modules())
    src = torch.randint(4, 50, (3, 6), generator=torch.Generator().manual_seed(1))
    tgt = torch.randint(4, 50, (3, 5), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model.logits(src, tgt)  # (B, T, V)
        assert quantize_int8(model) == before > 0
        got = model.logits(src, tgt)
    assert not any(isinstance(m, Linear) for m in model.modules())
    assert isinstance(model.out, Int8Linear)
    assert rel_error(got, want) < REL_ERROR


def test_a_quantized_model_translates_as_the_float_one(trained: EncoderDecoder) -> None:
    """Catches int8 decoding that loses the task: the model trained on reversal gives the same
    greedy and beam outputs with int8 layers (its margins are wide)."""
    src, _ = reverse_batch(torch.Generator().manual_seed(5), 24)
    sources = [[t for t in row.tolist() if 4 <= t < REV_VOCAB] for row in src]  # the words
    quantized = copy.deepcopy(trained)
    quantize_int8(quantized)
    for cfg in (
        DecodeConfig(method=SearchKind.greedy),
        DecodeConfig(method=SearchKind.beam, beam_size=4),
    ):
        want = [h[0].tokens for h in translate_ids(trained, sources, cfg)]
        got = [h[0].tokens for h in translate_ids(quantized, sources, cfg)]
        same = sum(g == w for g, w in zip(got, want, strict=True))
        assert same >= 0.9 * len(want), (cfg.method, same)


def test_quantizing_a_model_off_the_cpu_is_refused(make_model: MakeModel) -> None:
    model = make_model(PosKind.sinusoidal).to("meta")
    with pytest.raises(ConfigError, match="CPU only: use device=cpu"):
        quantize_int8(model)
