"""Graceful stop: SIGTERM, Ctrl-C (SIGINT) or SIGUSR2 asks the training loop to finish its
current step, save a checkpoint and exit; a second signal of the same kind acts as usual (kills
or raises KeyboardInterrupt) for a user who does not want to wait.

SIGUSR2 is what SLURM sends a job ahead of its time limit or on preemption when submitit asks it to
(`--signal=USR2@<signal_delay_s>`, hydra/launcher=slurm). submitit's own handler requeues the job
and exits at once; training takes the signal first, saves, and then `pass_on` calls that handler,
so the requeued job resumes from the checkpoint of the step it stopped at.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType, TracebackType
from typing import Any

log = logging.getLogger(__name__)

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)


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
        self._previous: dict[int, Any] = {}

    @property
    def name(self) -> str:
        """The received signal's name ("SIGTERM", "SIGINT"), or "" before one."""
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum
        signal.signal(signum, self._previous[signum])  # a second one acts as usual
        log.warning(
            "%s received: finishing the current step and saving a checkpoint (send it again "
            "to stop without saving)",
            signal.Signals(signum).name,
        )

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:
                if signum == signal.SIGINT and signal.getsignal(signum) is signal.SIG_IGN:
                    continue  # a background job or nohup: the terminal's Ctrl-C is not for it
                previous = signal.signal(signum, self._handle)
                self._previous[signum] = signal.SIG_DFL if previous is None else previous
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


def pass_on(signum: int) -> None:
    """After a stop on `signum` (the checkpoint saved, the handlers found at the start put back),
    call the handler that was there before training if it is a Python function (not Python's
    default KeyboardInterrupt): submitit's for SIGUSR2 requeues the job and exits."""
    handler = signal.getsignal(signum)
    if callable(handler) and handler is not signal.default_int_handler:
        handler(signum, None)
