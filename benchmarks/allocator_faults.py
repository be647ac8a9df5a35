"""Minor page faults of CPU training steps with and without allocator.keep_freed_memory.

    python benchmarks/allocator_faults.py [--runs 6] [--threads 2]

Each count comes from a fresh process (the setting is process-wide): a small model (d_model 128,
2 layers, vocabulary 500, dropout 0.1) trains 10 steps on batches of 3 shapes (blocks of
0.1-12 MB), and the minor page faults of steps 4-10 are counted. Runs with and without the
setting alternate, so that the load of the machine falls on both. Prints every count and the
medians and writes benchmarks/results/allocator_faults.json.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, median, write_json

# prints whether the setting took (always False without it) and the fault count of steps 4-10
STEPS = """
import resource, sys, torch
from seq2seq.kernels.allocator import keep_freed_memory
from tests.conftest import _make_model
tuned = sys.argv[1] == "1" and keep_freed_memory()
torch.set_num_threads(int(sys.argv[2]))
model = _make_model(d_model=128, d_ff=512, layers=2, vocab=500, dropout=0.1).train()
gen = torch.Generator().manual_seed(0)
faults = 0
for step in range(10):
    n = 24 + 7 * (step % 3)
    src = torch.randint(4, 500, (128, n), generator=gen)  # (B, S)
    tgt = torch.randint(4, 500, (128, n - 3), generator=gen)  # (B, T)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    model.logits(src, tgt).logsumexp(-1).sum().backward()
    faults += (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) * (step >= 3)
print(tuned, faults)
"""


def step_faults(tune: bool, threads: int) -> tuple[bool, int]:
    """(whether the setting took, page faults of steps 4-10) of one fresh process."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads)}
    done = subprocess.run(
        [sys.executable, "-c", STEPS, str(int(tune)), str(threads)],
        check=True,
        env=env,
        capture_output=True,
        text=True,
    )
    tuned, faults = done.stdout.split()
    return tuned == "True", int(faults)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=6, help="processes with and without it")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    faults: dict[str, list[int]] = {"without": [], "with": []}
    took = []
    for run in range(args.runs):
        for name, tune in (("without", False), ("with", True)):
            tuned, count = step_faults(tune, args.threads)
            faults[name].append(count)
            took += [tuned] if tune else []
            print(f"run {run + 1}/{args.runs} {name:>7} keep_freed_memory: {count} faults")
    medians = {name: median([float(c) for c in counts]) for name, counts in faults.items()}
    print(
        f"median page faults of steps 4-10: {medians['without']:.0f} without, "
        f"{medians['with']:.0f} with (the setting took: {all(took)})"
    )
    path = write_json(
        "allocator_faults",
        {
            "runs": args.runs,
            "threads": args.threads,
            "steps_counted": "4-10 of 10",
            "setting_took": all(took),
            "faults_without": faults["without"],
            "faults_with": faults["with"],
            "median_without": medians["without"],
            "median_with": medians["with"],
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
