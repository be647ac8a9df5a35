"""Refusals that reach the user: what seq2seq-train says when a setting cannot work (a learned
position table too short for the data), when a checkpoint cannot be resumed by this job (another
world size), and when torchrun's rank 0 failed its checks (the other ranks' one-line error)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from seq2seq.train.build import build_trainer
from seq2seq.train.checkpoint import load_checkpoint, save_checkpoint
from seq2seq.train.distributed import DistInfo
from seq2seq.train.resume import ResumeError
from seq2seq.train.run import train
from tests.tiny_run import (
    checkout_pythonpath,
    child_env,
    compose_train,
    run_cli,
    tiny_overrides,
    write_slice,
)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_slice(tmp_path_factory.mktemp("refusals") / "data")


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The `error: ...` line of a CLI that failed as a user error: exit status 1, no traceback."""
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("error: ")]
    return line


# --------------------------------------------------------------------------- learned positions


def test_learned_positions_shorter_than_a_sentence_is_one_error_line(
    data: Path, tmp_path: Path
) -> None:
    """Catches a too-short learned position table ending training in a traceback (or silently
    reusing rows): seq2seq-train prints one `error:` line naming pos_encoding.max_len and the
    table size, exits 1, and writes no checkpoint."""
    args = tiny_overrides(
        data, tmp_path / "cache", "pos_encoding=learned", "pos_encoding.max_len=8"
    )
    done = run_cli(args, tmp_path / "run")
    line = one_error_line(done)
    assert line.startswith("error: ConfigError: learned positions stop at 8 but position ")
    assert "raise pos_encoding.max_len" in line
    assert not list((tmp_path / "run" / "checkpoints").glob("*.pt"))


# --------------------------------------------------------------------------- world size


def one_step_checkpoint(data: Path, tmp_path: Path) -> tuple[Path, list[str]]:
    """A single-process run of one step: its last.pt and its overrides."""
    args = tiny_overrides(data, tmp_path / "cache", "trainer.max_steps=1", "trainer.valid_every=1")
    train(compose_train(args), tmp_path / "run")
    return tmp_path / "run" / "checkpoints" / "last.pt", args


def test_resume_refuses_a_checkpoint_of_another_world_size(data: Path, tmp_path: Path) -> None:
    """Catches a run resumed with another number of processes (its position in the sharded
    data would be wrong): both ways round, ResumeError names the two world sizes and the fix,
    and the checkpoint is left as it was."""
    path, args = one_step_checkpoint(data, tmp_path)
    ckpt = load_checkpoint(path)
    assert ckpt["train_state"]["world_size"] == 1  # what a single process records
    # written by 2 processes (the stored value edited), resumed by 1
    ckpt["train_state"]["world_size"] = 2
    save_checkpoint(ckpt, path)
    before = path.read_bytes()
    with pytest.raises(ResumeError) as err:
        train(compose_train(args), tmp_path / "run")
    assert "written by a run of 2 process(es) and this one has 1" in str(err.value)
    assert "torchrun --nproc_per_node" in str(err.value)
    assert path.read_bytes() == before
    # written by 1 process, resumed as rank 0 of 2 (no process group is needed to refuse)
    ckpt["train_state"]["world_size"] = 1
    process = (DistInfo(rank=0, world=2, local_rank=0), torch.device("cpu"))
    with pytest.raises(ResumeError, match=r"a run of 1 process\(es\) and this one has 2"):
        build_trainer(compose_train(args), tmp_path / "run", (path, ckpt), process=process)


# --------------------------------------------------------------------------- rank 0 fails

# seq2seq-train as one rank of a 2-process job, without a process group: init_distributed says
# which rank this is, and broadcast replays what rank 0 sent (rank 0 records what it sends).
RANK_CHILD = """
import json, os, sys
from pathlib import Path
import seq2seq.cli.train as cli
import seq2seq.train.run as run
from seq2seq.train.distributed import DistInfo
rank, sent = int(os.environ["RANK"]), Path(os.environ["TEST_SENT"])
run.init_distributed = lambda device: (DistInfo(rank, 2, rank), device)
values = [] if rank == 0 else json.loads(sent.read_text())
def broadcast(value, src=0):
    if rank == 0:
        values.append(value)
        sent.write_text(json.dumps(values))
        return value
    return values.pop(0)
run.broadcast = broadcast
sys.argv = ["seq2seq-train", *sys.argv[1:]]
cli.cli()
"""


def test_rank0_setup_failure_reaches_the_other_ranks_as_one_line(
    data: Path, tmp_path: Path
) -> None:
    """Catches the other ranks of a torchrun job hanging, or dying with a traceback, when rank
    0's checks fail: rank 0 prints its own error, rank 1 prints `error: DistributedSetupError:`
    with rank 0's error and message, and both exit 1."""
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "last.pt").write_bytes(b"a run was here")
    args = tiny_overrides(data, tmp_path / "cache", "trainer.resume=never")  # refused: last.pt
    sent = tmp_path / "sent.json"
    lines = []
    for rank in (0, 1):
        cwd = tmp_path / f"rank{rank}"
        cwd.mkdir()
        extra = [f"hydra.run.dir={run_dir}"] if rank == 0 else []  # rank 1 gets rank 0's
        done = subprocess.run(
            [sys.executable, "-c", RANK_CHILD, *args, *extra],
            cwd=cwd,
            env=child_env(
                RANK=str(rank),
                TEST_SENT=str(sent),
                PYTHONPATH=checkout_pythonpath(),
            ),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        lines.append(one_error_line(done))
        if rank == 0:
            assert json.loads(sent.read_text())[0] == str(run_dir)  # the run dir, then the error
    refusal = f"{run_dir / 'checkpoints'} already holds checkpoints (last.pt) and trainer.resume="
    assert lines[0].startswith(f"error: ResumeError: {refusal}")
    assert lines[1].startswith(f"error: DistributedSetupError: ResumeError on rank 0: {refusal}")
    assert os.listdir(tmp_path / "rank1") == []  # rank 1 wrote nothing of its own
