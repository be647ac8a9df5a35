"""seq2seq-average: one checkpoint whose weights are the mean of several of one run's (Vaswani
et al. 2017 average the last ones; `trainer.average_last` does it at the end of training).

    seq2seq-average run=outputs/<run> last=20 out=avg20.pt
    seq2seq-average "ckpts=[a.pt,b.pt,c.pt]" out=avg.pt

The output is a normal checkpoint (model, config, tokenizers) for seq2seq-translate,
seq2seq-evaluate and seq2seq-export; it has no optimizer state, so training cannot resume from it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from seq2seq.cli.app import entry_point
from seq2seq.config.commands import AverageConfig, register_configs
from seq2seq.errors import ConfigError
from seq2seq.train.checkpoint import (
    CheckpointError,
    average_checkpoints,
    newest_checkpoints,
    save_checkpoint,
)

log = logging.getLogger(__name__)


def inputs(cfg: AverageConfig) -> list[Path]:
    """The checkpoints to average: `ckpts`, or the newest `last` of `run` (one of the two)."""
    if (cfg.run is None) == (not cfg.ckpts):
        raise ConfigError("seq2seq-average takes run=DIR (with last=N) or ckpts=[a.pt,...]")
    if cfg.run is not None:
        return newest_checkpoints(Path(cfg.run), cfg.last)
    return [Path(p) for p in cfg.ckpts]


def average(cfg: AverageConfig) -> Path:
    """Write the average of the chosen checkpoints to cfg.out; returns its path."""
    paths, out = inputs(cfg), Path(cfg.out)
    if out.resolve() in {p.resolve() for p in paths}:
        raise CheckpointError(f"{out}: the output would overwrite one of the checkpoints averaged")
    save_checkpoint(average_checkpoints(paths), out)
    log.info("averaged %d checkpoints (%s) into %s", len(paths), ", ".join(map(str, paths)), out)
    return out


register_configs()
main = entry_point("average", average)  # seq2seq-average; user errors exit 1 with one line


if __name__ == "__main__":
    main()
