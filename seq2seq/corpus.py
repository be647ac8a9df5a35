"""A corpus on disk as the trainer uses it: every split read, tokenizers built on the training
split, training pairs filtered, and every split encoded to token ids.

`load_corpus(data, tokenizer)` does all of it. The file format, the filters and the batching are
`data.py`'s; the tokenizers are `tokenizer.py`'s. Training pairs are filtered (empty ones, and
those over data.max_len tokens, counted in the log); validation and test splits are kept whole,
so that their scores stay comparable with other toolkits.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from seq2seq.config import PROJECT_ROOT, DataConfig, TokenizerConfig, resolve_path
from seq2seq.data import drop_empty, drop_long, find_split_file, read_parallel
from seq2seq.tokenizer import Tokenizer, build_tokenizers

log = logging.getLogger(__name__)


@dataclass
class Split:
    """One split of a parallel corpus, as text and as token ids (no specials)."""

    name: str
    src_text: list[str]
    tgt_text: list[str]
    src_ids: list[list[int]]
    tgt_ids: list[list[int]]

    def __len__(self) -> int:
        return len(self.src_text)


def read_split(data: DataConfig, split: str) -> list[tuple[str, str]]:
    """The (source, target) line pairs of `split` under data.root."""
    root = resolve_path(data.root)
    src = find_split_file(root, split, data.src_lang)
    tgt = find_split_file(root, split, data.tgt_lang)
    return read_parallel(src, tgt)


def encode_split(
    name: str, pairs: list[tuple[str, str]], src_tok: Tokenizer, tgt_tok: Tokenizer
) -> Split:
    src_text, tgt_text = [p[0] for p in pairs], [p[1] for p in pairs]
    src_ids, tgt_ids = src_tok.encode_batch(src_text), tgt_tok.encode_batch(tgt_text)
    return Split(name, src_text, tgt_text, src_ids, tgt_ids)


def filter_train(
    name: str, pairs: list[tuple[str, str]], max_len: int, toks: tuple[Tokenizer, Tokenizer]
) -> Split:
    """Encode training pairs, dropping (and reporting) empty and over-long ones."""
    kept, report = drop_empty(pairs)
    split = encode_split(name, [pairs[i] for i in kept], *toks)
    lines = [i + 1 for i in kept]
    keep = drop_long(
        [len(s) for s in split.src_ids], [len(t) for t in split.tgt_ids], max_len, report, lines
    )
    log.info(report.summary(name))
    if not keep:
        raise ValueError(f"{name}: no training pairs left after filtering ({report.summary(name)})")
    pick = lambda xs: [xs[i] for i in keep]  # noqa: E731
    return Split(
        name, pick(split.src_text), pick(split.tgt_text), pick(split.src_ids), pick(split.tgt_ids)
    )


def load_corpus(
    data: DataConfig, tok: TokenizerConfig, tokenizers: tuple[Tokenizer, Tokenizer] | None = None
) -> tuple[Tokenizer, Tokenizer, dict[str, Split]]:
    """Read every split, train (or load cached) tokenizers on train, and encode.

    Training pairs are filtered (empty or longer than data.max_len tokens, counted in the log).
    Validation and test splits are kept whole, so scores stay comparable with other toolkits.
    `tokenizers` (a resumed checkpoint's) are used instead of building them when given.
    """
    train_pairs = read_split(data, data.train)
    kept, _ = drop_empty(train_pairs)
    if tokenizers is None:
        tokenizers = train_tokenizers(tok, train_pairs, kept)
    src_tok, tgt_tok = tokenizers
    splits = {data.train: filter_train(data.train, train_pairs, data.max_len, (src_tok, tgt_tok))}
    for name in dict.fromkeys([data.valid, *data.test]):
        splits[name] = encode_split(name, read_split(data, name), src_tok, tgt_tok)
    return src_tok, tgt_tok, splits


def train_tokenizers(
    tok: TokenizerConfig, pairs: list[tuple[str, str]], kept: list[int]
) -> tuple[Tokenizer, Tokenizer]:
    """Tokenizers trained on the kept training pairs, or loaded from the cache (JSON or a
    SentencePiece model: a cache file is never unpickled)."""
    cache = resolve_cache(tok.cache_dir)
    try:
        return build_tokenizers(
            getattr(tok.kind, "value", tok.kind),
            [pairs[i][0] for i in kept],
            [pairs[i][1] for i in kept],
            vocab_size=tok.vocab_size,
            joint=tok.joint,
            cache_dir=cache,
            min_freq=tok.min_freq,
            character_coverage=tok.character_coverage,
        )
    except (ValueError, RuntimeError, UnicodeDecodeError) as err:
        raise ValueError(
            f"cannot build the {getattr(tok.kind, 'value', tok.kind)} tokenizer ({err}). If a "
            f"cached tokenizer under {cache} is corrupt, delete it: it is trained again"
        ) from err


def resolve_cache(path: str) -> Path:
    """tokenizer.cache_dir as a path: a relative one is under the project root."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else PROJECT_ROOT / p
