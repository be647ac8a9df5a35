"""The optimizer step a real Trainer takes: the learning rate of every step against Vaswani et
al.'s eq. 3 written out, gradient clipping against a gradient computed by hand, and gradient
accumulation against one step on the concatenated batches."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import torch

from seq2seq.data.batching import Batch, collate
from seq2seq.data.tokenizer import EOS_ID, PAD_ID
from seq2seq.train.trainer import Trainer
from tests.references import smoothed_loss
from tests.train.test_trainer import tiny_trainer, train_records

PEAK = 0.003  # tiny_overrides' optim.lr


def record_optimizer_steps(trainer: Trainer) -> list[dict[str, object]]:
    """What each optimizer.step call is given: every group's lr and every gradient (cloned),
    recorded by a pre-step hook (torch calls it inside step, with the values step uses)."""
    calls: list[dict[str, object]] = []

    def hook(optimizer: torch.optim.Optimizer, args: object, kwargs: object) -> None:
        calls.append(
            {
                "lrs": [float(g["lr"]) for g in optimizer.param_groups],
                "grads": [p.grad.detach().clone() for p in trainer.model.parameters()],  # type: ignore[union-attr]
            }
        )

    trainer.optimizer.register_step_pre_hook(hook)
    return calls


def eq3(step: int, warmup: int) -> float:
    """Vaswani et al. 2017, eq. 3 scaled to peak PEAK: linear warm-up over `warmup` steps, then
    inverse square root (step is 1-based: the first optimizer step is step 1)."""
    return PEAK * min(step / warmup, math.sqrt(warmup / step))


def tensorboard_scalars(run_dir: Path, tag: str) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir / "tb")).Reload()
    return {e.step: e.value for e in events.Scalars(tag)}


# --------------------------------------------------------------------------- schedule


def test_lr_of_every_step_follows_warmup_then_inverse_sqrt(tmp_path: Path) -> None:
    """Catches an off-by-one or a wrong constant in the schedule (LambdaLR counts the steps
    already taken), and a log that records another step's lr than the one used."""
    warmup = 4
    steps = 4 * warmup
    trainer = tiny_trainer(
        tmp_path,
        f"optim.warmup_steps={warmup}",
        f"trainer.max_steps={steps}",
        "trainer.log_every=2",
    )
    calls = record_optimizer_steps(trainer)
    trainer.fit()
    trainer.close()
    used = [c["lrs"] for c in calls]
    want = [eq3(step, warmup) for step in range(1, steps + 1)]
    assert len(used) == steps
    assert [lrs[0] for lrs in used] == pytest.approx(want, rel=1e-12)
    assert all(len(lrs) == 1 for lrs in used)  # one parameter group: the lr above is the only one
    # the three points of the schedule, spelt out: lr / warmup, the peak, half the peak
    assert used[0][0] == pytest.approx(PEAK / warmup, rel=1e-12)
    assert used[warmup - 1][0] == pytest.approx(PEAK, rel=1e-12)
    assert used[4 * warmup - 1][0] == pytest.approx(PEAK / 2, rel=1e-12)
    logged = {r["step"]: r["lr"] for r in train_records(trainer)}
    assert logged == pytest.approx({step: want[step - 1] for step in range(1, steps + 1)})
    board = tensorboard_scalars(trainer.run_dir, "train/lr")  # every log_every=2 steps, float32
    assert sorted(board) == list(range(2, steps + 1, 2))
    for step in (warmup, 4 * warmup):
        assert board[step] == pytest.approx(want[step - 1], rel=1e-6)


def test_no_warmup_starts_at_the_peak(tmp_path: Path) -> None:
    """Catches optim.warmup_steps=0 (README's fine-tuning recipe) starting below the peak or
    repeating it: step 1 takes the peak lr, step n the peak / sqrt(n)."""
    trainer = tiny_trainer(tmp_path, "optim.warmup_steps=0", "trainer.max_steps=4")
    calls = record_optimizer_steps(trainer)
    trainer.fit()
    trainer.close()
    want = [PEAK / math.sqrt(step) for step in range(1, 5)]
    assert [c["lrs"][0] for c in calls] == pytest.approx(want, rel=1e-12)  # type: ignore[index]


def decayed(step: int, warmup: int, end: int, shape: str, floor: float) -> float:
    """A cosine or linear decay written out: linear warm-up to PEAK over `warmup` steps, then
    from PEAK down to `floor` at step `end` (1-based steps), and `floor` after it."""
    if step <= warmup:
        return PEAK * step / warmup
    done = min(1.0, (step - warmup) / (end - warmup))
    left = (1 + math.cos(math.pi * done)) / 2 if shape == "cosine" else 1 - done
    return floor + (PEAK - floor) * left


@pytest.mark.parametrize(
    ("shape", "decay", "floor"),
    [("cosine", 0, 0.0), ("linear", 0, 0.0), ("cosine", 8, PEAK / 10), ("linear", 6, 0.0)],
)
def test_cosine_and_linear_decay_to_min_lr_at_decay_steps(
    tmp_path: Path, shape: str, decay: int, floor: float
) -> None:
    """Catches a decay that starts before the warmup's end, ends at another step than
    optim.decay_steps (0: trainer.max_steps), misses optim.min_lr, or moves after its end; the
    midpoint of a cosine is half-way between the peak and min_lr, a linear one's the same."""
    warmup, steps = 2, 10
    trainer = tiny_trainer(
        tmp_path,
        f"optim.warmup_steps={warmup}",
        f"optim.schedule={shape}",
        f"optim.decay_steps={decay}",
        f"optim.min_lr={floor}",
        f"trainer.max_steps={steps}",
    )
    calls = record_optimizer_steps(trainer)
    trainer.fit()
    trainer.close()
    end = decay or steps
    used = [c["lrs"][0] for c in calls]  # type: ignore[index]
    want = [decayed(step, warmup, end, shape, floor) for step in range(1, steps + 1)]
    assert used == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert used[warmup - 1] == pytest.approx(PEAK, rel=1e-12)  # the peak, as inverse_sqrt's
    assert used[end - 1] == pytest.approx(floor, abs=1e-15)  # min_lr at decay_steps
    assert all(lr == pytest.approx(floor, abs=1e-15) for lr in used[end - 1 :])  # and after
    middle = (warmup + end) // 2  # half of the decay behind: half-way, cosine or linear
    assert used[middle - 1] == pytest.approx((PEAK + floor) / 2, rel=1e-12)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (
            ["optim.schedule=cosine", "optim.warmup_steps=10", "trainer.max_steps=10"],
            "trainer.max_steps",
        ),
        (
            ["optim.schedule=linear", "optim.warmup_steps=10", "optim.decay_steps=5"],
            "optim.decay_steps",
        ),
        (["optim.min_lr=0.01"], "optim.min_lr"),
        (["optim.decay_steps=-1"], "optim.decay_steps"),
    ],
)
def test_a_schedule_that_cannot_decay_is_refused(overrides: list[str], key: str) -> None:
    """Catches a decay ending inside the warmup (a division by zero or a jump), or a min_lr
    above the peak (a schedule that rises), reaching the training loop."""
    from seq2seq.config.checks import check_config
    from seq2seq.errors import ConfigError
    from tests.tiny_run import compose_train

    with pytest.raises(ConfigError, match=rf"config: {key}=.* is invalid"):
        check_config(compose_train(overrides))


# --------------------------------------------------------------------------- clipping


def reference_gradients(model: torch.nn.Module, batch: Batch, eps: float) -> list[torch.Tensor]:
    """The gradient of the batch's label-smoothed loss per target token, from the model's
    logits and the loss written out (tests/references.py), on a copy of the model."""
    model = copy.deepcopy(model).train()
    model.zero_grad(set_to_none=True)
    loss, _ = smoothed_loss(
        model.logits(batch.src, batch.tgt_in).flatten(0, 1), batch.tgt_out.flatten(), eps
    )  # type: ignore[operator]
    (loss / batch.tgt_tokens).backward()
    return [p.grad.detach().clone() for p in model.parameters()]  # type: ignore[union-attr]


@pytest.mark.parametrize("clip", [0.05, 0.0])
def test_clipping_scales_the_gradient_to_clip_norm_and_logs_the_norm_before(
    tmp_path: Path, clip: float
) -> None:
    """Catches clipping skipped, applied after the optimizer step, to the wrong norm, or
    optim.clip_norm=0 clipping everything to zero; and a logged grad_norm taken after clipping.
    (AdamW's first step is about lr * sign(gradient) whatever the gradient's scale, so the
    gradients handed to the optimizer are compared, not the weights.)"""
    trainer = tiny_trainer(tmp_path, f"optim.clip_norm={clip}", "trainer.max_steps=1")
    calls = record_optimizer_steps(trainer)
    batch = trainer.train_data.collate(trainer.epoch_batches(0)[0])  # fit's first step's batch
    want = reference_gradients(trainer.model, batch, trainer.cfg.trainer.label_smoothing)
    norm = math.sqrt(sum(float(g.double().square().sum()) for g in want))  # the 2-norm, by hand
    trainer.fit()
    trainer.close()
    assert norm > 10 * 0.05  # at the initial weights, clip_norm=0.05 does clip
    scale = min(1.0, clip / norm) if clip > 0 else 1.0
    (step,) = calls
    for got, ref in zip(step["grads"], want, strict=True):  # type: ignore[call-overload]
        torch.testing.assert_close(got, ref * scale, rtol=1e-4, atol=1e-7)
    handed = math.sqrt(sum(float(g.double().square().sum()) for g in step["grads"]))  # type: ignore[attr-defined]
    assert handed == pytest.approx(clip if clip > 0 else norm, rel=1e-4)
    (record,) = train_records(trainer)
    assert record["grad_norm"] == pytest.approx(norm, rel=1e-4)  # the norm before clipping


# --------------------------------------------------------------------------- accumulation


def concatenate(a: Batch, b: Batch) -> Batch:
    """One batch holding the pairs of `a` then `b`, re-padded to the wider of the two."""
    src: list[list[int]] = []
    tgt: list[list[int]] = []
    for batch in (a, b):
        for s, t in zip(batch.src.tolist(), batch.tgt_out.tolist(), strict=True):
            src.append([i for i in s if i != PAD_ID][:-1])  # the ids, without EOS
            tgt.append([i for i in t if i != PAD_ID][:-1])
            assert s[len(src[-1])] == EOS_ID
            assert t[len(tgt[-1])] == EOS_ID
    return collate(range(len(src)), src, tgt)


def test_accumulating_two_batches_is_one_step_on_both(tmp_path: Path) -> None:
    """Catches accumulation normalised per batch, by the wrong token count or number of
    batches, or dropping a batch's gradient: trainer.accum_steps=2 over batches A and B hands
    the optimizer the gradient of one step on A and B together (the loss summed over both
    batches' target tokens, divided by their total)."""
    common = ("trainer.max_steps=1", "optim.clip_norm=0")  # clipping would hide a scale error
    accumulated = tiny_trainer(tmp_path / "accum", "trainer.accum_steps=2", *common)
    single = tiny_trainer(tmp_path / "single", "trainer.accum_steps=1", *common)
    for name, tensor in single.model.state_dict().items():  # the same seed: the same weights
        assert torch.equal(tensor, accumulated.model.state_dict()[name]), name
    a, b = (accumulated.train_data.collate(ref) for ref in accumulated.epoch_batches(0)[:2])
    both = concatenate(a, b)
    assert both.tgt_tokens == a.tgt_tokens + b.tgt_tokens
    assert a.tgt_tokens != b.tgt_tokens  # unequal batches: a per-batch mean would differ
    steps = {"accum": record_optimizer_steps(accumulated), "single": record_optimizer_steps(single)}
    accumulated.fit()  # step 1: epoch 0's batches 0 and 1 (A and B)
    stats = single.train_step([both])
    accumulated.close()
    single.close()
    (got,), (want,) = steps["accum"], steps["single"]
    for g, w in zip(got["grads"], want["grads"], strict=True):  # type: ignore[call-overload]
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-7)
    # (the weights after the step are not compared: the attention keys' bias has an analytically
    # zero gradient, whose rounding noise AdamW's first step turns into lr-sized moves)
    (record,) = train_records(accumulated)
    assert stats is not None
    assert record["tokens"] == both.tgt_tokens
    assert record["loss"] == pytest.approx(stats["loss"], rel=1e-5)
    assert record["grad_norm"] == pytest.approx(stats["grad_norm"], rel=1e-4)
