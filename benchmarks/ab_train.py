"""Training speed of two checkouts of seq2seq, for a change that must not move it (a refactor).

    python benchmarks/ab_train.py --before /path/to/old/checkout [--after .] [--repeats 3]

Each side runs seq2seq-train in its own process, from its own checkout (PYTHONPATH), on the same
recipe: `make train`'s (experiment=numbers: Transformer-Tiny, BPE 1,000, the embedded numbers
data) for --steps steps, fp32 (no timing-based choice), 2 threads, one validation at the end,
each run in a fresh folder with a fresh tokenizer and data cache. The sides alternate. The
premise is checked before any ratio: both sides must reach the same test BLEU and validation loss
(the same weights, to float rounding), else the run stops. Then the median training tokens/s
(results.json's train_tokens_per_s: the fit, validation included) and the after/before ratio
are printed and written to benchmarks/results/ab_train.json. Prints nothing to docs/: a one-off
check, quoted where it is used.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, machine_fields, median, write_json


def side(path: Path, steps: int, work: Path) -> dict[str, float]:
    """One training run of the checkout at `path`, in its own process; its results.json."""
    module = (
        "seq2seq.cli.train" if (path / "seq2seq" / "cli" / "train.py").exists() else "seq2seq.train"
    )
    run_dir = Path(tempfile.mkdtemp(dir=work))
    args = [
        sys.executable,
        "-m",
        module,
        "experiment=numbers",
        f"trainer.max_steps={steps}",
        f"trainer.valid_every={steps}",
        "trainer.precision=fp32",
        "trainer.threads=2",
        "trainer.progress=false",
        "trainer.average_last=0",
        f"tokenizer.cache_dir={run_dir}/tok",
        f"data.cache_dir={run_dir}/prepared",
        f"hydra.run.dir={run_dir}/run",
    ]
    env = {**os.environ, "PYTHONPATH": str(path), "OMP_NUM_THREADS": "2"}
    done = subprocess.run(args, cwd=path, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{path}: seq2seq-train failed:\n{done.stderr[-3000:]}")
    results = json.loads((run_dir / "run" / "results.json").read_text())
    test = next(iter(results["test"].values()))
    return {
        "tokens_per_s": float(results["train_tokens_per_s"]),
        "bleu": float(test["bleu"]),
        "valid_loss": float(results["best_valid"]["loss"]),
        "steps": float(results["steps"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the other checkout")
    parser.add_argument("--after", type=Path, default=ROOT)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    sides = {"before": args.before.resolve(), "after": args.after.resolve()}
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as work:
        for repeat in range(args.repeats):
            for name in ("before", "after") if repeat % 2 == 0 else ("after", "before"):
                runs[name].append(side(sides[name], args.steps, Path(work)))
                print(name, runs[name][-1], flush=True)
    first = {s: runs[s][0] for s in runs}
    if (
        first["before"]["bleu"] != first["after"]["bleu"]
        or abs(first["before"]["valid_loss"] - first["after"]["valid_loss"]) > 1e-4
    ):
        raise SystemExit(f"the two checkouts trained different models: {first}: no ratio")
    speed = {s: median([r["tokens_per_s"] for r in runs[s]]) for s in runs}
    result = {
        **machine_fields(),
        "sides": {k: str(v) for k, v in sides.items()},
        "steps": args.steps,
        "tokens_per_s": speed,
        "after_over_before": speed["after"] / speed["before"],
        "runs": runs,
    }
    print(
        f"training: before {speed['before']:.0f}, after {speed['after']:.0f} tokens/s "
        f"(after/before {speed['after'] / speed['before']:.3f}); same test BLEU "
        f"{first['after']['bleu']:.2f}"
    )
    write_json("ab_train", result)


if __name__ == "__main__":
    main()
