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
from seq2seq import mkl
from seq2seq.config.schema import Precision
from seq2seq.data.batching import Batch
from seq2seq.kernels import onednn, timing
from seq2seq.train.build import build_trainer
from seq2seq.train.checkpoint import load_checkpoint
from seq2seq.train.precision import (
    BF16_MARGIN,
    CANDIDATES,
    DTYPE_PROBE_ROWS,
    TIMED_ROUNDS,
    bf16_may_pay,
    device_default,
    dtype_times,
    faster,
    product_shapes,
    resolve,
    time_precisions,
)
from seq2seq.train.trainer import Trainer
from tests.tiny_run import compose_train, tiny_overrides, write_slice


@pytest.fixture(autouse=True)
def even_products(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model's products take as long in bf16 as in fp32 (scripted, not this CPU's), so that
    auto times its steps on every CPU; tests of the products check set their own."""
    monkeypatch.setattr(seq2seq.train.precision, "_DTYPE_TIMES", {})
    even = {torch.float32: 0.001, torch.bfloat16: 0.001}
    monkeypatch.setattr(seq2seq.kernels, "time_product_dtypes", lambda shapes, dtypes, r: even)


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
        "float32 products: aten on this CPU (the model's products: onednn 2.0 ms, aten 1.0 ms; "
        f"MKL's Intel path: {mkl.STATE})" in caplog.text
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


def test_bf16_may_pay_only_where_its_products_are_not_clearly_slower() -> None:
    fp32 = 0.010
    for bf16, pays in ((0.005, True), (BF16_MARGIN * fp32, True), (0.013, False), (0.2, False)):
        assert bf16_may_pay({Precision.fp32: fp32, Precision.bf16: bf16}) == pays, bf16
    assert bf16_may_pay({Precision.fp32: 0.0, Precision.bf16: 0.0})  # a clock that stood still


def test_auto_times_no_bf16_step_where_bf16_products_are_slow(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Catches timing bf16 steps on a CPU that emulates bf16 (minutes there: 69 s a step against
    fp32's 3.2 on an AVX2-only AMD EPYC), skipping them where bf16 might win, or checking the
    products on a GPU."""
    slow = {Precision.fp32: 0.010, Precision.bf16: 0.200}
    untimed = lambda: pytest.fail("bf16 steps timed")  # noqa: E731
    with caplog.at_level(logging.INFO, logger="seq2seq"):
        got = resolve(Precision.auto, "", torch.device("cpu"), untimed, lambda: slow)
    assert got == (Precision.fp32, {})
    lines = [r.getMessage() for r in caplog.records if "precision auto" in r.getMessage()]
    assert lines == [
        "precision auto: fp32 on this CPU (the model's products: fp32 10.0 ms, bf16 200.0 ms; "
        f"bf16 steps not timed: their products take more than {BF16_MARGIN:.2f}x fp32's)"
    ]
    close = {Precision.fp32: 0.010, Precision.bf16: 0.011}
    steps = {Precision.fp32: 2.0, Precision.bf16: 1.0}
    got = resolve(Precision.auto, "", torch.device("cpu"), lambda: steps, lambda: close)
    assert got == (Precision.bf16, {"fp32": 2.0, "bf16": 1.0})
    no_check = lambda: pytest.fail("products checked")  # noqa: E731
    for device in ("meta", "cpu"):  # asked for fp32 / resumed: no check either
        asked = Precision.auto if device == "meta" else Precision.fp32
        assert resolve(asked, "", torch.device(device), untimed, no_check)[0] == Precision.fp32
    assert resolve(Precision.auto, "bf16", torch.device("cpu"), untimed, no_check)[0] == (
        Precision.bf16
    )


def test_a_cpu_run_checks_its_own_products_once_a_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The products checked are the model's (rows capped at DTYPE_PROBE_ROWS), in fp32 and
    bf16, timed once a process; where bf16's are slow the run trains in fp32 untimed."""
    calls: list[tuple] = []

    def time_product_dtypes(shapes: tuple, dtypes: list, rounds: int) -> dict:
        calls.append((shapes, tuple(dtypes), rounds))
        return {torch.float32: 0.001, torch.bfloat16: 0.020}

    monkeypatch.setattr(seq2seq.kernels, "time_product_dtypes", time_product_dtypes)
    monkeypatch.setattr(Trainer, "time_precisions", lambda self: pytest.fail("steps timed"))
    for name in ("a", "b"):
        trainer = auto_trainer(tmp_path / name)
        trainer.close()
        assert (trainer.precision, trainer.precision_times) == (Precision.fp32, {})
    cfg, vocab = trainer.cfg, trainer.tgt_tok.vocab_size
    shapes = tuple((min(r, DTYPE_PROBE_ROWS), k, n) for r, k, n in product_shapes(cfg, vocab))
    assert calls == [(shapes, (torch.float32, torch.bfloat16), TIMED_ROUNDS)]
    assert dtype_times(cfg, vocab) == {Precision.fp32: 0.001, Precision.bf16: 0.020}


def test_time_product_dtypes_times_each_dtype_alternating(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real products on a scripted clock: each dtype's forward and both gradients, alternating
    after an untimed round; the median of its rounds."""
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=lambda: clock.now))
    seen: list[torch.dtype] = []
    original = torch.nn.functional.linear

    def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        assert x.dtype == weight.dtype
        seen.append(x.dtype)
        clock.now += 1.0 if x.dtype == torch.float32 else 3.0
        return original(x, weight, bias)

    monkeypatch.setattr(onednn.F, "linear", linear)
    dtypes = [torch.float32, torch.bfloat16]
    times = onednn.time_product_dtypes([(4, 8, 16), (4, 16, 8)], dtypes, rounds=2)
    assert times == {torch.float32: 2.0, torch.bfloat16: 6.0}  # two shapes a round
    assert seen == [d for _ in range(3) for d in dtypes for _ in range(2)]


def test_a_resume_with_mkls_intel_path_switched_is_warned(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A run started with MKL's Intel path on (seq2seq/mkl.py) and resumed with it off keeps
    the state it started with and says that ATen's products now round differently."""
    on, off = (
        "on (MKL's vendor check answered by seq2seq._mkl_intel)",
        "off: SEQ2SEQ_MKL_INTEL_PATH=0",
    )
    monkeypatch.setattr(mkl, "STATE", off)
    with caplog.at_level(logging.WARNING):
        assert seq2seq.train.precision.check_mkl_path(on, "aten") == on
    assert "so this resume is not bit-exact" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        assert seq2seq.train.precision.check_mkl_path(off, "aten") == off  # unchanged
        assert seq2seq.train.precision.check_mkl_path(on, "onednn") == on  # MKL runs none
        assert seq2seq.train.precision.check_mkl_path("", "aten") == off  # a new run: now's
    assert "bit-exact" not in caplog.text
