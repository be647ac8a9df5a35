"""seq2seq-train: compose the training config with Hydra and run seq2seq.train.run.train.

A user error (seq2seq.errors.UserError) prints one `error: <Type>: <message>` line and exits 1;
in a Hydra multirun it marks that job failed and the sweep goes on. Ctrl-C or SIGTERM saves a
checkpoint and exits with the signal's status (seq2seq/train/interrupt.py).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import cast

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from seq2seq.cli.app import run_hydra
from seq2seq.config.schema import CONFIG_DIR, register_configs
from seq2seq.errors import UserError
from seq2seq.train.distributed import cleanup
from seq2seq.train.interrupt import TrainingInterrupted
from seq2seq.train.resume import merge_overrides
from seq2seq.train.run import train

log = logging.getLogger(__name__)

register_configs()


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="train")
def main(cfg: DictConfig) -> float:
    """Entry point of seq2seq-train; returns the first test split's BLEU (for sweeps)."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        overrides = list(HydraConfig.get().overrides.task)
        results = train(OmegaConf.to_object(cfg), run_dir, overrides)  # type: ignore[arg-type]
    except TrainingInterrupted as stop:
        log.warning("%s", stop)
        print(f"interrupted: {stop}", file=sys.stderr)
        sys.exit(stop.code)
    except UserError as err:
        log.error("%s: %s", type(err).__name__, err)
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            raise  # Hydra marks this job failed and runs the others of the sweep
        print(f"error: {type(err).__name__}: {err}", file=sys.stderr)
        sys.exit(1)
    finally:
        cleanup()
    bleu = next(iter(results.values()))["bleu"] if results else 0.0
    return float(cast(float, bleu))


# torchrun ranks other than 0 get no run directory, .hydra/ copy or log file from Hydra: the
# job's run directory is rank 0's (main broadcasts it), and rank 0 alone writes there.
WORKER_OVERRIDES = ["hydra.run.dir=.", "hydra.output_subdir=null", "hydra/job_logging=stdout"]


def cli() -> None:
    """seq2seq-train: `main` with WORKER_OVERRIDES added on torchrun ranks other than 0."""
    if int(os.environ.get("RANK", "0")) > 0:
        sys.argv = [sys.argv[0], *merge_overrides(sys.argv[1:], WORKER_OVERRIDES)]
    run_hydra(main)  # a bad override: one `error: ConfigError: ...` line, exit status 1


if __name__ == "__main__":
    cli()
