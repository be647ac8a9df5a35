"""Results of benchmarks/train_throughput.py: each engine's summary of its repeats, the Markdown of
its docs/BENCHMARKS.md section and the section's name. Every number printed comes from the run's
own results; the fixed text only says what was done."""

from __future__ import annotations

import argparse
from typing import Any

from common import median

# the premise: first-batch eval-mode losses of ours and Marian at the same initial weights agree
LOSS_TOLERANCE = 1e-5
# Marian runs with each of its attention implementations; we are compared with the faster
ENGINES = ("ours", "hf", "hf_eager")
NAMES = {
    "ours": "seq2seq Trainer",
    "hf": "HF MarianMTModel (sdpa)",
    "hf_eager": "HF MarianMTModel (eager)",
}


def summarise(runs: list[dict[str, Any]], warmup: int, peak: float = 0.0) -> dict[str, float]:
    """Medians over the repeats of one engine (the first `warmup` steps of each left out);
    `peak`: the device's TFLOP/s for the MFU (0: none)."""
    per_run = []
    for r in runs:
        secs = sum(r["seconds"][warmup:])
        src, tgt = sum(r["src_tokens"][warmup:]), sum(r["tgt_tokens"][warmup:])
        tflops = sum(r["flops"][warmup:]) / secs / 1e12
        per_run.append((secs / len(r["seconds"][warmup:]), (src + tgt) / secs, tgt / secs, tflops))
    tflops = median([p[3] for p in per_run])
    return {
        "s_per_step": median([p[0] for p in per_run]),
        "src_tgt_tokens_per_s": median([p[1] for p in per_run]),
        "tgt_tokens_per_s": median([p[2] for p in per_run]),
        "tflops": tflops,
        "mfu": tflops / peak if peak > 0 else 0.0,
        "peak_gpu_mb": median([r.get("gpu_mb", 0.0) for r in runs]),
        "peak_rss_mb": median([r["rss_mb"] for r in runs]),
        "final_loss": runs[0]["losses"][-1],
        "initial_eval_loss": runs[0]["initial_eval_loss"],
    }


def report(result: dict[str, Any]) -> str:
    """The Markdown body of the docs/BENCHMARKS.md section."""
    ours, gpu = result["ours"], result.get("device", "cpu") == "cuda"
    extra = " MFU | peak GPU memory (MB) |" if gpu else ""
    rows = [
        "| engine | src+tgt tokens/s | target tokens/s | s/step | model TFLOP/s | peak RSS (MB) "
        f"| loss at step {result['steps_total']} |{extra}",
        "|---|---|---|---|---|---|---|" + ("---|---|" if gpu else ""),
    ]
    for name, r in ((NAMES[e], result[e]) for e in ENGINES):
        speed = f"{r['src_tgt_tokens_per_s']:,.0f} | {r['tgt_tokens_per_s']:,.0f}"
        cost = f"{r['s_per_step']:.3f} | {r['tflops']:.3f} | {r['peak_rss_mb']:,.0f}"
        cells = f" {r['mfu']:.2%} | {r['peak_gpu_mb']:,.0f} |" if gpu else ""
        rows.append(f"| {name} | {speed} | {cost} | {r['final_loss']:.3f} |{cells}")
    curves = "\n".join(
        f"- {e}: " + ", ".join(f"{x:.3f}" for x in result["loss_curves"][e]) for e in ENGINES
    )
    return (
        "d=256, 3+3 layers, 4 heads, FFN 1024, post-norm, joint BPE 8000 (Multi30k train), "
        f"batches of <= {result['max_tokens']} padded tokens (epoch 0's first, length-bucketed), "
        f"label smoothing 0.1, AdamW, clipping 1.0, {result['precision']}, "
        + (
            f"R-Drop (alpha {result['rdrop_alpha']}: two passes a step, both engines), "
            if result.get("rdrop_alpha")
            else ""
        )
        + ("ours torch.compile'd, " if result.get("compile") else "")
        + (
            f"on the GPU (MFU against its datasheet peak, {result['peak_tflops']:g} TFLOP/s in "
            f"{result['precision']}), "
            if gpu
            else f"{result['threads']} threads, "
        )
        + "model TFLOP/s from seq2seq.train.flops' count of each batch. "
        f"Medians of {result['repeats']} repeats (engine order "
        "alternating, each in its own process) of "
        f"{result['steps']} timed steps after {result['warmup']} warm-up steps.\n\n"
        + "\n".join(rows)
        + f"\n\nSpeed-up (src+tgt tokens/s) over the faster Marian ({NAMES[result['hf_best']]}): "
        f"**{result['speedup']:.2f}x**.\n\n"
        f"Same initial weights (copied into Marian), checked before timing: eval-mode loss of the "
        f"first batch {ours['initial_eval_loss']:.8f} (ours) vs "
        f"{result['hf']['initial_eval_loss']:.8f} (Marian), largest gap "
        f"{result['initial_loss_gap']:.1e} (the run aborts above {LOSS_TOLERANCE:.0e}). Loss "
        f"per target token at each step (same batches and schedule, dropout {result['dropout']}; "
        "with dropout the masks differ, so the curves agree in trend, and exactly with "
        "`--dropout 0`):\n\n" + curves + "\n"
    )


def doc_name(args: argparse.Namespace) -> tuple[str, str]:
    """The results' name (JSON file, docs/BENCHMARKS.md section) and the section's title."""
    name = "train_throughput" + ("_rdrop" if args.rdrop_alpha > 0 else "")
    name += "_cuda" if args.device == "cuda" else ""
    name += "" if args.precision == "fp32" else f"_{args.precision}"
    where = ", CUDA" if args.device == "cuda" else ""
    title = f"Training throughput: seq2seq vs HF Marian ({args.precision}{where})"
    if args.rdrop_alpha > 0:
        title += f", R-Drop alpha {args.rdrop_alpha}"
    return name, title
