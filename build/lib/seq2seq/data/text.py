"""Reading parallel text and validating it.

A corpus split is a pair of line-aligned files `{split}.{src}` / `{split}.{tgt}`, each optionally
gzip-compressed (`.gz`), read whole or streamed in chunks. Every problem with the input (missing
file, bad encoding, corrupt gzip, empty file, mismatched line counts) raises `DataError` whose
message names the file, the 1-based line where relevant, and how to fix it.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path
from typing import BinaryIO

from seq2seq.errors import UserError

GZIP_MAGIC = b"\x1f\x8b"
MAX_LISTED_LINES = 5
MAX_LISTED_FILES = 20
STREAM_BLOCK = 1 << 22  # bytes read at a time by iter_lines


class DataError(UserError, ValueError):
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
