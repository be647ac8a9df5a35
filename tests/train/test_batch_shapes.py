"""trainer.batch_shapes=fixed (seq2seq/data/buckets.py) and trainer.compile on it: padding a
batch to its fixed shape changes neither the loss nor the gradients, the run logs each epoch's
shapes and share of real tokens, resumes exactly, and (slow) a compiled run compiles one graph
per shape and trains like eager on the same batches."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch

from seq2seq import kernels
from seq2seq.config.schema import BatchShapes, PosKind, TrainerConfig, fixed_shapes
from seq2seq.data.batching import Batch, collate
from seq2seq.data.buckets import pad_batch
from seq2seq.train.compiled import WarmUp
from seq2seq.train.run import train
from seq2seq.train.steplog import LOG_NAME, read_step_log
from tests.conftest import MakeModel
from tests.tiny_run import assert_same_weights, compose_train, tiny_overrides, write_slice

KINDS = [PosKind.sinusoidal, PosKind.learned, PosKind.rope, PosKind.alibi, PosKind.t5_bias]


def toy_batch() -> Batch:
    """Three pairs of different lengths, the shortest source and target in different rows."""
    src = [[4, 5, 6, 7, 8], [9, 10], [11, 12, 13]]
    tgt = [[14, 15], [16, 17, 18, 19, 20, 21], [22, 23, 4]]
    return collate([0, 1, 2], src, tgt)


def loss_and_grads(model: torch.nn.Module, batch: Batch, all_positions: bool) -> list[torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss, nll = model(batch.src, batch.tgt_in, batch.tgt_out, 0.1, 0.0, all_positions)
    loss.backward()
    return [loss.detach(), nll, *(p.grad for p in model.parameters())]


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.value)
@pytest.mark.parametrize("mode", kernels.MODES)
@pytest.mark.parametrize("all_positions", [False, True], ids=["real_rows", "all_positions"])
def test_padding_to_a_fixed_shape_changes_no_loss_or_gradient(
    kind: PosKind, mode: str, all_positions: bool, make_model: MakeModel
) -> None:
    """Catches padding or filler rows that leak into the loss or the gradients (an unmasked key,
    a label on a padded position, a filler row without a key: NaN), and a compiled step's
    all-positions loss that counts padded labels: the batch padded to 6 rows, sources of 9 and
    targets of 10 gives the unpadded batch's summed loss, NLL and every parameter's gradient,
    to float rounding, in both kernel modes."""
    model = make_model(kind, layers=2).train()  # no dropout: the same function both times
    batch = toy_batch()
    padded = pad_batch(batch, rows=6, src_len=9, tgt_len=10)
    with kernels.use(mode):
        want = loss_and_grads(model, batch, all_positions=False)
        got = loss_and_grads(model, padded, all_positions)
    for g, w in zip(got, want, strict=True):
        # float rounding differs by CPU: 1e-5 / 1e-6 failed by 2.5e-5 on the H200 machine's CPU
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_auto_fixes_the_shapes_with_compile_only() -> None:
    assert fixed_shapes(TrainerConfig()) == 0
    assert fixed_shapes(TrainerConfig(compile=True)) == 8
    assert fixed_shapes(TrainerConfig(compile=True, batch_shapes=BatchShapes.exact)) == 0
    assert fixed_shapes(TrainerConfig(batch_shapes=BatchShapes.fixed, shape_buckets=3)) == 3


def test_warm_up_logs_the_steps_that_meet_a_new_shape(caplog: pytest.LogCaptureFixture) -> None:
    """Catches a warm-up that counts every step, misses a shape met inside a group of
    accumulated batches, or ignores the precision (another graph): the steps with a new
    (precision, shape) are logged and summed, the others not; nothing without compile."""
    caplog.set_level(logging.INFO, logger="seq2seq.train.compiled")
    a, b = toy_batch(), pad_batch(toy_batch(), rows=4, src_len=9, tgt_len=10)
    warmup = WarmUp(enabled=True)
    steps = [([a], "fp32"), ([a], "fp32"), ([a, b], "fp32"), ([b], "fp32"), ([a], "bf16")]
    for i, (group, precision) in enumerate(steps, 1):
        with warmup.step(group, precision, i):
            pass
    logged = [r.getMessage() for r in caplog.records]
    assert [m.split(":")[0] for m in logged] == ["step 1", "step 3", "step 5"]
    assert len(warmup.seen) == 3
    off = WarmUp(enabled=False)
    with off.step([a], "fp32", 1):
        pass
    assert not off.seen
    assert len(caplog.records) == 3


FIXED = ("trainer.batch_shapes=fixed", "model.dropout=0.0")


def tiny_run(tmp_path: Path, *extra: str) -> tuple[list[str], Path]:
    data = tmp_path / "data"
    if not data.exists():
        write_slice(data)
    return tiny_overrides(data, tmp_path / "cache", *extra), tmp_path / "run"


def test_fixed_shapes_train_log_their_shapes_and_resume_exactly(tmp_path: Path) -> None:
    """Catches an epoch record that is missing or wrong, steps whose padding_efficiency counts
    filler rows as real, and fixed shapes that a resumed run would not reproduce: the log has
    one record per epoch (at most 3 shapes, the real share below 1 and at most the exact
    shapes'), and a run stopped at step 8 and resumed ends with the straight run's weights and
    log."""
    overrides, run_dir = tiny_run(tmp_path, *FIXED, "trainer.shape_buckets=3")
    train(compose_train(overrides), run_dir)
    log = read_step_log(run_dir / LOG_NAME)
    epochs = [r for r in log if r["type"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [0, 1]  # 12 steps of ~10 batches an epoch
    assert all(r["shapes"] <= 3 for r in epochs)
    exact_dir = tmp_path / "exact"
    exact = [*tiny_run(tmp_path)[0], "trainer.max_steps=1"]
    train(compose_train(exact), exact_dir)
    exact_epoch = next(r for r in read_step_log(exact_dir / LOG_NAME) if r["type"] == "epoch")
    assert epochs[0]["padding_efficiency"] < exact_epoch["padding_efficiency"] <= 1
    steps = [r["padding_efficiency"] for r in log if r["type"] == "train"]
    assert all(0 < share < 1 for share in steps)
    split = tmp_path / "split"  # stopped at step 8, then resumed to 12
    train(compose_train([*overrides, "trainer.max_steps=8"]), split)
    train(compose_train(overrides), split)
    last = "checkpoints/last.pt"
    assert_same_weights(run_dir / last, split / last)
    assert read_step_log(split / LOG_NAME) == log


@pytest.mark.slow  # torch.compile of 1 or 2 shapes, forward and backward: ~1-2 min on 2 cores
def test_compiled_fixed_shapes_compile_once_per_shape_and_train_like_eager(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Catches a compiled step that recompiles for batches of one shape (a shape that depends on
    the data: the real labels' count) or computes another loss: over 6 steps on at most 2
    fixed shapes, Dynamo compiles one graph per shape the steps met (the warm-up log's first
    steps) and the losses are eager's on the same batches."""
    from torch._dynamo.utils import counters

    caplog.set_level(logging.INFO, logger="seq2seq.train.compiled")
    extra = (*FIXED, "trainer.shape_buckets=2", "trainer.max_steps=6", "trainer.valid_every=6")
    losses = {}
    for name in ("eager", "compiled"):
        overrides = tiny_run(tmp_path, *extra, f"trainer.compile={name == 'compiled'}")[0]
        torch._dynamo.reset()
        counters.clear()
        train(compose_train(overrides), tmp_path / name)
        records = read_step_log(tmp_path / name / LOG_NAME)
        losses[name] = [r["loss"] for r in records if r["type"] == "train"]
    assert len(losses["compiled"]) == 6
    assert losses["compiled"] == pytest.approx(losses["eager"], rel=1e-4)
    firsts = [r for r in caplog.records if "first step of batch shape" in r.getMessage()]
    assert 1 <= len(firsts) <= 2
    assert counters["stats"]["unique_graphs"] == len(firsts), json.dumps(dict(counters["stats"]))
