"""Where a training step's time goes: ours against HF Marian, same batches, by phase and op kind.

    python benchmarks/train_profile.py [--precision fp32|bf16] [--steps 6] [--warmup 2]
        [--threads 2] [--data DIR] [--top 12] [--no-doc]

train_throughput.py's model, batches and engines (ours: the Trainer's step; Marian with sdpa and
with eager attention), each engine in a process of its own, run under torch.profiler for --steps
steps after --warmup unprofiled ones. Every op's self CPU time is put in a phase (forward, backward:
autograd's evaluate_function frames, optimizer: torch's `Optimizer.step` frame, clipping: the
rest of the step outside the loss's forward and backward) and a kind (matmul, attention, loss and
softmax, layer norm, dropout, copies and casts, other elementwise, indexing, optimizer math), and
the table gives milliseconds per step of each, with the profiled wall time per step (the profiler
adds its own overhead to every op: the step runs slower than unprofiled, and more so for the
engine that runs more ops). The ops of each engine with the largest self time are listed too.
Writes benchmarks/results/train_profile[_bf16].json and its docs/BENCHMARKS.md section.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import common  # noqa: F401  before torch: MKL's Intel path on AMD (common.py)
import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import train_throughput as tt
from common import multi30k_root, run_json, update_doc, write_json
from train_throughput_report import NAMES

# (kind, substrings of the op names that belong to it), matched in this order
KINDS: list[tuple[str, tuple[str, ...]]] = [
    ("loss and softmax", ("log_softmax", "cross_entropy", "nll_loss", "logsumexp", "loss")),
    ("attention", ("attention", "bmm", "baddbmm", "softmax")),
    ("matmul", ("::mm", "addmm", "linear", "matmul", "_linear_pointwise")),
    ("layer norm", ("layer_norm",)),
    ("dropout", ("dropout", "bernoulli", "rand")),
    ("optimizer math", ("adam", "_foreach", "lerp", "addcdiv", "addcmul", "sqrt")),
    ("copies and casts", ("copy_", "_to_copy", "::to", "clone", "contiguous", "::cat", "fill_")),
    ("indexing", ("index", "gather", "scatter", "embedding", "nonzero", "masked")),
    ("other elementwise", ("add", "mul", "div", "sub", "relu", "threshold", "where", "sum")),
]
PHASES = ("forward", "backward", "optimizer", "clip and rest")
ENGINES = tt.ENGINES


def kind_of(name: str) -> str:
    """The kind of an op, by its name (KINDS' first match; 'other' when none)."""
    low = name.lower()
    for kind, parts in KINDS:
        if any(p in low for p in parts):
            return kind
    return "other"


# our fused output layer + loss (seq2seq/kernels/loss.py): its softmax and elementwise ops are
# the loss's, not attention's or anything else's (its products stay matmuls)
LOSS_FRAMES = ("_LinearSmoothedNLL", "_LinearRDrop")


def classify(event: Any) -> tuple[str, str]:
    """The phase and kind of a profiled event, from its name and the frames around it."""
    names, node = [], event
    while node is not None:
        names.append(node.name)
        node = node.cpu_parent
    kind = kind_of(event.name)
    if kind != "matmul" and any(n in LOSS_FRAMES for n in names):
        kind = "loss and softmax"
    if any(n.startswith("Optimizer.step") for n in names):
        return "optimizer", kind
    if any(n.startswith("autograd::engine::evaluate_function") for n in names):
        return "backward", kind
    if "forward" in names:
        return "forward", kind
    return "clip and rest", kind


def profile_engine(engine: str, cfg: Any, steps: int, warmup: int) -> dict[str, Any]:
    """Child process: `warmup` steps, then `steps` profiled ones, the forward labelled."""
    batches, vocab = tt.first_batches(cfg, warmup + steps)
    with tempfile.TemporaryDirectory() as run_dir:
        step, _ = tt.engine_step(engine, cfg, vocab, Path(run_dir))
        for batch in batches[:warmup]:
            step(batch)
        with label_forward(engine), profile(activities=[ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            for batch in batches[warmup:]:
                step(batch)
            wall = time.perf_counter() - start
    table: Counter[tuple[str, str]] = Counter()
    ops: Counter[str] = Counter()
    for event in prof.events():
        if event.self_cpu_time_total <= 0 or event.name == "forward":
            continue
        table[classify(event)] += event.self_cpu_time_total / 1e3 / steps
        ops[event.name] += event.self_cpu_time_total / 1e3 / steps
    return {
        "engine": engine,
        "wall_ms_per_step": wall * 1e3 / steps,
        "ms": {f"{p}|{k}": v for (p, k), v in table.items()},
        "top_ops": ops.most_common(40),
    }


@contextmanager
def label_forward(engine: str) -> Iterator[None]:
    """Wraps the loss's forward in a profiler frame named 'forward' (ours: the model's forward,
    Marian: its model call), so that classify can tell the forward from clipping."""
    if engine == "ours":
        from seq2seq.model.transformer import EncoderDecoder

        model_class: Any = EncoderDecoder
    else:
        from transformers import MarianMTModel

        model_class = MarianMTModel
    original = model_class.forward

    def labelled(*args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function("forward"):
            return original(*args, **kwargs)

    model_class.forward = labelled
    try:
        yield
    finally:
        model_class.forward = original


def child(engine: str, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [
        sys.executable,
        __file__,
        "--engine",
        engine,
        *("--data", args.data, "--steps", str(args.steps), "--warmup", str(args.warmup)),
        *("--threads", str(args.threads), "--precision", args.precision),
    ]
    result: dict[str, Any] = run_json(cmd, tt.engine_env(engine, args.threads), engine)
    return result


def report(result: dict[str, Any], top: int) -> str:
    """The Markdown: ms per step by phase and kind, each engine a column; then the top ops."""
    runs = {e: result[e] for e in ENGINES}
    keys = sorted(
        {k for r in runs.values() for k in r["ms"]}, key=lambda k: PHASES.index(k.split("|")[0])
    )
    head = "| phase | kind | " + " | ".join(NAMES[e] for e in ENGINES) + " |"
    rows = [head, "|---|---|" + "---|" * len(ENGINES)]
    for key in keys:
        if max(r["ms"].get(key, 0.0) for r in runs.values()) < 1.0:
            continue
        phase, kind = key.split("|")
        cells = " | ".join(f"{r['ms'].get(key, 0.0):.1f}" for r in runs.values())
        rows.append(f"| {phase} | {kind} | {cells} |")
    totals = " | ".join(f"**{sum(r['ms'].values()):.1f}**" for r in runs.values())
    rows.append(f"| all | self CPU time of every op | {totals} |")
    walls = " | ".join(f"{r['wall_ms_per_step']:.1f}" for r in runs.values())
    rows.append(f"| all | profiled wall time | {walls} |")
    lists = []
    for engine, r in runs.items():
        ops = ", ".join(f"{name} {ms:.1f}" for name, ms in r["top_ops"][:top])
        lists.append(f"- {NAMES[engine]}: {ops}")
    return (
        f"train_throughput.py's model and batches, {result['precision']}, steps "
        f"{result['warmup'] + 1}-{result['warmup'] + result['steps']} of epoch 0 profiled, "
        f"{result['threads']} threads, each engine in its own process. Milliseconds per step of "
        "self CPU time (rows under 1 ms in every engine left out; the profiler's overhead "
        "is in every op):\n\n"
        + "\n".join(rows)
        + "\n\nLargest ops (ms per step):\n\n"
        + "\n".join(lists)
        + "\n"
    )


def arguments() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=str(multi30k_root()), help="Multi30k folder")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--steps", type=int, default=6, help="profiled steps")
    p.add_argument("--warmup", type=int, default=2, help="unprofiled first steps")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--top", type=int, default=12, help="ops listed per engine")
    p.add_argument("--no-doc", action="store_true", help="skip docs and results/")
    p.add_argument("--engine", choices=ENGINES, help="(internal) profile one engine, print JSON")
    args = p.parse_args()
    args.data = str(Path(args.data).resolve())
    # train_throughput's settings that this benchmark does not vary
    args.max_tokens, args.dropout, args.compile, args.rdrop_alpha = 4096, 0.1, False, 0.0
    args.device = "cpu"
    return args


def main() -> None:
    args = arguments()
    torch.set_num_threads(args.threads)
    if args.engine:
        cfg = tt.train_config(args)
        print(json.dumps(profile_engine(args.engine, cfg, args.steps, args.warmup)))
        return
    result: dict[str, Any] = {e: child(e, args) for e in ENGINES}
    result.update(
        precision=args.precision, steps=args.steps, warmup=args.warmup, threads=args.threads
    )
    print(report(result, args.top))
    if not args.no_doc:
        name = "train_profile" + ("_bf16" if args.precision == "bf16" else "")
        write_json(name, result)
        title = f"Training step profile: ours vs HF Marian ({args.precision})"
        update_doc(name, title, report(result, args.top))


if __name__ == "__main__":
    main()
