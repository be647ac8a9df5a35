"""Tests for seq2seq/train/distributed.py and DDP training: sharding, and 2 CPU processes (gloo)
that train in lock step and match single-process training with the same effective batch."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from seq2seq.train.build import build_trainer
from seq2seq.train.checkpoint import load_checkpoint
from seq2seq.train.distributed import DistInfo, cleanup, shard
from tests.tiny_run import REPO, child_env, compose_train, tiny_overrides, write_slice

STEPS = 3


def test_shard_gives_disjoint_equal_shares_covering_an_even_prefix() -> None:
    batches = [[i] for i in range(11)]
    shares = [shard(batches, DistInfo(rank, 3, rank)) for rank in range(3)]
    assert [len(s) for s in shares] == [3, 3, 3]  # 11 -> 9 usable: nobody waits alone
    flat = sorted(b[0] for s in shares for b in s)
    assert flat == list(range(9))
    assert shard(batches, DistInfo()) == batches


def overrides(data: Path, cache: Path, accum: int) -> list[str]:
    """Tiny model without dropout (so that ranks and the single run draw no random masks),
    STEPS steps, no validation on the way."""
    extra = [
        "model.dropout=0.0",
        f"trainer.max_steps={STEPS}",
        "trainer.valid_every=1000",
        f"trainer.accum_steps={accum}",
        "trainer.keep_last=0",
    ]
    return tiny_overrides(data, cache, *extra)


def rank_env(rank: int, world: int, port: int) -> dict[str, str]:
    """The variables torchrun sets for one rank on this machine."""
    return {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank),
    }


def _worker(rank: int, world: int, port: int, args: list[str], run_dir: str, out: str) -> None:
    """One torchrun-like rank: train STEPS steps, save this rank's weights to out/rank{rank}.pt."""
    os.environ.update(rank_env(rank, world, port))
    torch.set_num_threads(1)
    try:
        trainer = build_trainer(compose_train(args), Path(run_dir))
        trainer.fit()
        trainer.close()
        torch.save(trainer.model.state_dict(), Path(out) / f"rank{rank}.pt")
    finally:
        cleanup()


def spawn_ranks(world: int, args: list[str], run_dir: Path, out: Path) -> None:
    """`world` ranks of `_worker` in spawned processes, waited for; each must exit with 0. The
    standard library's spawn, not torch.multiprocessing's: its children import this module
    (and the tests package, which imports seq2seq before torch, as the CLI's ranks do), not
    torch first."""
    ctx, port = multiprocessing.get_context("spawn"), free_port()
    ranks = [
        ctx.Process(target=_worker, args=(rank, world, port, args, str(run_dir), str(out)))
        for rank in range(world)
    ]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout=600)
    assert [process.exitcode for process in ranks] == [0] * world


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def train_losses(run_dir: Path) -> list[float]:
    lines = (run_dir / "train_log.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if r["type"] == "train"]


def test_two_gloo_ranks_match_single_process_with_accumulation(tmp_path: Path) -> None:
    data, cache = write_slice(tmp_path / "data"), tmp_path / "cache"
    for folder in ("single", "ddp", "out"):
        (tmp_path / folder).mkdir()
    # single process, accum_steps=2: step k trains on batches 2k and 2k+1 of the epoch, which
    # are exactly rank 0's and rank 1's k-th batches (batches[rank::2]) with 2 ranks
    single = build_trainer(compose_train(overrides(data, cache, 2)), tmp_path / "single")
    initial = {k: v.clone() for k, v in single.model.state_dict().items()}
    single.fit()
    single.close()
    out = tmp_path / "out"
    args = overrides(data, cache, 1)
    spawn_ranks(2, args, tmp_path / "ddp", out)
    rank0, rank1 = (torch.load(out / f"rank{r}.pt", weights_only=True) for r in (0, 1))
    for name, tensor in rank0.items():
        assert torch.equal(tensor, rank1[name]), f"ranks differ in {name}"
    for name, tensor in single.model.state_dict().items():
        torch.testing.assert_close(rank0[name], tensor, rtol=1e-4, atol=1e-5, msg=name)
    assert any(not torch.equal(initial[k], rank0[k]) for k in initial)  # training happened
    # rank 0 alone wrote the log: STEPS train records whose losses (over both ranks' tokens)
    # equal the single run's
    ddp_losses, single_losses = train_losses(tmp_path / "ddp"), train_losses(tmp_path / "single")
    assert len(ddp_losses) == STEPS
    assert ddp_losses == pytest.approx(single_losses, rel=1e-5)
    assert (tmp_path / "ddp" / "checkpoints" / "last.pt").exists()


def test_torchrun_ranks_other_than_0_leave_no_hydra_files(tmp_path: Path) -> None:
    """seq2seq-train as torchrun starts it, without hydra.run.dir: rank 0 makes the run
    directory (.hydra/, train.log, checkpoints, results) and rank 1, started in another working
    directory, writes nothing there (Hydra would give it its own run dir, .hydra/ and log)."""
    data, cache = write_slice(tmp_path / "data"), tmp_path / "cache"
    args = overrides(data, cache, 1)
    cwds = [tmp_path / "rank0", tmp_path / "rank1"]
    procs = []
    port = free_port()
    for rank, cwd in enumerate(cwds):
        cwd.mkdir()
        env = child_env(**rank_env(rank, 2, port))
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "seq2seq.cli.train", *args, "name=ddp_cli"],
                cwd=cwd,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert list(cwds[1].iterdir()) == []
    (run_dir,) = (cwds[0] / "outputs" / "ddp_cli").iterdir()
    for name in (".hydra/config.yaml", "train.log", "results.json", "checkpoints/last.pt"):
        assert (run_dir / name).exists(), name


def test_two_torchrun_nodes_train_one_model(tmp_path: Path) -> None:
    """Two nodes as the README's SLURM command starts them (one torchrun per node, c10d
    rendezvous), here two torchrun agents on 127.0.0.1 with one rank each: the job trains one
    model over both ranks' batches, so rank 0's checkpoint is the single-process run with
    accum_steps=2 (the ranks' k-th batches are that run's k-th step)."""
    data, cache = write_slice(tmp_path / "data"), tmp_path / "cache"
    port, run_dir = free_port(), tmp_path / "run"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2"]
    torchrun += ["--nproc-per-node", "1", "--rdzv-backend", "c10d", "--max-restarts", "0"]
    torchrun += ["--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"nodes-{os.getpid()}"]
    torchrun += ["--local-addr", "127.0.0.1", "-m", "seq2seq.cli.train"]
    args = [*overrides(data, cache, 1), f"hydra.run.dir={run_dir}"]
    nodes = [
        subprocess.Popen(
            [*torchrun, *args],
            cwd=REPO,
            env=child_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # the agent and its worker: one process group to end
        )
        for _ in range(2)
    ]
    try:
        outputs = [node.communicate(timeout=180)[0] for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait()
    assert [node.returncode for node in nodes] == [0, 0], outputs
    assert sum("test BLEU (test)" in out for out in outputs) == 1  # rank 0 alone tests
    (tmp_path / "single").mkdir()
    single = build_trainer(compose_train(overrides(data, cache, 2)), tmp_path / "single")
    single.fit()
    single.close()
    trained = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert trained["train_state"]["step"] == STEPS
    for name, tensor in single.model.state_dict().items():
        torch.testing.assert_close(trained["model"][name], tensor, rtol=1e-4, atol=1e-5, msg=name)
    assert train_losses(run_dir) == pytest.approx(train_losses(tmp_path / "single"), rel=1e-5)
