"""Download Multi30k task 1 (raw, cased text) from its public repository.

    python scripts/download_multi30k.py --out data/multi30k

Fetches {split}.{lang}.gz for train, val, test_2016_flickr and test_2017_flickr in en, de and fr
from github.com/multi30k/dataset (data/task1/raw), checks each is gzip with the expected line
count, and writes it atomically. Files already present and complete are kept.
"""

from __future__ import annotations

import argparse
import gzip
import sys
import urllib.request
from pathlib import Path

BASE = "https://github.com/multi30k/dataset/raw/master/data/task1/raw"
SPLITS = {"train": 29000, "val": 1014, "test_2016_flickr": 1000, "test_2017_flickr": 1000}
LANGS = ("en", "de", "fr")


def line_count(data: bytes) -> int:
    """Lines in gzip-compressed `data`."""
    return gzip.decompress(data).decode("utf-8").count("\n")


def fetch(url: str, expected_lines: int) -> bytes:
    """The bytes at `url`, checked to be gzip with `expected_lines` lines."""
    with urllib.request.urlopen(url, timeout=60) as response:  # a fixed https URL
        data = response.read()
    lines = line_count(data)
    if lines != expected_lines:
        raise RuntimeError(f"{url}: {lines} lines, expected {expected_lines}")
    return data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("data/multi30k"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for split, expected in SPLITS.items():
        for lang in LANGS:
            path = args.out / f"{split}.{lang}.gz"
            if path.exists() and line_count(path.read_bytes()) == expected:
                print(f"ok       {path}")
                continue
            try:
                data = fetch(f"{BASE}/{split}.{lang}.gz", expected)
            except OSError as err:
                print(
                    f"error: {split}.{lang}.gz: {err}. Check your network, or copy the files "
                    f"into {args.out} by hand.",
                    file=sys.stderr,
                )
                return 1
            tmp = path.with_suffix(".gz.tmp")
            tmp.write_bytes(data)
            tmp.replace(path)
            print(f"fetched  {path} ({expected} lines)")
    print(f"Multi30k is in {args.out}: train with data=multi30k data.root={args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
