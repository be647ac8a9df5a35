"""`seq2seq-train -m` on Hydra's launcher plugins (the sweep extra), with the sweep experiment's
settings (experiment=pos_sweep: a fixed folder, a run folder per encoding and seed,
trainer.skip_finished) on a tiny model:

- joblib (make sweep): the runs go to worker processes, a worker takes a second run once it is
  free, and a run in a reused worker trains exactly what it trains in a fresh process;
- submitit_local (submitit's stand-in for SLURM on this machine): a two-seed sweep finishes, and
  a second call skips both runs, leaving their folders untouched;
- a job sent SIGUSR2 (what SLURM sends a submitit job before its time limit or on preemption)
  saves last.pt, is requeued by submitit, and resumes to the weights of a run never stopped;
- hydra/launcher=slurm (seq2seq/config/hydra/launcher/slurm.yaml) writes the sbatch script
  with our settings: SIGUSR2 ahead of the time limit, requeue.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from seq2seq.cli.train import is_local_multirun
from seq2seq.train.interrupt import StopSignals, pass_on
from seq2seq.train.run import train
from tests.tiny_run import (
    REPO,
    assert_same_weights,
    child_env,
    compose_train,
    tiny_overrides,
    wait_for,
    wait_until,
    write_slice,
)


def settings(root: Path, *extra: str) -> list[str]:
    """The sweep experiment with the tiny model on a slice of the numbers data."""
    if not (root / "data").exists():
        write_slice(root / "data")
    return ["experiment=pos_sweep", *tiny_overrides(root / "data", root / "cache", *extra)]


def multirun(root: Path, args: list[str]) -> list[str]:
    """The seq2seq-train -m command of a sweep into root/sweep."""
    return [sys.executable, "-m", "seq2seq.cli.train", "-m", *args, f"hydra.sweep.dir={root}/sweep"]


def run(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, cwd=REPO, env=env or child_env(), capture_output=True, text=True, timeout=300
    )


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under folder but the log, by path: (size, mtime in ns)."""
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "train.log"
    }


def test_joblib_runs_in_worker_processes_that_share_no_state(tmp_path: Path) -> None:
    args = settings(tmp_path, "trainer.max_steps=6", "trainer.valid_every=3")
    sweep = ["trainer.seed=1,2,3", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
    proc = subprocess.Popen(
        multirun(tmp_path, [*args, *sweep]),
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    out = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, out
    runs = [tmp_path / "sweep" / f"sinusoidal_seed{seed}" for seed in (1, 2, 3)]
    # the lock file names the process that trained the run: two workers, not the parent
    pids = [int((r / "train.lock").read_text()) for r in runs]
    assert len(set(pids)) == 2, pids
    assert proc.pid not in pids, pids
    assert all((r / "results.json").is_file() for r in runs)
    # seed 3 ran in a worker that had trained another run before: the same as a fresh run
    fresh = tmp_path / "fresh"
    train(compose_train([*args, "trainer.seed=3"]), fresh)
    assert_same_weights(fresh / "checkpoints" / "last.pt", runs[2] / "checkpoints" / "last.pt")


def train_records(run: Path) -> list[int]:
    """The steps of a run's train records in train_log.jsonl so far."""
    log = run / "train_log.jsonl"
    text = log.read_text() if log.exists() else ""
    lines = text.split("\n")[:-1]  # whole lines: the one being written has no newline yet
    return [json.loads(x)["step"] for x in lines if '"type": "train"' in x]


def terminal_job() -> None:
    """In the child: what a shell gives a foreground job (SIGINT at its default; the test's
    own process may ignore it, as under nohup)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


STEPS = 400  # the Ctrl-C test's runs


def test_ctrl_c_on_a_joblib_sweep_saves_the_running_jobs_and_starts_no_other(
    tmp_path: Path,
) -> None:
    """Ctrl-C (SIGINT to the terminal's process group) on a two-worker sweep of three runs: the
    two running jobs save last.pt at the step they were at, the third does not start, the
    sweep exits 130 and leaves no process behind; the same command then finishes the sweep,
    the interrupted runs resumed to the weights of a run never stopped."""
    # 400 steps: the jobs are stopped after their second, and must not finish the other 398
    # in the moment before the test stops them (40 did once, on an idle 2-core machine)
    args = settings(tmp_path, f"trainer.max_steps={STEPS}", "trainer.valid_every=100")
    sweep = ["trainer.seed=1,2,3", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
    cmd = multirun(tmp_path, [*args, *sweep])
    runs = [tmp_path / "sweep" / f"sinusoidal_seed{seed}" for seed in (1, 2, 3)]
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a process group of its own, as a terminal's job
        preexec_fn=terminal_job,
    )
    try:
        wait_until(lambda: all(len(train_records(r)) >= 2 for r in runs[:2]), proc)
        jobs = [int((r / "train.lock").read_text()) for r in runs[:2]]
        for job in jobs:  # held still while Ctrl-C arrives, so that neither ends on its own
            os.kill(job, signal.SIGSTOP)
        os.killpg(proc.pid, signal.SIGINT)
        for job in jobs:
            os.kill(job, signal.SIGCONT)
        out = proc.communicate(timeout=300)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signal.SIGINT, out
    assert "Ctrl-C stopped the sweep" in out
    for folder in runs[:2]:
        ckpt = torch.load(folder / "checkpoints" / "last.pt", weights_only=False)
        assert ckpt["train_state"]["step"] == train_records(folder)[-1] < STEPS  # no step lost
    assert not (runs[2] / "checkpoints").exists()
    assert "not started: the sweep was stopped (Ctrl-C)" in (runs[2] / "train.log").read_text()
    wait_until(lambda: not group_alive(proc.pid))  # the launcher's workers ended too
    assert not list(Path(tempfile.gettempdir()).glob(f"seq2seq-sweep-{proc.pid}-*"))
    again = run(cmd)
    assert again.returncode == 0, again.stdout + again.stderr
    for r in runs:
        assert json.loads((r / "results.json").read_text())["steps"] == STEPS
    assert json.loads((runs[0] / "results.json").read_text())["resumed_from"]
    fresh = tmp_path / "fresh"
    train(compose_train([*args, "trainer.seed=1"]), fresh)
    assert_same_weights(fresh / "checkpoints" / "last.pt", runs[0] / "checkpoints" / "last.pt")


def test_ctrl_c_stops_the_sweeps_that_run_here() -> None:
    """sweep_stop applies to a multirun on this machine's launchers, not to a cluster's."""
    assert is_local_multirun(["-m", "trainer.seed=1,2"])  # Hydra's basic launcher
    assert is_local_multirun(["--multirun", "hydra/launcher=joblib"])
    assert is_local_multirun(["hydra.mode=MULTIRUN", "hydra/launcher=submitit_local"])
    assert not is_local_multirun(["-m", "hydra/launcher=slurm"])
    assert not is_local_multirun(["-m", "hydra/launcher=joblib", "hydra/launcher=slurm"])
    assert not is_local_multirun(["trainer.seed=1"])  # one run: its own Ctrl-C handling


def group_alive(pgid: int) -> bool:
    """Whether a process of the group is left."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def test_submitit_local_sweep_finishes_and_a_second_call_skips_it(tmp_path: Path) -> None:
    args = settings(tmp_path, "trainer.max_steps=4", "trainer.valid_every=2")
    cmd = multirun(tmp_path, [*args, "trainer.seed=1,2", "hydra/launcher=submitit_local"])
    first = run(cmd)
    assert first.returncode == 0, first.stdout + first.stderr
    runs = [tmp_path / "sweep" / f"sinusoidal_seed{seed}" for seed in (1, 2)]
    assert all((r / "results.json").is_file() for r in runs)
    jobs = list((tmp_path / "sweep" / ".submitit").glob("*/*_result.pkl"))
    assert len(jobs) == 2  # each run was a submitit job of its own
    before = [snapshot(r) for r in runs]
    second = run(cmd)
    assert second.returncode == 0, second.stdout + second.stderr
    assert [snapshot(r) for r in runs] == before  # results, checkpoints, .hydra/: untouched
    for r in runs:
        assert (r / "train.log").read_text().count("already finished") == 1
    assert len(list((tmp_path / "sweep" / ".submitit").glob("*/*_result.pkl"))) == 4


def test_a_job_sent_sigusr2_saves_is_requeued_and_resumes_exactly(tmp_path: Path) -> None:
    args = settings(tmp_path, "trainer.max_steps=40", "trainer.valid_every=10")
    cmd = multirun(tmp_path, [*args, "trainer.seed=1", "hydra/launcher=submitit_local"])
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    folder = tmp_path / "sweep" / "sinusoidal_seed1"
    try:
        wait_for(folder / "checkpoints" / "step_10.pt", proc)
        job = int((folder / "train.lock").read_text())  # the job's training process
        # held still while the signal arrives, so that it stops well before step 40
        os.kill(job, signal.SIGSTOP)
        os.kill(job, signal.SIGUSR2)
        os.kill(job, signal.SIGCONT)
        out = proc.communicate(timeout=300)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    log = (folder / "train.log").read_text()
    stopped = log.split("training stopped at step ")[1]
    assert stopped.split(":")[1].strip().startswith("SIGUSR2 received")
    assert 10 <= int(stopped.split(":")[0]) < 40
    (job_err,) = (tmp_path / "sweep" / ".submitit").glob("*/*_0_log.err")
    assert "this job is preempted" in job_err.read_text()  # submitit's handler, after the save
    results = (folder / "results.json").read_text()
    assert f'"resumed_from": "{folder / "checkpoints" / "last.pt"}"' in results
    assert '"steps": 40' in results
    fresh = tmp_path / "fresh"
    train(compose_train([*args, "trainer.seed=1"]), fresh)
    assert_same_weights(fresh / "checkpoints" / "last.pt", folder / "checkpoints" / "last.pt")


def test_the_slurm_launcher_asks_for_sigusr2_and_requeue(tmp_path: Path) -> None:
    """sbatch and srun stand-ins: sbatch keeps the script it is given and refuses the job."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    script = tmp_path / "job.sh"
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\ncp "$1" {script}\necho no cluster >&2\nexit 1\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = child_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    args = settings(tmp_path, "trainer.seed=1,2", "hydra/launcher=slurm")
    proc = run(multirun(tmp_path, [*args, "hydra.launcher.partition=gpu"]), env)
    assert proc.returncode != 0
    assert "no cluster" in proc.stderr
    lines = script.read_text().splitlines()
    for flag in (
        "--signal=USR2@120",
        "--requeue",
        "--time=240",
        "--partition=gpu",
        "--gpus-per-node=1",
        "--array=0-1%2",
    ):
        assert f"#SBATCH {flag}" in lines, flag
    assert "submitit.core._submit" in lines[-1]
    assert lines[-1].startswith("srun ")


def test_pass_on_calls_the_handler_found_before_training_after_the_stop() -> None:
    """The chain a submitit job goes through, in this process: training's handler takes
    SIGUSR2, the previous one (submitit's requeue) is called only once the stop is handled."""
    calls: list[int] = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: calls.append(signum))
    try:
        with StopSignals() as stop:
            os.kill(os.getpid(), signal.SIGUSR2)
            assert stop.signum == signal.SIGUSR2
            assert calls == []
        pass_on(signal.SIGUSR2)
        assert calls == [signal.SIGUSR2]
    finally:
        signal.signal(signal.SIGUSR2, previous)
    pass_on(signal.SIGTERM)  # SIG_DFL (or pytest's own): nothing Python to call, no exit
