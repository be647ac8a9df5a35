"""`make bench`: run every benchmark script in its own process (so OpenMP runtimes and thread
settings never mix), stopping at the first failure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# script, arguments; each writes benchmarks/results/<name>.json and its docs/BENCHMARKS.md section
BENCHMARKS: list[tuple[str, list[str]]] = [
    ("model_speed.py", []),
    ("decode.py", []),
    ("decode_ops.py", ["--doc"]),
    ("train_throughput.py", []),
    ("train_throughput.py", ["--precision", "bf16"]),
    # whether this CPU's fp32 step is faster with products on oneDNN or ATen (MKL), and whether
    # the start-up timing of a training run picks that one
    ("products.py", []),
    # R-Drop's step (two passes and the KL term, issue #30), beside the plain one
    ("train_throughput.py", ["--rdrop-alpha", "1"]),
    # trainer.compile vs eager: each repeat compiles every fixed shape afresh (minutes)
    ("train_throughput.py", ["--compile-vs-eager", "--repeats", "3"]),
    ("train_throughput.py", ["--compile-vs-eager", "--repeats", "3", "--precision", "bf16"]),
    ("matmul_bound.py", []),
    ("allocator_faults.py", []),
    # what subword sampling does to the recipe's batches under each plan (counts; issue #30)
    ("sampling_plans.py", []),
]


def main() -> int:
    for script, args in BENCHMARKS:
        print(f"== {script} {' '.join(args)}", flush=True)
        done = subprocess.run([sys.executable, str(HERE / script), *args], check=False)
        if done.returncode != 0:
            print(f"{script} failed with exit code {done.returncode}", file=sys.stderr)
            return done.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
