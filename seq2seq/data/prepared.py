"""A prepared corpus on disk: token ids in flat memory-mapped arrays, written once by
seq2seq-prepare (prepare.py) and read by every training start, resume and torchrun rank.

The design follows fairseq's MMapIndexedDataset (Ott et al. 2019): one flat array of ids per side
and an index of offsets, so that a pair is two slices of a memory map and no Python object per
pair exists. A prepared directory holds:

    manifest.json                  format version, settings, sources (sizes, hashes), counts
    tokenizer.src.* / .tgt.*       the tokenizers the ids were made with (one file when joint)
    train/<split>/src.ids          (tokens,) every kept pair's source ids, concatenated
    train/<split>/tgt.ids          (tokens,) the same for the targets
    train/<split>/src.offsets      (pairs + 1,) int64: pair i's source ids are [off[i], off[i+1])
    train/<split>/tgt.offsets      (pairs + 1,) int64
    train/<split>/order            (pairs,) uint32: pairs sorted by (width, tgt len, src len)
    train/<split>/groups.npy       (groups, 5) int64: width, tgt len, src len, start in order,
                                   count; a group is a run of `order` with one length triple
    train/<split>/dropped.tsv      line number and reason of every pair left out
    eval/<split>.<lang>            validation and test text, whole (for BLEU)

`order` and `groups` are what batching needs (epochs.py), so a training start reads no array
whose size grows with the corpus. The ids are uint16 when the vocabulary fits, else uint32.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import DTypeLike

from seq2seq.data.text import DataError
from seq2seq.data.tokenizer import Tokenizer, load_tokenizer

FORMAT = 1  # bump when the layout changes; older directories are refused with the fix
MANIFEST = "manifest.json"
REASONS = ("empty", "too_long")  # why a pair is left out (dropped.tsv)
GROUP_COLUMNS = 5  # width, tgt len, src len, start, count


def id_dtype(vocab_size: int) -> np.dtype:
    """The most compact unsigned dtype that holds every id."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def index_arrays(src_lens: np.ndarray, tgt_lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`order` and `groups` of pairs with these lengths (see the module docstring).

    Pairs are sorted by (max(src, tgt), tgt, src), ties by index: the sort of data.token_batches.
    """
    src = src_lens.astype(np.int64)
    tgt = tgt_lens.astype(np.int64)
    key = (np.maximum(src, tgt) << 32) | (tgt << 16) | src  # (pairs,) lengths are < 2**16
    order = np.argsort(key, kind="stable")  # (pairs,)
    keys, starts, counts = np.unique(key[order], return_index=True, return_counts=True)
    groups = np.stack(
        [keys >> 32, (keys >> 16) & 0xFFFF, keys & 0xFFFF, starts, counts], axis=1
    )  # (groups, 5)
    return order.astype(np.uint32), groups.astype(np.int64)


def file_info(path: Path, digest: bool = True) -> dict[str, Any]:
    """A source file's identity: resolved path, size, modification time and (when `digest`)
    sha256 of its bytes."""
    stat = path.stat()
    info: dict[str, Any] = {
        "path": str(path.resolve()),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
    }
    if digest:
        info["sha256"] = sha256_file(path)
    return info


def sha256_file(path: Path) -> str:
    """sha256 of the bytes of `path`, read in blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class CorpusArrays:
    """One training split as arrays: memory maps of a prepared directory, or in memory
    (`from_ids`, for tests and benchmarks). `row(i)` is pair i's (source, target) ids."""

    src_ids: np.ndarray  # (tokens,)
    tgt_ids: np.ndarray  # (tokens,)
    src_offsets: np.ndarray  # (pairs + 1,)
    tgt_offsets: np.ndarray  # (pairs + 1,)
    order: np.ndarray  # (pairs,)
    groups: np.ndarray  # (groups, 5)

    def __len__(self) -> int:
        return len(self.order)

    def release(self) -> None:
        """Unmap the pages read so far from this process (they stay in the page cache, shared
        by every process that reads the corpus): without this the resident size would grow with
        each batch read, a whole page or more for every pair, until the corpus is mapped in."""
        for array in (self.src_ids, self.tgt_ids, self.src_offsets, self.tgt_offsets, self.order):
            mapped = getattr(array, "_mmap", None)  # None: in memory (from_ids), or empty
            if mapped is not None:
                mapped.madvise(mmap.MADV_DONTNEED)

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """The source and target ids of pair `i` (slices of the arrays)."""
        so, to = self.src_offsets, self.tgt_offsets
        return self.src_ids[so[i] : so[i + 1]], self.tgt_ids[to[i] : to[i + 1]]

    def reversed(self) -> CorpusArrays:
        """The same pairs the other way round, target -> source (bidirectional training): views
        of the same arrays, each group's lengths swapped (its pairs stay one run of `order`)."""
        groups = self.groups[:, [0, 2, 1, 3, 4]]  # (groups, 5): width, src len, tgt len, ...
        return CorpusArrays(
            self.tgt_ids, self.src_ids, self.tgt_offsets, self.src_offsets, self.order, groups
        )

    @classmethod
    def from_ids(
        cls, src: list[list[int]], tgt: list[list[int]], dtype: DTypeLike = np.int64
    ) -> CorpusArrays:
        """In-memory arrays of already encoded pairs (no files), the ids as `dtype`."""
        src_lens = np.array([len(s) for s in src], dtype=np.int64)
        tgt_lens = np.array([len(t) for t in tgt], dtype=np.int64)
        order, groups = index_arrays(src_lens, tgt_lens)

        def flat(rows: list[list[int]]) -> np.ndarray:
            ids = itertools.chain.from_iterable(rows)
            return np.fromiter(ids, dtype=dtype, count=sum(len(r) for r in rows))

        def offsets(lens: np.ndarray) -> np.ndarray:
            return np.concatenate([[0], np.cumsum(lens)])

        return cls(flat(src), flat(tgt), offsets(src_lens), offsets(tgt_lens), order, groups)

    @classmethod
    def open(cls, folder: Path, info: dict[str, Any], dtype: np.dtype) -> CorpusArrays:
        """Memory-map a prepared split, checking every file's size against the manifest."""
        pairs, tokens = info["kept"], info["tokens"]
        sizes = {
            "src.ids": tokens["src"] * dtype.itemsize,
            "tgt.ids": tokens["tgt"] * dtype.itemsize,
            "src.offsets": (pairs + 1) * 8,
            "tgt.offsets": (pairs + 1) * 8,
            "order": pairs * 4,
        }
        for name, size in sizes.items():
            check_size(folder / name, size)
        groups = np.load(folder / "groups.npy")
        if groups.shape != (info["groups"], GROUP_COLUMNS) or int(groups[:, 4].sum()) != pairs:
            raise DataError(damaged(folder / "groups.npy", "its groups do not match"))

        def memmap(name: str, dt: DTypeLike) -> np.ndarray:
            return np.memmap(folder / name, dtype=dt, mode="r") if sizes[name] else np.zeros(0, dt)

        return cls(
            memmap("src.ids", dtype),
            memmap("tgt.ids", dtype),
            memmap("src.offsets", np.int64),
            memmap("tgt.offsets", np.int64),
            memmap("order", np.uint32),
            groups,
        )


def check_size(path: Path, size: int) -> None:
    """A DataError when `path` is missing or not `size` bytes long (truncated or replaced)."""
    if not path.is_file():
        raise DataError(damaged(path, "it is missing"))
    actual = path.stat().st_size
    if actual != size:
        raise DataError(damaged(path, f"it has {actual} bytes, the manifest says {size}"))


def damaged(path: Path, what: str) -> str:
    """The message for a damaged prepared corpus: `path`, what is wrong, the fix."""
    return (
        f"{path}: the prepared corpus is damaged ({what}). fix: prepare it again with "
        f"seq2seq-prepare (or delete the folder: a cached one is prepared again on first use)"
    )


# --------------------------------------------------------------------------- a whole directory


@dataclass
class Prepared:
    """A prepared directory: its manifest, tokenizers and training splits (memory-mapped)."""

    path: Path
    manifest: dict[str, Any]
    tokenizers: tuple[Tokenizer, Tokenizer]
    train: dict[str, CorpusArrays]

    def fingerprint(self, names: list[str], valid: str) -> str:
        """sha256 of what the manifest says about the training splits `names` and the
        validation split (sources' hashes, settings, counts, tokenizers): a resumed run refuses
        a corpus whose fingerprint changed, with no pass over the data."""
        m = self.manifest
        parts = {
            "settings": m["settings"],
            "tokenizers": [m["tokenizers"]["src_sha256"], m["tokenizers"]["tgt_sha256"]],
            "train": {n: m["train"][n] | {"sources": hashes(m["train"][n])} for n in names},
            "valid": hashes(m["eval"][valid]) if valid in m["eval"] else None,
        }
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()

    def eval_files(self, split: str) -> tuple[Path, Path] | None:
        """The text files of an evaluation split stored here, or None."""
        if split not in self.manifest["eval"]:
            return None
        langs = self.manifest["settings"]["src_lang"], self.manifest["settings"]["tgt_lang"]
        src, tgt = (self.path / "eval" / f"{split}.{lang}" for lang in langs)
        return src, tgt


def hashes(entry: dict[str, Any]) -> list[str]:
    """The sha256 of each source file of a manifest's split `entry`."""
    return [source["sha256"] for source in entry["sources"]]


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of prepared directory `path`, refusing a missing, unreadable or other-format
    one with the fix."""
    file = path / MANIFEST
    if not path.is_dir():
        raise DataError(
            f"{path}: no prepared corpus there (the folder does not exist). fix: run "
            f"seq2seq-prepare with data.prepared={path} (and the data and tokenizer settings), "
            f"or leave data.prepared unset to prepare on first use"
        )
    try:
        manifest: dict[str, Any] = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise DataError(damaged(file, f"unreadable manifest: {err}")) from None
    if manifest.get("format") != FORMAT:
        raise DataError(
            f"{file}: prepared with format {manifest.get('format')!r}; this version reads format "
            f"{FORMAT}. fix: prepare it again with seq2seq-prepare"
        )
    return manifest


def check_sources(manifest: dict[str, Any]) -> None:
    """Refuse a prepared corpus whose source files changed since: a different size, or a new
    modification time and different content. Sources no longer on disk are not checked."""
    entries = [*manifest["train"].values(), *manifest["eval"].values()]
    for source in (s for entry in entries for s in entry["sources"]):
        path = Path(source["path"])
        if not path.is_file():
            continue
        stat = path.stat()
        same = stat.st_size == source["size"] and (
            stat.st_mtime_ns == source["mtime_ns"] or sha256_file(path) == source["sha256"]
        )
        if not same:
            raise DataError(
                f"{path} changed after it was prepared (size or content differs from the "
                f"manifest). fix: prepare the corpus again with seq2seq-prepare, or restore the "
                f"file"
            )


def open_prepared(path: Path, names: list[str]) -> Prepared:
    """Open prepared directory `path` for training on splits `names`, after checking its format,
    files and sources. Reads the manifest, the tokenizers and the group tables only."""
    manifest = read_manifest(path)
    missing = [n for n in names if n not in manifest["train"]]
    if missing:
        raise DataError(
            f"{path}: no training split {missing} (it holds {sorted(manifest['train'])}). fix: "
            f"set data.train to those, or prepare with data.train={names}"
        )
    check_sources(manifest)
    toks = manifest["tokenizers"]
    for side in ("src", "tgt"):
        file = path / toks[side]
        if not file.is_file() or sha256_file(file) != toks[f"{side}_sha256"]:
            raise DataError(damaged(file, "the tokenizer is missing or differs"))
    kind = manifest["settings"]["tokenizer"]["kind"]  # of directories that name no kind each
    kinds = {side: toks.get(f"{side}_kind", kind) for side in ("src", "tgt")}
    src_tok = load_tokenizer(path / toks["src"], kinds["src"])
    tgt = path / toks["tgt"]
    tgt_tok = src_tok if toks["src"] == toks["tgt"] else load_tokenizer(tgt, kinds["tgt"])
    dtype = np.dtype(manifest["id_dtype"])
    train = {n: CorpusArrays.open(path / "train" / n, manifest["train"][n], dtype) for n in names}
    return Prepared(path, manifest, (src_tok, tgt_tok), train)


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    """Write the manifest last, flushed to disk: its presence marks a complete directory."""
    file = path / MANIFEST
    with file.open("w", encoding="utf-8") as handle:
        json.dump(manifest, handle, indent=1, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
