"""int8 decoding on a CPU: every linear layer's weight as int8, its input quantized per call.

`quantize_int8(model)` swaps each `Linear` of a model (the attention projections, the
feed-forward layers and the output layer) for an `Int8Linear`: the weight quantized once, per
output row (symmetric, scale = max |w| / 127), and packed for PyTorch's quantized CPU engine;
each call quantizes its input to 8 bits with a scale of its own and runs an int8 GEMM with
int32 accumulation (PyTorch's dynamic quantization, `torch.ops.quantized.linear_dynamic`). The
activations keep 7 bits (`reduce_range`): on CPUs without VNNI the 8-bit product's 16-bit
intermediate sums can saturate, and the engine is not chosen per CPU here. Embeddings, layer
norms and attention stay in float32. It is an inference-only transform: the module keeps no
float weight, so the model can no longer train or be saved as a checkpoint.

torch 2.13 marks its quantized tensors deprecated (pytorch/pytorch#184982, torchao is to replace
them); the warning is silenced here, and this module is the one place to change when they go.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn

from seq2seq.errors import ConfigError
from seq2seq.model.layers import Linear

REDUCE_RANGE = True  # 7-bit activations: no saturation on CPUs without VNNI


class Int8Linear(nn.Module):
    """A linear layer with an int8 weight, per output channel, and inputs quantized per call
    (dynamic quantization; Jacob et al. 2018, "Quantization and Training of Neural Networks
    for Efficient Integer-Arithmetic-Only Inference"); `forward(x, relu)` as `Linear`'s."""

    def __init__(self, weight: Tensor, bias: Tensor | None) -> None:
        """Quantize `weight` (out, in) per row and pack it with `bias` (out,) or None."""
        super().__init__()
        weight = weight.detach().float()
        scales = (weight.abs().amax(dim=1) / 127).clamp(min=1e-8).double()  # (out,)
        zeros = torch.zeros_like(scales, dtype=torch.long)  # (out,) symmetric
        with warnings.catch_warnings():  # the deprecation (module docstring), once per layer
            warnings.filterwarnings("ignore", message=".*quantized tensor creation functions")
            qweight = torch.quantize_per_channel(weight, scales, zeros, 0, torch.qint8)
        b = None if bias is None else bias.detach().float()
        self.packed = torch.ops.quantized.linear_prepack(qweight, b)
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]

    def forward(self, x: Tensor, relu: bool = False) -> Tensor:
        """x (..., in) -> (..., out), in float32, then a ReLU if asked."""
        flat = x.reshape(-1, self.in_features).float()  # (N, in)
        y = torch.ops.quantized.linear_dynamic(flat, self.packed, REDUCE_RANGE)  # (N, out)
        y = y.reshape(*x.shape[:-1], self.out_features)  # (..., out)
        return torch.relu(y) if relu else y


def quantize_int8(model: nn.Module) -> int:
    """Replace every `Linear` inside `model` by an `Int8Linear`, in place; returns how many.
    The model must be on the CPU (PyTorch's quantized engine is CPU-only)."""
    if any(p.device.type != "cpu" for p in model.parameters()):
        raise ConfigError("quantize=int8 runs on the CPU only: use device=cpu (or quantize=none)")
    swaps = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, Linear)
    ]
    for parent, name, child in swaps:
        setattr(parent, name, Int8Linear(child.weight, child.bias))
    return len(swaps)
