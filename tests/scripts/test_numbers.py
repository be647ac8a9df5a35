"""Tests for scripts/make_numbers_data.py, the generator of the embedded English->German number
data set (a script, not part of the package: num2words is a dev dependency)."""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import pytest

from seq2seq.data.text import find_split_file, read_parallel

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "make_numbers_data", REPO / "scripts" / "make_numbers_data.py"
)
gen = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
_spec.loader.exec_module(gen)  # type: ignore[union-attr]
SEPARATOR, SPLITS, english, german = gen.SEPARATOR, gen.SPLITS, gen.english, gen.german
number_pairs, write_dataset = gen.number_pairs, gen.write_dataset

COMMITTED = REPO / "seq2seq" / "data" / "numbers"
SPLIT_NAMES = [name for name, *_ in SPLITS]


def numbers_in(phrase: str) -> int:
    """How many numbers a phrase holds."""
    return len(phrase.split(SEPARATOR))


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    """A freshly generated data set with the default seed."""
    root = tmp_path_factory.mktemp("numbers")
    return root, write_dataset(root, seed=1234)


@pytest.fixture(scope="module")
def splits(fresh: tuple[Path, dict[str, int]]) -> dict[str, list[tuple[str, str]]]:
    """Every split of the fresh data set read back through seq2seq.data.text."""
    root, _ = fresh
    return {
        name: read_parallel(find_split_file(root, name, "en"), find_split_file(root, name, "de"))
        for name in SPLIT_NAMES
    }


def test_known_translations() -> None:
    assert german(34) == "vierunddreißig"
    assert german(342) == "dreihundertzweiundvierzig"
    assert english(342) == "three hundred and forty-two"
    assert english(99999) == "ninety-nine thousand nine hundred and ninety-nine"  # no comma
    assert german(17) == "siebzehn"


def test_number_pairs_deterministic_and_seed_dependent() -> None:
    kwargs = {"min_numbers": 1, "max_numbers": 3, "max_value": 99999}
    first = number_pairs(200, seed=7, **kwargs)
    assert number_pairs(200, seed=7, **kwargs) == first
    assert number_pairs(200, seed=8, **kwargs) != first


def test_number_pairs_shape() -> None:
    pairs = number_pairs(2000, min_numbers=2, max_numbers=4, max_value=999, seed=0)
    sources = [src for src, _ in pairs]
    assert len(set(sources)) == 2000
    counts = {numbers_in(src) for src in sources}
    assert counts == {2, 3, 4}
    for src, tgt in pairs:
        assert numbers_in(src) == numbers_in(tgt)
    # digits drawn uniformly: one-digit and three-digit numbers are both common
    words = [w for src, _ in pairs for w in src.split(SEPARATOR)]
    assert sum("hundred" in w for w in words) > len(words) / 4
    assert sum(w in {english(n) for n in range(10)} for w in words) > len(words) / 5


def test_number_pairs_translation_aligned() -> None:
    pairs = number_pairs(300, min_numbers=1, max_numbers=3, max_value=999, seed=3)
    lookup = {english(n): german(n) for n in range(1000)}
    for src, tgt in pairs:
        assert [lookup[w] for w in src.split(SEPARATOR)] == tgt.split(SEPARATOR)


def test_number_pairs_exclude_and_exhaustion() -> None:
    exclude = {english(n) for n in range(5)}
    pairs = number_pairs(5, min_numbers=1, max_numbers=1, max_value=9, seed=0, exclude=exclude)
    assert {src for src, _ in pairs} == {english(n) for n in range(5, 10)}
    with pytest.raises(ValueError, match="distinct"):
        number_pairs(11, min_numbers=1, max_numbers=1, max_value=9, seed=0)


def test_write_dataset_counts(fresh: tuple[Path, dict[str, int]]) -> None:
    _, counts = fresh
    assert counts == {name: count for name, count, *_ in SPLITS}
    assert counts["train"] >= 10_000
    assert counts["test_long"] > 0


def test_splits_disjoint(splits: dict[str, list[tuple[str, str]]]) -> None:
    seen: set[str] = set()
    for name in SPLIT_NAMES:
        sources = [src for src, _ in splits[name]]
        assert len(set(sources)) == len(sources), f"duplicate source in {name}"
        assert seen.isdisjoint(sources), f"{name} shares sources with an earlier split"
        seen.update(sources)


def test_test_long_is_longer_than_train(
    splits: dict[str, list[tuple[str, str]]],
) -> None:
    longest_train = max(numbers_in(src) for src, _ in splits["train"])
    shortest_long = min(numbers_in(src) for src, _ in splits["test_long"])
    assert shortest_long > longest_train
    for name in ("train", "valid", "test"):
        assert {numbers_in(src) for src, _ in splits[name]} == {1, 2, 3}


def test_committed_files_match_fresh_generation(
    fresh: tuple[Path, dict[str, int]],
) -> None:
    root, _ = fresh
    expected = sorted(p.name for p in root.glob("*.gz"))
    assert sorted(p.name for p in COMMITTED.glob("*.gz")) == expected
    total = 0
    for name in expected:
        committed = (COMMITTED / name).read_bytes()
        regenerated = (root / name).read_bytes()
        total += len(committed)
        assert gzip.decompress(committed) == gzip.decompress(regenerated), (
            f"{name} content differs; rerun scripts/make_numbers_data.py"
        )
        assert committed == regenerated, f"{name}: same content but different gzip bytes"
    assert total < 1_500_000
