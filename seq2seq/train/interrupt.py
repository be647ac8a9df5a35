"""Graceful stop: SIGTERM, Ctrl-C (SIGINT) or SIGUSR2 asks the training loop to finish its
current step, save a checkpoint and exit; a second signal of the same kind acts as usual (kills
or raises KeyboardInterrupt) for a user who does not want to wait.

SIGUSR2 is what SLURM sends a job ahead of its time limit or on preemption when submitit asks it to
(`--signal=USR2@<signal_delay_s>`, hydra/launcher=slurm). submitit's own handler requeues the job
and exits at once; training takes the signal first, saves, and then `pass_on` calls that handler,
so the requeued job resumes from the checkpoint of the step it stopped at.

Ctrl-C on a sweep (`seq2seq-train -m`, seq2seq/cli/train.py `sweep_stop`): the launching process
ignores SIGINT, so that a launcher's worker processes, which inherit that, survive it while idle
and the launcher never kills a job half-way through its save; it names a stop file in the
environment (SWEEP_STOP_ENV). A job that takes SIGINT creates the file; a running job that sees
the file stops as if it had taken SIGINT (its Ctrl-C came while SIGINT was still ignored, during
its data loading), and a job that finds it at its start does not start (`sweep_stopped`).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)
SWEEP_STOP_ENV = "SEQ2SEQ_SWEEP_STOP"  # the stop file of the sweep this process is a job of


def sweep_stop_file() -> Path | None:
    """The stop file of the sweep this process runs a job of (None: not in a sweep)."""
    value = os.environ.get(SWEEP_STOP_ENV)
    return Path(value) if value else None


def sweep_stopped() -> bool:
    """True once Ctrl-C stopped the sweep this process runs a job of."""
    stop_file = sweep_stop_file()
    return stop_file is not None and stop_file.exists()


class TrainingInterrupted(Exception):  # noqa: N818 - a requested stop, not an error
    """Training stopped on a signal after saving a checkpoint; `code` is the exit status."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(message)
        self.signum = signum
        self.code = 128 + signum  # the shell's convention for a process ended by a signal


class StopSignals:
    """`with StopSignals() as stop:` ... `if stop.signum is not None: save and leave`.

    Handlers are installed only in the main thread (Python delivers signals there) and the
    previous ones are restored on exit.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}  # the handlers to put back
        self._second: dict[int, Any] = {}  # the handlers a second signal finds

    @property
    def name(self) -> str:
        """The received signal's name ("SIGTERM", "SIGINT"), or "" before one."""
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def poll(self) -> int | None:
        """The signal to stop on: one received, or SIGINT once the sweep's stop file exists."""
        if self.signum is None and sweep_stopped():
            log.warning("the sweep was stopped (Ctrl-C): finishing the step and saving")
            self.signum = signal.SIGINT
        return self.signum

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum
        signal.signal(signum, self._second[signum])  # a second one acts as usual
        stop_file = sweep_stop_file()
        if signum == signal.SIGINT and stop_file is not None:
            stop_file.touch()  # the sweep's other jobs stop too, and no new one starts
        log.warning(
            "%s received: finishing the current step and saving a checkpoint (send it again "
            "to stop without saving)",
            signal.Signals(signum).name,
        )

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                previous = signal.getsignal(signum)
                previous = signal.SIG_DFL if previous is None else previous
                second = previous  # what a second signal does
                if signum == signal.SIGINT and previous is signal.SIG_IGN:
                    if sweep_stop_file() is None:
                        continue  # a background job or nohup: the terminal's Ctrl-C is not for it
                    second = signal.SIG_DFL  # a sweep's job: a second Ctrl-C ends it at once
                signal.signal(signum, self._handle)
                self._previous[signum], self._second[signum] = previous, second
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
        self._second.clear()


def pass_on(signum: int) -> None:
    """After a stop on `signum` (the checkpoint saved, the handlers found at the start put back),
    call the handler that was there before training if it is a Python function (not Python's
    default KeyboardInterrupt): submitit's for SIGUSR2 requeues the job and exits."""
    handler = signal.getsignal(signum)
    if callable(handler) and handler is not signal.default_int_handler:
        handler(signum, None)
