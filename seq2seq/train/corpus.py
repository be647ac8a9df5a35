"""A corpus as the trainer uses it: the training pairs of a prepared corpus (memory-mapped and
batched per epoch), the validation and test splits as text and ids, and the tokenizers.

`load_corpus(cfg)` opens data.prepared, or prepares the data on first use into data.cache_dir
(keyed by the source files' paths, sizes and times and by the settings; the second start finds
it). Validation and test splits are kept whole, so that their scores stay comparable with other
toolkits; they are read from the prepared directory, or from data.root when not in it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from seq2seq.config.schema import (
    DataConfig,
    TokenizerConfig,
    TrainConfig,
    fixed_shapes,
    resolve_path,
)
from seq2seq.data.epochs import TrainData
from seq2seq.data.prepare import cached_prepare, digests, split_files
from seq2seq.data.prepared import CorpusArrays, Prepared, open_prepared
from seq2seq.data.subword_sampling import SubwordSampler, subword_sampler
from seq2seq.data.text import DataError, Split, read_parallel
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.train.checkpoint import data_fingerprint
from seq2seq.train.distributed import broadcast, current

log = logging.getLogger(__name__)


@dataclass
class Corpus:
    """What a training run reads: tokenizers, training pairs, evaluation splits, and the
    fingerprint a resumed run checks its data against."""

    tokenizers: tuple[Tokenizer, Tokenizer]
    train: TrainData
    evals: dict[str, Split]
    fingerprint: str


def encode_split(
    name: str, pairs: list[tuple[str, str]], src_tok: Tokenizer, tgt_tok: Tokenizer
) -> Split:
    """Split `name` of text pairs, each side encoded with its tokenizer."""
    src_text, tgt_text = [p[0] for p in pairs], [p[1] for p in pairs]
    src_ids, tgt_ids = src_tok.encode_batch(src_text), tgt_tok.encode_batch(tgt_text)
    return Split(name, src_text, tgt_text, src_ids, tgt_ids)


def load_corpus(cfg: TrainConfig, tokenizers: tuple[Tokenizer, Tokenizer] | None = None) -> Corpus:
    """The corpus of cfg's run; `tokenizers` (a resumed checkpoint's) must be those the data was
    prepared with. Under torchrun rank 0 prepares and the other ranks open its directory."""
    data = cfg.data
    if data.prepared:
        path = resolve_path(data.prepared)
    else:
        path, error = broadcast(rank0_prepare(data, cfg.tokenizer, tokenizers))
        if error:
            raise DataError(f"rank 0 could not prepare the data: {error}")
    prepared = open_checked(path, data, tokenizers)
    toks = prepared.tokenizers
    train = train_data(cfg, prepared.train, data.weights, toks)
    log_filtered(prepared, train, data)
    evals = {}
    for name in dict.fromkeys([data.valid, *data.test]):
        files = prepared.eval_files(name) or eval_source(data, name)
        evals[name] = encode_split(name, read_parallel(*files), *toks)
    return Corpus(toks, train, evals, prepared.fingerprint(data.train, data.valid))


def train_sampler(cfg: TrainConfig, toks: tuple[Tokenizer, Tokenizer]) -> SubwordSampler | None:
    """The training pairs' subword sampler (tokenizer.sampling), or None when it is off; the
    evaluation splits never have one."""
    d = cfg.data  # the caps of TrainData's filter: a sampled side over them keeps its ids
    caps = (min(d.train_max_src_len or d.max_len, d.max_len), d.max_len)
    return subword_sampler(cfg.tokenizer.sampling, toks, cfg.trainer.seed, caps)


def within_cap(split: Split, cap: int) -> Split:
    """The pairs of `split` whose source has at most `cap` tokens (all when cap is 0): a length
    experiment chooses its best checkpoint on sentences as short as those it trained on."""
    if not cap:
        return split
    keep = [i for i, ids in enumerate(split.src_ids) if len(ids) <= cap]
    log.info(
        "%s: %d of %d pairs within the cap of %d source tokens",
        split.name,
        len(keep),
        len(split),
        cap,
    )
    if not keep:
        raise DataError(
            f"{split.name}: no pair has a source of at most {cap} tokens: raise "
            "data.train_max_src_len (or data.length_cap)"
        )
    return Split(
        split.name,
        [split.src_text[i] for i in keep],
        [split.tgt_text[i] for i in keep],
        [split.src_ids[i] for i in keep],
        [split.tgt_ids[i] for i in keep],
    )


def rank0_prepare(
    data: DataConfig, tok: TokenizerConfig, tokenizers: tuple[Tokenizer, Tokenizer] | None
) -> tuple[Path | None, str | None]:
    """(the cached prepared directory, None) on rank 0; (None, the error) when it failed."""
    if not current().is_main:
        return None, None
    try:
        return cached_prepare(data, tok, tokenizers), None
    except Exception as err:
        if current().enabled:
            return None, f"{type(err).__name__}: {err}"
        raise


def eval_source(data: DataConfig, name: str) -> tuple[Path, Path]:
    """The raw (source, target) files of split `name` under data.root."""
    return split_files(data, [name])[name]


def read_split(data: DataConfig, name: str) -> list[tuple[str, str]]:
    """The (source, target) line pairs of split `name` under data.root."""
    return read_parallel(*eval_source(data, name))


def corpus_from_splits(
    cfg: TrainConfig, train: Split, evals: dict[str, Split], toks: tuple[Tokenizer, Tokenizer]
) -> Corpus:
    """A Corpus of already encoded splits, in memory (tests, benchmarks): no files."""
    arrays = {cfg.data.train[0]: CorpusArrays.from_ids(train.src_ids, train.tgt_ids)}
    valid = evals[cfg.data.valid]
    texts = (train.src_text, train.tgt_text, valid.src_text, valid.tgt_text)
    return Corpus(toks, train_data(cfg, arrays, [], toks), evals, data_fingerprint(*texts))


def train_data(
    cfg: TrainConfig,
    arrays: dict[str, CorpusArrays],
    weights: list[float],
    toks: tuple[Tokenizer, Tokenizer],
) -> TrainData:
    """The training pairs of `arrays` (a corpus's per file) batched as cfg's data and trainer
    say, drawn with `weights` (data.weights: one each, or empty = 1)."""
    data, t = cfg.data, cfg.trainer
    return TrainData(
        arrays,
        weights,
        data.max_len,
        t.max_tokens,
        t.seed,
        data.train_max_src_len,
        train_sampler(cfg, toks),
        fixed_shapes(t),
        data.bidirectional_epochs,
    )


def open_checked(
    path: Path, data: DataConfig, tokenizers: tuple[Tokenizer, Tokenizer] | None
) -> Prepared:
    """open_prepared, refusing a corpus of other languages or other tokenizers than `tokenizers`."""
    prepared = open_prepared(path, data.train)
    made = prepared.manifest["settings"]
    if (made["src_lang"], made["tgt_lang"]) != (data.src_lang, data.tgt_lang):
        raise DataError(
            f"{path} holds {made['src_lang']}-{made['tgt_lang']} but data.src_lang/tgt_lang are "
            f"{data.src_lang}-{data.tgt_lang}. fix: prepare that pair, or set the languages"
        )
    if data.max_len > made["max_len"]:
        log.warning(
            "%s was prepared with data.max_len=%d: longer pairs are not in it (data.max_len=%d)",
            path,
            made["max_len"],
            data.max_len,
        )
    if tokenizers is not None and digests(tokenizers) != digests(prepared.tokenizers):
        raise DataError(
            f"{path} was tokenized with other tokenizers than the checkpoint's. fix: resume with "
            f"the prepared corpus the run started with"
        )
    return prepared


def log_filtered(prepared: Prepared, train: TrainData, data: DataConfig) -> None:
    """One line per training split: the pairs kept, and those left out with the first of their
    line numbers (all of them are in the split's dropped.tsv)."""
    for name, over in zip(data.train, train.over_long(), strict=True):
        entry = prepared.manifest["train"][name]
        listed = dropped_lines(prepared.path / "train" / name / "dropped.tsv")
        parts = []
        for reason, label in (("empty", "empty"), ("too_long", "over-long")):
            count = entry["dropped"][reason]
            if count:
                limit = (
                    ""
                    if reason == "empty"
                    else f" (> {prepared.manifest['settings']['max_len']} tokens)"
                )
                parts.append(
                    f"{count} {label}{limit} (lines {format_lines(listed[reason], count)})"
                )
        if over:
            limit = f"data.max_len={data.max_len}"
            if data.train_max_src_len:
                limit += f" or a source over data.train_max_src_len={data.train_max_src_len}"
            parts.append(f"{over} over {limit} tokens")
        removed = "; removed " + ", ".join(parts) if parts else ""
        log.info("%s: kept %d/%d pairs%s", name, entry["kept"] - over, entry["pairs"], removed)


def dropped_lines(path: Path, limit: int = 5) -> dict[str, list[int]]:
    """The first `limit` line numbers of each reason in a dropped.tsv."""
    found: dict[str, list[int]] = {"empty": [], "too_long": []}
    with path.open(encoding="utf-8") as handle:
        next(handle)  # header
        for row in handle:
            line, reason = row.rstrip("\n").split("\t")
            if len(found[reason]) < limit:
                found[reason].append(int(line))
            if all(len(v) >= limit for v in found.values()):
                break
    return found


def format_lines(lines: list[int], count: int) -> str:
    """Line numbers for a log line: `lines`, then "..." when `count` is larger."""
    return ", ".join(map(str, lines)) + (", ..." if count > len(lines) else "")
