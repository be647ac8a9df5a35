"""When Trainer.fit stops: trainer.max_epochs against the epoch plan's batch counts, and
trainer.max_minutes against a fake clock (no sleeping, no real time measured)."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

import seq2seq.train.trainer
from seq2seq.data.batching import Batch
from seq2seq.train.trainer import Trainer
from tests.train.test_trainer import tiny_trainer, train_records

# the other limits, out of reach of a right run but reached soon by a run whose limit is ignored
LATER = ("trainer.max_steps=60", "trainer.max_epochs=50")


def stop_messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "training stopped at step" in r.getMessage()]


@pytest.mark.parametrize("accum", [1, 3])
def test_max_epochs_trains_every_batch_of_each_epoch_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, accum: int
) -> None:
    """Catches an epoch too many or too few (an off-by-one in the epoch limit), a batch skipped or
    repeated at an epoch's end, and an epoch's last, short group of accum_steps batches dropped:
    the steps per epoch are ceil(batches / accum_steps) of that epoch's plan, and each step's
    target tokens are those of its batches."""
    epochs = 2
    trainer = tiny_trainer(
        tmp_path, *LATER, f"trainer.max_epochs={epochs}", f"trainer.accum_steps={accum}"
    )
    plans = [trainer.train_data.epoch_batches(e) for e in range(epochs)]  # pure in (seed, epoch)
    want_tokens = []  # per step: the target tokens of its group of batches, epoch by epoch
    for plan in plans:
        batches: list[Batch] = [trainer.train_data.read(ref) for ref in plan]
        groups = [batches[i : i + accum] for i in range(0, len(batches), accum)]
        want_tokens += [sum(b.tgt_tokens for b in g) for g in groups]
        assert len(groups) == math.ceil(len(plan) / accum)
    caplog.set_level(logging.INFO, logger="seq2seq")
    trainer.fit()
    trainer.close()
    records = train_records(trainer)
    assert [r["tokens"] for r in records] == want_tokens
    per_epoch = [sum(r["epoch"] == e for r in records) for e in range(epochs + 1)]
    assert per_epoch == [math.ceil(len(plan) / accum) for plan in plans] + [0]
    assert trainer.state.step == len(want_tokens)
    assert trainer.state.epoch == epochs
    assert stop_messages(caplog) == [
        f"training stopped at step {len(want_tokens)}: max_epochs={epochs} reached"
    ]


class FakeClock:
    """time.monotonic for the trainer module: starts at an arbitrary reading and moves only when
    the test advances it."""

    def __init__(self) -> None:
        self.now = 12345.0

    def monotonic(self) -> float:
        return self.now


@pytest.mark.parametrize(("minutes", "seconds_a_step"), [(1.0, 7.0), (0.5, 4.0)])
def test_max_minutes_stops_once_the_clock_passes_the_limit(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    minutes: float,
    seconds_a_step: float,
) -> None:
    """Catches trainer.max_minutes read as seconds (or hours), a limit never checked, and a clock
    started anywhere but at fit's start: each training step takes `seconds_a_step` on a fake
    clock, so fit stops after the first step that ends past the limit."""
    clock = FakeClock()
    monkeypatch.setattr(seq2seq.train.trainer, "time", SimpleNamespace(monotonic=clock.monotonic))
    original = Trainer.train_step

    def timed_step(self: Trainer, group: list[Batch]) -> dict[str, float] | None:
        out = original(self, group)
        clock.now += seconds_a_step
        return out

    monkeypatch.setattr(Trainer, "train_step", timed_step)
    trainer = tiny_trainer(tmp_path, *LATER, f"trainer.max_minutes={minutes}")
    clock.now += 3600.0  # building the trainer took an hour: the limit counts from fit's start
    caplog.set_level(logging.INFO, logger="seq2seq")
    trainer.fit()
    trainer.close()
    # the first n with n * seconds_a_step > 60 * minutes (no tie in these cases)
    steps = math.floor(60 * minutes / seconds_a_step) + 1
    assert steps * seconds_a_step > 60 * minutes >= (steps - 1) * seconds_a_step
    assert trainer.state.step == steps
    assert len(train_records(trainer)) == steps
    assert stop_messages(caplog) == [
        f"training stopped at step {steps}: max_minutes={minutes} reached"
    ]
