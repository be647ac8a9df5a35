"""seq2seq/evaluation/markdown.py: a report's section is replaced in place, the rest kept."""

from __future__ import annotations

from pathlib import Path

from seq2seq.evaluation.markdown import replace_section, write_section

START, END = "<!-- x start -->", "<!-- x end -->"


def test_the_marked_section_is_replaced_and_the_rest_kept() -> None:
    text = f"# Doc\n\nintro\n\n{START}\nold body\n{END}\n\ntail\n"
    new = replace_section(text, START, END, "new body\n")
    assert new == f"# Doc\n\nintro\n\n{START}\nnew body\n{END}\n\ntail\n"
    assert replace_section(new, START, END, "new body") == new  # a second run changes nothing


def test_a_document_without_the_markers_gets_them_appended() -> None:
    assert replace_section("# Doc\n\n", START, END, "body") == f"# Doc\n\n{START}\nbody\n{END}\n"


def test_an_end_marker_before_the_start_counts_as_absent() -> None:
    text = f"{END}\nkept\n{START}\n"
    new = replace_section(text, START, END, "body")
    assert new.startswith(f"{END}\nkept\n{START}\n")
    assert new.endswith(f"{START}\nbody\n{END}\n")


def test_write_section_creates_the_document_from_its_empty_text(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    write_section(doc, START, END, "body", empty="# Title\n")
    write_section(doc, START, END, "body 2", empty="# Title\n")
    assert doc.read_text(encoding="utf-8") == f"# Title\n\n{START}\nbody 2\n{END}\n"
