"""Tests for the GPU-path options of the Trainer, run on the CPU: bf16 autocast, the FLOPs
formula behind train/mfu, padding efficiency in the log, and trainer.compile."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import seq2seq.train.flops
from seq2seq.config.schema import Precision
from seq2seq.data.batching import Batch, collate
from seq2seq.kernels import onednn
from seq2seq.train.build import build_trainer
from seq2seq.train.checkpoint import load_checkpoint
from seq2seq.train.compiled import CPU_ADVICE
from seq2seq.train.flops import (
    FlopCounter,
    Throughput,
    cpu_peak_tflops,
    gpu_peak_tflops,
    peak_tflops,
)
from seq2seq.train.run import train
from seq2seq.train.trainer import Trainer
from seq2seq.train.validation import log_positional_images
from tests.conftest import MakeModel
from tests.references import smoothed_loss
from tests.tiny_run import compose_train, tiny_overrides, write_slice


def tiny_trainer(tmp_path: Path, *extra: str) -> Trainer:
    data = tmp_path / "data"
    if not data.exists():
        write_slice(data)
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    args = tiny_overrides(
        data,
        tmp_path / "cache",
        "trainer.max_steps=3",
        "model.dropout=0.0",
        "trainer.valid_every=1000",
        "trainer.keep_last=0",
        *extra,
    )
    return build_trainer(compose_train(args), run_dir)


def train_records(trainer: Trainer) -> list[dict[str, float]]:
    lines = (trainer.run_dir / "train_log.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] == "train"]


def step_gradients(trainer: Trainer, batch: Batch, precision: Precision) -> list[torch.Tensor]:
    """The gradient of the batch's loss per target token with the model's current weights,
    its forward and backward in `precision` (the training step's autocast)."""
    trainer.precision = precision
    trainer.model.zero_grad(set_to_none=True)
    loss, _ = trainer.batch_loss(batch)
    (loss / batch.tgt_tokens).backward()
    grads = [p.grad.detach().clone() for p in trainer.model.parameters()]  # type: ignore[union-attr]
    trainer.model.zero_grad(set_to_none=True)
    return grads


def test_bf16_autocast_trains_on_cpu_like_fp32(tmp_path: Path) -> None:
    """Catches a wrong bf16 forward or backward (kernels' bf16 paths: attention's matmuls, the
    fused output layer + loss): 40 steps, well past the 5 warm-up steps, the bf16 loss tracks
    fp32's and falls as far; and at the trained weights bf16's gradient is fp32's to bf16
    rounding, tensor by tensor, in scale too (AdamW would hide a wrongly scaled gradient from
    the loss curve, as it is invariant to a per-tensor scale)."""
    steps, losses, trainers = 40, {}, {}
    for precision in ("fp32", "bf16"):
        trainer = tiny_trainer(
            tmp_path / precision, f"trainer.precision={precision}", f"trainer.max_steps={steps}"
        )
        before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        trainer.fit()
        trainer.close()
        after = trainer.model.state_dict()
        assert all(v.dtype == torch.float32 for v in after.values())  # master weights stay fp32
        assert any(not torch.equal(before[k], after[k]) for k in before)
        losses[precision] = [r["loss"] for r in train_records(trainer)]
        trainers[precision] = trainer
    fp32, bf16 = losses["fp32"], losses["bf16"]
    assert len(bf16) == len(fp32) == steps
    assert bf16 != fp32  # bf16 really ran
    assert bf16 == pytest.approx(fp32, rel=0.01)  # ~3e-4 apart, measured
    head, tail = sum(bf16[:5]) / 5, sum(bf16[-5:]) / 5
    assert tail < 0.85 * head  # it learns (fp32 and bf16 both fall by ~25% in 40 steps)
    trained = trainers["bf16"]
    batch = trained.train_data.read(trained.epoch_batches(trained.state.epoch)[0])
    want = step_gradients(trained, batch, Precision.fp32)
    got = step_gradients(trained, batch, Precision.bf16)
    names = [name for name, _ in trained.model.named_parameters()]
    for name, g, w in zip(names, got, want, strict=True):
        assert float(w.norm()) > 0, name
        error = float((g - w).norm() / w.norm())  # ~0.06 at most, measured
        assert error < 0.15, f"{name}: bf16's gradient is {error:.3f} of fp32's norm away"
    flat = lambda grads: torch.cat([g.flatten() for g in grads])  # noqa: E731
    assert float((flat(got) - flat(want)).norm() / flat(want).norm()) < 0.05  # ~0.012


def test_train_log_has_flops_and_padding_efficiency(tmp_path: Path) -> None:
    trainer = tiny_trainer(tmp_path)
    trainer.fit()
    trainer.close()
    for record in train_records(trainer):
        assert 0.3 < record["padding_efficiency"] <= 1.0  # length-bucketed batches pad little
        assert record["flops"] > 0


def math_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    **_: object,
) -> torch.Tensor:
    """Attention as plain matmuls (q (B, H, L, dh), k/v (B, H, S, dh)), which FlopCounterMode
    counts (it has no formula for the CPU SDPA kernel)."""
    scores = (q @ k.transpose(-2, -1)) * (scale or q.shape[-1] ** -0.5)  # (B, H, L, S)
    if is_causal:
        future = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    if attn_mask is not None:
        is_bool = attn_mask.dtype == torch.bool
        scores = scores.masked_fill(~attn_mask, float("-inf")) if is_bool else scores + attn_mask
    return scores.softmax(-1) @ v  # (B, H, L, dh)


def test_flop_formula_matches_torch_flop_counter(
    make_model: MakeModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unpadded batch: the formula against the FLOPs torch counts for forward + backward
    (matmuls only: biases and norms make the small gap). torch's counter does not see
    oneDNN's linear op, so the layers take F.linear here."""
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", math_sdpa)
    monkeypatch.setattr(onednn, "ENABLED", False)
    model = make_model("sinusoidal", d_model=32, layers=2, d_ff=64, vocab=50).train()
    src = [[5 + (i + j) % 40 for j in range(11)] for i in range(4)]  # (4, 12) with EOS
    tgt = [[7 + (i * j) % 40 for j in range(8)] for i in range(4)]  # (4, 9) with BOS/EOS
    batch = collate(range(4), src, tgt)
    with FlopCounterMode(display=False) as counter:
        logits = model.logits(batch.src, batch.tgt_in)  # (B, T, V)
        smoothed_loss(logits.flatten(0, 1), batch.tgt_out.flatten(), 0.1)[0].backward()
    counts = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    assert "aten.bmm" in counts or "aten.matmul" in counts  # attention was counted
    formula = FlopCounter(model, 32, (2, 2), 50).batch(
        batch.src_tokens, batch.tgt_tokens, batch.src.shape[1], batch.tgt_out.shape[1]
    )
    assert formula == pytest.approx(counter.get_total_flops(), rel=0.03)


def test_a_steps_counts_sum_its_batches(make_model: MakeModel) -> None:
    """FlopCounter.counts: target tokens, FLOPs, real and padded (src+tgt) tokens of a step's
    batches, padding excluded from the real tokens."""
    model = make_model("sinusoidal", d_model=32, layers=2, d_ff=64, vocab=50)
    src = [[5] * n for n in (3, 6, 2)]
    tgt = [[7] * n for n in (4, 1, 5)]
    batches = [collate([0, 1], src, tgt), collate([2], src, tgt)]
    counter = FlopCounter(model, 32, (2, 2), 50)
    tokens, flops, real, padded = counter.counts(batches)
    assert tokens == (4 + 1 + 2) + (5 + 1)  # target tokens and EOS
    assert real == tokens + (3 + 1 + 6 + 1) + (2 + 1)  # source tokens and EOS too
    assert padded == 2 * 7 + 2 * 5 + 1 * 3 + 1 * 6  # src (B, S) + tgt_out (B, T) of each
    widths = [(b.src.shape[1], b.tgt_out.shape[1]) for b in batches]
    assert flops == sum(
        counter.batch(b.src_tokens, b.tgt_tokens, *w) for b, w in zip(batches, widths, strict=True)
    )


class ScriptedMatmuls:
    """Stands in for flops.py's clock and kernels: each kernels.linear call "takes" the next of
    `seconds` on the clock and does no work (no timing of this machine is involved)."""

    def __init__(self, seconds: list[float]) -> None:
        self.seconds, self.now, self.calls = list(seconds), 1000.0, 0

    def perf_counter(self) -> float:
        return self.now

    monotonic = perf_counter

    def linear(self, a: torch.Tensor, b: torch.Tensor, bias: None) -> torch.Tensor:
        self.now += self.seconds[self.calls]
        self.calls += 1
        return a

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        clock = SimpleNamespace(perf_counter=self.perf_counter, monotonic=self.monotonic)
        monkeypatch.setattr(seq2seq.train.flops, "time", clock)
        monkeypatch.setattr(seq2seq.train.flops, "kernels", SimpleNamespace(linear=self.linear))


@pytest.fixture
def fresh_peak_cache() -> Iterator[None]:
    """cpu_peak_tflops' cache emptied before and after (a scripted peak must not outlive the
    test: later Trainers measure their own)."""
    cpu_peak_tflops.cache_clear()
    yield
    cpu_peak_tflops.cache_clear()


def test_cpu_peak_is_the_fastest_timed_matmul(monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches a peak taken from the untimed warm-up, from the slowest or mean repeat, or with
    the wrong FLOP count: 2 * size^3 over the fastest of the timed matmuls (scripted times)."""
    script = ScriptedMatmuls([0.0001, 0.004, 0.002, 0.003])  # warm-up, then 3 timed
    script.install(monkeypatch)
    tflops = cpu_peak_tflops.__wrapped__(torch.float32, size=64, repeats=3)
    assert script.calls == 4
    assert tflops == pytest.approx(2 * 64**3 / 0.002 / 1e12, rel=1e-6)


def test_cpu_peak_measures_a_real_matmul_and_leaves_the_random_generator_alone() -> None:
    """Catches a measurement that draws on torch's random generator (it would change the
    training's random stream) or fails on the real kernels; no bound on the rate itself."""
    state = torch.random.get_rng_state()
    tflops = cpu_peak_tflops.__wrapped__(torch.float32, size=32, repeats=1)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert math.isfinite(tflops)
    assert tflops > 0


@pytest.mark.usefixtures("fresh_peak_cache")
def test_peak_tflops_is_measured_once_and_a_configured_peak_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Catches the CPU's peak re-measured at every call (or never), and trainer.peak_tflops
    ignored: the first call times 1 + 8 matmuls, later ones reuse its result."""
    script = ScriptedMatmuls([0.5] + [0.01] * 8)
    script.install(monkeypatch)
    cpu = torch.device("cpu")
    assert peak_tflops(cpu, 2.5) == 2.5
    assert script.calls == 0  # a configured peak measures nothing
    want = 2 * 1024**3 / 0.01 / 1e12
    assert peak_tflops(cpu) == pytest.approx(want, rel=1e-6)
    assert script.calls == 9
    assert peak_tflops(cpu) == pytest.approx(want, rel=1e-6)
    assert script.calls == 9  # cached
    assert peak_tflops(torch.device("meta")) == 0.0  # unknown device: no MFU


def test_gpu_peak_depends_on_the_precision_and_the_most_specific_name() -> None:
    """Catches fp32 training measured against the bf16 tensor cores' peak (a 15x smaller MFU on
    an H100), and a PCIe card matched as its SXM sibling."""
    assert gpu_peak_tflops("NVIDIA H100 80GB HBM3", torch.bfloat16) == 989.0
    assert gpu_peak_tflops("NVIDIA H100 80GB HBM3", torch.float32) == 67.0
    assert gpu_peak_tflops("NVIDIA H100 PCIe", torch.bfloat16) == 756.0
    assert gpu_peak_tflops("NVIDIA H100 PCIe", torch.float32) == 51.0
    assert gpu_peak_tflops("NVIDIA A100-SXM4-40GB", torch.float16) == 312.0
    assert gpu_peak_tflops("Some Future GPU", torch.bfloat16) == 0.0  # unknown: no MFU


def test_mfu_and_padding_efficiency_over_a_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches MFU, TFLOP/s or padding efficiency computed with the wrong numerator,
    denominator or window: two steps of 5e11 and 3e11 FLOPs in 2 s (scripted clock) against a
    4 TFLOP/s peak are 0.4 TFLOP/s and an MFU of 0.1; the next window starts empty."""
    script = ScriptedMatmuls([])
    script.install(monkeypatch)
    meter = Throughput(peak_flops=4e12)
    meter.add(flops=5e11, real=90, padded=100)
    meter.add(flops=3e11, real=10, padded=20)
    script.now += 2.0
    out = meter.scalars()
    assert out == pytest.approx({"tflops": 0.4, "mfu": 0.1, "padding_efficiency": 100 / 120})
    script.now += 1.0
    assert meter.scalars() == {"tflops": 0.0, "mfu": 0.0, "padding_efficiency": 0.0}
    assert "mfu" not in Throughput(peak_flops=0.0).scalars()  # peak unknown: no MFU


def test_adamw_is_fused_on_cpu(make_model: MakeModel) -> None:
    from seq2seq.config.schema import OptimConfig
    from seq2seq.train.build import FUSED_ADAMW_ON_CPU, build_optimizer

    optimizer, _ = build_optimizer(make_model(), OptimConfig(), torch.device("cpu"), 10)
    assert optimizer.defaults["fused"] is (True if FUSED_ADAMW_ON_CPU else None)


def test_fused_adamw_steps_like_the_reference(make_model: MakeModel) -> None:
    """Our optimizer (fused on this CPU) moves the weights as torch's plain per-tensor AdamW."""
    from seq2seq.config.schema import OptimConfig
    from seq2seq.train.build import build_optimizer

    ours, ref = make_model(), make_model()
    ref.load_state_dict(ours.state_dict())
    cfg = OptimConfig(warmup_steps=1, weight_decay=0.01)
    opt, _ = build_optimizer(ours, cfg, torch.device("cpu"), 10)
    plain = torch.optim.AdamW(
        ref.parameters(),
        lr=cfg.lr,
        betas=tuple(cfg.betas),
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        foreach=False,
    )
    for step in range(3):
        for p, q in zip(ours.parameters(), ref.parameters()):
            p.grad = torch.full_like(p, 0.1 * (step + 1)) * torch.randn_like(p).sign()
            q.grad = p.grad.clone()
        opt.step()
        plain.step()
        for p, q in zip(ours.parameters(), ref.parameters()):
            torch.testing.assert_close(p, q)


def test_decoding_sees_the_weights_of_each_fused_step() -> None:
    """Linear's packed copy of a weight (no-grad CPU path) follows every optimizer step."""
    from seq2seq.config.schema import OptimConfig
    from seq2seq.model.layers import Linear
    from seq2seq.train.build import build_optimizer

    layer, x = Linear(16, 8), torch.randn(4, 16)
    opt, _ = build_optimizer(layer, OptimConfig(warmup_steps=1, lr=0.1), torch.device("cpu"), 10)
    for _ in range(2):
        with torch.no_grad():
            torch.testing.assert_close(layer(x), x @ layer.weight.T + layer.bias)
        layer(x).square().sum().backward()
        opt.step()


def test_compile_on_a_cpu_warns_eager_does_not(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A CPU run with trainer.compile logs the advice (compile was slower there); an eager run
    does not. Building the trainer compiles nothing yet (torch.compile is lazy)."""
    for name, extra in (("eager", ()), ("compiled", ("trainer.compile=true",))):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="seq2seq.train.build"):
            tiny_trainer(tmp_path / name, "trainer.device=cpu", *extra).close()
        warned = [r for r in caplog.records if r.getMessage() == CPU_ADVICE]
        assert len(warned) == (1 if name == "compiled" else 0), name


@pytest.mark.slow  # torch.compile's first compilation takes ~30 s on 2 CPU cores
def test_compile_trains_like_eager(tmp_path: Path) -> None:
    """The losses of the same steps agree (weights are not compared: the key bias has an
    analytically zero gradient, whose rounding noise Adam turns into lr-sized steps). Exact
    batch shapes, so with dynamic shapes: tests/train/test_batch_shapes.py compiles the fixed
    shapes that trainer.compile takes by default."""
    losses = {}
    for name, extra in (("eager", ()), ("compiled", ("trainer.compile=true",))):
        trainer = tiny_trainer(tmp_path / name, "trainer.batch_shapes=exact", *extra)
        trainer.fit()
        trainer.close()
        losses[name] = [r["loss"] for r in train_records(trainer)]
    assert len(losses["compiled"]) == 3
    assert losses["compiled"] == pytest.approx(losses["eager"], rel=1e-4)


@pytest.mark.parametrize(
    ("kind", "has_image"),
    [("sinusoidal", True), ("t5_bias", True), ("alibi", True), ("none", False)],
)
def test_positional_heatmaps_reach_tensorboard(tmp_path: Path, kind: str, has_image: bool) -> None:
    """Each validation logs a heatmap of every encoding that has a table or per-head biases."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer = tiny_trainer(tmp_path, f"pos_encoding={kind}")
    log_positional_images(trainer.writer, trainer.model, step=1)
    trainer.writer.flush()
    events = EventAccumulator(str(trainer.run_dir / "tb"), size_guidance={"images": 0}).Reload()
    tags = set(events.Tags()["images"])
    want = {"positional/encoder", "positional/decoder"} if has_image else set()
    assert tags == want
    for tag in want:
        image = events.Images(tag)[-1]
        assert image.width > 1
        assert image.height > 1
    trainer.close()


def test_a_trainer_from_objects_reads_no_corpus(tmp_path: Path) -> None:
    """The Trainer takes objects (a model, its optimizer and schedule, encoded splits and their
    tokenizers) and trains on them: data.root and tokenizer.cache_dir name no folder, and the
    run directory gets only its logs."""
    from seq2seq.data.tokenizer import build_vocab
    from seq2seq.model.transformer import build_model
    from seq2seq.train.build import build_optimizer
    from seq2seq.train.corpus import corpus_from_splits, encode_split

    absent = tmp_path / "absent"
    cfg = compose_train(tiny_overrides(absent, absent, "trainer.valid_every=1000"))
    pairs = [(f"{n} apples", f"{n} Äpfel") for n in range(40)]
    tok = build_vocab("char", [text for pair in pairs for text in pair], vocab_size=64)
    splits = {name: encode_split(name, pairs, tok, tok) for name in ("train", "valid", "test")}
    model = build_model(cfg, tok.vocab_size, tok.vocab_size)
    optimizer, scheduler = build_optimizer(
        model, cfg.optim, torch.device("cpu"), cfg.trainer.max_steps
    )
    before = {k: v.clone() for k, v in model.state_dict().items()}
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    corpus = corpus_from_splits(cfg, splits["train"], splits, (tok, tok))
    trainer = Trainer(cfg, model, optimizer, scheduler, corpus, run_dir)
    batch = corpus.train.collate(trainer.epoch_batches(0)[0])
    stats = trainer.train_step([batch])
    trainer.close()
    assert stats is not None
    assert stats["tokens"] == batch.tgt_tokens
    assert trainer.state.step == 1
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not absent.exists()
    assert sorted(p.name for p in run_dir.iterdir()) == ["tb", "train_log.jsonl"]


@pytest.mark.parametrize("metric", ["loss", "bleu"])
def test_best_pt_is_the_best_logged_validation(tmp_path: Path, metric: str) -> None:
    """A real tiny run: best.pt is the validation with the lowest loss / highest BLEU of the
    run's log (the first of equals), and every validation logs BLEU and chrF (TER is left to
    the test splits)."""
    write_slice(tmp_path / "data")
    extra = ["trainer.valid_every=2", f"trainer.best_metric={metric}", "trainer.keep_last=0"]
    cfg = compose_train(tiny_overrides(tmp_path / "data", tmp_path / "cache", *extra))
    train(cfg, tmp_path / "run")
    lines = (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()
    valid = [r for r in map(json.loads, lines) if r["type"] == "valid"]
    assert [r["step"] for r in valid] == [2, 4, 6, 8, 10, 12]
    assert all({"bleu", "chrf"} <= r.keys() and "ter" not in r for r in valid)
    sign = 1 if metric == "loss" else -1
    want = min(valid, key=lambda r: (sign * r[metric], r["step"]))
    best = load_checkpoint(tmp_path / "run" / "checkpoints" / "best.pt")["train_state"]
    assert (best["step"], best["best_score"]) == (want["step"], want[metric])
    assert valid[-1]["best_step"] == want["step"]
