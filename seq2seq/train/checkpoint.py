"""Checkpoints: atomic writes, safe loads, rotation and averaging, and the state a training
checkpoint carries besides tensors (random-generator states, a fingerprint of the data).

A checkpoint is a plain dict of tensors, numbers, strings and bytes. It is written to a temporary
file in the same folder, fsynced, then renamed over the target, so a crash never leaves a half
written `last.pt`. It is read with `torch.load(weights_only=True)`, which refuses to unpickle
arbitrary objects.
"""

from __future__ import annotations

import hashlib
import logging
import os
import random
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from seq2seq.errors import UserError

log = logging.getLogger(__name__)
STEP_FILE = re.compile(r"^step_(\d+)\.pt$")


class CheckpointError(UserError, RuntimeError):
    """A checkpoint that is missing, truncated, corrupt or unsafe; the message names the file."""


def remove_partial_writes(folder: Path) -> list[Path]:
    """Delete the temporary files of checkpoint writes that never finished (a process killed
    mid-write leaves one, as large as a checkpoint); nothing ever reads them. Call it only while
    holding the run directory's lock, so that no other process is writing there."""
    partial = sorted(folder.glob(".*.pt.*.tmp")) if folder.is_dir() else []
    for path in partial:
        path.unlink(missing_ok=True)
        log.warning("removed %s, a checkpoint write that never finished", path)
    return partial


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """Write `state` to `path` atomically: temporary file, fsync, rename, fsync of the folder.

    A failed write (disk full, read-only folder, ...) removes the temporary file, leaves any
    earlier `path` untouched and raises a CheckpointError naming the file and the folder.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:
        raise _write_error(path, err) from err
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(err, OSError):
            raise _write_error(path, err) from err
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _write_error(path: Path, err: OSError) -> CheckpointError:
    kept = f"the previous {path.name} is intact" if path.exists() else f"no {path.name} was written"
    return CheckpointError(
        f"{path}: cannot write the checkpoint ({err.strerror or err}); {kept}. Free space in "
        f"{path.parent} or make it writable, then resume the run"
    )


def load_checkpoint(path: Path | str, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint safely; any failure becomes a CheckpointError that names the file."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint; pass the best.pt or last.pt of a run")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # torch raises many types for bad files
        raise CheckpointError(
            f"{path}: cannot be loaded safely ({type(err).__name__}: {_detail(err)}). It is "
            "truncated, corrupt, or holds pickled objects other than tensors and plain values "
            "(refused: unpickling them could run arbitrary code); use an earlier checkpoint of "
            "the run"
        ) from err
    if not isinstance(state, dict) or "model" not in state:
        raise CheckpointError(f"{path}: not a seq2seq checkpoint (no 'model' entry)")
    return state


def _detail(err: Exception) -> str:
    """The useful part of torch's error: its unpickler's complaint, else the first line (never
    torch's advice to retry with weights_only=False)."""
    text = str(err)
    marker = "WeightsUnpickler error:"
    if marker in text:
        return text[text.index(marker) :].splitlines()[0][:200]
    return text.splitlines()[0][:200] if text else "no detail"


def load_model_state(model: torch.nn.Module, state: dict[str, torch.Tensor], path: Path) -> None:
    """model.load_state_dict, with a CheckpointError naming the file when the weights don't fit."""
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        raise CheckpointError(
            f"{path}: its weights do not fit the model its config and vocabulary describe: "
            f"{str(err)[:300]}"
        ) from err


def step_checkpoints(folder: Path) -> list[Path]:
    """The periodic checkpoints step_N.pt in `folder`, oldest first."""
    found = [
        (int(m.group(1)), p) for p in folder.glob("step_*.pt") if (m := STEP_FILE.match(p.name))
    ]
    return [p for _, p in sorted(found)]


def newest_checkpoints(run: Path, n: int) -> list[Path]:
    """The newest `n` step checkpoints of a run folder (or of its checkpoints/ folder itself),
    oldest first; a CheckpointError where it has fewer."""
    if n < 1:
        raise CheckpointError(f"the number of checkpoints to average must be at least 1, got {n}")
    folder = run / "checkpoints" if (run / "checkpoints").is_dir() else run
    if not folder.is_dir():
        raise CheckpointError(
            f"{run}: no such run folder (give a run's folder or its checkpoints/)"
        )
    found = step_checkpoints(folder)
    if len(found) < n:
        raise CheckpointError(
            f"{folder}: has {len(found)} step_N.pt checkpoints, fewer than the {n} asked for"
        )
    return found[-n:]


def rotate_checkpoints(folder: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` step_N.pt files (best.pt and last.pt stay)."""
    for path in step_checkpoints(folder)[: max(0, len(step_checkpoints(folder)) - keep_last)]:
        path.unlink(missing_ok=True)


def average_state_dicts(paths: list[Path]) -> dict[str, torch.Tensor]:
    """Element-wise mean of the models in `paths` (Vaswani et al. 2017 average the last ones).

    Floating-point tensors are averaged in float64 and cast back; integer buffers are taken from
    the first checkpoint. Checkpoints whose parameter names or shapes differ are refused. One
    checkpoint is in memory at a time, besides the running sum.
    """
    return _average(paths)[0]


def average_checkpoints(paths: list[Path]) -> dict[str, Any]:
    """A checkpoint whose model is the average of `paths`; config, tokenizers and counters come
    from the last of them. Optimizer, scheduler and RNG states are left out (they belong to one
    run position), so the result serves translation and evaluation, not resuming."""
    model, last = _average(paths)
    keep = ("config", "tokenizers", "train_state")
    state = {key: last[key] for key in keep if key in last}
    return {**state, "model": model, "averaged_from": [str(p) for p in paths]}


def average_last(folder: Path, n: int) -> tuple[Path, list[Path]]:
    """Average the last `n` step checkpoints of `folder` into `folder`/average.pt (trainer.
    average_last); returns its path and the checkpoints averaged."""
    sources = step_checkpoints(folder)[-n:]
    if len(sources) < n:
        log.warning(
            "trainer.average_last=%d but only %d step checkpoints to average", n, len(sources)
        )
    path = folder / "average.pt"
    save_checkpoint(average_checkpoints(sources), path)
    log.info("averaged %s into %s", ", ".join(p.name for p in sources), path)
    return path, sources


def _average(paths: list[Path]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The mean model of `paths` and the last checkpoint (without its model)."""
    if not paths:
        raise CheckpointError("no checkpoints to average")
    state = load_checkpoint(paths[0])
    first, tokenizers = state.pop("model"), state.get("tokenizers")
    total = {k: v.double() for k, v in first.items() if v.is_floating_point()}
    for path in paths[1:]:
        state = load_checkpoint(path)
        model = state.pop("model")
        if model.keys() != first.keys():
            raise CheckpointError(f"{path}: its parameters differ from those of {paths[0]}")
        if state.get("tokenizers") != tokenizers:
            raise CheckpointError(f"{path}: its vocabulary differs from that of {paths[0]}")
        for name in total:
            if model[name].shape != first[name].shape:
                raise CheckpointError(
                    f"{path}: {name} has shape {tuple(model[name].shape)}, but "
                    f"{tuple(first[name].shape)} in {paths[0]}"
                )
            total[name] += model[name].double()
    mean = {
        name: (total[name] / len(paths)).to(value.dtype) if name in total else value
        for name, value in first.items()
    }
    return mean, state


# --------------------------------------------------------------------------- run state


def data_fingerprint(*columns: Sequence[str]) -> str:
    """sha256 of text columns (e.g. train source, train target, valid source, valid target)."""
    digest = hashlib.sha256()
    for column in columns:
        digest.update(len(column).to_bytes(8, "little"))
        for text in column:
            data = text.encode("utf-8")
            digest.update(len(data).to_bytes(8, "little"))
            digest.update(data)
    return digest.hexdigest()


def rng_state(cuda: bool = False) -> dict[str, Any]:
    """Python's, torch's CPU and (`cuda`: for a run on CUDA) the CUDA generators, as tensors and
    plain values. A CPU run's state never holds CUDA's, even where something in the process
    has started CUDA: its checkpoints must not depend on what else the process did."""
    version, internal, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
        "torch": torch.get_rng_state(),
    }
    if cuda:
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Set the generators from `rng_state()`'s result."""
    python = state.get("python")
    if isinstance(python, dict):
        random.setstate((python["version"], tuple(python["internal"]), python["gauss_next"]))
    else:  # checkpoints before the plain format stored a repr, which is never evaluated
        log.warning("the checkpoint has no usable python random state; it is not restored")
    torch.set_rng_state(state["torch"].cpu())
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available():
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all([s.cpu() for s in cuda])
        else:
            log.warning(
                "CUDA random states of %d devices not restored on %d",
                len(cuda),
                torch.cuda.device_count(),
            )


@dataclass
class TrainState:
    """Counters that a checkpoint stores so that a run can resume where it stopped."""

    step: int = 0  # optimizer steps taken
    epoch: int = 0  # current epoch (its batch order is a function of seed and epoch)
    batch: int = 0  # batches of the current epoch already consumed
    best_metric: str = "bleu"  # the validation metric that chooses best.pt (trainer.best_metric)
    best_score: float | None = None  # its best value so far (None: no validation yet)
    best_valid: dict[str, float] = field(default_factory=dict)  # validation metrics at best_step
    tokens: int = 0  # target tokens trained on
    best_step: int = 0  # step of the best validation
    valid_step: int = -1  # step of the last validation
    stale_validations: int = 0  # validations since the best one (early stopping)
    bad_streak: int = 0  # consecutive steps skipped for a non-finite loss or gradient
    skipped_steps: int = 0  # steps skipped for a non-finite loss or gradient, in all
    log_records: int = 0  # records in train_log.jsonl when the checkpoint was written
    world_size: int = 1  # processes (torchrun ranks) the batch position `batch` refers to
    precision: str = ""  # the precision trained in (what trainer.precision=auto chose)
    products: str = ""  # where float32 CPU products ran: onednn or aten ("": no choice made)
    mkl_intel_path: str = ""  # seq2seq.mkl.STATE when the run started ("": not recorded)

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> TrainState:
        """The counters of a checkpoint's "train_state"; one written before trainer.best_metric
        existed holds `best_bleu` (-1: none yet), which becomes the BLEU best score."""
        known = {f.name for f in fields(cls)}
        state = cls(**{k: v for k, v in saved.items() if k in known})
        if "best_score" not in saved and saved.get("best_bleu", -1.0) >= 0:
            state.best_metric, state.best_score = "bleu", float(saved["best_bleu"])
            state.best_valid = {"bleu": float(saved["best_bleu"])}
        return state
