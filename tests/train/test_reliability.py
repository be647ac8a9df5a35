"""Faults other than interruption (docs/RELIABILITY.md): non-finite losses, early stopping,
checkpoint averaging, unusable run directories and failing saves, and bad input to training and
translation. Each test shows the behaviour and the message a user gets."""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import pickle
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import seq2seq.cli.translate
import seq2seq.train.rundir
from seq2seq.cli.average import average
from seq2seq.config.checks import check_config
from seq2seq.config.commands import AverageConfig, TranslateConfig
from seq2seq.config.schema import SearchKind, TokenizerConfig, TokenizerKind
from seq2seq.data.text import DataError
from seq2seq.data.tokenizer import UNK_ID, build_vocab
from seq2seq.decode.load import load_for_inference
from seq2seq.errors import ConfigError
from seq2seq.train.build import build_trainer
from seq2seq.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from seq2seq.train.corpus import load_corpus
from seq2seq.train.run import train
from seq2seq.train.rundir import RunDirError
from seq2seq.train.steplog import LOG_NAME, read_step_log
from seq2seq.train.testing import validate_checkpoint
from seq2seq.train.trainer import NonFiniteLossError, Trainer
from tests.tiny_run import (
    REPO,
    child_env,
    compose_train,
    run_cli,
    tiny_overrides,
    write_slice,
)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with the data slice (root/data) and a tokenizer cache shared by the module."""
    root = tmp_path_factory.mktemp("reliability")
    write_slice(root / "data")
    return root


def overrides(root: Path, *extra: str) -> list[str]:
    return tiny_overrides(root / "data", root / "tokenizers", *extra)


@pytest.fixture(scope="module")
def averaged_run(root: Path) -> Path:
    """The tiny run with trainer.average_last=2 (steps 8 and 12 are averaged)."""
    train(compose_train(overrides(root, "trainer.average_last=2")), root / "averaged")
    return root / "averaged"


def model_of(path: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(path)["model"]


def mean_of(*paths: Path) -> dict[str, torch.Tensor]:
    models = [model_of(p) for p in paths]
    return {k: (sum(m[k].double() for m in models) / len(models)).float() for k in models[0]}


def assert_models_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


# --------------------------------------------------------------------------- averaging


def test_average_last_scores_best_and_average(averaged_run: Path) -> None:
    ckpts = averaged_run / "checkpoints"
    summary = json.loads((averaged_run / "results.json").read_text())
    assert summary["averaged"] == ["step_8.pt", "step_12.pt"]
    assert summary["test_average"]["test"]["n"] == summary["test"]["test"]["n"] == 20
    assert_models_equal(
        model_of(ckpts / "average.pt"), mean_of(ckpts / "step_8.pt", ckpts / "step_12.pt")
    )
    average, last = model_of(ckpts / "average.pt"), model_of(ckpts / "step_12.pt")
    assert any(not torch.equal(average[k], last[k]) for k in last)
    hyps = (averaged_run / "test.average.hyp").read_text(encoding="utf-8").splitlines()
    assert len(hyps) == 20


def test_average_last_validates_the_average_and_records_the_runs_model(
    averaged_run: Path, root: Path, tmp_path: Path
) -> None:
    """results.json holds average.pt's validation, measured as best.pt's was in training, beside
    the run's model: average.pt, since the run made its planned steps."""
    ckpts = averaged_run / "checkpoints"
    summary = json.loads((averaged_run / "results.json").read_text())
    (tmp_path / "check").mkdir()
    trainer = build_trainer(compose_train(overrides(root)), tmp_path / "check")
    try:
        average = validate_checkpoint(trainer, ckpts / "average.pt")
        best = validate_checkpoint(trainer, ckpts / "best.pt")
    finally:
        trainer.close()
    assert summary["valid_average"] == pytest.approx(average)
    assert {k: summary["best_valid"][k] for k in best} == pytest.approx(best)
    assert average["loss"] != pytest.approx(best["loss"])  # two models, two measurements
    assert summary["steps"] == 12  # the run made its max_steps: the average, whatever val says
    assert summary["chosen"] == {
        "checkpoint": "average.pt",
        "rule": "completed: the average",
        "metric": "bleu",
        "best": summary["best_valid"]["bleu"],
        "average": average["bleu"],
    }


def test_average_last_must_be_kept(root: Path) -> None:
    cfg = compose_train(overrides(root, "trainer.average_last=4", "trainer.keep_last=3"))
    with pytest.raises(ValueError, match=r"trainer\.keep_last=3 .* trainer\.average_last \(4\)"):
        check_config(cfg)


def test_seq2seq_average(averaged_run: Path, tmp_path: Path) -> None:
    ckpts = averaged_run / "checkpoints"
    average(AverageConfig(out=str(tmp_path / "a.pt"), run=str(averaged_run), last=2))
    pair = [str(ckpts / "step_8.pt"), str(ckpts / "step_12.pt")]
    average(AverageConfig(out=str(tmp_path / "b.pt"), ckpts=pair))
    assert_models_equal(model_of(tmp_path / "a.pt"), model_of(ckpts / "average.pt"))
    assert_models_equal(model_of(tmp_path / "b.pt"), model_of(ckpts / "average.pt"))
    # the checkpoints/ folder itself names the run as well
    average(AverageConfig(out=str(tmp_path / "c.pt"), run=str(ckpts), last=3))
    three = mean_of(ckpts / "step_4.pt", ckpts / "step_8.pt", ckpts / "step_12.pt")
    assert_models_equal(model_of(tmp_path / "c.pt"), three)
    # a normal checkpoint for translation, but not one to resume training from
    cfg = TranslateConfig(ckpt=str(tmp_path / "a.pt"), device="cpu")
    assert len(seq2seq.cli.translate.translate_lines(cfg, ["seven", "", "twelve"])) == 3
    resume = compose_train(overrides(averaged_run.parent, f"trainer.resume={tmp_path / 'a.pt'}"))
    with pytest.raises(CheckpointError, match="no optimizer"):
        train(resume, tmp_path / "run")


def test_seq2seq_average_errors(averaged_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "x.pt"
    with pytest.raises(CheckpointError, match="fewer than the 5 asked for"):
        average(AverageConfig(out=str(out), run=str(averaged_run), last=5))
    with pytest.raises(CheckpointError, match="no such run folder"):
        average(AverageConfig(out=str(out), run=str(tmp_path / "missing"), last=2))
    with pytest.raises(CheckpointError, match="at least 1, got 0"):
        average(AverageConfig(out=str(out), run=str(averaged_run), last=0))
    with pytest.raises(ConfigError, match=r"run=DIR \(with last=N\) or ckpts="):
        average(AverageConfig(out=str(out)))
    step = averaged_run / "checkpoints" / "step_8.pt"
    with pytest.raises(ConfigError, match="run=DIR"):
        average(AverageConfig(out=str(out), run=str(averaged_run), ckpts=[str(step)]))
    with pytest.raises(CheckpointError, match="overwrite one of the checkpoints averaged"):
        average(AverageConfig(out=str(step), ckpts=[str(step)]))
    (tmp_path / "bad.pt").write_bytes(b"junk")
    with pytest.raises(CheckpointError, match=r"bad\.pt: cannot be loaded safely"):
        average(AverageConfig(out=str(out), ckpts=[str(step), str(tmp_path / "bad.pt")]))
    assert not out.exists()


def average_script(*args: str) -> subprocess.CompletedProcess[str]:
    """seq2seq-average as a user runs it (this checkout's package)."""
    return subprocess.run(
        [sys.executable, "-m", "seq2seq.cli.average", *args],
        cwd=REPO,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_seq2seq_average_console_script(averaged_run: Path, tmp_path: Path) -> None:
    """As a user runs it: one line and exit status 1 on bad input, the file on good input."""
    done = average_script(f"run={averaged_run}", "last=9", f"out={tmp_path / 'x.pt'}")
    assert done.returncode == 1
    assert "fewer than the 9 asked for" in done.stderr
    assert "Traceback" not in done.stderr
    done = average_script(f"run={averaged_run}", "last=2", f"out={tmp_path / 'y.pt'}")
    assert done.returncode == 0, done.stderr
    ckpts = averaged_run / "checkpoints"
    assert_models_equal(model_of(tmp_path / "y.pt"), model_of(ckpts / "average.pt"))


# --------------------------------------------------------------------------- non-finite loss


def poison(monkeypatch: pytest.MonkeyPatch, calls: set[int] | None, value: float) -> None:
    """Multiply the training loss by `value` (NaN or inf) on the given 1-based calls of
    Trainer.batch_loss (all calls from min(calls) on when `calls` has one element < 0)."""
    original = Trainer.batch_loss
    count = {"n": 0}

    def batch_loss(self: Trainer, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        count["n"] += 1
        loss, nll = original(self, batch)
        hit = count["n"] in calls if calls is not None else True
        return (loss * value, nll) if hit else (loss, nll)

    monkeypatch.setattr(Trainer, "batch_loss", batch_loss)


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_nonfinite_loss_skips_the_step(
    root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    value: float,
) -> None:
    poison(monkeypatch, {3, 7}, value)
    cfg = compose_train(overrides(root))
    trainer = build_trainer(cfg, tmp_path)
    trainer.fit()
    trainer.close()
    s = trainer.state
    assert (s.step, s.skipped_steps, s.bad_streak) == (12, 2, 0)
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())
    adam_steps = {float(st["step"]) for st in trainer.optimizer.state.values()}
    assert adam_steps == {12.0}
    assert trainer.scheduler.last_epoch == 12  # skipped, not stepped
    skips = [r for r in read_step_log(tmp_path / LOG_NAME) if r["type"] == "skip"]
    assert [(r["step"], r["streak"]) for r in skips] == [(2, 1), (5, 1)]
    assert {r["loss"] for r in skips} == {str(value)}
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert sum("optimizer step skipped" in w for w in warnings) == 2
    board = EventAccumulator(str(tmp_path / "tb"))
    board.Reload()
    assert [(e.step, e.value) for e in board.Scalars("train/skipped_steps")] == [(2, 1), (5, 2)]
    # a checkpoint with non-finite weights is never written
    before = (tmp_path / "checkpoints" / "last.pt").read_bytes()
    with torch.no_grad():
        next(trainer.model.parameters()).fill_(math.nan)
    with pytest.raises(NonFiniteLossError, match="not finite"):
        trainer.save(best=True)
    assert (tmp_path / "checkpoints" / "last.pt").read_bytes() == before


def test_repeated_nonfinite_loss_stops_with_intact_checkpoint(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    poison(monkeypatch, set(range(6, 100)), math.nan)
    cfg = compose_train(overrides(root, "trainer.max_bad_steps=3"))
    with pytest.raises(NonFiniteLossError) as err:
        train(cfg, tmp_path)
    last = tmp_path / "checkpoints" / "last.pt"
    assert "3 consecutive steps" in str(err.value)
    assert "max_bad_steps=3" in str(err.value)
    assert f"{last} (step 4) is intact" in str(err.value)
    state = load_checkpoint(last)
    assert state["train_state"]["step"] == 4
    assert all(torch.isfinite(t).all() for t in state["model"].values())
    assert sorted(p.name for p in last.parent.iterdir()) == ["best.pt", "last.pt", "step_4.pt"]
    log = read_step_log(tmp_path / LOG_NAME)
    assert [r["type"] for r in log[-3:]] == ["skip"] * 3
    assert log[-4]["step"] == 5


# --------------------------------------------------------------------------- early stopping


def scripted_bleu(monkeypatch: pytest.MonkeyPatch, script: dict[int, float]) -> None:
    """Validation BLEU by step, as given (0 for steps not in `script`)."""

    def validate(self: Trainer) -> dict[str, float]:
        return {"loss": 1.0, "ppl": math.e, "bleu": script.get(self.state.step, 0.0)}

    monkeypatch.setattr(Trainer, "validate", validate)


BLEU = {2: 10.0, 4: 12.0, 6: 11.0, 8: 12.0, 10: 30.0}  # no gain at 6 and 8 (equal is no gain)
PATIENCE = ["trainer.valid_every=2", "trainer.max_steps=20", "trainer.patience=2"]


def valid_records(run_dir: Path) -> list[tuple[int, float, int]]:
    log = read_step_log(run_dir / LOG_NAME)
    return [
        (r["step"], r["best_score"], r["stale_validations"]) for r in log if r["type"] == "valid"
    ]


def test_early_stopping(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    scripted_bleu(monkeypatch, BLEU)
    train(compose_train(overrides(root, *PATIENCE)), tmp_path)
    assert valid_records(tmp_path) == [(2, 10.0, 0), (4, 12.0, 0), (6, 12.0, 1), (8, 12.0, 2)]
    assert load_checkpoint(tmp_path / "checkpoints" / "best.pt")["train_state"]["step"] == 4
    messages = [r.getMessage() for r in caplog.records]
    assert any(
        "early stopping: no BLEU gain in 2 validations" in m and "step 4" in m for m in messages
    )
    assert any(
        "(best BLEU 12.00 at step 4; 2 without BLEU gain, patience 2)" in m for m in messages
    )


def test_early_stopping_state_survives_resume(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted_bleu(monkeypatch, BLEU)
    train(compose_train(overrides(root, *PATIENCE, "trainer.max_steps=6")), tmp_path)
    assert valid_records(tmp_path)[-1] == (6, 12.0, 1)
    train(compose_train(overrides(root, *PATIENCE)), tmp_path)  # resumes, stops at 8 (not 20)
    assert valid_records(tmp_path) == [(2, 10.0, 0), (4, 12.0, 0), (6, 12.0, 1), (8, 12.0, 2)]
    log_before = read_step_log(tmp_path / LOG_NAME)
    train(compose_train(overrides(root, *PATIENCE)), tmp_path)  # already stopped: no training
    assert read_step_log(tmp_path / LOG_NAME) == log_before


def scripted_metrics(monkeypatch: pytest.MonkeyPatch, loss: dict[int, float]) -> None:
    """Validation loss by step as given, BLEU and chrF rising with the step."""

    def validate(self: Trainer) -> dict[str, float]:
        step = self.state.step
        return {"loss": loss[step], "ppl": math.exp(loss[step]), "bleu": step, "chrf": 2 * step}

    monkeypatch.setattr(Trainer, "validate", validate)


LOSS = {2: 3.0, 4: 2.0, 6: 2.5, 8: 2.0, 10: 1.0}  # no decrease at 6 and 8 (equal is none)


@pytest.mark.parametrize(
    ("metric", "best_step", "last_step"), [("loss", 4, 8), ("bleu", 10, 10), ("chrf", 10, 10)]
)
def test_best_metric_chooses_best_pt_and_drives_early_stopping(
    root: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    metric: str,
    best_step: int,
    last_step: int,
) -> None:
    caplog.set_level(logging.INFO)
    scripted_metrics(monkeypatch, LOSS)
    args = overrides(root, *PATIENCE, "trainer.max_steps=10", f"trainer.best_metric={metric}")
    train(compose_train(args), tmp_path)
    best = load_checkpoint(tmp_path / "checkpoints" / "best.pt")["train_state"]
    assert (best["step"], best["best_metric"], best["best_step"]) == (best_step, metric, best_step)
    log = [r for r in read_step_log(tmp_path / LOG_NAME) if r["type"] == "valid"]
    assert log[-1]["step"] == last_step
    results = json.loads((tmp_path / "results.json").read_text())
    at_best = {k: log[best_step // 2 - 1][k] for k in ("loss", "ppl", "bleu", "chrf")}
    assert results["best_valid"] == {"metric": metric, "step": best_step, **at_best}
    assert results["best_valid_bleu"] == best_step
    if metric == "loss":
        messages = [r.getMessage() for r in caplog.records]
        assert any(
            "early stopping: no loss decrease in 2 validations" in m
            and "best loss 2.000 at step 4" in m
            for m in messages
        )


# --------------------------------------------------------------------------- run directory


def test_unwritable_run_dir_fails_before_training(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def read_only(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(seq2seq.train.rundir.tempfile, "NamedTemporaryFile", read_only)
    monkeypatch.setattr(Trainer, "__init__", lambda *a: pytest.fail("training started"))
    with pytest.raises(RunDirError) as err:
        train(compose_train(overrides(root)), tmp_path / "run")
    assert f"{tmp_path / 'run' / 'checkpoints'}: cannot write" in str(err.value)
    assert "Read-only file system" in str(err.value)
    assert "hydra.run.dir" in str(err.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_run_dir(root: Path, tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run").chmod(0o555)
    with pytest.raises(RunDirError, match="run"):
        train(compose_train(overrides(root)), tmp_path / "run")


def test_full_disk_fails_before_training(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        seq2seq.train.rundir.shutil, "disk_usage", lambda path: SimpleNamespace(free=5000)
    )
    monkeypatch.setattr(Trainer, "__init__", lambda *a: pytest.fail("training started"))
    with pytest.raises(RunDirError, match=r"checkpoints: only 0\.0 MiB free.* a checkpoint"):
        train(compose_train(overrides(root)), tmp_path / "run")


def test_failing_save_keeps_the_previous_checkpoint(
    root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_save, calls = torch.save, {"n": 0}

    def save(obj: object, f: Any, *args: Any, **kwargs: Any) -> None:
        calls["n"] += 1
        if calls["n"] > 3:  # the second validation's writes fail: disk full
            f.write(b"PK\x03\x04 part of a checkpoint")
            raise OSError(errno.ENOSPC, "No space left on device")
        real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)
    with pytest.raises(CheckpointError) as err:
        train(compose_train(overrides(root)), tmp_path)
    ckpts = tmp_path / "checkpoints"
    assert str(err.value).startswith(f"{ckpts / 'step_8.pt'}: cannot write the checkpoint (No")
    assert f"Free space in {ckpts}" in str(err.value)
    monkeypatch.undo()
    assert load_checkpoint(ckpts / "last.pt")["train_state"]["step"] == 4
    assert sorted(p.name for p in ckpts.iterdir()) == ["best.pt", "last.pt", "step_4.pt"]


# --------------------------------------------------------------------------- bad input: training


def bad_data(tmp_path: Path, case: str) -> Path:
    """A copy of the data slice with one fault."""
    data = tmp_path / "data"
    write_slice(data)
    if case == "mismatched line counts":
        lines = (data / "train.de").read_text(encoding="utf-8").splitlines()
        (data / "train.de").write_text("\n".join(lines[:-1]) + "\n", encoding="utf-8")
    elif case == "missing split":
        (data / "valid.en").unlink()
    elif case == "missing language":
        (data / "test.de").unlink()
    elif case == "empty file":
        (data / "valid.de").write_bytes(b"")
    elif case == "invalid UTF-8":
        (data / "train.en").write_bytes((data / "train.en").read_bytes() + b"caf\xe9\n")
        (data / "train.de").write_bytes((data / "train.de").read_bytes() + b"cafe\n")
    return data


@pytest.mark.parametrize(
    ("case", "match"),
    [
        ("mismatched line counts", r"line counts differ: .*train\.en has 150 lines"),
        ("missing split", r"no data file for split 'valid', language 'en'"),
        ("missing language", r"no data file for split 'test', language 'de'"),
        ("empty file", r"valid\.de: file is empty"),
        ("invalid UTF-8", r"train\.en:151: invalid UTF-8"),
    ],
)
def test_bad_training_data_is_named(root: Path, tmp_path: Path, case: str, match: str) -> None:
    data = bad_data(tmp_path, case)
    cfg = compose_train(overrides(root, f"data.root={data}"))
    with pytest.raises(DataError, match=match):
        train(cfg, tmp_path / "run")
    assert list((tmp_path / "run" / "checkpoints").iterdir()) == []


def test_cli_prints_the_error_without_a_traceback(root: Path, tmp_path: Path) -> None:
    data = bad_data(tmp_path, "missing split")
    done = run_cli(overrides(root, f"data.root={data}"), tmp_path / "run")
    assert done.returncode == 1
    assert "error: DataError: no data file for split 'valid'" in done.stderr
    assert "Traceback" not in done.stderr + done.stdout


def test_empty_and_overlong_training_lines_are_dropped_and_counted(
    root: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    data = write_slice(tmp_path / "data")
    src = (data / "train.en").read_text(encoding="utf-8").splitlines()
    tgt = (data / "train.de").read_text(encoding="utf-8").splitlines()
    src[2], tgt[5], src[9], tgt[9] = "", "   \t ", " ".join(["seven"] * 10_000), "sieben"
    (data / "train.en").write_text("\n".join(src) + "\n", encoding="utf-8")
    (data / "train.de").write_text("\n".join(tgt) + "\n", encoding="utf-8")
    cfg = compose_train(overrides(root, f"data.root={data}", "tokenizer=word"))
    corpus = load_corpus(cfg)
    assert len(corpus.train) == 147
    refs = corpus.train.epoch_batches(0)
    assert max(corpus.train.collate(r).src.shape[1] for r in refs) <= 64 + 1
    want = "train: kept 147/150 pairs; removed 2 empty (lines 3, 6), 1 over-long (> 64 tokens)"
    assert any(r.getMessage() == f"{want} (lines 10)" for r in caplog.records)


def test_tokenizer_cache_is_never_unpickled(root: Path, tmp_path: Path) -> None:
    class Payload:
        def __reduce__(self) -> tuple[object, tuple[str, str]]:
            return (open, (str(tmp_path / "pwned"), "w"))

    cfg = compose_train(overrides(root, f"tokenizer.cache_dir={tmp_path / 'cache'}"))
    cfg.data.cache_dir = str(tmp_path / "prepared")  # trains tokenizers: no prepared data yet
    for kind in ("bpe", "word"):
        cfg.tokenizer = TokenizerConfig(
            TokenizerKind(kind), vocab_size=200, cache_dir=str(tmp_path / "cache")
        )
        load_corpus(cfg)
    assert len(list((tmp_path / "cache").iterdir())) == 2
    for path in (tmp_path / "cache").iterdir():
        path.write_bytes(pickle.dumps(Payload()))
    for kind in ("bpe", "word"):
        cfg.tokenizer = TokenizerConfig(
            TokenizerKind(kind), vocab_size=200, cache_dir=str(tmp_path / "cache")
        )
        cfg.data.cache_dir = str(tmp_path / f"prepared-{kind}")  # prepared again: trains
        with pytest.raises(ValueError, match=f"cached tokenizer under {tmp_path / 'cache'}"):
            load_corpus(cfg)
    assert not (tmp_path / "pwned").exists()


# --------------------------------------------------------------------------- bad input: translation


def translate_cfg(averaged_run: Path, tmp_path: Path, lines: list[str] | None) -> TranslateConfig:
    source = tmp_path / "in.txt"
    source.write_text("".join(x + "\n" for x in lines or []), encoding="utf-8")
    best = averaged_run / "checkpoints" / "best.pt"
    return TranslateConfig(
        ckpt=str(best), input=str(source), output=str(tmp_path / "out.txt"), device="cpu"
    )


def output_lines(tmp_path: Path) -> list[str]:
    return (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()


def test_translate_truncates_an_overlong_line_with_a_warning(
    averaged_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = translate_cfg(averaged_run, tmp_path, ["seven", " ".join(["seven"] * 10_000), "two"])
    cfg.decode.method = SearchKind.greedy
    seq2seq.cli.translate.run(cfg)
    assert len(output_lines(tmp_path)) == 3
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("1 input lines exceed 64 tokens" in w and "lines 2" in w for w in warnings)


def test_translate_empty_input_gives_empty_output(
    averaged_run: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    cfg = translate_cfg(averaged_run, tmp_path, None)
    assert (tmp_path / "in.txt").read_bytes() == b""
    seq2seq.cli.translate.run(cfg)
    assert (tmp_path / "out.txt").read_bytes() == b""
    assert any("is empty: the output is empty too" in r.getMessage() for r in caplog.records)
    cfg.ckpt = str(tmp_path / "missing.pt")  # a bad checkpoint is reported all the same
    with pytest.raises(CheckpointError, match=r"missing\.pt"):
        seq2seq.cli.translate.run(cfg)


def test_translate_unseen_characters_become_unk(averaged_run: Path, tmp_path: Path) -> None:
    lines = ["seven ☃ 𝔘 zwölf", "日本語", "twelve"]  # noqa: RUF001 - unseen characters, on purpose
    cfg = translate_cfg(averaged_run, tmp_path, lines)
    _model, src_tok, _, _ = load_for_inference(cfg.ckpt, "cpu")
    assert all(UNK_ID in src_tok.encode(line) for line in lines[:2])
    seq2seq.cli.translate.run(cfg)
    assert len(output_lines(tmp_path)) == 3


def score_checkpoint_whose_vocabulary_does_not_fit(averaged_run: Path, tmp_path: Path) -> None:
    state = load_checkpoint(averaged_run / "checkpoints" / "best.pt")
    other = build_vocab("word", ["a b c"], vocab_size=10).state()
    state["tokenizers"] = {"src": other, "tgt": other}
    save_checkpoint(state, tmp_path / "mixed.pt")
    cfg = translate_cfg(averaged_run, tmp_path, ["seven"])
    cfg.ckpt = str(tmp_path / "mixed.pt")
    with pytest.raises(CheckpointError, match=r"mixed\.pt: its weights do not fit .* vocabulary"):
        seq2seq.cli.translate.run(cfg)
    assert not (tmp_path / "out.txt").exists()


@pytest.fixture(autouse=True)
def _no_stray_signal_handlers() -> Iterator[None]:
    before = signal.getsignal(signal.SIGTERM)
    yield
    assert signal.getsignal(signal.SIGTERM) == before
