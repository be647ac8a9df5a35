"""The machine-readable training log `<run dir>/train_log.jsonl`.

`StepLog` appends one JSON object a line (train steps, skipped steps, validations), flushed as
written. A checkpoint stores how many records had been written; resuming cuts the file back to
that many, so a resumed run's log equals that of a run that was never interrupted.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

LOG_NAME = "train_log.jsonl"


def _plain(value: Any) -> Any:
    """JSON has no NaN or infinity: non-finite floats are written as strings ("nan", "inf")."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def state_fields(state: object, names: tuple[str, ...]) -> dict[str, Any]:
    """The named fields of a run's state (a TrainState), for a record."""
    return {name: getattr(state, name) for name in names}


class StepLog:
    """`train_log.jsonl`: one JSON record a line, flushed as written."""

    def __init__(self, path: Path, keep_records: int) -> None:
        """Open `path` for appending after cutting it back to its first `keep_records` records
        (0 for a fresh run); a half-written last line (a killed process) is dropped too."""
        self.path = path
        self.records = self._cut(keep_records)
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()

    def _cut(self, keep: int) -> int:
        lines = self.path.read_text(encoding="utf-8").splitlines() if self.path.exists() else []
        kept = []
        for line in lines[:keep]:
            try:
                json.loads(line)
            except ValueError:
                break
            kept.append(line + "\n")
        if lines and len(kept) < keep:
            log.warning("%s: %d records, the checkpoint expected %d", self.path, len(kept), keep)
        if len(kept) != len(lines):
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.writelines(kept)
            os.replace(tmp, self.path)
        return len(kept)

    def write(self, record: dict[str, Any]) -> None:
        """Append `record` (numbers, strings) as one line."""
        line = json.dumps({k: _plain(v) for k, v in record.items()}, allow_nan=False)
        self._file.write(line + "\n")
        self._file.flush()
        self.records += 1

    def close(self) -> None:
        """Close the file."""
        self._file.close()


def read_step_log(path: Path) -> list[dict[str, Any]]:
    """The records of a `train_log.jsonl`."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
