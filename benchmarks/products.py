"""Where float32 training products should run on this CPU: oneDNN or ATen (MKL), ours, fp32.

    python benchmarks/products.py [--data DIR] [--repeats 3] [--steps 10] [--warmup 2]

A training run times both backends on its model's shapes before it starts (~1 s,
seq2seq.train.precision.resolve_products) and keeps the faster. This checks that choice on the
whole step: our Trainer trains train_throughput.py's model on its batches (fp32, 2 threads),
once with every float32 product on oneDNN and once on ATen, each run in its own process, the
order alternating over --repeats. Each process also runs the run-time timing itself, so the
report shows what the start-up measurement picked beside what the whole step says.

The premise is checked before any ratio: both backends compute the same function (the first
batch's eval-mode loss at the initial weights agrees to 1e-5), else the run stops.
Writes benchmarks/results/products.json and docs/BENCHMARKS.md (products).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_throughput as tt
from common import command, median, multi30k_root, run_json, update_doc, write_json

BACKENDS = ("onednn", "aten")


def run_backend(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    """Child process: train_throughput's run of ours with every float32 product on `backend`;
    also what the run-time timing measured and would have picked."""
    import torch

    from seq2seq import kernels

    torch.set_num_threads(args.threads)
    timed: dict[str, float] = {}
    real_time = kernels.time_products

    def time_products(shapes: Any) -> dict[str, float]:
        timed.update(real_time(shapes))
        return timed

    kernels.time_products = time_products  # keep the measurement, then force `backend`
    kernels.faster_products = lambda times: backend
    cfg = tt.train_config(tt_args(args))
    result = tt.run_engine("ours", cfg, args.warmup + args.steps)
    assert kernels.products() == backend, kernels.products()
    return {**result, "probe_s": timed, "probe_pick": min(timed, key=timed.__getitem__)}


def tt_args(args: argparse.Namespace) -> argparse.Namespace:
    """train_throughput's arguments, in fp32, for its train_config."""
    saved = sys.argv
    sys.argv = ["train_throughput.py", "--data", args.data, "--threads", str(args.threads)]
    try:
        return tt.arguments()
    finally:
        sys.argv = saved


def child(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run one backend in a fresh Python process, with train_throughput's environment for ours
    (its threads, this checkout on the path); returns its result."""
    cmd = [sys.executable, __file__, "--backend", backend, "--data", args.data]
    cmd += ["--steps", str(args.steps), "--warmup", str(args.warmup)]
    cmd += ["--threads", str(args.threads)]
    result: dict[str, Any] = run_json(cmd, tt.engine_env("ours", args.threads), backend)
    return result


def summarise(runs: dict[str, list[dict[str, Any]]], warmup: int) -> dict[str, Any]:
    """Per backend: the median s/step of each repeat (after the warm-up steps), their median,
    and the start-up timing's picks; the whole step's ratio."""
    result: dict[str, Any] = {}
    for backend, repeats in runs.items():
        per_repeat = [median(r["seconds"][warmup:]) for r in repeats]
        result[backend] = {
            "s_per_step": median(per_repeat),
            "s_per_step_repeats": per_repeat,
            "probe_ms": [{k: v * 1e3 for k, v in r["probe_s"].items()} for r in repeats],
            "probe_picks": [r["probe_pick"] for r in repeats],
            "initial_eval_loss": repeats[0]["initial_eval_loss"],
        }
    steps = {b: result[b]["s_per_step"] for b in BACKENDS}
    result["faster"] = min(steps, key=steps.__getitem__)
    result["aten_over_onednn"] = steps["onednn"] / steps["aten"]  # > 1: ATen's step is faster
    picks = [p for b in BACKENDS for p in result[b]["probe_picks"]]
    result["probe_agrees"] = sum(p == result["faster"] for p in picks) / len(picks)
    return result


def report(result: dict[str, Any]) -> str:
    rows = [
        "| float32 products | s/step (median of repeats) | repeats' medians | start-up timing, "
        "ms (oneDNN / ATen) |",
        "|---|---|---|---|",
    ]
    for backend in BACKENDS:
        r = result[backend]
        probes = "; ".join(f"{p['onednn']:.0f} / {p['aten']:.0f}" for p in r["probe_ms"])
        repeats = ", ".join(f"{s:.3f}" for s in r["s_per_step_repeats"])
        rows.append(f"| {backend} | {r['s_per_step']:.3f} | {repeats} | {probes} |")
    return (
        "train_throughput.py's model and batches, ours, fp32, "
        f"{result['threads']} threads: medians of {result['steps']} timed steps after "
        f"{result['warmup']} warm-up steps, {result['repeats']} repeats in processes of their "
        "own, alternating. Premise: first-batch eval losses "
        f"{result['onednn']['initial_eval_loss']:.8f} (oneDNN) and "
        f"{result['aten']['initial_eval_loss']:.8f} (ATen).\n\n"
        + "\n".join(rows)
        + f"\n\nThe whole step is faster on **{result['faster']}** (oneDNN's step / ATen's: "
        f"{result['aten_over_onednn']:.3f}); the start-up timing that a training run makes "
        f"picked it in {result['probe_agrees']:.0%} of the {2 * result['repeats']} processes.\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=str(multi30k_root()), help="Multi30k folder")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per repeat")
    parser.add_argument("--warmup", type=int, default=2, help="untimed first steps")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--backend", choices=BACKENDS, help="(internal) run one backend")
    parser.add_argument("--no-doc", action="store_true", help="skip docs and results/")
    args = parser.parse_args()
    sys.argv[0] = str(Path(__file__).resolve())  # common.command() names it from the root
    args.data = str(Path(args.data).resolve())
    if args.backend:
        print(json.dumps(run_backend(args.backend, args)))
        return
    runs: dict[str, list[dict[str, Any]]] = {b: [] for b in BACKENDS}
    for repeat in range(args.repeats):
        for backend in BACKENDS if repeat % 2 == 0 else BACKENDS[::-1]:
            runs[backend].append(child(backend, args))
            print(f"repeat {repeat + 1} {backend}: {runs[backend][-1]['seconds']}", flush=True)
        if repeat == 0:
            gap = abs(runs["onednn"][0]["initial_eval_loss"] - runs["aten"][0]["initial_eval_loss"])
            if gap > 1e-5:
                raise SystemExit(f"the backends' first-batch losses differ by {gap:.2e}: no ratio")
    result = summarise(runs, args.warmup)
    result.update(repeats=args.repeats, steps=args.steps, warmup=args.warmup, threads=args.threads)
    print(json.dumps(result, indent=2))
    print(report(result))
    if not args.no_doc:
        write_json("products", result)
        update_doc("products", "fp32 products: oneDNN vs ATen (MKL), ours", report(result))
        print(f"command: {command()}")


if __name__ == "__main__":
    main()
