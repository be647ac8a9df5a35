"""Training FLOPs of a step, the device's peak, and model FLOPs utilisation (MFU).

FLOPs of one training step (forward + backward = 3 x forward; a matmul of a token with an
(n x m) weight is 2nm FLOPs forward), over the batches of the step:

    6 * (P_enc * n_src + (P_dec + d * V_tgt) * n_tgt)          weights
  + 12 * d * (L_enc * n_src * S + L_dec * n_tgt * (T + S))      attention scores and values

P_enc / P_dec: non-embedding parameters of the encoder / decoder stacks (embedding lookups cost
no FLOPs); d * V_tgt: the output projection (a matmul even when tied to the embedding);
n_src / n_tgt: non-pad source / target tokens; S / T: the padded source / target widths of the
batch (each query attends to the S or T keys; the decoder's self-attention is counted unmasked,
and its cross-attention reads S keys). MFU = FLOPs per second / peak FLOPs per second.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence

import torch
from torch import nn

from seq2seq import kernels
from seq2seq.data.batching import Batch

# Dense bf16/fp16 tensor-core peaks in TFLOPS, matched against torch.cuda.get_device_name.
PEAK_TFLOPS = {
    "H200": 989.0,
    "H100 PCIe": 756.0,
    "H100": 989.0,
    "A100": 312.0,
    "A10G": 125.0,
    "A10": 125.0,
    "L40S": 362.0,
    "L4": 121.0,
    "V100": 125.0,
    "T4": 65.0,
    "RTX 4090": 165.0,
    "RTX 3090": 71.0,
}
# Plain float32 peaks (CUDA cores, no TF32: PyTorch's default for float32 matmuls), the vendors'
# datasheets; training in fp32 is measured against these, not against the bf16 tensor cores.
PEAK_FP32_TFLOPS = {
    "H200": 67.0,
    "H100 PCIe": 51.0,
    "H100": 67.0,
    "A100": 19.5,
    "A10G": 31.2,
    "A10": 31.2,
    "L40S": 91.6,
    "L4": 30.3,
    "V100": 15.7,
    "T4": 8.1,
    "RTX 4090": 82.6,
    "RTX 3090": 35.6,
}


def peak_tflops(
    device: torch.device, configured: float = 0.0, dtype: torch.dtype = torch.float32
) -> float:
    """`configured` when positive, else for a GPU the table's value for its name and `dtype`
    (first name that matches; 0 for an unknown GPU: MFU is then not logged), else on the CPU
    its measured matmul peak in `dtype` (cpu_peak_tflops)."""
    if configured > 0:
        return configured
    if device.type == "cpu":
        return cpu_peak_tflops(dtype)
    if device.type != "cuda":
        return 0.0
    return gpu_peak_tflops(torch.cuda.get_device_name(device), dtype)


def gpu_peak_tflops(name: str, dtype: torch.dtype) -> float:
    """The datasheet peak of the GPU called `name` in `dtype` (float32: PEAK_FP32_TFLOPS, else
    the tensor cores' PEAK_TFLOPS); 0 when no key of the table is in the name."""
    table = PEAK_FP32_TFLOPS if dtype == torch.float32 else PEAK_TFLOPS
    return next((peak for key, peak in table.items() if key in name), 0.0)


@functools.cache
def cpu_peak_tflops(dtype: torch.dtype, size: int = 1024, repeats: int = 8) -> float:
    """TFLOPS of a square `size` matmul in `dtype` on this process's CPU threads, the best of
    `repeats` (after one warm-up): a CPU's peak depends on its cores, threads and instructions
    (2 AVX-512 cores: ~0.45 fp32, ~0.9 bf16), so it is measured, once per dtype (~0.1 s). The
    matmul is the one training uses (kernels.linear: float32 on oneDNN, where MKL's SGEMM
    reaches ~0.2 on AMD CPUs). Constant operands: drawing random ones would move the
    training's random generator."""
    a = b = torch.full((size, size), 0.5, dtype=dtype)
    kernels.linear(a, b, None)  # the warm-up, untimed
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        kernels.linear(a, b, None)  # a @ b.T
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e12


def stack_params(model: nn.Module) -> tuple[int, int]:
    """Non-embedding parameters of the encoder stack and of the decoder stack (with norms)."""
    enc = dec = 0
    for name, param in model.named_parameters():
        if name.startswith(("encoder.", "enc_norm.")):
            enc += param.numel()
        elif name.startswith(("decoder.", "dec_norm.")):
            dec += param.numel()
    return enc, dec


class FlopCounter:
    """FLOPs of a step's batches for one model (see the module docstring for the formula)."""

    def __init__(
        self,
        model: nn.Module,
        d_model: int,
        layers: tuple[int, int],
        tgt_vocab: int,
        passes: int = 1,
    ) -> None:
        """`passes`: forward and backward passes per batch (2 with R-Drop, trainer.rdrop_alpha;
        its KL's elementwise work is not counted)."""
        self.enc_params, self.dec_params = stack_params(model)
        self.d, self.layers, self.vocab, self.passes = d_model, layers, tgt_vocab, passes

    def batch(self, n_src: int, n_tgt: int, src_width: int, tgt_width: int) -> float:
        """Training FLOPs of one batch of n_src/n_tgt real tokens padded to the given widths."""
        weights = 6 * (self.enc_params * n_src + (self.dec_params + self.d * self.vocab) * n_tgt)
        enc_layers, dec_layers = self.layers
        attention = (
            12
            * self.d
            * (enc_layers * n_src * src_width + dec_layers * n_tgt * (tgt_width + src_width))
        )
        return float(self.passes * (weights + attention))

    def counts(self, group: Sequence[Batch]) -> list[float]:
        """A step's batches: target tokens, training FLOPs, real and padded (src+tgt) tokens."""
        tokens = flops = real = padded = 0.0
        for b in group:
            n_src, n_tgt = b.src_tokens, b.tgt_tokens
            tokens, real = tokens + n_tgt, real + n_src + n_tgt
            padded += b.src.numel() + b.tgt_out.numel()  # src (B, S), tgt_out (B, T)
            flops += self.batch(n_src, n_tgt, b.src.shape[1], b.tgt_out.shape[1])
        return [tokens, flops, real, padded]


class Throughput:
    """FLOPs and real/padded tokens since the last log line: MFU and padding efficiency."""

    def __init__(self, peak_flops: float) -> None:
        self.peak = peak_flops  # FLOPs per second of all the devices together (0: unknown)
        self.flops = self.real = self.padded = 0.0
        self.start = time.monotonic()

    def add(self, flops: float, real: float, padded: float) -> None:
        """Count one step's FLOPs and its real and padded tokens."""
        self.flops, self.real, self.padded = (
            self.flops + flops,
            self.real + real,
            self.padded + padded,
        )

    def scalars(self) -> dict[str, float]:
        """train/mfu (when the peak is known), train/padding_efficiency and train/tflops since
        the last call; starts a new window."""
        elapsed = max(time.monotonic() - self.start, 1e-9)
        out = {
            "tflops": self.flops / elapsed / 1e12,
            "padding_efficiency": self.real / max(self.padded, 1.0),
        }
        if self.peak > 0:
            out["mfu"] = self.flops / elapsed / self.peak
        self.flops = self.real = self.padded = 0.0
        self.start = time.monotonic()
        return out
