"""Average the weights of several checkpoints of one run (Vaswani et al. 2017 average the last 5).

    python scripts/average_checkpoints.py --inputs a.pt b.pt c.pt --output avg.pt
    python scripts/average_checkpoints.py --run outputs/numbers/<run> --last 3 --output avg.pt

The output is a normal checkpoint (model, config, tokenizers) for seq2seq-translate and
seq2seq-evaluate; it has no optimizer state, so training cannot resume from it. Setting
trainer.average_last=N does the same at the end of training (checkpoints/average.pt).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from seq2seq.train.checkpoint import (
    CheckpointError,
    average_checkpoints,
    save_checkpoint,
    step_checkpoints,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--inputs", nargs="+", type=Path, help="checkpoints to average")
    source.add_argument("--run", type=Path, help="a run folder: average its step_N.pt files")
    parser.add_argument("--last", type=int, default=5, help="with --run: how many (default 5)")
    parser.add_argument("--output", type=Path, required=True, help="where to write the average")
    return parser.parse_args(argv)


def sources(args: argparse.Namespace) -> list[Path]:
    """The checkpoints to average, as the arguments choose them."""
    if args.inputs:
        return list(args.inputs)
    if args.last < 1:
        raise CheckpointError(f"--last must be at least 1, got {args.last}")
    folder = args.run / "checkpoints" if (args.run / "checkpoints").is_dir() else args.run
    found = step_checkpoints(folder)
    if len(found) < args.last:
        raise CheckpointError(
            f"{folder}: has {len(found)} step_N.pt checkpoints, fewer than --last {args.last}"
        )
    return found[-args.last :]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        paths = sources(args)
        if args.output.resolve() in {p.resolve() for p in paths}:
            raise CheckpointError(f"{args.output}: the output would overwrite one of the inputs")
        save_checkpoint(average_checkpoints(paths), args.output)
    except CheckpointError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(
        f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) into {args.output}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
