"""The sections of a Markdown document that a report owns: the text between its two marker
comments, replaced on every run while the rest of the document is kept as it is. Used by the
benchmark scripts (docs/BENCHMARKS.md) and the sweep report (docs/POSITIONAL_ENCODINGS.md);
free of torch, so that any script may import it."""

from __future__ import annotations

from pathlib import Path


def replace_section(text: str, start: str, end: str, body: str) -> str:
    """`text` with what lies between the markers `start` and `end` replaced by `body`, or with
    the markers and `body` appended when `text` lacks them (an `end` before `start` counts as
    absent)."""
    section = f"{start}\n{body.strip()}\n{end}"
    before, found, rest = text.partition(start)
    if found and end in rest:
        return before + section + rest.split(end, 1)[1]
    return text.rstrip() + "\n\n" + section + "\n"


def write_section(doc: Path, start: str, end: str, body: str, empty: str = "") -> None:
    """Replace (or append) the marked section of the document at `doc`; `empty` is the text of
    a document that does not exist yet."""
    text = doc.read_text(encoding="utf-8") if doc.exists() else empty
    doc.write_text(replace_section(text, start, end, body), encoding="utf-8")
