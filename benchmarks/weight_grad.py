"""A linear layer's float32 weight gradient on this CPU: oneDNN (what kernels/onednn.py runs) or
ATen's mm, at the shapes of train_throughput.py's model.

    python benchmarks/weight_grad.py [--threads 2] [--rows 4096] [--repeats 20]

A one-off check for issue #29, quoted where it is used; it writes nothing. For each (out, in)
weight shape of the benchmark model (d=256, FFN 1024, vocabulary 8000's output layer excluded:
the fused loss makes that one), the gradient grad.T @ x of `rows` rows is computed by
`onednn.weight_grad` (oneDNN's `_linear_pointwise` on transposed operands, which it copies
first) and by `torch.mm(grad.T, x)` (ATen: MKL for float32, which takes transposed operands as
they are). Prints the median milliseconds of each over --repeats (after 3 untimed calls), their
ratio, and the largest difference between the two results.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import torch
from torch import Tensor

from seq2seq.kernels import onednn

SHAPES = [(256, 256), (512, 256), (768, 256), (1024, 256), (256, 1024)]  # (out, in) weights


def median_ms(fn: Callable[[], Tensor], repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print("| weight (out, in) | oneDNN ms | ATen mm ms | oneDNN / mm time | max abs diff |")
    print("|---|---|---|---|---|")
    for n, k in SHAPES:
        grad, x = torch.randn(args.rows, n), torch.randn(args.rows, k)  # (M, N), (M, K)
        ours = median_ms(functools.partial(onednn.weight_grad, grad, x), args.repeats)
        aten = median_ms(functools.partial(torch.mm, grad.T, x), args.repeats)
        diff = (onednn.weight_grad(grad, x) - torch.mm(grad.T, x)).abs().max().item()
        print(f"| ({n}, {k}) | {ours:.3f} | {aten:.3f} | {ours / aten:.2f} | {diff:.1e} |")


if __name__ == "__main__":
    main()
