"""trainer.precision=auto: the choice is timed on real steps, logged, leaves no trace on the run,
and a resumed run keeps it (seq2seq/train/precision.py, Trainer.state_precision). Where float32
products run (oneDNN or ATen) is timed, kept and resumed alike (resolve_products)."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import seq2seq.kernels
import seq2seq.train.precision
from seq2seq.config.schema import Precision
from seq2seq.data.batching import Batch
from seq2seq.kernels import onednn, timing
from seq2seq.train.build import build_trainer
from seq2seq.train.checkpoint import load_checkpoint
from seq2seq.train.precision import (
    CANDIDATES,
    TIMED_ROUNDS,
    device_default,
    faster,
    resolve,
    time_precisions,
)
from seq2seq.train.trainer import Trainer
from tests.tiny_run import compose_train, tiny_overrides, write_slice


def auto_trainer(tmp_path: Path, precision: str = "auto", more: list[str] | None = None) -> Trainer:
    """A tiny run (dropout on, so that the random generators matter) in `precision`."""
    data = tmp_path.parent / "data"
    if not data.exists():
        write_slice(data)
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True)
    args = tiny_overrides(
        data,
        tmp_path.parent / "cache",
        "trainer.max_steps=3",
        "trainer.valid_every=1000",
        "trainer.keep_last=0",
    )
    cfg = compose_train([*args, f"trainer.precision={precision}", *(more or [])])
    return build_trainer(cfg, run_dir)


# seconds each timed round of a candidate "takes" (round 0, the warm-up, first): the medians of
# the timed rounds are 3.0 and 2.0 (their means 3.33 and 2.17; the warm-ups would move both)
SLOW = [0.001, 3.0, 6.0, 1.0]
FAST = [90.0, 2.0, 0.5, 4.0]


@pytest.mark.parametrize(
    ("seconds", "chosen"),
    [
        ({Precision.fp32: SLOW, Precision.bf16: FAST}, Precision.bf16),
        ({Precision.fp32: FAST, Precision.bf16: SLOW}, Precision.fp32),
    ],
    ids=["bf16-faster", "fp32-faster"],
)
def test_auto_takes_the_precision_whose_timed_steps_were_faster(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    seconds: dict[Precision, list[float]],
    chosen: Precision,
) -> None:
    """Catches auto keeping the slower precision, timing the warm-up round, averaging instead of
    taking the median, or timing other steps than the run's own: real probe steps in each
    candidate, alternating, on a clock that moves by the scripted seconds (no real timing)."""
    clock = SimpleNamespace(now=500.0)
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=lambda: clock.now))
    original, probed = Trainer.probe_step, []

    def probe_step(self: Trainer, group: list[Batch]) -> None:
        original(self, group)
        clock.now += seconds[self.precision][sum(p == self.precision for p in probed)]
        probed.append(self.precision)

    monkeypatch.setattr(Trainer, "probe_step", probe_step)
    with caplog.at_level(logging.INFO, logger="seq2seq"):
        trainer = auto_trainer(tmp_path / "a")
    trainer.close()
    assert probed == [p for _ in range(TIMED_ROUNDS + 1) for p in CANDIDATES]
    medians = {p.value: sorted(s[1:])[1] for p, s in seconds.items()}  # of the 3 timed rounds
    assert trainer.precision_times == pytest.approx(medians, rel=1e-9)
    assert trainer.precision == chosen
    assert trainer.state.precision == chosen.value
    autocast = trainer.autocast()  # the run trains in the choice
    assert isinstance(autocast, torch.autocast) == (chosen == Precision.bf16)
    lines = [r.getMessage() for r in caplog.records if "precision auto" in r.getMessage()]
    shown = ", ".join(f"{p} {s:.4f}" for p, s in medians.items())
    assert lines == [f"precision auto: {chosen.value} on this CPU (s/step: {shown})"]


def test_timing_leaves_no_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run whose auto chose fp32 trains exactly as a run asked for fp32: the timed steps'
    weights, optimizer state, schedule and random draws are all put back."""
    monkeypatch.setattr(seq2seq.train.precision, "faster", lambda times: Precision.fp32)
    runs = {}
    for precision in ("auto", "fp32"):
        trainer = auto_trainer(tmp_path / precision, precision)
        trainer.fit()
        trainer.close()
        log = (trainer.run_dir / "train_log.jsonl").read_text().splitlines()
        runs[precision] = (trainer.model.state_dict(), [line for line in log if "train" in line])
    assert runs["auto"][1] == runs["fp32"][1]  # every step's loss, norm and lr, to the bit
    for name, tensor in runs["fp32"][0].items():
        assert torch.equal(runs["auto"][0][name], tensor), name


def test_a_resumed_run_keeps_its_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seq2seq.train.precision, "faster", lambda times: Precision.bf16)
    trainer = auto_trainer(tmp_path)
    trainer.fit()
    trainer.close()
    path = trainer.ckpt_dir / "last.pt"
    ckpt = load_checkpoint(path)
    assert ckpt["train_state"]["precision"] == "bf16"

    def no_timing(self: Trainer) -> None:
        raise AssertionError("a resumed run must not time the precisions again")

    monkeypatch.setattr(Trainer, "time_precisions", no_timing)
    resumed = build_trainer(trainer.cfg, trainer.run_dir, (path, ckpt))
    resumed.close()
    assert resumed.precision == Precision.bf16


def test_time_precisions_alternates_and_skips_the_warm_up() -> None:
    calls: list[tuple[Precision, int]] = []
    times = time_precisions(lambda p, r: calls.append((p, r)), rounds=2)
    assert calls == [(p, r) for r in range(3) for p in CANDIDATES]
    assert set(times) == set(CANDIDATES)


def test_faster_takes_the_shorter_step_and_fp32_on_a_tie() -> None:
    assert faster({Precision.fp32: 2.0, Precision.bf16: 1.0}) == Precision.bf16
    assert faster({Precision.fp32: 1.0, Precision.bf16: 2.0}) == Precision.fp32
    assert faster({Precision.fp32: 1.0, Precision.bf16: 1.0}) == Precision.fp32


def test_a_cpu_and_a_cuda_gpu_with_bf16_are_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    """None: time both (a GPU's fastest precision depends on the model's size, as a CPU's on
    the CPU); fp32 where bf16 cannot run fast."""
    assert device_default(torch.device("cpu")) is None
    assert device_default(torch.device("meta")) == Precision.fp32
    for bf16, want in ((True, None), (False, Precision.fp32)):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda bf16=bf16: bf16)
        assert device_default(torch.device("cuda")) == want


@pytest.mark.parametrize(("fp32_s", "chosen"), [(0.017, Precision.fp32), (0.050, Precision.bf16)])
def test_auto_on_a_cuda_gpu_times_both_and_keeps_the_faster(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    fp32_s: float,
    chosen: Precision,
) -> None:
    """On CUDA (bf16 supported) auto takes the timed faster step, as on a CPU, and logs both."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    times = {Precision.fp32: fp32_s, Precision.bf16: 0.035}
    with caplog.at_level(logging.INFO, logger="seq2seq"):
        got = resolve(Precision.auto, "", torch.device("cuda"), lambda: times)
    assert got == (chosen, {"fp32": fp32_s, "bf16": 0.035})
    lines = [r.getMessage() for r in caplog.records if "precision auto" in r.getMessage()]
    shown = f"fp32 {fp32_s:.4f}, bf16 0.0350"
    assert lines == [f"precision auto: {chosen.value} on this GPU (s/step: {shown})"]
    # asked for, or resumed: no timing
    untimed = lambda: pytest.fail("timed")  # noqa: E731
    assert resolve(Precision.fp32, "", torch.device("cuda"), untimed) == (Precision.fp32, {})
    assert resolve(Precision.auto, "bf16", torch.device("cuda"), untimed) == (Precision.bf16, {})


@pytest.fixture
def fresh_products(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """No choice of this process remembered; time_products scripted (oneDNN 2 ms, ATen 1 ms)
    and its calls recorded."""
    monkeypatch.setattr(seq2seq.train.precision, "_PRODUCTS", {})
    timed: list[tuple] = []

    def time_products(shapes: tuple) -> dict[str, float]:
        timed.append(shapes)
        return {"onednn": 0.002, "aten": 0.001}

    monkeypatch.setattr(seq2seq.kernels, "time_products", time_products)
    return timed


def test_products_are_timed_on_the_models_shapes_and_the_faster_kept(
    tmp_path: Path, fresh_products: list[tuple], caplog: pytest.LogCaptureFixture
) -> None:
    """Catches keeping oneDNN where ATen was faster, timing other shapes than the model's, not
    recording the choice, or timing again for a second run of the process."""
    with caplog.at_level(logging.INFO, logger="seq2seq"):
        trainer = auto_trainer(tmp_path / "a", "fp32")
    trainer.close()
    cfg, vocab = trainer.cfg, trainer.tgt_tok.vocab_size
    d, ff, rows = cfg.model.d_model, cfg.model.d_ff, cfg.trainer.max_tokens
    assert fresh_products == [((rows, d, d), (rows, d, ff), (rows, ff, d), (256, d, vocab))]
    assert (trainer.products, trainer.state.products) == ("aten", "aten")
    assert trainer.products_times == {"onednn": 0.002, "aten": 0.001}
    assert onednn.products() == "aten"  # the run's products go to F.linear
    assert (
        "float32 products: aten on this CPU (the model's products: onednn 2.0 ms, aten 1.0 ms)"
        in caplog.text
    )
    again = auto_trainer(tmp_path / "b", "auto")
    again.close()
    assert len(fresh_products) == 1
    assert again.products == "aten"


@pytest.mark.parametrize("override", ["trainer.kernels=reference", "trainer.precision=bf16"])
def test_products_are_not_timed_where_no_cpu_float32_product_runs(
    tmp_path: Path, fresh_products: list[tuple], override: str
) -> None:
    key, value = override.split("=")
    trainer = auto_trainer(tmp_path, value if "precision" in key else "fp32", [override])
    trainer.close()
    assert fresh_products == []
    assert trainer.products == ""
    assert trainer.products_times == {}


def test_a_resumed_run_keeps_its_products(tmp_path: Path, fresh_products: list[tuple]) -> None:
    """The products a run started with come back on resume, untimed (an exact resume), even
    where this process would have chosen the other."""
    trainer = auto_trainer(tmp_path, "fp32")
    trainer.fit()
    trainer.close()
    path = trainer.ckpt_dir / "last.pt"
    ckpt = load_checkpoint(path)
    assert ckpt["train_state"]["products"] == "aten"
    onednn.set_products("onednn")
    seq2seq.train.precision._PRODUCTS.clear()
    resumed = build_trainer(trainer.cfg, trainer.run_dir, (path, ckpt))
    resumed.close()
    assert len(fresh_products) == 1
    assert resumed.products == "aten"
    assert onednn.products() == "aten"


def test_product_shapes_cap_the_rows_timed() -> None:
    """A large batch is timed on PROBE_ROWS rows: the start-up timing stays about a second."""
    cfg = compose_train(["trainer.max_tokens=8192", "model.d_model=64", "model.d_ff=128"])
    rows = seq2seq.train.precision.PROBE_ROWS
    assert seq2seq.train.precision.product_shapes(cfg, 100) == (
        (rows, 64, 64),
        (rows, 64, 128),
        (rows, 128, 64),
        (256, 64, 100),
    )
