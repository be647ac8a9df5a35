"""(Re)write the embedded English->German number-phrase data set (seq2seq/data/numbers/).

Usage: python scripts/make_numbers_data.py [--root seq2seq/data/numbers] [--seed 1234]

The output is deterministic: the same seed gives byte-identical files, so the committed
copy under seq2seq/data/numbers/ can be checked against a fresh run
(tests/scripts/test_numbers.py). The
generator lives here, not in the package: only this script needs num2words (the dev extra).

A phrase is a short list of numbers written out in words, e.g.

    "three hundred and forty-two, seventeen" -> "dreihundertzweiundvierzig, siebzehn"

It is a small but real translation problem that needs no download: German writes a
number as one compound word and puts units before tens ("vierunddreißig" = "thirty-four"),
so a model has to reorder and merge, not just copy word by word.

English commas inside a single number ("ninety-nine thousand, nine hundred") are removed,
so ", " only ever separates numbers and every phrase has exactly one translation.

Splits written by :func:`write_dataset`: ``train``, ``valid`` and ``test`` hold phrases of
1-3 numbers; ``test_long`` holds 4-8 numbers, longer than anything seen in training, to
study how positional encodings generalise to longer inputs. No evaluation source appears
in ``train`` (nor in another evaluation split).
"""

from __future__ import annotations

import argparse
import gzip
import io
import random
from collections.abc import Set as AbstractSet
from functools import cache
from pathlib import Path

from num2words import num2words

SEPARATOR = ", "
MAX_VALUE = 99_999


# (split, number of pairs, fewest numbers per phrase, most numbers per phrase).
# Training is generated first so its distribution is exactly the intended one; each
# evaluation split then excludes every source written before it.
SPLITS: tuple[tuple[str, int, int, int], ...] = (
    ("train", 30_000, 1, 3),
    ("valid", 500, 1, 3),
    ("test", 1_000, 1, 3),
    ("test_long", 500, 4, 8),
)


@cache
def english(n: int) -> str:
    """``n`` in English words without internal commas, e.g. 342 -> 'three hundred and forty-two'."""
    return num2words(n, lang="en").replace(",", "")


@cache
def german(n: int) -> str:
    """``n`` in German words, e.g. 342 -> 'dreihundertzweiundvierzig'."""
    return num2words(n, lang="de")


def _draw_value(rng: random.Random, max_value: int) -> int:
    """Draw a value in ``[0, max_value]`` with its number of digits uniform.

    Uniform digits means 7 and 73 512 are both common, unlike uniform values where
    almost every number would have five digits.
    """
    digits = rng.randint(1, len(str(max_value)))
    low = 0 if digits == 1 else 10 ** (digits - 1)
    high = min(10**digits - 1, max_value)
    return rng.randint(low, high)


def number_pairs(
    count: int,
    *,
    min_numbers: int,
    max_numbers: int,
    max_value: int,
    seed: int,
    exclude: AbstractSet[str] = frozenset(),
) -> list[tuple[str, str]]:
    """Generate ``count`` distinct (English, German) number phrases.

    Each phrase has ``k`` numbers, ``k`` uniform in ``[min_numbers, max_numbers]``, joined
    with ", ". Sources are unique and none is in ``exclude``. Deterministic: only
    ``random.Random(seed)`` is used.

    Raises:
        ValueError: bad arguments, or too few distinct phrases exist to fill ``count``.
    """
    if not 1 <= min_numbers <= max_numbers:
        raise ValueError(f"need 1 <= min_numbers <= max_numbers, got {min_numbers}, {max_numbers}")
    if count < 0 or max_value < 0:
        raise ValueError(f"count and max_value must be >= 0, got {count}, {max_value}")
    rng = random.Random(seed)
    seen: set[str] = set()
    pairs: list[tuple[str, str]] = []
    attempts_left = 100 * count + 1000
    while len(pairs) < count:
        if attempts_left == 0:
            raise ValueError(
                f"only {len(pairs)} of {count} distinct phrases found; "
                f"raise max_value or max_numbers, or lower count"
            )
        attempts_left -= 1
        values = [_draw_value(rng, max_value) for _ in range(rng.randint(min_numbers, max_numbers))]
        source = SEPARATOR.join(english(v) for v in values)
        if source in seen or source in exclude:
            continue
        seen.add(source)
        pairs.append((source, SEPARATOR.join(german(v) for v in values)))
    return pairs


def _write_gzip(path: Path, lines: list[str]) -> None:
    """Write lines gzip-compressed, byte-identically on every run (mtime 0, fixed name)."""
    buffer = io.BytesIO()
    with gzip.GzipFile(
        filename=path.name.removesuffix(".gz"),
        mode="wb",
        fileobj=buffer,
        compresslevel=9,
        mtime=0,
    ) as stream:
        stream.write("".join(line + "\n" for line in lines).encode("utf-8"))
    path.write_bytes(buffer.getvalue())


def write_dataset(root: Path, *, seed: int = 1234, max_value: int = MAX_VALUE) -> dict[str, int]:
    """Write ``{split}.en.gz`` and ``{split}.de.gz`` for every split in :data:`SPLITS`.

    Re-running with the same arguments gives byte-identical files.

    Returns:
        ``{split: number of lines}``.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    seeds = random.Random(seed)
    used: set[str] = set()
    counts: dict[str, int] = {}
    for split, count, low, high in SPLITS:
        pairs = number_pairs(
            count,
            min_numbers=low,
            max_numbers=high,
            max_value=max_value,
            seed=seeds.randrange(2**32),
            exclude=used,
        )
        used.update(source for source, _ in pairs)
        _write_gzip(root / f"{split}.en.gz", [source for source, _ in pairs])
        _write_gzip(root / f"{split}.de.gz", [target for _, target in pairs])
        counts[split] = len(pairs)
    return counts


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, write the data set and print the line count of each split."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--root", type=Path, default=Path("seq2seq/data/numbers"), help="output folder"
    )
    parser.add_argument("--seed", type=int, default=1234, help="random seed")
    args = parser.parse_args(argv)
    counts = write_dataset(args.root, seed=args.seed)
    for split, lines in counts.items():
        print(f"{split}: {lines} pairs -> {args.root / split}.en.gz, {args.root / split}.de.gz")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
