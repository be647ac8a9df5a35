"""Tests for seq2seq.train.progress: a bar on a terminal, plain report lines in a log file."""

from __future__ import annotations

import io
import logging

import pytest

from seq2seq.train.progress import Progress


class Terminal(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def run(progress: Progress, steps: int, every: int) -> None:
    for step in range(1, steps + 1):
        progress.step()
        if step % every == 0:
            progress.report(step, {"loss": f"{10 / step:.3f}"})
    progress.close()


def test_a_log_gets_one_plain_line_per_report_and_no_bar(caplog: pytest.LogCaptureFixture) -> None:
    stream = io.StringIO()
    with caplog.at_level(logging.INFO, logger="seq2seq.train.progress"):
        run(Progress(total=100, initial=0, enabled=True, stream=stream), steps=100, every=25)
    assert stream.getvalue() == ""  # no bar frames
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [f"step {s}/100: loss {10 / s:.3f}" for s in (25, 50, 75, 100)]


def test_a_terminal_gets_the_bar_and_no_report_lines(caplog: pytest.LogCaptureFixture) -> None:
    stream = Terminal()
    with caplog.at_level(logging.INFO, logger="seq2seq.train.progress"):
        run(Progress(total=40, initial=10, enabled=True, stream=stream), steps=30, every=10)
    assert "40/40" in stream.getvalue()
    assert "loss=0.333" in stream.getvalue()
    assert not caplog.records


@pytest.mark.parametrize("stream", [io.StringIO(), Terminal()], ids=["log", "terminal"])
def test_disabled_shows_nothing(stream: io.StringIO, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="seq2seq.train.progress"):
        run(Progress(total=10, initial=0, enabled=False, stream=stream), steps=10, every=5)
    assert stream.getvalue() == ""
    assert not caplog.records
