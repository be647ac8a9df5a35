"""seq2seq-prepare: turn raw parallel text into a prepared corpus (prepared.py), once.

    seq2seq-prepare data.root=wmt14 data.train=[europarl,commoncrawl,news] data.prepared=wmt14.prep
    seq2seq-train data.prepared=wmt14.prep data.weights=[1,1,3] ...

It takes the training config tree (the same data and tokenizer groups and overrides as
seq2seq-train) and makes two passes over the training files, each in bounded memory:

1. read and check every line (UTF-8, line counts; the errors of data.py), and draw a seeded random
   sample of at most tokenizer.sample_lines pairs (all of them when there are fewer, in file
   order), on which the tokenizer is trained (or loaded from its cache);
2. tokenize in worker processes (bulk.py; order kept), drop empty and over-long pairs (each
   listed in dropped.tsv with its line number and reason), and append the ids to flat files.

The directory is written under a temporary name and renamed into place once complete, so a
half-written one is never used. seq2seq-train calls `prepare` itself (into data.cache_dir) when
data.prepared is not given.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from seq2seq.config.schema import DataConfig, TokenizerConfig, resolve_path
from seq2seq.data.encode import encode_chunk, init_worker
from seq2seq.data.prepared import (
    FORMAT,
    file_info,
    id_dtype,
    index_arrays,
    read_manifest,
    sha256_file,
    write_manifest,
)
from seq2seq.data.text import DataError, find_split_file, iter_parallel, read_parallel
from seq2seq.data.tokenizer import Tokenizer, build_tokenizers, save_tokenizer, tokenizer_bytes

log = logging.getLogger(__name__)

CHUNK = 50_000  # line pairs read, sampled and tokenized at a time
SMALL = 32 << 20  # bytes of training files below which data.workers=0 tokenizes in-process
MAX_LENGTH = (1 << 16) - 1  # lengths are stored in 16 bits (prepared.index_arrays)
Chunk = tuple[list[str], list[str]]


def split_files(data: DataConfig, names: Iterable[str]) -> dict[str, tuple[Path, Path]]:
    """The (source, target) files of each split of `names` under data.root."""
    root = resolve_path(data.root)
    return {
        name: (
            find_split_file(root, name, data.src_lang),
            find_split_file(root, name, data.tgt_lang),
        )
        for name in dict.fromkeys(names)
    }


def train_files(data: DataConfig) -> dict[str, tuple[Path, Path]]:
    """The (source, target) files of each training split."""
    return split_files(data, data.train)


def eval_files(data: DataConfig) -> dict[str, tuple[Path, Path]]:
    """The (source, target) files of the validation and test splits."""
    return split_files(data, [data.valid, *data.test])


# --------------------------------------------------------------------------- pass 1: sample


class Reservoir:
    """A seeded uniform sample of at most `size` non-empty pairs from a stream of chunks: each
    pair draws a random key and the `size` smallest keys are kept (Efraimidis & Spirakis 2006
    with equal weights). Candidates pile up to twice `size` before the largest keys are dropped,
    so that the work stays linear in the stream."""

    def __init__(self, size: int, seed: int) -> None:
        """An empty sample of at most `size` pairs, drawn with `seed`."""
        self.size, self.rng = size, np.random.default_rng(seed)
        self.keys: list[np.ndarray] = []  # per chunk: (taken,) the candidates' keys
        self.position: list[np.ndarray] = []  # per chunk: (taken,) their place in the stream
        self.pairs: list[tuple[str, str]] = []
        self.count = self.seen = 0
        self.threshold = np.inf  # keys at or above it can no longer enter

    def add(self, src: list[str], tgt: list[str]) -> None:
        """Offer the next chunk of line pairs (blank ones never enter)."""
        keys = self.rng.random(len(src))  # (chunk,) drawn for every pair: reproducible
        take = [
            i
            for i in np.flatnonzero(keys < self.threshold).tolist()
            if src[i].strip() and tgt[i].strip()
        ]
        self.keys.append(keys[take])
        self.position.append(self.seen + np.array(take, dtype=np.int64))
        self.pairs += [(src[i], tgt[i]) for i in take]
        self.count += len(take)
        self.seen += len(src)
        if self.count > 2 * self.size:
            self.compact()

    def compact(self) -> None:
        """Keep the `size` smallest keys (all of them when fewer)."""
        keys, position = np.concatenate(self.keys), np.concatenate(self.position)
        if len(keys) > self.size:
            keep = np.argpartition(keys, self.size - 1)[: self.size]
            keys, position = keys[keep], position[keep]
            self.pairs = [self.pairs[i] for i in keep.tolist()]
            self.threshold = float(keys.max())
        self.keys, self.position, self.count = [keys], [position], len(keys)

    def sample(self) -> tuple[list[str], list[str]]:
        """The sampled (source, target) lines in file order."""
        if not self.pairs:
            return [], []
        self.compact()
        ordered = np.argsort(self.position[0], kind="stable").tolist()
        return [self.pairs[i][0] for i in ordered], [self.pairs[i][1] for i in ordered]


def sample_and_check(files: dict[str, tuple[Path, Path]], size: int, seed: int) -> Reservoir:
    """Pass 1: read every training file through (the checks of data.py) and sample pairs."""
    reservoir = Reservoir(size, seed)
    for name, (src, tgt) in files.items():
        before = reservoir.seen
        for chunk in iter_parallel(src, tgt, CHUNK):
            reservoir.add(*chunk)
        log.info("%s: %d pairs read (%s, %s)", name, reservoir.seen - before, src, tgt)
    return reservoir


def tokenizers_for(
    tok: TokenizerConfig, files: dict[str, tuple[Path, Path]], cache: Path
) -> tuple[Tokenizer, Tokenizer]:
    """Tokenizers trained on a sample of the training pairs (or loaded from the cache)."""
    reservoir = sample_and_check(files, tok.sample_lines, tok.sample_seed)
    src, tgt = reservoir.sample()
    if not src:
        raise DataError(f"no non-empty training pairs in {sorted(files)}; check the files")
    log.info("tokenizer: %s trained on %d of %d pairs", tok.kind.value, len(src), reservoir.seen)
    try:
        return build_tokenizers(
            tok.kind.value,
            src,
            tgt,
            vocab_size=tok.vocab_size,
            joint=tok.joint,
            cache_dir=cache,
            min_freq=tok.min_freq,
            character_coverage=tok.character_coverage,
            lowercase=tok.lowercase,
        )
    except (ValueError, RuntimeError, UnicodeDecodeError) as err:
        raise ValueError(
            f"cannot build the {tok.kind.value} tokenizer ({err}). If a cached tokenizer under "
            f"{cache} is corrupt, delete it: it is trained again"
        ) from err


# --------------------------------------------------------------------------- pass 2: encode


def encoded_chunks(chunks: Iterator[Chunk], states: dict[str, Any], workers: int) -> Iterator[Any]:
    """encode_chunk of every chunk, in order: in `workers` processes (at most two chunks each in
    flight, so reading never runs far ahead), or in this one when workers <= 1."""
    if workers <= 1:
        init_worker(states)
        yield from map(encode_chunk, chunks)
        return
    context = multiprocessing.get_context("spawn")  # no fork of a process that runs torch
    with context.Pool(workers, initializer=init_worker, initargs=(states,)) as pool:
        pending: list[Any] = []
        for chunk in chunks:
            pending.append(pool.apply_async(encode_chunk, (chunk,)))
            if len(pending) >= 2 * workers:
                yield pending.pop(0).get()
        for result in pending:
            yield result.get()


class SplitWriter:
    """Appends encoded chunks of one training split to its files and counts what it drops."""

    def __init__(self, folder: Path, dtype: np.dtype, max_len: int) -> None:
        folder.mkdir(parents=True)
        self.folder, self.dtype, self.max_len = folder, dtype, max_len
        self.ids = {side: (folder / f"{side}.ids").open("wb") for side in ("src", "tgt")}
        self.dropped = (folder / "dropped.tsv").open("w", encoding="utf-8")
        self.dropped.write("line\treason\n")
        self.lens: dict[str, list[np.ndarray]] = {"src": [], "tgt": []}
        self.lines = 0
        self.counts = {"empty": 0, "too_long": 0}

    def add(self, src_ids: Any, src_lens: Any, tgt_ids: Any, tgt_lens: Any, empty: Any) -> None:
        """One chunk of bulk.encode_chunk; `empty` marks the blank pairs."""
        long = ~empty & ((src_lens > self.max_len) | (tgt_lens > self.max_len))  # (chunk,)
        for reason, mask in (("empty", empty), ("too_long", long)):
            for line in (np.flatnonzero(mask) + self.lines + 1).tolist():
                self.dropped.write(f"{line}\t{reason}\n")
            self.counts[reason] += int(mask.sum())
        keep = ~(empty | long)
        for side, ids, lens in (("src", src_ids, src_lens), ("tgt", tgt_ids, tgt_lens)):
            self.ids[side].write(ids[np.repeat(keep, lens)].astype(self.dtype).tobytes())
            self.lens[side].append(lens[keep].astype(np.int64))
        self.lines += len(src_lens)

    def close(self) -> dict[str, Any]:
        """Write offsets, order and groups; returns the split's counts for the manifest."""
        for handle in (*self.ids.values(), self.dropped):
            handle.close()
        src, tgt = (np.concatenate(self.lens[s] or [np.zeros(0, np.int64)]) for s in self.lens)
        for side, lens in (("src", src), ("tgt", tgt)):
            offsets = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)  # (pairs + 1,)
            offsets.tofile(self.folder / f"{side}.offsets")
        order, groups = index_arrays(src, tgt)
        order.tofile(self.folder / "order")
        np.save(self.folder / "groups.npy", groups)
        return {
            "pairs": self.lines,
            "kept": len(src),
            "dropped": self.counts,
            "tokens": {"src": int(src.sum()), "tgt": int(tgt.sum())},
            "groups": len(groups),
        }


def encode_split(
    files: tuple[Path, Path],
    folder: Path,
    toks: tuple[Tokenizer, Tokenizer],
    max_len: int,
    workers: int,
) -> dict[str, Any]:
    """Pass 2 over one training split: its arrays in `folder`, its manifest entry returned."""
    dtype = id_dtype(max(t.vocab_size for t in toks))
    writer = SplitWriter(folder, dtype, max_len)
    states = {"src": toks[0].state(), "tgt": toks[1].state()}
    for encoded in encoded_chunks(iter_parallel(*files, CHUNK), states, workers):
        writer.add(*encoded)
    entry = writer.close()
    if entry["kept"] == 0:
        raise DataError(f"{files[0]}: no pair left after dropping empty and over-long ones")
    entry["sources"] = [file_info(path) for path in files]
    return entry


# --------------------------------------------------------------------------- the directory


def prepare(
    data: DataConfig,
    tok: TokenizerConfig,
    out: Path,
    tokenizers: tuple[Tokenizer, Tokenizer] | None = None,
) -> Path:
    """Prepare data's training, validation and test splits into directory `out` (replaced when
    it exists) with `tokenizers`, or with tokenizers trained on a sample. Returns `out`."""
    if not 1 <= data.max_len <= MAX_LENGTH:
        raise DataError(f"data.max_len={data.max_len}: a prepared corpus needs 1..{MAX_LENGTH}")
    files, evals = train_files(data), eval_files(data)
    start = time.monotonic()
    if tokenizers is None:
        tokenizers = tokenizers_for(tok, files, resolve_path(tok.cache_dir))
    sampled = time.monotonic()
    out = Path(out)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        manifest = write_directory(tmp, data, tok, files, evals, tokenizers)
        manifest["seconds"] = {  # not part of the fingerprint
            "read_sample_and_train_tokenizer": sampled - start,
            "tokenize_and_write": time.monotonic() - sampled,
        }
        write_manifest(tmp, manifest)
        replace_directory(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def write_directory(
    tmp: Path,
    data: DataConfig,
    tok: TokenizerConfig,
    files: dict[str, tuple[Path, Path]],
    evals: dict[str, tuple[Path, Path]],
    toks: tuple[Tokenizer, Tokenizer],
) -> dict[str, Any]:
    """Everything but the manifest, which is returned."""
    workers = data.workers or len(os.sched_getaffinity(0))
    if not data.workers and sum(p.stat().st_size for pair in files.values() for p in pair) < SMALL:
        workers = 1  # starting worker processes would take longer than the work
    names = {"src": "tokenizer.src", "tgt": "tokenizer.tgt"}
    if tokenizer_bytes(toks[0]) == tokenizer_bytes(toks[1]):
        names = {"src": "tokenizer.joint", "tgt": "tokenizer.joint"}
    tokenizer_entry: dict[str, str] = {}
    for side, tokenizer in zip(("src", "tgt"), toks, strict=True):
        suffix = ".json" if tokenizer.kind in ("word", "char") else ".model"
        file = tmp / (names[side] + suffix)
        save_tokenizer(file, tokenizer)
        tokenizer_entry |= {side: file.name, f"{side}_sha256": sha256_file(file)}
        tokenizer_entry[f"{side}_kind"] = tokenizer.kind
    train = {}
    for name, pair in files.items():
        train[name] = encode_split(pair, tmp / "train" / name, toks, data.max_len, workers)
        log.info("%s: kept %d of %d pairs", name, train[name]["kept"], train[name]["pairs"])
    (tmp / "eval").mkdir()
    evaluation = {}
    for name, (src, tgt) in evals.items():
        pairs = read_parallel(src, tgt)  # whole: scores stay comparable with other toolkits
        for lang, column in ((data.src_lang, 0), (data.tgt_lang, 1)):
            text = "".join(p[column] + "\n" for p in pairs)
            (tmp / "eval" / f"{name}.{lang}").write_text(text, encoding="utf-8")
        evaluation[name] = {"pairs": len(pairs), "sources": [file_info(src), file_info(tgt)]}
    return {
        "format": FORMAT,
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "id_dtype": id_dtype(max(t.vocab_size for t in toks)).name,
        "settings": settings(data, tok),
        "tokenizers": tokenizer_entry,
        "train": train,
        "eval": evaluation,
    }


def settings(data: DataConfig, tok: TokenizerConfig) -> dict[str, Any]:
    """The settings a prepared corpus is made with (in its manifest and its cache key)."""
    return {
        "src_lang": data.src_lang,
        "tgt_lang": data.tgt_lang,
        "max_len": data.max_len,
        "tokenizer": {
            "kind": tok.kind.value,
            "vocab_size": tok.vocab_size,
            "joint": tok.joint,
            "min_freq": tok.min_freq,
            "character_coverage": tok.character_coverage,
            "sample_lines": tok.sample_lines,
            "sample_seed": tok.sample_seed,
            # only when set, so that the corpora prepared before it existed keep their keys
            **({"lowercase": True} if tok.lowercase else {}),
        },
    }


def replace_directory(new: Path, out: Path) -> None:
    """Move the complete directory `new` to `out`, replacing an older one."""
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if out.exists():
        os.replace(out, old)
    os.replace(new, out)
    shutil.rmtree(old, ignore_errors=True)


def digests(tokenizers: tuple[Tokenizer, Tokenizer]) -> list[str]:
    """sha256 of each tokenizer as saved (`tokenizer_bytes`), source then target."""
    return [hashlib.sha256(tokenizer_bytes(t)).hexdigest() for t in tokenizers]


# --------------------------------------------------------------------------- the cache


def cache_key(data: DataConfig, tok: TokenizerConfig) -> str:
    """What a cached prepared corpus depends on: the source files' paths, sizes and modification
    times, the splits and the settings."""
    files = {**train_files(data), **eval_files(data)}
    key = {
        "format": FORMAT,
        "sources": {n: [file_info(p, digest=False) for p in pair] for n, pair in files.items()},
        "train": data.train,
        "settings": settings(data, tok),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def cached_prepare(
    data: DataConfig, tok: TokenizerConfig, tokenizers: tuple[Tokenizer, Tokenizer] | None = None
) -> Path:
    """The prepared corpus of data and tok in data.cache_dir, prepared now if absent or damaged.
    With `tokenizers` (a resumed run's), one prepared with exactly those."""
    root = Path(data.cache_dir).expanduser()  # relative: to the working directory, as outputs/
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{data.name}-{data.src_lang}-{data.tgt_lang}-{cache_key(data, tok)}"
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one preparer at a time; the others then find it
        if tokenizers is not None and not usable(path, digests(tokenizers)):
            path = path.with_name(path.name + "-" + digests(tokenizers)[0][:8])
        if not usable(path):
            log.info("preparing the data into %s (once; later starts reuse it)", path)
            prepare(data, tok, path, tokenizers)
    return path


def usable(path: Path, tokenizer_digests: list[str] | None = None) -> bool:
    """Whether `path` holds a complete prepared corpus (made with those tokenizers)."""
    try:
        toks = read_manifest(path)["tokenizers"]
    except DataError:
        return False
    return (
        tokenizer_digests is None or [toks["src_sha256"], toks["tgt_sha256"]] == tokenizer_digests
    )


def describe_prepared(path: Path) -> str:
    """A few lines on a prepared directory: where, what it holds, its size on disk."""
    manifest = read_manifest(path)
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    lines = [f"prepared corpus: {path} ({size / 1e6:.1f} MB on disk)"]
    for name, e in manifest["train"].items():
        d = e["dropped"]
        lines.append(
            f"  train {name}: {e['kept']}/{e['pairs']} pairs kept ({d['empty']} empty, "
            f"{d['too_long']} over {manifest['settings']['max_len']} tokens); tokens "
            f"{e['tokens']['src']} src, {e['tokens']['tgt']} tgt"
        )
    for name, e in manifest["eval"].items():
        lines.append(f"  eval {name}: {e['pairs']} pairs")
    lines.append(f"train with: seq2seq-train data.prepared={path} (and the same data settings)")
    return "\n".join(lines)
