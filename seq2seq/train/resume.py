"""Resuming a run: which checkpoint to resume from, whether the config still describes the same
run, and the overrides a run is restarted with (`make resume RUN=<dir>`, `resume_cli.py`).

A run resumes when it is started again on its own run directory (`hydra.run.dir=<dir>`, which
`make resume` does with the run's saved overrides) and `trainer.resume=auto` (the default) finds a
checkpoint there: `last.pt`, or the newest loadable `step_N.pt` when `last.pt` is unreadable.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf

from seq2seq.config.schema import Schedule, TrainConfig, config_from_dict, resolve_path
from seq2seq.errors import UserError
from seq2seq.train.checkpoint import CheckpointError, load_checkpoint, step_checkpoints

log = logging.getLogger(__name__)

# Settings that may change between a run and its resumption: they stop the run earlier or later,
# change what is printed, where it runs, or how the test splits are decoded, but not the training
# trajectory itself. Every other difference is refused.
SAFE_KEYS = frozenset(
    {
        "name",
        "data.root",  # the data itself is compared by its manifest (Prepared.fingerprint)
        "data.prepared",
        "data.cache_dir",
        "data.workers",
        "data.test",
        "tokenizer.cache_dir",
        "trainer.max_steps",
        "trainer.max_epochs",
        "trainer.max_minutes",
        "trainer.valid_every",
        "trainer.log_every",
        "trainer.progress",
        "trainer.device",
        "trainer.threads",
        "trainer.resume",
        "trainer.skip_finished",
        "trainer.keep_last",
        "trainer.patience",
        "trainer.max_bad_steps",
        "trainer.average_last",
    }
)
SAFE_PREFIXES = ("decode.",)
RESUMABLE = ("model", "optimizer", "scheduler", "scaler", "train_state", "rng", "config")
# a checkpoint to resume from: its path and its contents
Resume = tuple[Path, dict[str, Any]]


class ResumeError(UserError, RuntimeError):
    """The run cannot resume: no usable checkpoint, or a config or data that changed."""


# --------------------------------------------------------------------------- which checkpoint


def find_checkpoint(mode: str, ckpt_dir: Path) -> Resume | None:
    """The checkpoint to resume from and its contents, or None to start afresh.

    mode is trainer.resume: "auto" (last.pt, falling back to the newest loadable step_N.pt with a
    warning naming each bad file), "never", or the path of a checkpoint.
    """
    candidates = [ckpt_dir / "last.pt", *reversed(step_checkpoints(ckpt_dir))]
    present = [p for p in candidates if p.exists()]
    if mode == "never":
        if present:
            raise ResumeError(
                f"{ckpt_dir} already holds checkpoints ({', '.join(p.name for p in present)}) "
                "and trainer.resume=never: choose another hydra.run.dir, or resume the run with "
                "trainer.resume=auto"
            )
        return None
    if mode != "auto":
        path = resolve_path(mode)
        return path, _resumable(path, load_checkpoint(path))
    problems = []
    for path in present:
        try:
            return path, _resumable(path, load_checkpoint(path))
        except CheckpointError as err:
            log.warning("cannot resume: %s; trying an earlier checkpoint", err)
            problems.append(f"{path.name}: {err}")
    if problems:
        raise ResumeError(
            f"no checkpoint in {ckpt_dir} can be resumed from: " + "; ".join(problems) + ". "
            "Start a new run in another hydra.run.dir"
        )
    return None


def _resumable(path: Path, state: dict[str, Any]) -> dict[str, Any]:
    missing = [key for key in RESUMABLE if key not in state]
    if missing:
        raise CheckpointError(
            f"{path}: has no {', '.join(missing)} (an averaged or inference-only checkpoint); "
            "training cannot resume from it"
        )
    return state


# --------------------------------------------------------------------------- same run?


def flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; lists and None stay whole values."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _plain(cfg: TrainConfig) -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True)  # type: ignore[return-value]


def config_changes(saved: dict[str, Any], cfg: TrainConfig) -> list[tuple[str, Any, Any]]:
    """(key, checkpoint value, current value) for every setting that would change the run."""
    before = flatten(_plain(config_from_dict(saved)))  # fills keys added since with defaults
    after = flatten(_plain(cfg))
    missing = object()
    changes = []
    safe = SAFE_KEYS - _schedule_keys(cfg)
    for key in sorted(before.keys() | after.keys()):
        old, new = before.get(key, missing), after.get(key, missing)
        if old != new and key not in safe and not key.startswith(SAFE_PREFIXES):
            changes.append((key, None if old is missing else old, None if new is missing else new))
    return changes


def _schedule_keys(cfg: TrainConfig) -> frozenset[str]:
    """The otherwise safe keys that set the learning-rate schedule: trainer.max_steps where a
    cosine or linear decay ends there (optim.decay_steps 0)."""
    decays = cfg.optim.schedule != Schedule.inverse_sqrt and cfg.optim.decay_steps == 0
    return frozenset({"trainer.max_steps"}) if decays else frozenset()


def check_compatible(saved: dict[str, Any], cfg: TrainConfig, source: Path) -> None:
    """Refuse to resume from `source` when the config changed in a way that changes the run."""
    try:
        changes = config_changes(saved, cfg)
    except Exception as err:  # OmegaConf raises several types for a bad config
        raise ResumeError(
            f"cannot resume from {source}: its config does not fit this version's schema "
            f"({type(err).__name__}: {str(err).splitlines()[0]}); start a new run"
        ) from err
    if changes:
        scheduled = _schedule_keys(cfg)
        safe = ", ".join(sorted(SAFE_KEYS - scheduled))
        why = " (not trainer.max_steps: optim.schedule decays to optim.min_lr there)"
        listed = "; ".join(
            f"{key}: {old!r} in the checkpoint, {new!r} now" for key, old, new in changes
        )
        raise ResumeError(
            f"cannot resume from {source}: the config differs in settings that would change the "
            f"run ({listed}). Restore them, or start a new run in another hydra.run.dir. "
            f"Settings that may change on resume: {safe}, decode.*{why if scheduled else ''}"
        )


# --------------------------------------------------------------------------- overrides


OVERRIDES_NAME = "overrides.yaml"


def record_overrides(run_dir: Path, overrides: list[str]) -> None:
    """Keep the overrides of a start that passed the resume checks in <run dir>/overrides.yaml.
    (Hydra rewrites .hydra/overrides.yaml on every start, refused ones included.)"""
    text = "# the overrides of this run's last accepted start; make resume RUN=<dir> reuses them\n"
    path = run_dir / OVERRIDES_NAME
    tmp = path.with_name(f".{OVERRIDES_NAME}.tmp")
    tmp.write_text(text + yaml.safe_dump(list(overrides)), encoding="utf-8")
    tmp.replace(path)


def saved_overrides(run_dir: Path) -> list[str]:
    """The command-line overrides the run in `run_dir` was (last) started with."""
    for path in (run_dir / OVERRIDES_NAME, run_dir / ".hydra" / "overrides.yaml"):
        if path.is_file():
            return [str(o) for o in yaml.safe_load(path.read_text(encoding="utf-8")) or []]
    raise ResumeError(
        f"{run_dir / OVERRIDES_NAME} not found: {run_dir} is not the folder of a seq2seq-train run"
    )


def merge_overrides(saved: list[str], extra: list[str]) -> list[str]:
    """`saved` without the keys that `extra` sets again, then `extra`."""

    def key(override: str) -> str:
        return override.split("=", 1)[0].lstrip("+~")

    given = {key(o) for o in extra}
    return [o for o in saved if key(o) not in given] + extra
