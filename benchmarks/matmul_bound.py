"""The fastest train_throughput.py could ever go on this machine: its matmuls at the CPU's peak.

    python benchmarks/matmul_bound.py [--data DIR] [--steps 10] [--warmup 2] [--threads 2]

For each precision (fp32, bf16 autocast), runs our Trainer's step on train_throughput.py's
batches under torch.profiler with shapes recorded, and sums 2*M*N*K over every mm, addmm, bmm
and oneDNN linear (seq2seq/kernels/onednn.py) it ran: padding included; both engines run the same
products. Dividing by the peak of a 2048x2048 matmul in that precision (flops.cpu_peak_tflops,
best of 8, measured before and after the profiled steps and the higher kept: a host whose speed
moves would otherwise set the floor by a slow moment; both are reported) gives the step time
that the matmuls alone would need, and so the most src+tgt tokens per second any engine can
reach. Writes benchmarks/results/matmul_bound.json and
docs/BENCHMARKS.md (matmul_bound).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from pathlib import Path
from typing import Any

import common  # noqa: F401  before torch: MKL's Intel path on AMD (common.py)
import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_throughput as tt
from common import command, multi30k_root, update_doc, write_json

from seq2seq.config.schema import Precision, TrainConfig
from seq2seq.train.flops import cpu_peak_tflops
from seq2seq.train.precision import DTYPES

LINEAR = "mkldnn::_linear_pointwise"  # seq2seq/kernels/onednn.py's float32 products: X @ W.T
MATMULS = ("aten::mm", "aten::addmm", "aten::addmm_", "aten::bmm", LINEAR)
PRECISIONS = ("fp32", "bf16")


def matmul_flops(event: Any) -> int:
    """2*M*N*K of one profiled matmul event (batched: times the batch)."""
    shapes = event.input_shapes
    if event.name == LINEAR:
        x, w = shapes[:2]  # (..., K), (N, K)
        return 2 * math.prod(x) * w[0]
    a, b = (shapes[1], shapes[2]) if event.name.startswith("aten::addmm") else shapes[:2]
    if event.name == "aten::bmm":
        return 2 * a[0] * a[1] * a[2] * b[2]
    return 2 * a[0] * a[1] * b[1]


def bench_config(args: argparse.Namespace, precision: str) -> TrainConfig:
    """train_throughput.py's config at its default settings (plain step, no R-Drop), in
    `precision`, with this script's --data and --threads."""
    fixed = {
        "precision": precision,
        "compile": False,
        "max_tokens": 4096,
        "dropout": 0.1,
        "rdrop_alpha": 0.0,
        "device": "cpu",
    }
    return tt.train_config(argparse.Namespace(**{**vars(args), **fixed}))


def measure(args: argparse.Namespace, precision: str) -> dict[str, float]:
    """Matmul FLOPs and seconds per step of our step, the peak, and the tokens/s ceiling."""
    cfg = bench_config(args, precision)
    dtype = DTYPES[Precision(precision)]
    peak_before = cpu_peak_tflops(dtype, size=2048) * 1e3  # GFLOP/s
    batches, vocab = tt.first_batches(cfg, args.warmup + args.steps)
    with tempfile.TemporaryDirectory() as run_dir:
        step, _ = tt.engine_step("ours", cfg, vocab, Path(run_dir))
        for batch in batches[: args.warmup]:
            step(batch)
        timed = batches[args.warmup :]
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for batch in timed:
                step(batch)
    events = [e for e in prof.events() if e.name in MATMULS and e.input_shapes]
    flops = sum(matmul_flops(e) for e in events) / len(timed)
    seconds = sum(e.self_cpu_time_total for e in events) / 1e6 / len(timed)
    peak_after = cpu_peak_tflops(dtype, size=2048) * 1e3  # GFLOP/s
    peak = max(peak_before, peak_after)
    tokens = sum(b.src_tokens + b.tgt_tokens for b in timed) / len(timed)
    floor = flops / 1e9 / peak
    return {
        "matmul_gflop_per_step": flops / 1e9,
        "matmul_s_per_step": seconds,
        "matmul_gflops": flops / 1e9 / seconds,
        "peak_gflops": peak,
        "peak_gflops_before": peak_before,
        "peak_gflops_after": peak_after,
        "floor_s_per_step": floor,
        "src_tgt_tokens_per_step": tokens,
        "ceiling_tokens_per_s": tokens / floor,
    }


def report(result: dict[str, Any]) -> str:
    rows = [
        "| precision | matmul GFLOP/step | ours: s/step in matmuls (GFLOP/s) | peak GFLOP/s "
        "(2048^3; before / after the steps) | floor s/step | src+tgt tokens/step | "
        "ceiling tokens/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in PRECISIONS:
        r = result[name]
        rows.append(
            f"| {name} | {r['matmul_gflop_per_step']:.1f} | {r['matmul_s_per_step']:.3f} "
            f"({r['matmul_gflops']:.0f}) | {r['peak_gflops']:.0f} ({r['peak_gflops_before']:.0f} / "
            f"{r['peak_gflops_after']:.0f}) | {r['floor_s_per_step']:.3f} "
            f"| {r['src_tgt_tokens_per_step']:,.0f} | {r['ceiling_tokens_per_s']:,.0f} |"
        )
    return (
        f"train_throughput.py's model and batches (steps {result['warmup'] + 1}-"
        f"{result['warmup'] + result['steps']}), {result['threads']} threads; matmul FLOPs as "
        "executed (padding included), profiled. The ceiling is the src+tgt tokens/s of a step "
        "that did nothing but its matmuls, at the peak.\n\n" + "\n".join(rows) + "\n"
    )


def main() -> None:
    default_data = str(multi30k_root())
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=default_data, help="Multi30k folder")
    parser.add_argument("--steps", type=int, default=10, help="profiled steps")
    parser.add_argument("--warmup", type=int, default=2, help="unprofiled first steps")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-doc", action="store_true", help="skip docs and results/")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.data = str(Path(args.data).resolve())
    result: dict[str, Any] = {name: measure(args, name) for name in PRECISIONS}
    result.update(steps=args.steps, warmup=args.warmup, threads=args.threads)
    print(report(result))
    if not args.no_doc:
        write_json("matmul_bound", result)
        update_doc("matmul_bound", "Training throughput's ceiling: matmuls at peak", report(result))
        print(f"command: {command()}")


if __name__ == "__main__":
    main()
