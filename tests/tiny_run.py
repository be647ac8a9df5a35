"""Helpers for the tests that train (test_resume.py, test_reliability.py): a slice of the numbers
data, a tiny model config that trains a step in milliseconds, and seq2seq-train run in a child
process that can be paused or signalled at a chosen step."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from seq2seq.config.checks import check_config
from seq2seq.config.commands import register_configs
from seq2seq.config.schema import TrainConfig
from seq2seq.train.build import build_trainer
from seq2seq.train.checkpoint import load_checkpoint
from seq2seq.train.steplog import LOG_NAME
from seq2seq.train.trainer import Trainer

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "seq2seq" / "config"
NUMBERS = REPO / "seq2seq" / "data" / "numbers"
SIZES = {"train": 150, "valid": 20, "test": 20}  # ~10 batches an epoch at max_tokens=256


def write_slice(folder: Path, sizes: dict[str, int] = SIZES) -> Path:
    """The first lines of each split of seq2seq/data/numbers, as plain {split}.{lang} files."""
    folder.mkdir(parents=True)
    for split, n in sizes.items():
        for lang in ("en", "de"):
            with gzip.open(NUMBERS / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = [next(f) for _ in range(n)]
            (folder / f"{split}.{lang}").write_text("".join(lines), encoding="utf-8")
    return folder


def tiny_overrides(data: Path, cache: Path, *extra: str) -> list[str]:
    """Overrides for a one-layer d_model=32 model on `data`; dropout on, so that resuming has
    to restore the random generators to be exact."""
    return [
        f"data.root={data}",
        "data.test=[test]",
        "data.max_len=64",
        "tokenizer=bpe",
        "tokenizer.vocab_size=200",
        f"tokenizer.cache_dir={cache}",
        f"data.cache_dir={cache}/prepared",
        "model.d_model=32",
        "model.n_heads=2",
        "model.enc_layers=1",
        "model.dec_layers=1",
        "model.d_ff=64",
        "model.dropout=0.1",
        "optim.lr=0.003",
        "optim.warmup_steps=5",
        "trainer.max_steps=12",
        "trainer.valid_every=4",
        "trainer.valid_bleu_sentences=10",
        "trainer.log_every=2",
        "trainer.max_tokens=256",
        "trainer.progress=false",
        "trainer.device=cpu",
        "trainer.threads=1",
        "trainer.precision=fp32",  # auto would time both; runs compared bit for bit must agree
        *extra,
    ]


def compose_train(overrides: list[str]) -> TrainConfig:
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = OmegaConf.to_object(compose("train", overrides=overrides))
    assert isinstance(cfg, TrainConfig)
    return cfg


def tiny_trainer(tmp_path: Path, name: str, *extra: str) -> Trainer:
    """A Trainer of the tiny config with `extra` overrides, on a slice written to tmp_path/data
    (once), its run folder tmp_path/name."""
    data = tmp_path / "data"
    if not data.exists():
        write_slice(data)
    cfg = compose_train(tiny_overrides(data, tmp_path / "cache", *extra))
    check_config(cfg)
    (tmp_path / name).mkdir()
    return build_trainer(cfg, tmp_path / name)


def assert_resume_is_exact(tmp_path: Path, settings: list[str], step: int) -> None:
    """tmp_path/straight, a finished tiny_trainer run of `settings`, against its step-`step`
    checkpoint resumed to the end in tmp_path/resumed: the same weights, optimizer state,
    counters and step log, to the bit."""
    straight = tmp_path / "straight"
    at = straight / "checkpoints" / f"step_{step}.pt"
    cfg = compose_train(tiny_overrides(tmp_path / "data", tmp_path / "cache", *settings))
    (tmp_path / "resumed").mkdir()
    shutil.copy(straight / LOG_NAME, tmp_path / "resumed")  # cut back to `step` on resuming
    resumed = build_trainer(cfg, tmp_path / "resumed", resume=(at, load_checkpoint(at)))
    resumed.fit()
    resumed.close()
    last = "checkpoints/last.pt"
    assert_same_weights(straight / last, tmp_path / "resumed" / last)
    assert (tmp_path / "resumed" / LOG_NAME).read_bytes() == (straight / LOG_NAME).read_bytes()


# The child process: seq2seq-train, except that before optimizer step PAUSE_AT + 1 it either
# touches READY and sleeps (for the parent to SIGKILL it) or sends itself the signal ACTION.
CHILD = """
import os, signal, sys, time
from pathlib import Path
import seq2seq.cli.train as train
import seq2seq.train.trainer as trainer
pause_at, action = int(os.environ["TEST_PAUSE_AT"]), os.environ["TEST_ACTION"]
original = trainer.Trainer.train_step
def train_step(self, group):
    if self.state.step == pause_at and not getattr(self, "_paused", False):
        self._paused = True
        if action == "wait":
            Path(os.environ["TEST_READY"]).touch()
            time.sleep(600)
        else:
            os.kill(os.getpid(), getattr(signal, action))
    return original(self, group)
trainer.Trainer.train_step = train_step
sys.argv = ["seq2seq-train", *sys.argv[1:]]
train.cli()
"""


def child_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1", **extra}


def checkout_pythonpath() -> str:
    """PYTHONPATH for a child that must import this checkout's seq2seq: the checkout first, then
    what PYTHONPATH held already (a machine whose dependencies sit on it keeps them)."""
    return os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))


def start_child(
    overrides: list[str], run_dir: Path, pause_at: int, action: str
) -> subprocess.Popen[str]:
    """seq2seq-train in a child process on run_dir, paused or signalled after step pause_at."""
    env = child_env(
        TEST_PAUSE_AT=str(pause_at),
        TEST_ACTION=action,
        TEST_READY=str(run_dir.parent / f"{run_dir.name}.ready"),
    )
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, *overrides, f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_until(
    check: Callable[[], bool],
    proc: subprocess.Popen[str] | None = None,
    what: str = "the condition",
    limit_s: float = 300,
) -> None:
    """Block until check() holds; fail if the child `proc` exits first (a guard, not a timing
    test)."""
    deadline = time.monotonic() + limit_s
    while not check():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the child exited ({proc.returncode}): {proc.communicate()[0]}")
        if time.monotonic() > deadline:
            if proc is not None:
                proc.kill()
            raise AssertionError(f"{what} did not hold within {limit_s} s")
        time.sleep(0.05)


def wait_for(path: Path, proc: subprocess.Popen[str], limit_s: float = 300) -> None:
    """Block until `path` exists; fail if the child exits first."""
    wait_until(path.exists, proc, f"{path} exists", limit_s)


def run_cli(overrides: list[str], run_dir: Path) -> subprocess.CompletedProcess[str]:
    """seq2seq-train (as the console script runs it) on run_dir, to completion."""
    return subprocess.run(
        [sys.executable, "-m", "seq2seq.cli.train", *overrides, f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def assert_same_weights(a: Path, b: Path, counters: bool = True) -> None:
    """The two checkpoints hold bit-identical model and optimizer tensors (and counters)."""
    first, second = load_checkpoint(a), load_checkpoint(b)
    assert first["model"].keys() == second["model"].keys()
    for name, tensor in first["model"].items():
        assert torch.equal(tensor, second["model"][name]), name
    moments = lambda s: [t for st in s["optimizer"]["state"].values() for t in st.values()]  # noqa: E731
    assert all(torch.equal(x, y) for x, y in zip(moments(first), moments(second), strict=True))
    assert not counters or first["train_state"] == second["train_state"]
