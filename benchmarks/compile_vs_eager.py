"""trainer.compile against eager on the same batches: `python benchmarks/train_throughput.py
--compile-vs-eager [--precision fp32|bf16] [--compile-mode default|max_autotune]
[--shape-buckets 8] [--steps 10] [--repeats 3] [--device cpu|cuda]` (issue #29).

train_throughput.py's model and data (ours only, no Marian), three engines, each in its own
process, the order alternating over the repeats:

- eager_exact: the default run, trainer.compile=false with exact batch shapes (its own batches);
- eager_fixed: eager on the compiled run's batches (trainer.batch_shapes=fixed, the CPU kernels);
- eager_reference: eager on the same batches with the reference kernels (trainer.kernels=
  reference): what the compiled graphs compute, uncompiled. It splits compiled's gap to
  eager_fixed into the kernels' part (eager_reference against eager_fixed) and the compiler's
  (compiled against eager_reference);
- compiled: trainer.compile=true (fixed shapes, static graphs, the reference kernels in them).

Each engine's Trainer takes the batches of epoch 0 in training order: first the first batch of
every shape (the fixed engines: all their shapes, at most --shape-buckets; eager_exact: --warmup
batches), untimed as steady state: their seconds are the warm-up, torch.compile's compilations
for `compiled`, with Inductor's on-disk caches empty (a first run's); then the next --steps
batches, timed (every shape already compiled). Reported: the warm-up, the mean s/step of the
timed steps, real (non-pad) source + target tokens per second, and the share of real tokens
among the padded (over epoch 0 and over the timed steps); compiled against eager_fixed (same
batches: s/step) and against eager_exact (real tokens/s: what a user gains by switching compile
on), and after how many steps the warm-up is repaid. The CPU's model and its vector/matrix
flags (AVX-512, AVX512-BF16, AMX) are recorded: Inductor's CPU code and GEMM templates depend
on them. Results: benchmarks/results/train_compile[_bf16][_max_autotune].json and
docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common  # noqa: F401  before torch: MKL's Intel path on AMD (common.py)
import torch
from common import child_pythonpath, median, peak_rss_mb, update_doc, write_json

from seq2seq.config.schema import TrainConfig
from seq2seq.train.machine import SPEED_FLAGS, cpu_flags

ENGINES = ("eager_exact", "eager_fixed", "eager_reference", "compiled")
OVERRIDES = {
    "eager_exact": ["trainer.compile=false", "trainer.batch_shapes=exact"],
    "eager_fixed": ["trainer.compile=false", "trainer.batch_shapes=fixed"],
    "eager_reference": [
        "trainer.compile=false",
        "trainer.batch_shapes=fixed",
        "trainer.kernels=reference",
    ],
    "compiled": ["trainer.compile=true", "trainer.batch_shapes=fixed"],
}


def engine_overrides(engine: str, args: argparse.Namespace) -> list[str]:
    """The Hydra overrides of `engine` on top of train_throughput.py's config."""
    return [
        *OVERRIDES[engine],
        f"trainer.shape_buckets={args.shape_buckets}",
        f"trainer.compile_mode={args.compile_mode}",
    ]


def run_engine(cfg: TrainConfig, steps: int, warmup: int) -> dict[str, Any]:
    """Child process: the warm-up steps (one per shape with fixed shapes, else `warmup`), then
    `steps` timed training steps of epoch 0 in training order."""
    from seq2seq.train.build import build_trainer

    with tempfile.TemporaryDirectory() as run_dir:
        trainer = build_trainer(cfg, Path(run_dir))
        data = trainer.train_data
        groups = [[b.to(trainer.device) for b in data.passes(r)] for r in data.epoch_batches(0)]
        shape = lambda g: tuple((*b.src.shape, b.tgt_out.shape[1]) for b in g)  # noqa: E731
        firsts: dict[Any, int] = {}
        for i, group in enumerate(groups):
            firsts.setdefault(shape(group), i)
        first = sorted(firsts.values()) if data.buckets is not None else list(range(warmup))
        rest = [g for i, g in enumerate(groups) if i not in set(first)][:steps]
        sync = torch.cuda.synchronize if trainer.device.type == "cuda" else lambda: None
        warm, timed = [], []
        for seconds, batches in ((warm, [groups[i] for i in first]), (timed, rest)):
            for group in batches:
                sync()
                start = time.perf_counter()
                trainer.train_step(group)
                sync()  # a GPU's step ends when its kernels do
                seconds.append(time.perf_counter() - start)
        trainer.close()
    return {
        "warmup_seconds": warm,
        "seconds": timed,
        "real": [sum(b.src_tokens + b.tgt_tokens for b in g) for g in rest],
        "padded": [sum(b.src.numel() + b.tgt_out.numel() for b in g) for g in rest],
        "shapes": len(firsts),
        "epoch_share": data.epoch_padding(0)["padding_efficiency"],
        "rss_mb": peak_rss_mb(),
    }


def child(engine: str, args: argparse.Namespace) -> dict[str, Any]:
    """One engine in a fresh process (its own peak RSS), with empty compile caches: the warm-up
    of a first compiled run (a later run on the same machine reads Inductor's on-disk cache)."""
    script = Path(__file__).with_name("train_throughput.py")
    cmd = [sys.executable, str(script), "--data", args.data, "--compile-engine", engine]
    for flag in ("steps", "warmup", "threads", "max_tokens", "precision", "dropout", "device"):
        cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    cmd += ["--shape-buckets", str(args.shape_buckets), "--compile-mode", args.compile_mode]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": child_pythonpath()}
    with tempfile.TemporaryDirectory() as cache:  # Inductor's caches empty: a cold warm-up
        env["TORCHINDUCTOR_CACHE_DIR"] = cache
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{engine} failed:\n{out.stderr[-3000:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def summarise(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Medians over the repeats of one engine."""
    per = [
        (
            sum(r["warmup_seconds"]),
            sum(r["seconds"]) / len(r["seconds"]),
            sum(r["real"]) / sum(r["seconds"]),
            sum(r["real"]) / sum(r["padded"]),
        )
        for r in runs
    ]
    return {
        "warmup_s": median([p[0] for p in per]),
        "s_per_step": median([p[1] for p in per]),
        "real_tokens_per_s": median([p[2] for p in per]),
        "real_share": per[0][3],
        "epoch_share": runs[0]["epoch_share"],
        "warmup_steps": len(runs[0]["warmup_seconds"]),
        "shapes": runs[0]["shapes"],
        "peak_rss_mb": median([r["rss_mb"] for r in runs]),
    }


def verdict(result: dict[str, Any]) -> dict[str, Any]:
    """compiled against eager_fixed (same batches) and eager_exact (real tokens/s), the same
    batches' gap split into the kernels' and the compiler's parts (eager_reference), and the
    steps after which compiled's extra warm-up is repaid against eager_exact (None: never)."""
    exact, fixed, ref, comp = (result[e] for e in ENGINES)
    gain = comp["real_tokens_per_s"] / exact["real_tokens_per_s"]
    # seconds eager_exact would spend on one compiled step's real tokens, minus compiled's own
    real_per_step = comp["real_tokens_per_s"] * comp["s_per_step"]
    saved = real_per_step / exact["real_tokens_per_s"] - comp["s_per_step"]
    extra = comp["warmup_s"] - exact["warmup_s"] * comp["warmup_steps"] / exact["warmup_steps"]
    return {
        "same_batches_speedup": fixed["s_per_step"] / comp["s_per_step"],
        "compiler_speedup": ref["s_per_step"] / comp["s_per_step"],  # same kernels
        "reference_kernels_speedup": fixed["s_per_step"] / ref["s_per_step"],  # uncompiled
        "real_tokens_speedup": gain,
        "repaid_after_steps": extra / saved if saved > 0 else None,
        "pays": gain > 1,
    }


def report(result: dict[str, Any]) -> str:
    """The Markdown body of the docs/BENCHMARKS.md section."""
    rows = [
        "| engine | shapes in epoch 0 | real tokens: epoch 0, timed steps | warm-up steps | "
        "warm-up (s) | s/step | real src+tgt tokens/s | peak RSS (MB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for e in ENGINES:
        r = result[e]
        rows.append(
            f"| {e} | {r['shapes']} | {100 * r['epoch_share']:.1f}%, "
            f"{100 * r['real_share']:.1f}% | {r['warmup_steps']} | "
            f"{r['warmup_s']:.1f} | {r['s_per_step']:.3f} | {r['real_tokens_per_s']:,.0f} | "
            f"{r['peak_rss_mb']:,.0f} |"
        )
    v = result["verdict"]
    repaid = v["repaid_after_steps"]
    when = f"is repaid after ~{repaid:,.0f} steps" if repaid is not None else "is never repaid"
    pays = "pays" if v["pays"] else "does not pay"
    return (
        f"train_throughput.py's model and data, {result['precision']}, batches of <= "
        f"{result['max_tokens']} padded tokens, {result['threads']} threads, fixed shapes: "
        f"{result['shape_buckets']} lengths, torch.compile mode {result['compile_mode']}; "
        f"CPU flags: {', '.join(result['cpu_flags']) or 'none of ' + ', '.join(SPEED_FLAGS)}. "
        f"Medians of {result['repeats']} repeats (engine order alternating, each in its own "
        f"process) of {result['steps']} timed steps of epoch 0 after the warm-up steps (the "
        "fixed engines: the first batch of each shape).\n\n"
        + "\n".join(rows)
        + f"\n\ncompiled against eager on the same batches: **{v['same_batches_speedup']:.2f}x** "
        f"(s/step), of which the compiler (compiled against eager_reference, the same kernels): "
        f"**{v['compiler_speedup']:.2f}x**, the reference kernels (eager_reference against "
        f"eager_fixed): {v['reference_kernels_speedup']:.2f}x; "
        f"against the default eager run (exact shapes), real tokens/s: "
        f"**{v['real_tokens_speedup']:.2f}x**: trainer.compile {pays} on this "
        f"{'GPU' if result['device'] == 'cuda' else 'CPU'}; its extra "
        f"warm-up {when}. eager_exact's timed steps are other batches than the fixed engines' "
        "(its own epoch 0), so its s/step does not compare; its real tokens/s does.\n"
    )


def main(args: argparse.Namespace, cfg_of: Any) -> None:
    """--compile-engine E: run engine E here (print JSON); else every engine, the report."""
    if args.compile_engine:
        torch.set_num_threads(args.threads)
        cfg = cfg_of(args, engine_overrides(args.compile_engine, args))
        print(json.dumps(run_engine(cfg, args.steps, args.warmup)))
        return
    runs: dict[str, list[dict[str, Any]]] = {e: [] for e in ENGINES}
    for repeat in range(args.repeats):
        for engine in ENGINES if repeat % 2 == 0 else ENGINES[::-1]:
            runs[engine].append(child(engine, args))
            print(f"repeat {repeat + 1} {engine}: {runs[engine][-1]}", flush=True)
    result: dict[str, Any] = {e: summarise(runs[e]) for e in ENGINES}
    result.update(
        repeats=args.repeats,
        steps=args.steps,
        threads=args.threads,
        max_tokens=args.max_tokens,
        precision=args.precision,
        shape_buckets=args.shape_buckets,
        compile_mode=args.compile_mode,
        cpu_flags=cpu_flags(),
        device=args.device,
        gpu=torch.cuda.get_device_name() if args.device == "cuda" else None,
    )
    result["verdict"] = verdict(result)
    print(json.dumps(result, indent=2))
    if not args.no_doc:
        # one section per precision and mode: max_autotune's run keeps the default mode's
        default_mode = args.compile_mode == "default"
        name = "train_compile" + ("" if args.precision == "fp32" else f"_{args.precision}")
        name += "" if default_mode else f"_{args.compile_mode}"
        name += "_cuda" if args.device == "cuda" else ""
        mode = "" if default_mode else f", mode {args.compile_mode}"
        mode += f", CUDA, {result['gpu']}" if args.device == "cuda" else ""
        title = f"trainer.compile vs eager ({args.precision}{mode})"
        write_json(name, result)
        update_doc(name, title, report(result))
