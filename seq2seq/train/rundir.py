"""The run directory: one training process at a time, writable, with room for checkpoints,
before training starts (the training log written there is `steplog.py`'s).

- `RunLock` holds an exclusive `fcntl.flock` on `<run dir>/train.lock` for the whole run; a second
  run on the same directory fails at once, naming the directory and the holder's pid. The kernel
  drops the lock when the process dies, even by SIGKILL, so a stale lock file is harmless.
- `check_writable` and `check_free_space` fail before any data is read or step is trained.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import tempfile
from pathlib import Path
from types import TracebackType
from typing import IO

from seq2seq.errors import UserError

log = logging.getLogger(__name__)

LOCK_NAME = "train.lock"


class RunDirError(UserError, RuntimeError):
    """The run directory cannot be used: in use, not writable, or out of space."""


class RunLock:
    """`with RunLock(run_dir):` holds the directory's lock, or raises RunDirError at once."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.path = run_dir / LOCK_NAME
        self._file: IO[str] | None = None

    def __enter__(self) -> RunLock:
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            handle = open(self.path, "a+", encoding="utf-8")  # held until __exit__
        except OSError as err:
            raise RunDirError(f"{self.run_dir}: cannot create the run directory ({err})") from err
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            handle.seek(0)
            holder = handle.read().strip() or "unknown"
            handle.close()
            if err.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise RunDirError(f"{self.path}: cannot lock the run directory ({err})") from err
            raise RunDirError(
                f"{self.run_dir} is in use by another training run (pid {holder}); wait for it "
                "to finish, stop it, or choose another directory with hydra.run.dir=..."
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
        self._file = handle
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._file is not None:
            self._file.close()  # closing the last descriptor releases the flock
            self._file = None


def check_writable(folder: Path) -> None:
    """Create `folder` and write, fsync and delete a probe file there, or raise RunDirError."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".probe-") as probe:
            probe.write(b"\0" * 4096)
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as err:
        raise RunDirError(
            f"{folder}: cannot write checkpoints there ({err.strerror or err}); make it "
            "writable or choose another directory with hydra.run.dir=..."
        ) from err


def check_free_space(folder: Path, checkpoint_bytes: int, keep: int) -> None:
    """Refuse to start when `folder` cannot hold two checkpoints (the one being written and the
    previous one); warn when it cannot hold the `keep` checkpoints a run accumulates."""
    free = shutil.disk_usage(folder).free

    def mib(n: int) -> str:
        return f"{n / 2**20:.1f} MiB"

    if free < 2 * checkpoint_bytes:
        raise RunDirError(
            f"{folder}: only {mib(free)} free, but a checkpoint takes about "
            f"{mib(checkpoint_bytes)} and saving needs room for two; free space or choose "
            "another directory with hydra.run.dir=..."
        )
    if free < keep * checkpoint_bytes:
        log.warning(
            "%s: %s free; the %d checkpoints this run keeps need about %s",
            folder,
            mib(free),
            keep,
            mib(keep * checkpoint_bytes),
        )
