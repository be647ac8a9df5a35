"""Reading parallel text, validating it, and cutting it into batches.

Reading: a corpus split is a pair of line-aligned files `{split}.{src}` / `{split}.{tgt}`,
each optionally gzip-compressed (`.gz`). Every problem with the input (missing file, bad
encoding, corrupt gzip, empty file, mismatched line counts) raises `DataError` whose
message names the file, the 1-based line where relevant, and how to fix it.

Filtering: bad pairs are never dropped silently. The two filters share one
`FilterReport` that counts every removal with its 1-based line number:

1. `kept, report = drop_empty(pairs)` keeps pairs where neither side is blank.
2. `kept2 = drop_long(src_lens, tgt_lens, max_len, report, line_numbers)` runs on the
   tokenized survivors (`line_numbers[i]` is the file line of survivor `i`) and keeps
   those whose both sides have at most `max_len` tokens.
3. `report.summary("train")` gives one human-readable line for the log.

Batching: token-id sequences are `list[int]` without special tokens. `collate` adds
BOS/EOS and padding; `token_batches` groups examples of similar length under a token
budget (a pure function of its arguments, so resuming and sharding are reproducible);
`sentence_batches` groups sentences for inference.
"""

from __future__ import annotations

import gzip
import random
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import zip_longest
from pathlib import Path
from typing import BinaryIO

import torch

from seq2seq.tokenizer import BOS_ID, EOS_ID, PAD_ID

GZIP_MAGIC = b"\x1f\x8b"
MAX_LISTED_LINES = 5
MAX_LISTED_FILES = 20
STREAM_BLOCK = 1 << 22  # bytes read at a time by iter_lines

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "PAD_ID",
    "Batch",
    "DataError",
    "FilterReport",
    "Split",
    "collate",
    "drop_empty",
    "drop_long",
    "find_split_file",
    "iter_lines",
    "iter_parallel",
    "read_lines",
    "read_parallel",
    "decode_text",
    "split_lines",
    "sentence_batches",
    "token_batches",
]


class DataError(ValueError):
    """Bad input data. The message names the file, the line (1-based) and how to fix it."""


# --------------------------------------------------------------------------- reading


def find_split_file(root: Path, split: str, lang: str) -> Path:
    """`root/{split}.{lang}` or `root/{split}.{lang}.gz` (plain preferred).

    Neither existing is a DataError that lists both candidates, what the folder does contain
    (or that it is missing) and how to fix it.
    """
    root = Path(root)
    plain = root / f"{split}.{lang}"
    packed = root / f"{split}.{lang}.gz"
    for candidate in (plain, packed):
        if candidate.is_file():
            return candidate
    if root.is_dir():
        names = sorted(p.name for p in root.iterdir())
        shown = ", ".join(names[:MAX_LISTED_FILES]) or "(nothing)"
        if len(names) > MAX_LISTED_FILES:
            shown += f", ... ({len(names)} entries)"
        found = f"{root} contains: {shown}"
    else:
        found = f"the folder {root} does not exist"
    raise DataError(
        f"no data file for split '{split}', language '{lang}': looked for {plain} and "
        f"{packed}; {found}. fix: point the data root at a folder holding line-aligned "
        f"files named {{split}}.{{lang}} or {{split}}.{{lang}}.gz, or check the split and "
        f"language names"
    )


def _is_utf8(data: bytes) -> bool:
    """Whether `data` decodes as strict UTF-8."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _read_bytes(path: Path) -> bytes:
    """Return the (decompressed) bytes of `path`; gzip is detected by its magic bytes.

    A file named `.gz` without a gzip header is read as plain text if it is valid UTF-8.
    """
    with _open_binary(path) as handle:
        raw = handle.read()
    if raw[:2] != GZIP_MAGIC:
        if path.suffix == ".gz" and not _is_utf8(raw):
            raise DataError(
                f"{path}: named .gz but it is not gzip-compressed (no gzip header). "
                f"fix: re-download or re-compress the file"
            )
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as err:
        raise _corrupt_gzip(path, err) from None


def _corrupt_gzip(path: Path, err: Exception) -> DataError:
    return DataError(
        f"{path}: corrupt or truncated gzip file ({err}). fix: re-download or "
        f"re-compress it (gzip -t {path} checks a file)"
    )


def _open_binary(path: Path) -> BinaryIO:
    """`path` opened for reading bytes; a missing file or a folder is a DataError."""
    try:
        return path.open("rb")
    except FileNotFoundError:
        raise DataError(f"{path}: file not found. fix: check the path") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, expected a text file") from None
    except OSError as err:
        raise DataError(f"{path}: cannot read ({err})") from err


def decode_text(path: Path | str, data: bytes, first_line: int = 1) -> str:
    """Decode strict UTF-8, reporting the line and column of the first bad byte (`data` starts
    at line `first_line` of the file)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + first_line
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise DataError(
            f"{path}:{line}: invalid UTF-8 (byte 0x{data[err.start]:02x} at column {column}). "
            f"fix: re-encode the file as UTF-8, e.g. iconv -f latin1 -t utf-8 {path} > fixed"
        ) from None


def read_lines(path: Path, allow_empty: bool = False) -> list[str]:
    """The lines of a plain or gzip-compressed UTF-8 text file.

    Only the line terminator ("\\n" or "\\r\\n") is removed; other whitespace is kept. A
    UTF-8 byte-order mark at the start of the file is dropped. A missing file, corrupt gzip,
    invalid UTF-8 or (unless `allow_empty`, which gives []) an empty file is a DataError.
    """
    path = Path(path)
    text = decode_text(path, _read_bytes(path))
    if not text and not allow_empty:
        raise DataError(f"{path}: file is empty (0 lines). fix: check the file was written")
    return split_lines(text)


def split_lines(text: str) -> list[str]:
    """Lines of `text`, split on "\\n" only (U+2028 and the like stay inside a line), without
    a leading byte-order mark or the "\\r" of "\\r\\n"."""
    lines = text.removeprefix("\ufeff").split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def read_parallel(src_path: Path, tgt_path: Path) -> list[tuple[str, str]]:
    """(source, target) pairs of two line-aligned files; a DataError when either file is
    unreadable or their line counts differ."""
    src = read_lines(src_path)
    tgt = read_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(_mismatch(src_path, tgt_path, len(src), len(tgt)))
    return list(zip(src, tgt, strict=True))


def _mismatch(src_path: Path, tgt_path: Path, n_src: int, n_tgt: int) -> str:
    """The message of parallel files whose line counts differ."""
    return (
        f"line counts differ: {src_path} has {n_src} lines but {tgt_path} has {n_tgt}. fix: "
        f"the files must be line-aligned (line i of one translates line i of the other); look "
        f"for a truncated file or sentences split over lines"
    )


def _open_stream(path: Path) -> BinaryIO:
    """`path` opened for reading bytes, decompressed when it starts with the gzip magic."""
    raw = _open_binary(path)
    if raw.peek(2)[:2] == GZIP_MAGIC:  # type: ignore[attr-defined]
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw


def _read_block(stream: BinaryIO, path: Path) -> bytes:
    """The next STREAM_BLOCK bytes of `stream` (b"" at the end); a corrupt gzip is a DataError."""
    try:
        return stream.read(STREAM_BLOCK)
    except (OSError, EOFError, zlib.error) as err:
        raise _corrupt_gzip(path, err) from None


def iter_lines(path: Path | str, chunk: int) -> Iterator[list[str]]:
    """The lines of a plain or gzip text file as lists of `chunk` lines (the last may be
    shorter), read in blocks: a file of any size in bounded memory.

    The lines are those of `read_lines` (the same terminators removed, the same byte-order
    mark dropped), with the same errors: invalid UTF-8 names the file, line and column; an
    empty file is a DataError.
    """
    path = Path(path)
    buffer: list[str] = []
    count, rest = 0, b""
    with _open_stream(path) as stream:
        while block := _read_block(stream, path):
            data = rest + block
            cut = data.rfind(b"\n") + 1
            rest = data[cut:]
            if cut == 0:
                continue
            text = decode_text(path, data[:cut], count + 1)
            lines = text.replace("\r\n", "\n").split("\n")[:-1]
            if count == 0 and lines:
                lines[0] = lines[0].removeprefix("\ufeff")
            count += len(lines)
            buffer += lines
            while len(buffer) >= chunk:
                yield buffer[:chunk]
                buffer = buffer[chunk:]
    if rest:
        last = decode_text(path, rest, count + 1).removesuffix("\r")
        buffer.append(last.removeprefix("\ufeff") if count == 0 else last)
        count += 1
    if count == 0:
        raise DataError(f"{path}: file is empty (0 lines). fix: check the file was written")
    if buffer:
        yield buffer


def iter_parallel(
    src_path: Path, tgt_path: Path, chunk: int
) -> Iterator[tuple[list[str], list[str]]]:
    """`read_parallel` in chunks of `chunk` line pairs (bounded memory); mismatched line counts
    are the same DataError, raised when the shorter file ends."""
    done = 0
    pairs = zip_longest(iter_lines(src_path, chunk), iter_lines(tgt_path, chunk))
    for src, tgt in pairs:
        if src is None or tgt is None or len(src) != len(tgt):
            n_src, n_tgt = done + len(src or []), done + len(tgt or [])
            for more_src, more_tgt in pairs:  # count the rest, for the message
                n_src, n_tgt = n_src + len(more_src or []), n_tgt + len(more_tgt or [])
            raise DataError(_mismatch(src_path, tgt_path, n_src, n_tgt))
        done += len(src)
        yield src, tgt


# --------------------------------------------------------------------------- filtering


def _format_lines(lines: Sequence[int]) -> str:
    """Format at most five line numbers, with an ellipsis when there are more."""
    shown = ", ".join(str(n) for n in lines[:MAX_LISTED_LINES])
    return shown + (", ..." if len(lines) > MAX_LISTED_LINES else "")


@dataclass
class FilterReport:
    """What the filters removed from one split; line numbers are 1-based file lines."""

    total: int
    empty: list[int] = field(default_factory=list)
    too_long: list[int] = field(default_factory=list)
    max_len: int | None = None

    @property
    def kept(self) -> int:
        """Number of pairs that survived every filter."""
        return self.total - len(self.empty) - len(self.too_long)

    def summary(self, name: str) -> str:
        """One log line, e.g. `train: kept 28990/29000 pairs; removed 4 empty (lines ...)`."""
        text = f"{name}: kept {self.kept}/{self.total} pairs"
        parts = []
        if self.empty:
            parts.append(f"{len(self.empty)} empty (lines {_format_lines(self.empty)})")
        if self.too_long:
            parts.append(
                f"{len(self.too_long)} over-long (> {self.max_len} tokens) "
                f"(lines {_format_lines(self.too_long)})"
            )
        return text + ("; removed " + ", ".join(parts) if parts else "")


def drop_empty(pairs: Sequence[tuple[str, str]]) -> tuple[list[int], FilterReport]:
    """Return the indices of pairs whose both sides contain non-whitespace text.

    The returned report has `total == len(pairs)` and the 1-based line numbers of the
    removed pairs in `report.empty`.
    """
    kept: list[int] = []
    empty: list[int] = []
    for i, (src, tgt) in enumerate(pairs):
        if src.strip() and tgt.strip():
            kept.append(i)
        else:
            empty.append(i + 1)
    return kept, FilterReport(total=len(pairs), empty=empty)


def drop_long(
    src_lens: Sequence[int],
    tgt_lens: Sequence[int],
    max_len: int,
    report: FilterReport,
    line_numbers: Sequence[int],
) -> list[int]:
    """Return positions whose source and target both have at most `max_len` tokens.

    `line_numbers[i]` is the 1-based file line of position `i`; removed ones are
    appended to `report.too_long` and `report.max_len` is set.
    """
    if not len(src_lens) == len(tgt_lens) == len(line_numbers):
        raise ValueError(
            f"drop_long: got {len(src_lens)} source lengths, {len(tgt_lens)} target lengths "
            f"and {len(line_numbers)} line numbers; they must match"
        )
    report.max_len = max_len
    kept: list[int] = []
    for i, (s, t) in enumerate(zip(src_lens, tgt_lens, strict=True)):
        if s <= max_len and t <= max_len:
            kept.append(i)
        else:
            report.too_long.append(line_numbers[i])
    return kept


# --------------------------------------------------------------------------- batching


@dataclass
class Split:
    """An evaluation split, as text and as token ids (no specials)."""

    name: str
    src_text: list[str]
    tgt_text: list[str]
    src_ids: list[list[int]]
    tgt_ids: list[list[int]]

    def __len__(self) -> int:
        return len(self.src_text)


@dataclass
class Batch:
    """A padded batch of examples.

    Attributes:
        src: `(B, S)` source ids followed by EOS, right-padded with PAD.
        tgt_in: `(B, T)` BOS followed by target ids (decoder input), right-padded.
        tgt_out: `(B, T)` target ids followed by EOS (decoder labels), right-padded.
        index: `(B,)` position of each example in the dataset.
    """

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor
    index: torch.Tensor

    @property
    def src_tokens(self) -> int:
        """Number of non-pad source tokens."""
        return int((self.src != PAD_ID).sum())

    @property
    def tgt_tokens(self) -> int:
        """Number of non-pad target tokens (the labels the loss is computed on)."""
        return int((self.tgt_out != PAD_ID).sum())

    def to(self, device: torch.device | str) -> Batch:
        """Return a copy with every tensor moved to `device`."""
        return Batch(
            src=self.src.to(device, non_blocking=True),
            tgt_in=self.tgt_in.to(device, non_blocking=True),
            tgt_out=self.tgt_out.to(device, non_blocking=True),
            index=self.index.to(device, non_blocking=True),
        )


def _pad(rows: list[list[int]]) -> torch.Tensor:
    """Right-pad rows with PAD into a `(len(rows), longest)` long tensor."""
    width = max(len(row) for row in rows)
    return torch.tensor([row + [PAD_ID] * (width - len(row)) for row in rows], dtype=torch.long)


def collate(index: Sequence[int], src: Sequence[list[int]], tgt: Sequence[list[int]]) -> Batch:
    """Build a `Batch` from the examples `index` of the full lists `src`/`tgt`."""
    if not index:
        raise ValueError("collate: empty batch")
    src_rows = [list(src[i]) + [EOS_ID] for i in index]
    tgt_in = [[BOS_ID] + list(tgt[i]) for i in index]
    tgt_out = [list(tgt[i]) + [EOS_ID] for i in index]
    return Batch(
        src=_pad(src_rows),
        tgt_in=_pad(tgt_in),
        tgt_out=_pad(tgt_out),
        index=torch.tensor(list(index), dtype=torch.long),
    )


def token_batches(
    src_lens: Sequence[int],
    tgt_lens: Sequence[int],
    max_tokens: int,
    *,
    shuffle: bool,
    seed: int = 0,
    epoch: int = 0,
) -> list[list[int]]:
    """Group example indices into length-bucketed batches under a token budget.

    Examples are sorted by `(max(src_len, tgt_len), tgt_len, src_len)`: by the width that
    the budget counts, then so that a batch's targets and then sources are alike (less padding
    than sorting by `(tgt_len, src_len)`: docs/BENCHMARKS.md, kernel notes). When `shuffle`
    ties are broken by a random order drawn from `(seed, epoch)`, otherwise by index. Batches
    are cut greedily so that `len(batch) * (max(src_len, tgt_len) + 1) <= max_tokens` (the
    `+ 1` is the BOS/EOS); an example over budget on its own forms a batch by itself. With
    `shuffle` the order of the batches is then shuffled from `(seed, epoch)`.

    A pure function: the same arguments always give the same batches (only a local
    `random.Random` is used), which resuming and multi-GPU sharding rely on.
    """
    if len(src_lens) != len(tgt_lens):
        raise ValueError(f"token_batches: {len(src_lens)} source vs {len(tgt_lens)} target lengths")
    if max_tokens <= 0:
        raise ValueError(f"token_batches: max_tokens must be positive, got {max_tokens}")
    order = list(range(len(src_lens)))
    rng = random.Random(f"token_batches:{seed}:{epoch}")
    if shuffle:
        rng.shuffle(order)
    # stable: keeps the shuffled ties
    order.sort(key=lambda i: (max(src_lens[i], tgt_lens[i]), tgt_lens[i], src_lens[i]))
    batches: list[list[int]] = []
    batch: list[int] = []
    width = 0
    for i in order:
        size = max(src_lens[i], tgt_lens[i]) + 1
        if batch and (len(batch) + 1) * max(width, size) > max_tokens:
            batches.append(batch)
            batch, width = [], 0
        batch.append(i)
        width = max(width, size)
    if batch:
        batches.append(batch)
    if shuffle:
        rng.shuffle(batches)
    return batches


def sentence_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Cut indices sorted by length (longest first) into batches of `batch_size`.

    Used for inference; callers put outputs back in input order with the indices.
    """
    if batch_size <= 0:
        raise ValueError(f"sentence_batches: batch_size must be positive, got {batch_size}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[k : k + batch_size] for k in range(0, len(order), batch_size)]
