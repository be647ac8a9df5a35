"""Tests for resuming (seq2seq/train/resume.py and the Trainer): a run killed with SIGKILL (at the
first step, mid-backward, during validation, while writing last.pt, right after it, during the test
scoring), stopped with SIGTERM or Ctrl-C, or left with a corrupt last.pt resumes to exactly the
checkpoint and log of a run that was never interrupted; config or data changes that would alter the
run are refused."""

from __future__ import annotations

import json
import logging
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import pytest
import torch

import seq2seq.train.trainer
from seq2seq.config.schema import TrainConfig
from seq2seq.train.checkpoint import (
    CheckpointError,
    load_checkpoint,
    restore_rng,
    rng_state,
    save_checkpoint,
)
from seq2seq.train.interrupt import StopSignals, TrainingInterrupted
from seq2seq.train.resume import (
    ResumeError,
    check_compatible,
    config_changes,
    merge_overrides,
    record_overrides,
    saved_overrides,
)
from seq2seq.train.run import train
from seq2seq.train.rundir import RunDirError
from seq2seq.train.steplog import LOG_NAME, read_step_log
from seq2seq.train.trainer import Trainer
from tests.tiny_run import (
    REPO,
    assert_same_weights,
    child_env,
    compose_train,
    start_child,
    tiny_overrides,
    wait_for,
    write_slice,
)

# The tiny run: 12 steps, a checkpoint every 4, about 10 batches an epoch (so resuming from
# step 8 crosses into epoch 1).


@dataclass
class Straight:
    overrides: list[str]
    cfg: TrainConfig
    run_dir: Path
    data: Path

    @property
    def last(self) -> Path:
        return self.run_dir / "checkpoints" / "last.pt"

    def log(self) -> list[dict[str, object]]:
        return read_step_log(self.run_dir / LOG_NAME)


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> Straight:
    """The reference: the tiny run trained to the end without interruption."""
    root = tmp_path_factory.mktemp("resume")
    data = write_slice(root / "data")
    overrides = tiny_overrides(data, root / "tokenizers")
    cfg = compose_train(overrides)
    train(cfg, root / "straight")
    return Straight(overrides, cfg, root / "straight", data)


def copy_run(straight: Straight, tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(straight.run_dir, run_dir)
    return run_dir


def step_of(path: Path) -> int:
    return int(load_checkpoint(path)["train_state"]["step"])


def results(run_dir: Path) -> object:
    return json.loads((run_dir / "results.json").read_text())["test"]


def assert_same_tree(want: object, got: object, where: str = "") -> None:
    """Equal nested dicts, lists and plain values, with bit-identical tensors (dtype included)."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), where
        assert want.dtype == got.dtype, where
        assert torch.equal(want, got), where
    elif isinstance(want, dict):
        assert isinstance(got, dict), where
        assert want.keys() == got.keys(), where
        for key, value in want.items():
            assert_same_tree(value, got[key], f"{where}[{key!r}]")
    elif isinstance(want, (list, tuple)):
        assert type(got) is type(want), where
        assert len(got) == len(want), where
        for i, (x, y) in enumerate(zip(want, got, strict=True)):
            assert_same_tree(x, y, f"{where}[{i}]")
    else:
        assert type(got) is type(want), (where, want, got)
        assert got == want, (where, want, got)


def assert_same_run(straight: Straight, run_dir: Path) -> None:
    """A bit-identical last.pt: weights, optimizer (moments, step counts, param groups), LR
    schedule, grad scaler, counters, random states, config and tokenizers; a byte-identical
    train_log.jsonl; the same test scores."""
    last = run_dir / "checkpoints" / "last.pt"
    assert_same_tree(load_checkpoint(straight.last), load_checkpoint(last))
    assert (run_dir / LOG_NAME).read_bytes() == (straight.run_dir / LOG_NAME).read_bytes()
    assert results(run_dir) == results(straight.run_dir)


def test_straight_run_log_is_complete(straight: Straight) -> None:
    log = straight.log()
    assert [r["step"] for r in log if r["type"] == "train"] == list(range(1, 13))
    assert [r["step"] for r in log if r["type"] == "valid"] == [4, 8, 12]
    assert {r["epoch"] for r in log if r["type"] == "train" and r["step"] > 8} == {0, 1}
    assert [(r["epoch"], r["step"]) for r in log if r["type"] == "epoch"] == [(0, 0), (1, 10)]
    assert all(isinstance(r["loss"], float) for r in log if r["type"] != "epoch")
    assert all(isinstance(r["lr"], float) for r in log if r["type"] == "train")


def test_sigkill_then_resume_is_exact(straight: Straight, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    child = start_child(straight.overrides, run_dir, pause_at=10, action="wait")
    try:
        wait_for(tmp_path / "run.ready", child)  # step 10 done; the checkpoint is from step 8
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL
    assert step_of(run_dir / "checkpoints" / "last.pt") == 8
    assert max(r["step"] for r in read_step_log(run_dir / LOG_NAME)) == 10  # to be dropped
    # make resume RUN=<dir>: the run's own overrides, read back from <dir>/.hydra
    done = subprocess.run(
        [sys.executable, "-m", "seq2seq.cli.resume", str(run_dir)],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"resumed from {run_dir / 'checkpoints' / 'last.pt'}: step 8" in done.stdout
    assert_same_run(straight, run_dir)


# The child of the SIGKILL tests: seq2seq-train, except that at the moment KILL_MOMENT, with
# KILL_STEP optimizer steps done, it writes "<moment> <step>" to KILL_MARKER and sleeps until the
# parent kills it. "writing_last" first writes half of last.pt's temporary file (and fsyncs it).
KILL_CHILD = """
import io, os, sys, time
from pathlib import Path
import seq2seq  # before torch, as in the CLI: MKL's Intel path on AMD CPUs (seq2seq/mkl.py)
import torch
import seq2seq.train.validation as metrics
import seq2seq.cli.train as train
import seq2seq.train.trainer as trainer
import seq2seq.train.testing as testing
MOMENT, STEP = os.environ["KILL_MOMENT"], int(os.environ["KILL_STEP"])
MARKER, run = Path(os.environ["KILL_MARKER"]), {}
def chosen(moment):
    return moment == MOMENT and run["trainer"].state.step == STEP
def stop_here(moment):
    if chosen(moment):
        MARKER.with_suffix(".tmp").write_text(f"{moment} {STEP}")
        os.replace(MARKER.with_suffix(".tmp"), MARKER)
        time.sleep(600)
def wrap(owner, name, moment):
    original = getattr(owner, name)
    def stopping(*args, **kwargs):
        stop_here(moment)
        return original(*args, **kwargs)
    setattr(owner, name, stopping)
init, batch_loss = trainer.Trainer.__init__, trainer.Trainer.batch_loss
def trainer_init(self, *args, **kwargs):
    run["trainer"] = self
    init(self, *args, **kwargs)
def loss_and_hook(self, batch):
    if chosen("backward"):  # a parameter half-way down: its gradient comes mid-backward
        params = list(self.model.parameters())
        params[len(params) // 2].register_hook(lambda grad: stop_here("backward"))
    return batch_loss(self, batch)
trainer.Trainer.__init__, trainer.Trainer.batch_loss = trainer_init, loss_and_hook
wrap(trainer.Trainer, "batch_loss", "forward")
wrap(metrics, "translate_ids", "validation")  # validation's greedy decoding, after its loss
wrap(testing, "translate_ids", "test")  # scoring best.pt on the test split
save_checkpoint, torch_save = trainer.save_checkpoint, torch.save
def saving(state, path):
    run["target"] = path.name
    save_checkpoint(state, path)
    if path.name == "last.pt":
        stop_here("after_checkpoint")
def half_save(obj, f, *args, **kwargs):
    if run.get("target") == "last.pt" and chosen("writing_last"):
        whole = io.BytesIO()
        torch_save(obj, whole, *args, **kwargs)
        f.write(whole.getvalue()[: len(whole.getvalue()) // 2])
        f.flush()
        os.fsync(f.fileno())
        stop_here("writing_last")
    return torch_save(obj, f, *args, **kwargs)
trainer.save_checkpoint, torch.save = saving, half_save
sys.argv = ["seq2seq-train", *sys.argv[1:]]
train.cli()
"""


@dataclass(frozen=True)
class Moment:
    name: str  # where KILL_CHILD stops
    step: int  # optimizer steps done then: the newest train_log.jsonl record's step
    saved: int | None  # the step of last.pt when it is killed (None: no checkpoint yet)


def await_marker(marker: Path, child: subprocess.Popen[bytes], out: Path) -> None:
    """Block until the child writes `marker`; fail if it exits first (a guard, not a timing)."""
    deadline = time.monotonic() + 300
    while not marker.exists():
        assert child.poll() is None, f"the child exited ({child.returncode}):\n{out.read_text()}"
        assert time.monotonic() < deadline, f"{marker} did not appear:\n{out.read_text()}"
        time.sleep(0.05)


def kill_child_at(moment: Moment, overrides: list[str], run_dir: Path) -> None:
    """Start KILL_CHILD on run_dir and SIGKILL it once it reports that it reached `moment`."""
    marker, out = run_dir.parent / "reached", run_dir.parent / "child.out"
    env = child_env(KILL_MOMENT=moment.name, KILL_STEP=str(moment.step), KILL_MARKER=str(marker))
    with out.open("wb") as sink:
        child = subprocess.Popen(
            [sys.executable, "-c", KILL_CHILD, *overrides, f"hydra.run.dir={run_dir}"],
            cwd=REPO,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        await_marker(marker, child, out)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    assert marker.read_text() == f"{moment.name} {moment.step}"


KILL_MOMENTS = [
    pytest.param(Moment("writing_last", 8, 4), id="while-writing-last.pt"),
    pytest.param(Moment("forward", 0, None), id="in-the-first-step"),
    pytest.param(Moment("backward", 6, 4), id="mid-backward"),
    pytest.param(Moment("validation", 8, 4), id="during-validation"),
    pytest.param(Moment("after_checkpoint", 8, 8), id="right-after-last.pt"),
    pytest.param(Moment("test", 12, 12), id="during-test-scoring"),
]


@pytest.mark.parametrize("moment", KILL_MOMENTS)
def test_sigkill_at_any_moment_then_resume_is_exact(
    straight: Straight, tmp_path: Path, moment: Moment
) -> None:
    run_dir, ckpts = tmp_path / "run", tmp_path / "run" / "checkpoints"
    kill_child_at(moment, straight.overrides, run_dir)
    last = ckpts / "last.pt"
    assert (step_of(last) if last.exists() else None) == moment.saved
    logged = read_step_log(run_dir / LOG_NAME)
    assert max((r["step"] for r in logged), default=0) == moment.step  # some to be dropped
    partial = list(ckpts.glob(".last.pt.*.tmp"))
    assert len(partial) == (moment.name == "writing_last")
    for path in partial:  # half a checkpoint, left where it was written
        with pytest.raises(CheckpointError, match="cannot be loaded"):
            load_checkpoint(path)
    assert not (run_dir / "results.json").exists()
    train(straight.cfg, run_dir)
    assert_same_run(straight, run_dir)
    assert not list(ckpts.glob(".*.tmp"))  # the resumed run removed the half-written file


def test_sigterm_saves_then_resume_is_exact(straight: Straight, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    child = start_child(straight.overrides, run_dir, pause_at=5, action="SIGTERM")
    out, _ = child.communicate(timeout=600)
    assert child.returncode == 128 + signal.SIGTERM, out
    assert "SIGTERM" in out
    assert f"make resume RUN={run_dir}" in out
    assert step_of(run_dir / "checkpoints" / "last.pt") == 6  # the current step was finished
    assert not (run_dir / "checkpoints" / "step_6.pt").exists()  # only last.pt is written
    train(straight.cfg, run_dir)
    assert_same_run(straight, run_dir)


def test_a_run_with_subword_sampling_resumes_exactly_in_another_process(
    straight: Straight, tmp_path: Path
) -> None:
    """BPE-dropout's draws depend on (seed, epoch, pair) only, not on the process: steps 1-6 in
    a child process, SIGTERM, the rest here, against the straight run here (SentencePiece's own
    sampler draws otherwise in every process: seq2seq/data/subword_draws.py)."""
    overrides = [*straight.overrides, "tokenizer.sampling.bpe_dropout=0.2"]
    cfg = compose_train(overrides)
    reference = Straight(overrides, cfg, tmp_path / "straight", straight.data)
    train(cfg, reference.run_dir)
    run_dir = tmp_path / "run"
    child = start_child(overrides, run_dir, pause_at=5, action="SIGTERM")
    out, _ = child.communicate(timeout=600)
    assert child.returncode == 128 + signal.SIGTERM, out
    assert step_of(run_dir / "checkpoints" / "last.pt") == 6
    train(cfg, run_dir)
    assert_same_run(reference, run_dir)


@pytest.fixture
def sigint_handler() -> Iterator[Callable[[int, FrameType | None], object]]:
    """A SIGINT handler of the test's own (Python's default raises KeyboardInterrupt too), set
    for the test: pytest may have started with SIGINT ignored (nohup, `trap '' INT`, a
    background job), and a Ctrl-C test must not depend on that."""

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGINT, interrupt)
    yield interrupt
    signal.signal(signal.SIGINT, before)


def test_ctrl_c_saves_then_resume_is_exact(
    straight: Straight,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    sigint_handler: Callable[[int, FrameType | None], object],
) -> None:
    run_dir = tmp_path / "run"
    original = Trainer.train_step

    def press_ctrl_c(self: Trainer, group: list) -> object:
        if self.state.step == 9:
            os.kill(os.getpid(), signal.SIGINT)
        return original(self, group)

    monkeypatch.setattr(Trainer, "train_step", press_ctrl_c)
    with pytest.raises(TrainingInterrupted) as stop:
        train(straight.cfg, run_dir)
    assert stop.value.code == 128 + signal.SIGINT
    assert "SIGINT" in str(stop.value)
    assert signal.getsignal(signal.SIGINT) is sigint_handler  # the one before the run
    assert step_of(run_dir / "checkpoints" / "last.pt") == 10
    monkeypatch.undo()
    train(straight.cfg, run_dir)
    assert_same_run(straight, run_dir)


@pytest.mark.parametrize("before", [signal.SIG_IGN, signal.SIG_DFL, signal.default_int_handler])
def test_stop_signals_restore_the_handlers_they_found(before: object) -> None:
    found = signal.signal(signal.SIGINT, before)  # SIG_IGN: a background job, `trap '' INT`
    try:
        with StopSignals():
            pass
        assert signal.getsignal(signal.SIGINT) is before
    finally:
        signal.signal(signal.SIGINT, found)


def test_ignored_sigint_stays_ignored() -> None:
    """A background job (SIGINT ignored by the shell) is not stopped by the terminal's Ctrl-C;
    SIGTERM still asks it to stop."""
    found = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with StopSignals() as stop:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)  # ignored: no effect
            assert stop.signum is None
            os.kill(os.getpid(), signal.SIGTERM)
            assert stop.signum == signal.SIGTERM
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, found)


class Died(BaseException):
    """The process 'dies' here."""


@pytest.mark.parametrize("dies_before", ["step_8.pt", "last.pt"])
def test_killed_between_checkpoint_files_resumes_exactly(
    straight: Straight, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, dies_before: str
) -> None:
    real_save = seq2seq.train.trainer.save_checkpoint

    def save(state: dict, path: Path) -> None:
        if path.name == dies_before and state["train_state"]["step"] == 8:
            raise Died
        real_save(state, path)

    monkeypatch.setattr(seq2seq.train.trainer, "save_checkpoint", save)
    with pytest.raises(Died):
        train(straight.cfg, tmp_path)
    monkeypatch.undo()
    assert step_of(tmp_path / "checkpoints" / "last.pt") == 4
    train(straight.cfg, tmp_path)
    assert_same_run(straight, tmp_path)
    assert step_of(tmp_path / "checkpoints" / "best.pt") == step_of(
        straight.run_dir / "checkpoints" / "best.pt"
    )


def test_corrupt_last_falls_back_to_newest_good_step(
    straight: Straight, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    run_dir = copy_run(straight, tmp_path)
    ckpts = run_dir / "checkpoints"
    data = (ckpts / "last.pt").read_bytes()
    (ckpts / "last.pt").write_bytes(data[: len(data) // 3])  # truncated
    (ckpts / "step_12.pt").write_bytes(b"\x00garbage" * 100)  # corrupt
    train(straight.cfg, run_dir)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(str(ckpts / "last.pt") in w for w in warnings), warnings
    assert any(str(ckpts / "step_12.pt") in w for w in warnings), warnings
    assert any(
        f"resumed from {ckpts / 'step_8.pt'}: step 8" in r.getMessage() for r in caplog.records
    )
    assert_same_run(straight, run_dir)


def test_resume_from_an_explicit_checkpoint(straight: Straight, tmp_path: Path) -> None:
    source = straight.run_dir / "checkpoints" / "step_8.pt"
    run_dir = tmp_path / "fork"
    cfg = compose_train([*straight.overrides, f"trainer.resume={source}"])
    train(cfg, run_dir)
    assert_same_weights(straight.last, run_dir / "checkpoints" / "last.pt", counters=False)
    kept = load_checkpoint(source)["train_state"]["log_records"]
    assert read_step_log(run_dir / LOG_NAME) == straight.log()[kept:]  # the log starts there


class Payload:
    """Unpickling this creates the file `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.marker, "w"))


def test_malicious_checkpoint_is_not_resumed(straight: Straight, tmp_path: Path) -> None:
    run_dir = copy_run(straight, tmp_path)
    ckpts, marker = run_dir / "checkpoints", tmp_path / "pwned"
    for path in ckpts.glob("step_*.pt"):
        path.unlink()
    evil = {**load_checkpoint(ckpts / "last.pt"), "extra": Payload(marker)}
    (ckpts / "last.pt").write_bytes(pickle.dumps(evil, protocol=2))
    with pytest.raises(ResumeError, match=r"no checkpoint .* can be resumed from: last\.pt"):
        train(straight.cfg, run_dir)
    explicit = compose_train([*straight.overrides, f"trainer.resume={ckpts / 'last.pt'}"])
    with pytest.raises(CheckpointError, match=r"last\.pt: cannot be loaded safely"):
        train(explicit, tmp_path / "other")
    assert not marker.exists()
    pickle.loads((ckpts / "last.pt").read_bytes())  # the payload is live
    assert marker.exists()


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("model.d_model=64", "model.d_model"),
        ("pos_encoding=rope", "pos_encoding.kind"),
        ("tokenizer=char", "tokenizer.kind"),
        ("tokenizer.vocab_size=150", "tokenizer.vocab_size"),
        ("trainer.seed=2", "trainer.seed"),
        ("trainer.max_tokens=512", "trainer.max_tokens"),
        ("data.max_len=32", "data.max_len"),
        ("data.src_lang=de", "data.src_lang"),
        ("optim.lr=0.01", "optim.lr"),
        ("trainer.precision=bf16", "trainer.precision"),
        ("trainer.best_metric=loss", "trainer.best_metric"),  # the best score is BLEU's
    ],
)
def test_resume_refuses_config_changes(
    straight: Straight, tmp_path: Path, override: str, key: str
) -> None:
    run_dir = copy_run(straight, tmp_path)
    before = (run_dir / "checkpoints" / "last.pt").read_bytes()
    with pytest.raises(ResumeError) as err:
        train(compose_train([*straight.overrides, override]), run_dir)
    message = str(err.value)
    assert f"{key}: " in message
    assert str(run_dir / "checkpoints" / "last.pt") in message
    assert (run_dir / "checkpoints" / "last.pt").read_bytes() == before


def test_config_changes_lists_only_unsafe_keys(straight: Straight) -> None:
    saved = load_checkpoint(straight.last)["config"]
    safe = [
        "trainer.max_steps=20",
        "trainer.valid_every=3",
        "trainer.log_every=1",
        "trainer.progress=true",
        "trainer.device=auto",
        "trainer.threads=2",
        "trainer.patience=4",
        "decode=beam",
        "decode.beam_size=2",
        "data.test=[valid]",
        "trainer.max_minutes=5",
    ]
    assert config_changes(saved, compose_train([*straight.overrides, *safe])) == []
    both = compose_train([*straight.overrides, *safe, "model.d_ff=128", "trainer.seed=3"])
    assert config_changes(saved, both) == [("model.d_ff", 64, 128), ("trainer.seed", 1, 3)]


@pytest.mark.parametrize(
    ("schedule", "refused"),
    [
        (["optim.schedule=cosine"], True),  # decays to min_lr at trainer.max_steps
        (["optim.schedule=linear", "optim.decay_steps=20"], False),  # at its own decay_steps
        ([], False),  # inverse_sqrt does not depend on max_steps
    ],
)
def test_max_steps_is_unsafe_where_the_schedule_ends_there(
    schedule: list[str], refused: bool
) -> None:
    """Catches a resume that moves where a cosine or linear decay ends (its later steps would
    take other learning rates than the run it continues), and a refusal where nothing moves."""
    from omegaconf import OmegaConf

    before = compose_train(["trainer.max_steps=10", *schedule])
    saved = OmegaConf.to_container(OmegaConf.structured(before), enum_to_str=True)
    after = compose_train(["trainer.max_steps=30", *schedule])
    changes = config_changes(saved, after)  # type: ignore[arg-type]
    assert changes == ([("trainer.max_steps", 10, 30)] if refused else [])
    if refused:
        with pytest.raises(ResumeError, match=r"not trainer\.max_steps: optim\.schedule decays"):
            check_compatible(saved, after, Path("x.pt"))  # type: ignore[arg-type]


def test_resume_refuses_a_config_of_another_schema() -> None:
    with pytest.raises(ResumeError, match=r"x\.pt: its config does not fit .* 'nonsense'"):
        check_compatible({"model": {"nonsense": 1}}, TrainConfig(), Path("x.pt"))


def test_resume_with_safe_changes_and_moved_data(straight: Straight, tmp_path: Path) -> None:
    run_dir = copy_run(straight, tmp_path)
    moved = shutil.copytree(straight.data, tmp_path / "moved")
    cfg = compose_train(
        [
            *straight.overrides,
            f"data.root={moved}",
            "trainer.max_steps=14",
            "trainer.log_every=1",
            "decode=beam",
            "decode.beam_size=2",
        ]
    )
    train(cfg, run_dir)
    assert step_of(run_dir / "checkpoints" / "last.pt") == 14
    log = read_step_log(run_dir / LOG_NAME)
    assert log[: len(straight.log())] == straight.log()
    assert [r["step"] for r in log[len(straight.log()) :]] == [13, 14, 14]


def test_resume_refuses_changed_data(straight: Straight, tmp_path: Path) -> None:
    run_dir = copy_run(straight, tmp_path)
    data = shutil.copytree(straight.data, tmp_path / "data")
    lines = (data / "train.de").read_text(encoding="utf-8").splitlines()
    lines[4] = "dreizehn"
    (data / "train.de").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ResumeError, match=r"data under .* changed"):
        train(compose_train([*straight.overrides, f"data.root={data}"]), run_dir)


def test_resume_never_refuses_a_dir_with_checkpoints(straight: Straight, tmp_path: Path) -> None:
    run_dir = copy_run(straight, tmp_path)
    with pytest.raises(ResumeError, match="already holds checkpoints"):
        train(compose_train([*straight.overrides, "trainer.resume=never"]), run_dir)


def test_second_run_on_the_same_dir_fails_at_once(straight: Straight, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from seq2seq.train.rundir import RunLock; "
            "lock = RunLock(Path(sys.argv[1])).__enter__(); "
            "print('locked', flush=True); time.sleep(600)",
            str(run_dir),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirError) as err:
            train(straight.cfg, run_dir)
        assert str(run_dir) in str(err.value)
        assert f"pid {holder.pid}" in str(err.value)
        assert not (run_dir / "checkpoints").exists()  # failed before anything else
    finally:
        holder.kill()
        holder.wait()


def test_python_random_state_is_stored_as_plain_values(tmp_path: Path) -> None:
    random.seed(7)
    torch.manual_seed(7)
    state = rng_state()
    python = state["python"]
    assert isinstance(python["internal"], list)
    assert all(type(x) is int for x in python["internal"])
    save_checkpoint({"model": {}, "rng": state}, tmp_path / "rng.pt")
    want = (random.random(), torch.rand(3))
    random.seed(1)
    torch.manual_seed(1)
    restore_rng(load_checkpoint(tmp_path / "rng.pt")["rng"])  # weights_only=True loads it
    got = (random.random(), torch.rand(3))
    assert got[0] == want[0]
    assert torch.equal(got[1], want[1])


def test_a_cpu_runs_random_state_holds_no_cuda_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches a CPU run's checkpoint that stores CUDA's generators when anything else in the
    process has started CUDA (seen on a GPU machine: a resumed run's checkpoint then lacked
    the key its straight twin had, and resumes were no longer identical)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert set(rng_state()) == {"python", "torch"}
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [torch.zeros(4)])
    assert set(rng_state(cuda=True)) == {"python", "torch", "cuda"}


def test_make_resume_reuses_the_saved_overrides(tmp_path: Path) -> None:
    (tmp_path / ".hydra").mkdir()  # Hydra's copy: rewritten by every start, refused ones too
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- model=small\n- +trainer.seed=2\n")
    assert saved_overrides(tmp_path) == ["model=small", "+trainer.seed=2"]
    record_overrides(tmp_path, ["model=tiny", "data.root=a b,c"])  # the last accepted start's
    assert saved_overrides(tmp_path) == ["model=tiny", "data.root=a b,c"]
    merged = merge_overrides(saved_overrides(tmp_path), ["model=base", "trainer.max_steps=9"])
    assert merged == ["data.root=a b,c", "model=base", "trainer.max_steps=9"]
    assert merge_overrides(["+a=1", "b=2"], ["a=3"]) == ["b=2", "a=3"]
    with pytest.raises(ResumeError, match=r"overrides\.yaml not found"):
        saved_overrides(tmp_path / "elsewhere")


def test_a_refused_start_keeps_the_overrides_to_resume_with(
    straight: Straight, tmp_path: Path
) -> None:
    run_dir = copy_run(straight, tmp_path)
    record_overrides(run_dir, straight.overrides)
    with pytest.raises(ResumeError):
        train(
            compose_train([*straight.overrides, "model.d_ff=128"]),
            run_dir,
            [*straight.overrides, "model.d_ff=128"],
        )
    assert saved_overrides(run_dir) == straight.overrides
