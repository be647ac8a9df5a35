"""The `make resume RUN=<dir>` entry point: seq2seq-train again on a run directory, with the
overrides the run was started with (plus any given), which resumes from its last checkpoint.

    python -m seq2seq.cli.resume RUN_DIR [key=value ...]

Which checkpoint, and whether the config still fits it, is `resume.py`'s to decide, inside
seq2seq-train. A run of a sweep resumes too, even a finished one (its experiment's
trainer.skip_finished is turned off): `make resume RUN=multirun/pos_sweep/rope_seed1
ARGS="trainer.max_steps=1200"` trains it further. A user error prints one
`error: <Type>: <message>` line and exits 1, as seq2seq-train does.
"""

from __future__ import annotations

import sys
from pathlib import Path

from seq2seq.cli import train
from seq2seq.cli.app import fail
from seq2seq.errors import UserError
from seq2seq.train.resume import merge_overrides, saved_overrides

USAGE = "usage: python -m seq2seq.cli.resume RUN_DIR [key=value ...]  (make resume RUN=...)"


def main(argv: list[str] | None = None) -> None:
    """Train again in RUN_DIR (argv[0]) with its saved overrides and the given ones."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0].startswith("-"):
        sys.exit(USAGE)
    run_dir = Path(args[0])
    try:
        overrides = merge_overrides(saved_overrides(run_dir), ["trainer.skip_finished=false"])
        overrides = merge_overrides(overrides, args[1:])
    except (UserError, OSError) as err:  # OSError: an unreadable overrides file
        fail(err)
    quoted = str(run_dir).replace("\\", "\\\\").replace("'", "\\'")
    sys.argv = [sys.argv[0], *overrides, f"hydra.run.dir='{quoted}'"]
    train.cli()


if __name__ == "__main__":
    main()
