"""seq2seq-train: compose the training config with Hydra and run seq2seq.train.run.train.

A user error (seq2seq.errors.UserError) prints one `error: <Type>: <message>` line and exits 1;
in a Hydra multirun (`seq2seq-train -m`, on any launcher) it marks that job failed, the other
jobs go on, and the sweep then ends with one `error:` line naming the first failed run's
directory and exit status 1. Ctrl-C, SIGTERM or SIGUSR2 saves a checkpoint and exits with the
signal's status (seq2seq/train/interrupt.py), after handing the signal to the handler that was
there before training (submitit's requeues a SLURM job on SIGUSR2).

Ctrl-C on a sweep (`sweep_stop`): every running job finishes its step and saves last.pt, the jobs
not started yet do not start, and the sweep exits with status 130 once the running ones are
done; the same command then resumes them. A second Ctrl-C ends the jobs at once.

With trainer.skip_finished=true (the sweep experiments), a job whose run directory holds
results.json returns at once (train/run.py), and `hydra_output_subdir` below keeps Hydra from
rewriting its .hydra/: a finished run's folder stays as it was, its log file aside.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from seq2seq.cli.app import run_hydra
from seq2seq.config.commands import register_configs
from seq2seq.config.schema import CONFIG_DIR
from seq2seq.errors import UserError
from seq2seq.train.distributed import cleanup
from seq2seq.train.interrupt import (
    SWEEP_STOP_ENV,
    TrainingInterrupted,
    pass_on,
    sweep_stop_file,
    sweep_stopped,
)
from seq2seq.train.resume import merge_overrides
from seq2seq.train.run import is_finished, train

log = logging.getLogger(__name__)


class SweepJobError(UserError, RuntimeError):
    """A job of a multirun stopped on a user error; the message names its run directory."""


def hydra_output_subdir(skip_finished: bool, output_dir: str) -> str | None:
    """hydra.output_subdir (train.yaml): `.hydra`, where Hydra writes the job's composed config,
    its own and the overrides at every start, or None (Hydra writes none) for a finished run
    that trainer.skip_finished skips, so that its .hydra/ still holds the config it ran with."""
    return None if skip_finished and is_finished(Path(output_dir)) else ".hydra"


register_configs()
OmegaConf.register_new_resolver("seq2seq.hydra_output_subdir", hydra_output_subdir, replace=True)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="train")
def main(cfg: DictConfig) -> float:
    """Entry point of seq2seq-train; returns the first test split's BLEU (for sweeps)."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    if sweep_stopped():
        log.warning("%s: not started: the sweep was stopped (Ctrl-C)", run_dir)
        return math.nan
    try:
        overrides = list(HydraConfig.get().overrides.task)
        results = train(OmegaConf.to_object(cfg), run_dir, overrides)  # type: ignore[arg-type]
    except TrainingInterrupted as stop:
        log.warning("%s", stop)
        if stop.signum == signal.SIGINT and sweep_stop_file() is not None:
            return math.nan  # a sweep's Ctrl-C: the job ends, the launcher waits for the others
        print(f"interrupted: {stop}", file=sys.stderr)
        pass_on(stop.signum)  # under submitit, SIGUSR2's handler requeues the job (and exits)
        sys.exit(stop.code)
    except UserError as err:
        log.error("%s: %s", type(err).__name__, err)
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            # Hydra marks this job failed, runs the others of the sweep, then raises the first
            # failure (cli() prints it)
            raise SweepJobError(f"{run_dir}: {type(err).__name__}: {err}") from err
        print(f"error: {type(err).__name__}: {err}", file=sys.stderr)
        sys.exit(1)
    finally:
        cleanup()
    bleu = next(iter(results.values()))["bleu"] if results else 0.0
    return float(cast(float, bleu))


# torchrun ranks other than 0 get no run directory, .hydra/ copy or log file from Hydra: the
# job's run directory is rank 0's (main broadcasts it), and rank 0 alone writes there.
WORKER_OVERRIDES = ["hydra.run.dir=.", "hydra.output_subdir=null", "hydra/job_logging=stdout"]


@contextlib.contextmanager
def sweep_stop() -> Iterator[Path]:
    """Around a multirun's launch: SIGINT ignored here, and so in the launcher's worker processes
    (an idle one would die of it, and the launcher would kill the busy ones mid-save), and a
    stop file named in the environment that the sweep's jobs share (train/interrupt.py)."""
    stop_file = Path(tempfile.gettempdir()) / f"seq2seq-sweep-{os.getpid()}-{uuid.uuid4().hex}"
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ[SWEEP_STOP_ENV] = str(stop_file)
    try:
        yield stop_file
    finally:
        os.environ.pop(SWEEP_STOP_ENV, None)
        signal.signal(signal.SIGINT, previous)


def is_local_multirun(args: list[str]) -> bool:
    """Whether the command line asks Hydra for a multirun whose jobs run on this machine (the
    basic, joblib or submitit_local launcher): Ctrl-C here can stop them (sweep_stop). A
    cluster's jobs (hydra/launcher=slurm) go on after Ctrl-C ends the submitting process."""
    launchers = [a.split("=", 1)[1] for a in args if a.startswith("hydra/launcher=")]
    local = launchers[-1] in ("basic", "joblib", "submitit_local") if launchers else True
    return local and any(a in ("-m", "--multirun", "hydra.mode=MULTIRUN") for a in args)


def cli() -> None:
    """seq2seq-train: `main` with WORKER_OVERRIDES added on torchrun ranks other than 0."""
    if int(os.environ.get("RANK", "0")) > 0:
        sys.argv = [sys.argv[0], *merge_overrides(sys.argv[1:], WORKER_OVERRIDES)]
    multirun = is_local_multirun(sys.argv[1:]) and SWEEP_STOP_ENV not in os.environ
    stopped = False
    with sweep_stop() if multirun else contextlib.nullcontext() as stop_file:
        try:
            run_hydra(main)  # a bad override: one `error: ConfigError: ...` line, exit status 1
        except SweepJobError as err:  # raised by Hydra's sweeper once every job of the sweep ran
            print(f"error: a run of the sweep failed: {err}", file=sys.stderr)
            sys.exit(1)
        finally:
            if stop_file is not None and stop_file.exists():
                stop_file.unlink()
                stopped = True
    if stopped:
        print(
            "interrupted: Ctrl-C stopped the sweep: its running jobs saved their last.pt and the "
            "others did not start; the same command resumes it",
            file=sys.stderr,
        )
        sys.exit(128 + signal.SIGINT)


if __name__ == "__main__":
    cli()
