"""The Trainer with subword regularization (tokenizer.sampling), word dropout
(model.src_word_dropout, tgt_word_dropout) and R-Drop (trainer.rdrop_alpha): they train, from the
command line's keys; a run resumed from its checkpoint draws the same segmentations and dropout
and word-dropout masks and ends bit-identical to the uninterrupted run; R-Drop's steps
count twice the FLOPs; alpha=0 is the step from before R-Drop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import Tensor

from seq2seq.data.batching import fit_budget
from seq2seq.model.transformer import EncoderDecoder
from tests.kernels.test_rdrop import todays_forward
from tests.tiny_run import assert_resume_is_exact, assert_same_weights, tiny_trainer

REGULARIZERS = [
    "tokenizer.sampling.bpe_dropout=0.2",
    "trainer.rdrop_alpha=1.0",
    "model.src_word_dropout=0.1",
    "model.tgt_word_dropout=0.1",
]


def losses(run_dir: Path) -> list[float]:
    records = map(json.loads, (run_dir / "train_log.jsonl").read_text().splitlines())
    return [r["loss"] for r in records if r["type"] == "train"]


# each plan of the sampled segmentations, with a token budget that ends epoch 0 between step 8
# and step 12 (planned on the sampled lengths, an epoch has more batches)
PLANS = {"sampled": "trainer.max_tokens=500", "prepared": "trainer.max_tokens=256"}


@pytest.mark.parametrize("plan", list(PLANS))
def test_resumed_run_samples_and_drops_out_as_the_straight_one(tmp_path: Path, plan: str) -> None:
    """12 steps (into the second epoch) straight, against 8 steps' checkpoint resumed to 12 in
    another directory: the same weights, optimizer state and counters, to the bit."""
    settings = [*REGULARIZERS, f"tokenizer.sampling.plan={plan}", PLANS[plan]]
    straight = tiny_trainer(tmp_path, "straight", *settings)
    assert len(straight.epoch_batches(0)) in range(9, 12)
    straight.fit()
    straight.close()
    assert straight.state.step == 12
    assert straight.state.epoch >= 1
    assert_resume_is_exact(tmp_path, settings, 8)


def test_regularized_run_trains_and_differs_from_the_plain_one(tmp_path: Path) -> None:
    for name, extra in (("plain", []), ("regularized", REGULARIZERS)):
        t = tiny_trainer(tmp_path, name, "trainer.max_steps=6", *extra)
        t.fit()
        t.close()
    got, want = losses(tmp_path / "regularized"), losses(tmp_path / "plain")
    assert len(got) == len(want) == 6
    assert all(torch.isfinite(torch.tensor(got)))
    assert got != want


def test_rdrop_counts_two_passes_of_flops(tmp_path: Path) -> None:
    one = tiny_trainer(tmp_path, "one")
    two = tiny_trainer(tmp_path, "two", "trainer.rdrop_alpha=0.5")
    args = (100, 120, 12, 14)
    assert two.flops.batch(*args) == 2 * one.flops.batch(*args)
    for t in (one, two):
        t.close()


def test_alpha_zero_steps_as_before_r_drop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """trainer.rdrop_alpha=0 on the command line: the losses and weights of the same run whose
    model computes its loss as before R-Drop (tests/kernels/test_rdrop.py), to the bit."""

    def before(
        model: EncoderDecoder, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, eps: float, *_: float
    ) -> tuple[Tensor, Tensor]:
        return todays_forward(model, src, tgt_in, tgt_out, eps)

    for name, patch in (("zero", False), ("before", True)):
        if patch:
            monkeypatch.setattr(EncoderDecoder, "forward", before)
        t = tiny_trainer(tmp_path, name, "trainer.max_steps=3", "trainer.rdrop_alpha=0")
        t.fit()
        t.close()
    assert losses(tmp_path / "zero") == losses(tmp_path / "before")
    assert_same_weights(
        tmp_path / "before" / "checkpoints" / "last.pt",
        tmp_path / "zero" / "checkpoints" / "last.pt",
    )


@pytest.mark.parametrize("budget", [96, 256])
def test_sampled_steps_keep_to_the_token_budget(tmp_path: Path, budget: int) -> None:
    """Every pass the trainer takes holds at most trainer.max_tokens (token_batches' measure),
    and every pair of the planned batch is trained on once."""
    t = tiny_trainer(
        tmp_path, "run", "tokenizer.sampling.bpe_dropout=0.3", f"trainer.max_tokens={budget}"
    )
    for ref in t.epoch_batches(0):
        planned = t.train_data.collate(ref)
        parts = t._collate(ref)
        assert sorted(i for p in parts for i in p.index.tolist()) == sorted(planned.index.tolist())
        for part in parts:
            width = max(part.src.shape[1], part.tgt_out.shape[1])
            assert part.src.shape[0] == 1 or part.src.shape[0] * (width + 1) <= budget
        assert len(parts) == len(fit_budget(planned, budget))
    t.close()
