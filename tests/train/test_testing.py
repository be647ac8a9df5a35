"""train/testing.py's choice of the run's model: average.pt for a run that made its planned steps;
for one stopped early, average.pt only where the validation set finds it strictly better than
best.pt by trainer.best_metric (the test sets choose nothing)."""

from __future__ import annotations

import logging

import pytest

from seq2seq.config.schema import TrainerConfig
from seq2seq.train.checkpoint import TrainState
from seq2seq.train.testing import choose_checkpoint, completed

EARLY = "stopped early: the better on val"
COMPLETED = "completed: the average"


def state(metric: str, best: float | None) -> TrainState:
    return TrainState(best_metric=metric, best_score=best, best_step=1348)


def valid(metric: str, average: float) -> dict[str, float]:
    return {"loss": 9.0, "bleu": 0.0, "chrf": 0.0, metric: average}


@pytest.mark.parametrize(
    ("metric", "best", "average", "chosen"),
    [
        ("bleu", 32.96, 33.10, "average.pt"),
        ("bleu", 32.96, 23.50, "best.pt"),  # a run stopped early: the average reaches back
        ("bleu", 32.96, 32.96, "best.pt"),  # a tie keeps best.pt
        ("chrf", 58.0, 58.5, "average.pt"),
        ("loss", 1.80, 1.75, "average.pt"),  # loss: lower is better
        ("loss", 1.80, 1.90, "best.pt"),
        ("bleu", None, 10.0, "best.pt"),  # no validation ever ran: nothing to compare
    ],
)
def test_a_run_stopped_early_takes_the_average_only_where_it_validates_better(
    metric: str, best: float | None, average: float, chosen: str
) -> None:
    choice = choose_checkpoint(state(metric, best), valid(metric, average), done=False)
    assert choice == {
        "checkpoint": chosen,
        "rule": EARLY,
        "metric": metric,
        "best": best,
        "average": average,
    }


@pytest.mark.parametrize(
    ("metric", "best", "average"),
    [
        ("bleu", 41.49, 41.38),  # run 52's margin: best.pt ahead on val by 0.11
        ("bleu", 32.96, 33.10),
        ("loss", 1.80, 1.90),
        ("bleu", None, 10.0),
    ],
)
def test_a_completed_run_takes_the_average_whatever_the_validation(
    metric: str, best: float | None, average: float
) -> None:
    choice = choose_checkpoint(state(metric, best), valid(metric, average), done=True)
    assert choice == {
        "checkpoint": "average.pt",
        "rule": COMPLETED,
        "metric": metric,
        "best": best,
        "average": average,
    }


def test_a_losing_average_is_a_warning_that_names_both_scores(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="seq2seq.train.testing"):
        choose_checkpoint(state("bleu", 32.96), valid("bleu", 23.5), done=False)
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "best.pt" in record.message
    assert EARLY in record.message
    assert "BLEU 23.50" in record.message
    assert "step 1348: BLEU 32.96" in record.message


def test_a_completed_run_logs_its_choice_with_both_validations(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="seq2seq.train.testing"):
        choose_checkpoint(state("bleu", 41.49), valid("bleu", 41.38), done=True)
    (record,) = caplog.records
    assert record.levelno == logging.INFO
    assert f"({COMPLETED}): average.pt" in record.message
    assert "BLEU 41.38" in record.message
    assert "step 1348: BLEU 41.49" in record.message


@pytest.mark.parametrize(
    ("step", "epoch", "done"),
    [
        (8000, 40, True),  # max_steps reached
        (6500, 33, False),  # stopped before: the time cap or patience
        (1200, 100, True),  # max_epochs reached
        (7999, 99, False),
    ],
)
def test_a_run_is_completed_at_max_steps_or_max_epochs(step: int, epoch: int, done: bool) -> None:
    trainer = TrainerConfig(max_steps=8000, max_epochs=100)
    assert completed(TrainState(step=step, epoch=epoch), trainer) is done
