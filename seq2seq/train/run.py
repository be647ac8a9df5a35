"""A training run from a typed config: train(cfg, run_dir), which seq2seq-train calls.

train(cfg, run_dir): lock the run dir, check it is writable with room for checkpoints,
find a checkpoint to resume from and check it fits the config (train/resume.py), then
build_trainer(cfg, run_dir, resume).fit() (train/build.py, train/trainer.py), score best.pt
(and the averaged checkpoint) on the test splits, and write results.json, last and atomically:
a run directory with results.json holds a finished run, which trainer.skip_finished=true (the
sweeps) leaves alone. docs/RELIABILITY.md lists how every fault is handled.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Any

from seq2seq.config.checks import check_config
from seq2seq.config.schema import TrainConfig
from seq2seq.data.prepared import sha256_file
from seq2seq.errors import UserError
from seq2seq.kernels import resolve_device
from seq2seq.train.build import Process, build_trainer, checkpoint_bytes
from seq2seq.train.checkpoint import (
    average_last,
    load_checkpoint,
    remove_partial_writes,
)
from seq2seq.train.distributed import broadcast, init_distributed
from seq2seq.train.finetune import adopt, check_overrides, load_source
from seq2seq.train.hparams import write_hparams
from seq2seq.train.machine import describe
from seq2seq.train.resume import (
    Resume,
    check_compatible,
    find_checkpoint,
    record_overrides,
)
from seq2seq.train.rundir import RunLock, check_free_space, check_writable
from seq2seq.train.testing import (
    choose_checkpoint,
    completed,
    score_checkpoint,
    validate_checkpoint,
)
from seq2seq.train.trainer import Trainer

log = logging.getLogger(__name__)


RESULTS_NAME = "results.json"


class DistributedSetupError(UserError, RuntimeError):
    """Rank 0 could not set the run up; the other ranks stop with its message."""


class ResultsError(UserError, RuntimeError):
    """A finished run's results.json cannot be read."""


def is_finished(run_dir: Path) -> bool:
    """The run in run_dir finished: it wrote results.json, the last thing a run writes."""
    return (run_dir / RESULTS_NAME).is_file()


def finished_results(run_dir: Path) -> dict[str, dict[str, object]]:
    """A finished run's test scores (from its results.json), for trainer.skip_finished."""
    path = run_dir / RESULTS_NAME
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
        scores: dict[str, dict[str, object]] = summary["test"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ResultsError(
            f"{path}: the run looks finished but its results cannot be read ({err}); delete the "
            "file to test the run again (it resumes from its checkpoints)"
        ) from err
    log.info(
        "%s: already finished (%s holds its test scores): skipped, not trained again, its "
        "files left as they are (trainer.skip_finished=true)",
        run_dir,
        RESULTS_NAME,
    )
    return scores


def prepare_run(cfg: TrainConfig, run_dir: Path) -> Resume | None:
    """Checks before any data is read: the run dir is writable with room for checkpoints, and
    a checkpoint to resume from (trainer.resume) fits the config. Returns that checkpoint."""
    ckpt_dir = run_dir / "checkpoints"
    check_writable(ckpt_dir)
    remove_partial_writes(ckpt_dir)  # a killed run's half-written file; we hold the lock
    check_free_space(ckpt_dir, checkpoint_bytes(cfg), cfg.trainer.keep_last + 3)
    resume = find_checkpoint(cfg.trainer.resume, ckpt_dir)
    if resume is not None:
        check_compatible(resume[1]["config"], cfg, resume[0])
    return resume


def train(
    cfg: TrainConfig, run_dir: Path, overrides: list[str] | None = None
) -> dict[str, dict[str, object]]:
    """Train (or resume), test, and write results.json into run_dir; returns the test scores
    of best.pt. Holds the run dir's lock throughout. `overrides` (the command line's) are kept
    for `make resume` once the checks have passed. Under torchrun every rank calls it; they
    all use rank 0's run_dir (the ranks' clocks, and so Hydra's folder names, may differ)."""
    check_config(cfg)
    start = time.monotonic()
    process = init_distributed(resolve_device(cfg.trainer.device))  # the one join of the job
    run_dir = Path(broadcast(str(run_dir)))
    if cfg.trainer.skip_finished and broadcast(is_finished(run_dir)):  # rank 0's answer
        return finished_results(run_dir) if process[0].is_main else {}
    if not process[0].is_main:
        logging.getLogger("seq2seq").setLevel(logging.WARNING)  # rank 0 speaks for the job
        return train_worker(cfg, run_dir, process)
    with contextlib.ExitStack() as stack:
        try:  # the lock and the run-dir checks are rank 0's; the others wait for the result
            stack.enter_context(RunLock(run_dir))
            source = None
            if cfg.trainer.init_from:  # its model settings, before comparing with a checkpoint
                source = load_source(cfg.trainer.init_from)
                check_overrides(cfg, source, overrides or [])
                adopt(cfg, source)
            resume = prepare_run(cfg, run_dir)
        except Exception as err:
            broadcast((None, f"{type(err).__name__} on rank 0: {err}"))
            raise
        broadcast((str(resume[0]) if resume else None, None))
        if overrides is not None:
            record_overrides(run_dir, overrides)
        if source is not None and resume is None:
            log.info("fine-tuning from %s (sha256 %s)", source.path, sha256_file(source.path))
        trainer = build_trainer(cfg, run_dir, resume, source, process)
        try:
            summary = fit_and_test(trainer)
        finally:
            trainer.close()
    summary["resumed_from"] = str(resume[0]) if resume else None
    if source is not None:
        summary["init_from"] = {"path": str(source.path), "sha256": sha256_file(source.path)}
    summary["minutes"] = (time.monotonic() - start) / 60
    summary["machine"] = describe()  # the times and speeds above hold for this CPU
    write_results(cfg, run_dir, summary)
    print_summary(trainer.ckpt_dir, run_dir / "tb", summary)
    test: dict[str, dict[str, object]] = summary["test"]
    return test


def print_summary(ckpt_dir: Path, tb_dir: Path, summary: dict[str, Any]) -> None:
    """Where the run's files are, its test BLEU, and the run's model (train/testing.py)."""
    print(f"checkpoints: {ckpt_dir}\ntensorboard: tensorboard --logdir {tb_dir}")
    for tag, results in (("", summary["test"]), (" averaged", summary.get("test_average", {}))):
        for name, scores in results.items():
            print(f"test BLEU ({name}{tag}): {scores['bleu']:.2f}")
    if "chosen" in summary:
        chosen = summary["chosen"]
        print(f"the run's model ({chosen['rule']}): {chosen['checkpoint']}")


def write_results(cfg: TrainConfig, run_dir: Path, summary: dict[str, Any]) -> None:
    """results.json, written atomically (a results.json is a whole one: it marks a finished
    run), and the run's settings and scores in TensorBoard's HParams view."""
    write_hparams(run_dir / "tb", cfg, summary)
    tmp = run_dir / f".{RESULTS_NAME}.tmp"
    tmp.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    tmp.replace(run_dir / RESULTS_NAME)


def train_worker(cfg: TrainConfig, run_dir: Path, process: Process) -> dict[str, dict[str, object]]:
    """Ranks other than 0: resume from the checkpoint rank 0 chose (a path on the shared run
    dir), train in step with rank 0, and leave testing to it."""
    path, error = broadcast(None)
    if error is not None:
        raise DistributedSetupError(error)
    resume = (Path(path), load_checkpoint(path)) if path is not None else None
    trainer = build_trainer(cfg, run_dir, resume, process=process)
    try:
        trainer.fit()
    finally:
        trainer.close()
    return {}


def fit_and_test(trainer: Trainer) -> dict[str, Any]:
    """Train, then score best.pt (and the average of the last checkpoints) on the test splits;
    returns the summary for results.json (times and speeds are of this invocation)."""
    s, start_tokens, fit_start = trainer.state, trainer.state.tokens, time.monotonic()
    trainer.fit()
    fit_seconds = max(time.monotonic() - fit_start, 1e-9)
    test, length = score_checkpoint(trainer, trainer.ckpt_dir / "best.pt")
    summary: dict[str, Any] = {"test": test}
    if length is not None:  # a length experiment: every test split by source tokens
        summary["length"] = length
    if trainer.cfg.trainer.average_last:
        average, sources = average_last(trainer.ckpt_dir, trainer.cfg.trainer.average_last)
        summary["valid_average"] = validate_checkpoint(trainer, average)
        done = completed(s, trainer.cfg.trainer)
        summary["chosen"] = choose_checkpoint(s, summary["valid_average"], done)
        summary["test_average"], length = score_checkpoint(trainer, average, ".average")
        summary["averaged"] = [p.name for p in sources]
        if length is not None:
            summary["length_average"] = length
    return {
        **summary,
        "best_valid_bleu": s.best_valid.get("bleu"),  # of best.pt's validation
        "best_valid": {"metric": s.best_metric, "step": s.best_step, **s.best_valid},
        "steps": s.step,
        "skipped_steps": s.skipped_steps,
        "train_minutes": fit_seconds / 60,
        "params": trainer.model.num_params(),
        "untrained_positions": trainer.untrained,
        "precision": trainer.precision.value,
        "precision_s_per_step": trainer.precision_times,
        "fp32_products": trainer.products,  # "" where no choice was made
        "fp32_products_s": trainer.products_times,
        "train_tokens_per_s": (s.tokens - start_tokens) / fit_seconds,
    }
