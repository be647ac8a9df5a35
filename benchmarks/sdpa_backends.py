"""SDPA's backends on a GPU in bf16: what a new shape costs each of them.

    python benchmarks/sdpa_backends.py [--data DIR] [--batches 13] [--device cuda] [--no-doc]

F.scaled_dot_product_attention picks one of its backends at each call (flash, memory-efficient,
cuDNN, math). cuDNN's attention builds an execution graph for each new shape and caches it by
shape; a translation batch has lengths of its own, so every training step brings new shapes.
This benchmark times each set of enabled backends in its own child process (the caches live in
the process), twice over the same inputs: the first pass pays each shape's set-up, the second
finds it done.

- op: SDPA alone, forward and backward, bf16, 8 heads of 64 (the model has 4, so no shape is
  shared with the step below), for each of `--batches` shapes of ~4,096 tokens: encoder-style
  attention under a padding mask given as a float bias (B, 1, 1, T), then causal attention.
- step: our Trainer's optimizer step (bf16 autocast) on train_throughput.py's batches (epoch 0's
  first, each of its own shape), same model and settings as that benchmark.

Sets: default (every backend enabled: torch's own choice), no_cudnn (flash, efficient, math: what
seq2seq.kernels.setup_process leaves enabled), efficient, math, cudnn. A set that cannot run a
call records the error. The default set also records the profiler's attention kernels (which
backend torch chose). Results: benchmarks/results/sdpa_backends.json, docs/BENCHMARKS.md
(sdpa_backends). --device cpu is a dry run of the code (the flags mean nothing there).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import common  # noqa: F401  before torch: MKL's Intel path on AMD (common.py)
import torch
import torch.nn.functional as F
from common import median, multi30k_root, run_json, update_doc, write_json

SETS = {
    "default": ("flash", "efficient", "math", "cudnn"),
    "no_cudnn": ("flash", "efficient", "math"),
    "efficient": ("efficient",),
    "math": ("math",),
    "cudnn": ("cudnn",),
}
HEADS, HEAD_DIM, TOKENS = 8, 64, 4096


def enable(names: tuple[str, ...]) -> None:
    """Enable exactly these SDPA backends in this process (torch.backends.cuda's flags)."""
    backends = torch.backends.cuda
    backends.enable_flash_sdp("flash" in names)
    backends.enable_mem_efficient_sdp("efficient" in names)
    backends.enable_math_sdp("math" in names)
    backends.enable_cudnn_sdp("cudnn" in names)


def op_shapes(count: int) -> list[tuple[int, int]]:
    """`count` distinct (batch, length) pairs of about TOKENS tokens each, lengths 12, 15, ..."""
    return [(TOKENS // (12 + 3 * i), 12 + 3 * i) for i in range(count)]


def op_inputs(batch: int, length: int, device: torch.device) -> list[torch.Tensor]:
    """q, k, v (B, H, T, Dh) needing gradients, and a padding bias (B, 1, 1, T): 0 at kept keys,
    -inf at the last quarter of every other row's keys."""
    q, k, v = (
        torch.randn(
            batch, HEADS, length, HEAD_DIM, device=device, dtype=torch.bfloat16
        ).requires_grad_()
        for _ in range(3)
    )  # (B, H, T, Dh) each
    bias = torch.zeros(batch, 1, 1, length, device=device, dtype=torch.bfloat16)  # (B, 1, 1, T)
    bias[::2, ..., length - length // 4 :] = float("-inf")
    return [q, k, v, bias]


def op_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> None:
    """Masked then causal attention, forward and backward."""
    masked = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)  # (B, H, T, Dh)
    causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, T, Dh)
    (masked.float().sum() + causal.float().sum()).backward()


def timed(calls: list[Any], sync: Any) -> list[float]:
    """Seconds of each call, synchronized before and after."""
    seconds = []
    for call in calls:
        sync()
        start = time.perf_counter()
        call()
        sync()
        seconds.append(time.perf_counter() - start)
    return seconds


def two_passes(calls: list[Any], sync: Any) -> dict[str, Any]:
    """The calls timed twice (the second pass finds every shape seen), or the first error."""
    try:
        return {"first": timed(calls, sync), "second": timed(calls, sync)}
    except RuntimeError as err:
        return {"error": str(err).splitlines()[0][:300]}


def attention_kernels(inputs: list[torch.Tensor]) -> list[str]:
    """The GPU kernels of one op call whose names say attention, by time (the chosen backend)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        op_call(*inputs)
        torch.cuda.synchronize()
    words = ("attn", "attention", "fmha", "flash", "cudnn", "sdpa", "softmax")
    events = sorted(prof.key_averages(), key=lambda e: -e.device_time_total)
    return [e.key[:120] for e in events if any(w in e.key.lower() for w in words)][:6]


def step_calls(args: argparse.Namespace, device: torch.device) -> list[Any]:
    """One Trainer optimizer step per train_throughput batch (bf16, on `device`)."""
    import tempfile

    from train_throughput import first_batches, train_config

    from seq2seq.train.build import build_trainer

    cfg = train_config(
        argparse.Namespace(
            data=args.data,
            dropout=0.1,
            max_tokens=TOKENS,
            threads=1,
            device=str(device),
            precision="bf16",
            compile=False,
            rdrop_alpha=0.0,
        )
    )
    batches = [b.to(device) for b in first_batches(cfg, args.batches)[0]]
    trainer = build_trainer(cfg, Path(tempfile.mkdtemp()))  # calls kernels.setup_process
    return [lambda b=b: trainer.train_step([b]) for b in batches]


def child(args: argparse.Namespace) -> dict[str, Any]:
    """One backend set's timings (this process enables only its backends)."""
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    steps = step_calls(args, device)
    enable(SETS[args.set])  # after build_trainer, whose setup_process sets flags of its own
    inputs = [op_inputs(b, t, device) for b, t in op_shapes(args.batches)]
    result = {
        "set": args.set,
        "op": two_passes([lambda x=x: op_call(*x) for x in inputs], sync),
        "step": two_passes(steps, sync),
    }
    if args.set == "default" and device.type == "cuda":
        result["kernels"] = attention_kernels(inputs[0])
    return result


def summary(passes: dict[str, Any]) -> str:
    """'first-pass total / second-pass total (median call)' in seconds, or the error."""
    if "error" in passes:
        return f"fails: {passes['error'][:80]}"
    first, second = passes["first"], passes["second"]
    return f"{sum(first):.3f} / {sum(second):.3f} ({median(second) * 1e3:.1f} ms)"


def report(result: dict[str, Any]) -> str:
    """The Markdown body of the docs/BENCHMARKS.md section."""
    n = result["batches"]
    rows = [
        "| enabled backends | op: first / second pass, s (median call) "
        "| training step: first / second pass, s (median step) |",
        "|---|---|---|",
    ]
    for name, r in result["sets"].items():
        rows.append(
            f"| {name}: {', '.join(SETS[name])} | {summary(r['op'])} | {summary(r['step'])} |"
        )
    kernels = result["sets"].get("default", {}).get("kernels") or ["(not recorded)"]
    return (
        f"bf16 on {result['device']}, {n} shapes per pass, each set in its own process; a pass "
        "sums its calls. op: SDPA forward + backward, 8 heads of 64, ~4,096 tokens a call, a "
        "padding bias then causal. Training step: train_throughput.py's model and first "
        f"{n} batches, our Trainer.\n\n" + "\n".join(rows) + "\n\nAttention kernels of the "
        "default set (profiler, one op call): " + "; ".join(f"`{k}`" for k in kernels) + "\n"
    )


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=None, help="the Multi30k folder")
    parser.add_argument("--batches", type=int, default=13, help="shapes per pass")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--sets", default=",".join(SETS), help="comma-separated set names")
    parser.add_argument("--set", default=None, help=argparse.SUPPRESS)  # a child's own set
    parser.add_argument("--no-doc", action="store_true", help="print only")
    return parser.parse_args()


def main() -> None:
    args = arguments()
    args.data = str(multi30k_root(args.data).resolve())
    if args.set:
        print(json.dumps(child(args)))
        return
    sets = {}
    for name in args.sets.split(","):
        cmd = [
            sys.executable,
            __file__,
            "--set",
            name,
            "--data",
            args.data,
            "--batches",
            str(args.batches),
            "--device",
            args.device,
        ]
        sets[name] = run_json(cmd, env=dict(os.environ), what=f"set {name}")
        print(
            name, "op", summary(sets[name]["op"]), "step", summary(sets[name]["step"]), flush=True
        )
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu (dry run)"
    result = {"device": device, "batches": args.batches, "sets": sets}
    print(report(result))
    if not args.no_doc and args.device == "cuda":
        write_json("sdpa_backends", result)
        update_doc(
            "sdpa_backends", "SDPA backends on a GPU: what a new shape costs (bf16)", report(result)
        )


if __name__ == "__main__":
    main()
