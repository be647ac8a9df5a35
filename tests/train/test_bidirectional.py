"""Bidirectional training (data.bidirectional_epochs, BiT) in the Trainer, from the command
line's keys: the first epochs hold the reversed pairs too, the run trains through the switch,
and a run resumed before the switch ends bit-identical to the uninterrupted one. The settings it
cannot combine with are refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from seq2seq.config.checks import check_config
from seq2seq.errors import ConfigError
from tests.tiny_run import assert_resume_is_exact, compose_train, tiny_overrides, tiny_trainer

# a budget that gives the slice's epoch ~4 batches, so that 16 steps cross the switch; a
# checkpoint every 2 steps, all kept
BUDGET = "trainer.max_tokens=700"
BIT = [
    "data.bidirectional_epochs=1",
    BUDGET,
    "trainer.max_steps=16",
    "trainer.valid_every=2",
    "trainer.keep_last=10",
]


def test_resumed_run_crosses_the_switch_as_the_straight_one(tmp_path: Path) -> None:
    """16 steps straight (epoch 0 both ways, then source -> target only), against the step-4
    checkpoint (in epoch 0) resumed to 16 in another directory: the same weights, optimizer
    state, counters and log, to the bit."""
    plain = tiny_trainer(tmp_path, "plain", BUDGET)
    straight = tiny_trainer(tmp_path, "straight", *BIT)
    first, second = straight.epoch_batches(0), straight.epoch_batches(1)
    pairs = len(plain.train_data)
    assert straight.train_data.epoch_plan(0).drawn == [pairs, pairs]
    assert straight.train_data.epoch_plan(1).drawn == [pairs, 0]
    assert len(first) >= 2 * len(plain.epoch_batches(0)) - 1
    assert second == plain.epoch_batches(1)
    assert 4 < len(first) < 16
    plain.close()
    straight.fit()
    straight.close()
    assert straight.state.step == 16
    assert straight.state.epoch >= 2
    assert_resume_is_exact(tmp_path, BIT, 4)


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("tokenizer.joint=false model.share_embeddings=false", "unless tokenizer.joint=true"),
        ("tokenizer.sampling.bpe_dropout=0.1", "with tokenizer.sampling on"),
        ("data.train_max_src_len=10", "with data.train_max_src_len"),
        ("data.bidirectional_epochs=-1", "0 \\(off\\) or more"),
    ],
)
def test_what_bidirectional_training_cannot_combine_with_is_refused(
    tmp_path: Path, setting: str, expected: str
) -> None:
    extra = ["data.bidirectional_epochs=2", *setting.split()]
    cfg = compose_train(tiny_overrides(tmp_path / "data", tmp_path / "cache", *extra))
    with pytest.raises(ConfigError, match=f"data.bidirectional_epochs=.* {expected}"):
        check_config(cfg)
