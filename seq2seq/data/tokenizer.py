"""Tokenizers for source and target text, trained on the training split and cached on disk.

Four kinds share one interface (`Tokenizer`) and the same four special ids:

* `bpe` and `unigram`: SentencePiece subword models (`SentencePieceTokenizer`);
* `word`: whitespace-separated words (`VocabTokenizer`);
* `char`: single characters, spaces included (`VocabTokenizer`).

Any kind can fold case (`lowercase`): it is trained on lowercased text and lowercases what it
encodes, so its model sees, and writes, lowercase only. SentencePiece models do it with their own
normalisation rule (`nmt_nfkc_cf`: NFKC, then case folding), which lives in the model file, so
every program that loads the model (CTranslate2, transformers) folds case the same way.

A tokenizer's `Tokenizer.state()` holds only plain values (str, int, bytes, lists), so it
can be stored inside a checkpoint that is read back with `torch.load(weights_only=True)`, and
`tokenizer_from_state` rebuilds the tokenizer from it.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import sentencepiece as spm

logger = logging.getLogger(__name__)

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
UNK_PIECE = "\u2047"  # "⁇", how SentencePiece renders an unknown piece
SENTENCEPIECE_KINDS = ("bpe", "unigram")
VOCAB_KINDS = ("word", "char")
KINDS = SENTENCEPIECE_KINDS + VOCAB_KINDS
_CACHE_FORMAT = 1  # bump when the cached file layout or the training recipe changes


@runtime_checkable
class Tokenizer(Protocol):
    """What the trainer, translator and checkpoint code need from a tokenizer."""

    kind: str

    @property
    def vocab_size(self) -> int:
        """Number of ids, the special tokens included."""
        ...

    @property
    def lowercase(self) -> bool:
        """Whether the tokenizer folds case: it encodes "A" as "a", and decodes lowercase text."""
        ...

    def encode(self, text: str) -> list[int]:
        """Ids of `text`, without BOS/EOS."""
        ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`[encode(t) for t in texts]`, possibly faster."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`: PAD and BOS are skipped, everything from the first EOS is dropped."""
        ...

    def id_to_token(self, token_id: int) -> str:
        """The token (piece, word or character) that `token_id` stands for."""
        ...

    def state(self) -> dict[str, object]:
        """Plain-valued description that `tokenizer_from_state` turns into a tokenizer."""
        ...


def _content_ids(ids: Iterable[int]) -> list[int]:
    """`ids` as ints without PAD/BOS, cut at the first EOS."""
    out: list[int] = []
    for raw in ids:
        i = int(raw)
        if i == EOS_ID:
            break
        if i not in (PAD_ID, BOS_ID):
            out.append(i)
    return out


class SentencePieceTokenizer:
    """Subword tokenizer backed by a SentencePiece model (Kudo & Richardson 2018).

    `kind="bpe"` is byte-pair encoding (Sennrich et al. 2016); `kind="unigram"` is the unigram
    language model of Kudo (2018). The serialized model proto is the whole state.
    """

    def __init__(self, kind: str, model_proto: bytes) -> None:
        if kind not in SENTENCEPIECE_KINDS:
            raise ValueError(
                f"SentencePiece kind must be one of {SENTENCEPIECE_KINDS}, got {kind!r}"
            )
        self.kind = kind
        self._proto = bytes(model_proto)
        self._sp = spm.SentencePieceProcessor(model_proto=self._proto)
        found = (
            self._sp.pad_id(),
            self._sp.bos_id(),
            self._sp.eos_id(),
            self._sp.unk_id(),
        )
        if found != (PAD_ID, BOS_ID, EOS_ID, UNK_ID):
            raise ValueError(f"SentencePiece model has special ids {found}, expected (0, 1, 2, 3)")
        # the model's normaliser folds case (nmt_nfkc_cf) if "A" and "a" normalise alike
        self._lowercase = bool(self._sp.normalize("A") == self._sp.normalize("a"))

    @property
    def processor(self) -> spm.SentencePieceProcessor:
        """The SentencePiece processor itself (bulk.WordCache encodes through it)."""
        return self._sp

    @property
    def vocab_size(self) -> int:
        """Number of pieces in the model (may be below the requested size on small corpora)."""
        return int(self._sp.get_piece_size())

    @property
    def lowercase(self) -> bool:
        """Whether the model's normaliser folds case (`nmt_nfkc_cf`)."""
        return self._lowercase

    def id_to_token(self, token_id: int) -> str:
        """The piece of `token_id` (`"▁"` marks a word start)."""
        return str(self._sp.id_to_piece(int(token_id)))

    def encode(self, text: str) -> list[int]:
        """Piece ids of `text` (after SentencePiece's NFKC/whitespace normalisation)."""
        return list(self._sp.encode(text, out_type=int))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids of every text, encoded by SentencePiece in one multithreaded call."""
        return [list(ids) for ids in self._sp.encode(list(texts), out_type=int)]

    def decode(self, ids: Sequence[int]) -> str:
        """Detokenized text; out-of-range ids render as unknown (`⁇`)."""
        size = self.vocab_size
        content = [i if 0 <= i < size else UNK_ID for i in _content_ids(ids)]
        return str(self._sp.decode(content))

    def state(self) -> dict[str, object]:
        """`{"kind": ..., "model": <serialized model proto bytes>}`."""
        return {"kind": self.kind, "model": self._proto}

    def __reduce__(self) -> tuple[type[SentencePieceTokenizer], tuple[str, bytes]]:
        return (SentencePieceTokenizer, (self.kind, self._proto))

    def __repr__(self) -> str:
        return f"SentencePieceTokenizer(kind={self.kind!r}, vocab_size={self.vocab_size})"


_SPLITTERS: dict[str, Callable[[str], list[str]]] = {"word": str.split, "char": list}
_JOINERS: dict[str, Callable[[Iterable[str]], str]] = {
    "word": " ".join,
    "char": "".join,
}


class VocabTokenizer:
    """Tokenizer with an explicit token list: whitespace words (`word`) or characters (`char`).

    `tokens[i]` is the token of id `i`; the first four are `SPECIAL_TOKENS`. Special
    tokens are never produced from text (a literal `"<s>"` word encodes to UNK).
    """

    def __init__(self, kind: str, tokens: Sequence[str], lowercase: bool = False) -> None:
        if kind not in VOCAB_KINDS:
            raise ValueError(f"vocabulary kind must be one of {VOCAB_KINDS}, got {kind!r}")
        if tuple(tokens[: len(SPECIAL_TOKENS)]) != SPECIAL_TOKENS:
            raise ValueError(f"tokens must start with {SPECIAL_TOKENS}")
        if len(set(tokens)) != len(tokens):
            raise ValueError("tokens must be unique")
        self.kind, self._lowercase = kind, lowercase
        self._tokens = [str(t) for t in tokens]
        self._index = {t: i for i, t in enumerate(self._tokens) if i >= len(SPECIAL_TOKENS)}
        self._split = _SPLITTERS[kind]
        self._join = _JOINERS[kind]

    @property
    def vocab_size(self) -> int:
        """Number of tokens, the specials included."""
        return len(self._tokens)

    @property
    def lowercase(self) -> bool:
        """Whether `encode` lowercases text first (str.lower)."""
        return self._lowercase

    def id_to_token(self, token_id: int) -> str:
        """The token string of `token_id`."""
        return self._tokens[int(token_id)]

    def encode(self, text: str) -> list[int]:
        """Ids of the words/characters of `text`; unseen ones map to `UNK_ID`."""
        index = self._index
        if self._lowercase:
            text = text.lower()
        return [index.get(tok, UNK_ID) for tok in self._split(text)]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`[encode(t) for t in texts]`."""
        return [self.encode(t) for t in texts]

    def decode(self, ids: Sequence[int]) -> str:
        """Words joined by single spaces (`word`) or characters concatenated (`char`)."""
        tokens = self._tokens
        special = len(SPECIAL_TOKENS)
        return self._join(
            tokens[i] if special <= i < len(tokens) else UNK_PIECE for i in _content_ids(ids)
        )

    def state(self) -> dict[str, object]:
        """`{"kind": ..., "tokens": [token of id 0, token of id 1, ...]}`, and `"lowercase":
        True` when it folds case (absent otherwise, so older states read the same)."""
        state: dict[str, object] = {"kind": self.kind, "tokens": list(self._tokens)}
        if self._lowercase:
            state["lowercase"] = True
        return state

    def __repr__(self) -> str:
        return (
            f"VocabTokenizer(kind={self.kind!r}, vocab_size={self.vocab_size}, "
            f"lowercase={self._lowercase})"
        )


def build_vocab(
    kind: str, texts: Iterable[str], *, vocab_size: int, min_freq: int = 1, lowercase: bool = False
) -> VocabTokenizer:
    """Counts words/characters of `texts` (lowercased first if `lowercase`); keeps the
    `vocab_size` most frequent (specials included) seen at least `min_freq` times, ties broken
    by token string."""
    if kind not in VOCAB_KINDS:
        raise ValueError(f"vocabulary kind must be one of {VOCAB_KINDS}, got {kind!r}")
    split = _SPLITTERS[kind]
    counts: Counter[str] = Counter()
    for text in texts:
        counts.update(split(text.lower() if lowercase else text))
    candidates = [t for t, c in counts.items() if c >= min_freq and t not in SPECIAL_TOKENS]
    candidates.sort(key=lambda t: (-counts[t], t))
    kept = candidates[: vocab_size - len(SPECIAL_TOKENS)]
    return VocabTokenizer(kind, [*SPECIAL_TOKENS, *kept], lowercase)


def train_sentencepiece(
    kind: str,
    texts: Iterable[str],
    *,
    vocab_size: int,
    character_coverage: float = 1.0,
    lowercase: bool = False,
) -> SentencePieceTokenizer:
    """Trains a SentencePiece `bpe`/`unigram` model in memory, with the fixed special ids.

    `hard_vocab_limit=False` lets a small corpus yield fewer pieces than `vocab_size`. Training
    is single-threaded: multithreaded unigram training gives thread-count-dependent pieces, and one
    thread is fast enough (about a second for Multi30k at 8000 pieces). `lowercase` takes
    SentencePiece's case-folding rule `nmt_nfkc_cf` instead of its default `nmt_nfkc`.
    """
    if kind not in SENTENCEPIECE_KINDS:
        raise ValueError(f"SentencePiece kind must be one of {SENTENCEPIECE_KINDS}, got {kind!r}")
    writer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_writer=writer,
            model_type=kind,
            vocab_size=vocab_size,
            character_coverage=character_coverage,
            normalization_rule_name="nmt_nfkc_cf" if lowercase else "nmt_nfkc",
            hard_vocab_limit=False,
            pad_id=PAD_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            unk_id=UNK_ID,
            pad_piece=SPECIAL_TOKENS[PAD_ID],
            bos_piece=SPECIAL_TOKENS[BOS_ID],
            eos_piece=SPECIAL_TOKENS[EOS_ID],
            unk_piece=SPECIAL_TOKENS[UNK_ID],
            num_threads=1,  # unigram pieces depend on the thread count; one thread is reproducible
            minloglevel=2,
        )
    except RuntimeError as err:  # sentencepiece reports bad settings/corpora as RuntimeError
        raise ValueError(f"SentencePiece {kind} training failed: {err}") from err
    return SentencePieceTokenizer(kind, writer.getvalue())


@dataclass(frozen=True)
class Settings:
    """What a tokenizer is trained with besides its kind and texts (`build_tokenizers`)."""

    vocab_size: int
    min_freq: int = 1  # word/char only
    character_coverage: float = 1.0  # bpe/unigram only
    lowercase: bool = False

    def key(self, kind: str) -> dict[str, object]:
        """The settings that influence training of `kind` (and so belong in the cache key).
        `lowercase` only when set, so that the caches made before it existed stay valid."""
        applies = "character_coverage" if kind in SENTENCEPIECE_KINDS else "min_freq"
        key = {"kind": kind, "vocab_size": self.vocab_size, applies: getattr(self, applies)}
        return {**key, **({"lowercase": True} if self.lowercase else {})}


def _train(kind: str, texts: Sequence[str], settings: Settings) -> Tokenizer:
    """A `kind` tokenizer trained on `texts`."""
    if kind in SENTENCEPIECE_KINDS:
        return train_sentencepiece(
            kind,
            texts,
            vocab_size=settings.vocab_size,
            character_coverage=settings.character_coverage,
            lowercase=settings.lowercase,
        )
    return build_vocab(
        kind,
        texts,
        vocab_size=settings.vocab_size,
        min_freq=settings.min_freq,
        lowercase=settings.lowercase,
    )


def tokenizer_from_state(state: dict[str, object]) -> Tokenizer:
    """Rebuilds a tokenizer from `Tokenizer.state()`."""
    kind = state.get("kind")
    if kind in SENTENCEPIECE_KINDS:
        model = state.get("model")
        if not isinstance(model, bytes):
            raise ValueError("SentencePiece tokenizer state needs 'model' bytes")
        return SentencePieceTokenizer(str(kind), model)
    if kind in VOCAB_KINDS:
        tokens = state.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise ValueError(f"{kind} tokenizer state needs a 'tokens' list of str")
        return VocabTokenizer(str(kind), tokens, state.get("lowercase") is True)
    raise ValueError(f"unknown tokenizer kind {kind!r}; expected one of {KINDS}")


def cache_path(cache_dir: Path, settings: dict[str, object], texts: Sequence[str]) -> Path:
    """Where the tokenizer trained with `settings` on `texts` is cached: a sha256 of both."""
    digest = hashlib.sha256()
    header = {"format": _CACHE_FORMAT, **settings}
    digest.update(json.dumps(header, sort_keys=True).encode("utf-8"))
    for text in texts:
        data = text.encode("utf-8")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    suffix = ".model" if settings["kind"] in SENTENCEPIECE_KINDS else ".json"
    return Path(cache_dir) / f"{settings['kind']}-{digest.hexdigest()}{suffix}"


def write_atomic(path: Path, data: bytes) -> None:
    """Writes `data` to `path` via a temporary file, so readers never see a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".tmp-", delete=False) as handle:
        handle.write(data)
        tmp_name = handle.name
    os.replace(tmp_name, path)


def tokenizer_bytes(tokenizer: Tokenizer) -> bytes:
    """What `save_tokenizer` writes: a SentencePiece model file, or JSON."""
    state = tokenizer.state()
    if tokenizer.kind in SENTENCEPIECE_KINDS:
        data = state["model"]
        assert isinstance(data, bytes)
        return data
    return json.dumps(state, ensure_ascii=False).encode("utf-8")


def save_tokenizer(path: Path, tokenizer: Tokenizer) -> None:
    """Write `tokenizer` to `path` atomically (`tokenizer_bytes`)."""
    write_atomic(path, tokenizer_bytes(tokenizer))


def load_tokenizer(path: Path, kind: str) -> Tokenizer:
    """The tokenizer `save_tokenizer` wrote to `path` (never unpickled)."""
    data = path.read_bytes()
    if kind in SENTENCEPIECE_KINDS:
        return SentencePieceTokenizer(kind, data)
    return tokenizer_from_state(json.loads(data.decode("utf-8")))


def _train_or_load(
    kind: str, texts: Sequence[str], cache_dir: Path, settings: Settings
) -> Tokenizer:
    """The cached tokenizer for these texts and settings, training (and caching) it if absent."""
    path = cache_path(cache_dir, settings.key(kind), texts)
    if path.exists():
        logger.info("loading %s tokenizer from cache %s", kind, path)
        return load_tokenizer(path, kind)
    tokenizer = _train(kind, texts, settings)
    save_tokenizer(path, tokenizer)
    logger.info("trained %s tokenizer (%d ids), cached at %s", kind, tokenizer.vocab_size, path)
    return tokenizer


def build_tokenizers(
    kind: str,
    src_texts: Sequence[str],
    tgt_texts: Sequence[str],
    *,
    vocab_size: int,
    joint: bool,
    cache_dir: Path,
    min_freq: int = 1,
    character_coverage: float = 1.0,
    lowercase: bool = False,
) -> tuple[Tokenizer, Tokenizer]:
    """Trains (or loads from `cache_dir`) the (source, target) tokenizers.

    `joint=True` trains one tokenizer on both sides and returns it twice (the same object).
    `min_freq` applies to `word`/`char` only, `character_coverage` to `bpe`/`unigram`
    only, `lowercase` (fold case) to every kind; the cache key holds the kind, the settings that
    apply to it, and the texts.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown tokenizer kind {kind!r}; expected one of {KINDS}")
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must exceed {len(SPECIAL_TOKENS)}, got {vocab_size}")
    if min_freq < 1:
        raise ValueError(f"min_freq must be >= 1, got {min_freq}")
    if not 0.0 < character_coverage <= 1.0:
        raise ValueError(f"character_coverage must be in (0, 1], got {character_coverage}")
    settings = Settings(vocab_size, min_freq, character_coverage, lowercase)
    if joint:
        shared = _train_or_load(kind, [*src_texts, *tgt_texts], Path(cache_dir), settings)
        return shared, shared
    src = _train_or_load(kind, list(src_texts), Path(cache_dir), settings)
    tgt = _train_or_load(kind, list(tgt_texts), Path(cache_dir), settings)
    return src, tgt
