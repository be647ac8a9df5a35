"""(Re)write the embedded English->German number-phrase data set.

Usage: python scripts/make_numbers_data.py [--root data/numbers] [--seed 1234]

The output is deterministic: the same seed gives byte-identical files, so the committed
copy under data/numbers/ can be checked against a fresh run.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seq2seq.numbers import write_dataset


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, write the data set and print the line count of each split."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("data/numbers"), help="output folder")
    parser.add_argument("--seed", type=int, default=1234, help="random seed")
    args = parser.parse_args(argv)
    counts = write_dataset(args.root, seed=args.seed)
    for split, lines in counts.items():
        print(f"{split}: {lines} pairs -> {args.root / split}.en.gz, {args.root / split}.de.gz")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
