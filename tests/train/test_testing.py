"""train/testing.py's choice of the run's model: average.pt only where the validation set finds
it strictly better than best.pt by trainer.best_metric (the test sets choose nothing)."""

from __future__ import annotations

import logging

import pytest

from seq2seq.train.checkpoint import TrainState
from seq2seq.train.testing import choose_checkpoint


def state(metric: str, best: float | None) -> TrainState:
    return TrainState(best_metric=metric, best_score=best, best_step=1348)


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
def test_the_average_is_chosen_only_where_it_validates_better(
    metric: str, best: float | None, average: float, chosen: str
) -> None:
    valid = {"loss": 9.0, "bleu": 0.0, "chrf": 0.0, metric: average}
    choice = choose_checkpoint(state(metric, best), valid)
    assert choice == {"checkpoint": chosen, "metric": metric, "best": best, "average": average}


def test_a_losing_average_is_a_warning_that_names_both_scores(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="seq2seq.train.testing"):
        choose_checkpoint(state("bleu", 32.96), {"loss": 2.0, "bleu": 23.5, "chrf": 50.0})
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "best.pt" in record.message
    assert "BLEU 23.50" in record.message
    assert "step 1348: BLEU 32.96" in record.message
