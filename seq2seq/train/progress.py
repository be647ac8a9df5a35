"""Training progress for a person: a progress bar on a terminal, plain lines in a log.

A tqdm bar redraws itself many times a second; written to a file or a pipe (nohup, a SLURM log,
`make train > log`) every frame stays in it. So the bar is drawn only when stderr is a terminal;
otherwise each report (every trainer.log_every steps) is one plain log line.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

from tqdm import tqdm

log = logging.getLogger(__name__)


class Progress:
    """Steps done out of `total`: a tqdm bar on a terminal `stream`, else report lines."""

    def __init__(self, total: int, initial: int, enabled: bool, stream: TextIO | None = None):
        """`enabled`: trainer.progress on the process that speaks for the job (rank 0)."""
        stream = stream if stream is not None else sys.stderr
        self.total, self.enabled = total, enabled
        terminal = enabled and stream.isatty()
        self.bar = (
            tqdm(total=total, initial=initial, file=stream, desc="train") if terminal else None
        )

    def step(self) -> None:
        """One optimizer step done."""
        if self.bar is not None:
            self.bar.update(1)

    def report(self, step: int, values: dict[str, str]) -> None:
        """The latest statistics: the bar's postfix, or one line `step N/total: k v, ...`."""
        if self.bar is not None:
            self.bar.set_postfix(values)
        elif self.enabled:
            shown = ", ".join(f"{name} {value}" for name, value in values.items())
            log.info("step %d/%d: %s", step, self.total, shown)

    def close(self) -> None:
        """Close the bar, when there is one."""
        if self.bar is not None:
            self.bar.close()
