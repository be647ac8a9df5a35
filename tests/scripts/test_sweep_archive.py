"""scripts/sweep_archive.py: a sweep's finished runs kept as their report inputs (no
checkpoints, the validation curve only) and put back into a sweep folder, which then holds them
finished (trainer.skip_finished skips them) and reports the same."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "sweep_archive", REPO / "scripts" / "sweep_archive.py"
)
sa = importlib.util.module_from_spec(_spec)
sys.modules["sweep_archive"] = sa
_spec.loader.exec_module(sa)

LOG = [{"type": "train", "step": 1, "loss": 3.0}, {"type": "valid", "step": 1, "bleu": 2.0}]


def make_job(sweep: Path, name: str, finished: bool) -> Path:
    """A job folder: .hydra files, checkpoints, a log, and results.json + a .hyp if finished."""
    job = sweep / name
    (job / ".hydra").mkdir(parents=True)
    (job / "checkpoints").mkdir()
    (job / "checkpoints" / "last.pt").write_bytes(b"weights")
    (job / ".hydra" / "config.yaml").write_text(f"name: {name}\n")
    (job / ".hydra" / "overrides.yaml").write_text("- trainer.seed=1\n")
    (job / ".hydra" / "hydra.yaml").write_text("hydra: {}\n")
    (job / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in LOG))
    if finished:
        (job / "results.json").write_text(json.dumps({"test": {"t": {"bleu": 1.0}}}))
        (job / "t.hyp").write_text(f"{name}\n")
    return job


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_save_keeps_the_report_inputs_of_finished_runs(tmp_path: Path) -> None:
    sweep, archive = tmp_path / "sweep", tmp_path / "archive"
    make_job(sweep, "a_seed1", finished=True)
    make_job(sweep, "b_seed1", finished=False)
    assert sa.main(["save", str(sweep), str(archive)]) == 0
    assert sorted(p.name for p in archive.iterdir()) == ["a_seed1"]
    kept = files(archive / "a_seed1")
    assert sorted(kept) == [
        ".hydra/config.yaml",
        ".hydra/overrides.yaml",
        "results.json",
        "t.hyp",
        "train_log.jsonl",
    ]
    assert [json.loads(ln) for ln in kept["train_log.jsonl"].decode().splitlines()] == [LOG[1]]
    (sweep / "a_seed1" / "t.hyp").write_text("newer\n")  # saved again: replaced
    sa.save(sweep, archive)
    assert (archive / "a_seed1" / "t.hyp").read_text() == "newer\n"


def test_restore_fills_in_what_the_sweep_lacks(tmp_path: Path) -> None:
    sweep, archive, fresh = tmp_path / "sweep", tmp_path / "archive", tmp_path / "fresh"
    for name in ("a_seed1", "b_seed1", "c_seed1"):
        make_job(sweep, name, finished=True)
    sa.save(sweep, archive)
    make_job(fresh, "a_seed1", finished=True).joinpath("t.hyp").write_text("mine\n")
    make_job(fresh, "b_seed1", finished=False)  # unfinished here: replaced, checkpoints kept
    assert sa.restore(archive, fresh) == ["b_seed1", "c_seed1"]
    assert (fresh / "a_seed1" / "t.hyp").read_text() == "mine\n"  # finished here: left alone
    assert (fresh / "b_seed1" / "results.json").is_file()
    assert (fresh / "b_seed1" / "checkpoints" / "last.pt").is_file()
    assert files(fresh / "c_seed1") == files(archive / "c_seed1")
    assert sa.restore(archive, fresh) == []  # nothing left to restore
    assert sa.restore(tmp_path / "none", fresh) == []  # no archive yet: nothing to do
