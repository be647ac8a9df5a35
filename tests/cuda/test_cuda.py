"""The product on a CUDA GPU: the plain-PyTorch reference path there computes what the CPU
computes, and a training run trains, resumes and saves checkpoints a CPU can load.

Skipped without a CUDA device (CI has none); run on a GPU machine with `make test` or
`pytest tests/cuda`. Tolerances: float32 with TF32 off (PyTorch's default for matmuls, set
explicitly here), so CUDA and CPU differ by summation order alone.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import seq2seq.train.precision
from seq2seq import kernels
from seq2seq.config.schema import DecodeConfig, PosKind, Precision, SearchKind
from seq2seq.data.batching import collate
from seq2seq.decode.load import load_for_inference
from seq2seq.decode.schedule import translate_ids
from seq2seq.decode.search import Hypothesis
from seq2seq.model.transformer import EncoderDecoder
from seq2seq.train.checkpoint import load_checkpoint
from seq2seq.train.steplog import LOG_NAME, read_step_log
from tests.conftest import MakeModel
from tests.search_cases import SEARCHES, eos_biased_model, random_sources
from tests.tiny_run import run_cli, start_child, tiny_overrides, write_slice
from tests.train.test_precision import auto_trainer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

CUDA = torch.device("cuda")
VOCAB = 61
LOSS_RTOL = 1e-5
GRAD_ATOL = 1e-5
SCORE_TOL = 1e-4


@pytest.fixture(autouse=True)
def no_tf32() -> Iterator[None]:
    """float32 matmuls in float32 (a TF32 product differs from the CPU's by ~1e-3)."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
    kernels.set_mode("auto")


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(src, tgt_in, tgt_out) of 5 rows with padding at varied lengths (data.batching.collate)."""
    gen = torch.Generator().manual_seed(seed)
    src = [torch.randint(4, VOCAB, (n,), generator=gen).tolist() for n in (8, 3, 5, 1, 6)]
    tgt = [torch.randint(4, VOCAB, (n,), generator=gen).tolist() for n in (7, 2, 4, 5, 1)]
    b = collate(range(5), src, tgt)
    return b.src, b.tgt_in, b.tgt_out


def loss_and_grads(
    model: EncoderDecoder, device: torch.device, rdrop: float, all_positions: bool
) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """The summed loss and NLL of `batch()` on `device`, and every parameter's gradient."""
    model = model.to(device)
    model.zero_grad(set_to_none=True)
    src, tgt_in, tgt_out = (t.to(device) for t in batch())
    loss, nll = model(src, tgt_in, tgt_out, 0.1, rdrop, all_positions)
    loss.backward()
    grads = {n: p.grad.detach().cpu() for n, p in model.named_parameters() if p.grad is not None}
    return [loss.detach().cpu(), nll.detach().cpu()], grads


@pytest.mark.parametrize("kind", list(PosKind), ids=lambda k: k.value)
def test_loss_and_gradients_on_cuda_match_the_cpu(kind: PosKind, make_model: MakeModel) -> None:
    """Catches a positional hook, mask or the reference loss that computes something else on
    CUDA than on the CPU (device-dependent indexing, a mask built on the wrong device, dtype
    promotion): the CPU's fused loss kernels (auto) against CUDA's reference path."""
    model = make_model(kind, layers=2, vocab=VOCAB, norm_first=kind != PosKind.rope)
    want, want_grads = loss_and_grads(model, torch.device("cpu"), 0.0, False)
    got, grads = loss_and_grads(model, CUDA, 0.0, False)
    torch.testing.assert_close(got, want, rtol=LOSS_RTOL, atol=0.0)
    assert grads.keys() == want_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, want_grads[name], rtol=1e-4, atol=GRAD_ATOL, msg=name)


@pytest.mark.parametrize("all_positions", [False, True])
def test_rdrop_loss_on_cuda_matches_the_cpus_fused_kernel(
    all_positions: bool, make_model: MakeModel
) -> None:
    """Catches R-Drop's reference loss (both (N, V) logits) disagreeing with the CPU's chunked
    kernel, with padded labels skipped inside the loss (all_positions) or before it. Dropout
    is 0, so both passes agree and the KL term must be 0 on both devices."""
    model = make_model(PosKind.rope, layers=1, vocab=VOCAB)
    want, want_grads = loss_and_grads(model, torch.device("cpu"), 1.0, all_positions)
    got, grads = loss_and_grads(model, CUDA, 1.0, all_positions)
    plain, _ = loss_and_grads(model, CUDA, 0.0, all_positions)
    torch.testing.assert_close(got, want, rtol=LOSS_RTOL, atol=0.0)
    torch.testing.assert_close(got[0], plain[0], rtol=LOSS_RTOL, atol=0.0)  # KL = 0
    for name, grad in grads.items():
        torch.testing.assert_close(grad, want_grads[name], rtol=1e-4, atol=GRAD_ATOL, msg=name)


def tokens(found: list[list[Hypothesis]]) -> list[list[list[int]]]:
    return [[h.tokens for h in hyps] for hyps in found]


@pytest.mark.parametrize("search", sorted(SEARCHES))
@pytest.mark.parametrize("kind", [PosKind.sinusoidal, PosKind.rope, PosKind.t5_bias])
def test_searches_on_cuda_find_what_the_cpu_finds(
    kind: PosKind, search: str, make_model: MakeModel
) -> None:
    """Catches a search whose bookkeeping (finished rows, beams reordered, the cache kept for
    the rows left, the sampler's random table) depends on the device: the same tokens as the
    CPU's, and scores within float tolerance."""
    model = eos_biased_model(make_model, kind, VOCAB)
    sources = random_sources(VOCAB, 9)
    want = translate_ids(model, sources, SEARCHES[search])
    got = translate_ids(model.to(CUDA), sources, SEARCHES[search])
    assert tokens(got) == tokens(want)
    for g_hyps, w_hyps in zip(got, want, strict=True):
        for g, w in zip(g_hyps, w_hyps, strict=True):
            assert g.score == pytest.approx(w.score, abs=SCORE_TOL)
    assert len({len(h.tokens) for hyps in got for h in hyps}) > 1


@pytest.fixture(scope="module")
def cuda_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Path]:
    """The tiny training run (tests/tiny_run.py), trained on CUDA to the end."""
    root = tmp_path_factory.mktemp("cuda_run")
    overrides = tiny_overrides(
        write_slice(root / "data"), root / "tokenizers", "trainer.device=cuda"
    )
    run_dir = root / "straight"
    out = run_cli(overrides, run_dir)
    assert out.returncode == 0, out.stdout + out.stderr
    return overrides, run_dir


def test_a_run_trains_on_cuda_and_its_checkpoint_translates_on_the_cpu(
    cuda_run: tuple[list[str], Path],
) -> None:
    """Catches a run that silently trains on the CPU, a loss that does not fall, and a
    checkpoint that holds CUDA tensors a CPU-only machine cannot load."""
    _, run_dir = cuda_run
    log = (run_dir / "train.log").read_text()
    assert "device cuda" in log
    steps = [r for r in read_step_log(run_dir / LOG_NAME) if r.get("type") == "train"]
    assert steps
    assert steps[-1]["loss"] < steps[0]["loss"]
    state = load_checkpoint(run_dir / "checkpoints" / "best.pt")
    assert all(t.device.type == "cpu" for t in state["model"].values())
    model, src_tok, _, _ = load_for_inference(run_dir / "checkpoints" / "best.pt", "cpu")
    ids = [src_tok.encode(line) for line in ("one two three", "forty")]
    cfg = DecodeConfig(method=SearchKind.beam, beam_size=3, max_len_a=1.0, max_len_b=5)
    on_cpu = translate_ids(model, ids, cfg)
    on_cuda = translate_ids(model.to(CUDA), ids, cfg)
    assert tokens(on_cuda) == tokens(on_cpu)
    assert json.loads((run_dir / "results.json").read_text())  # test scores were written


def test_a_run_stopped_on_cuda_resumes_to_the_same_weights(
    cuda_run: tuple[list[str], Path], tmp_path: Path
) -> None:
    """Catches a resume on CUDA that loses the GPU's random state (dropout masks would differ
    after the restart) or the optimizer's: SIGTERM after step 6, resume, and the final weights
    match the straight run's (to float tolerance: CUDA's atomic adds may reorder sums)."""
    overrides, straight = cuda_run
    run_dir = tmp_path / "run"
    child = start_child(overrides, run_dir, pause_at=5, action="SIGTERM")
    out, _ = child.communicate(timeout=600)
    assert child.returncode == 128 + signal.SIGTERM, out
    assert "cuda" in load_checkpoint(run_dir / "checkpoints" / "last.pt")["rng"]
    resumed = run_cli(overrides, run_dir)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    want = load_checkpoint(straight / "checkpoints" / "last.pt")
    got = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert got["train_state"]["step"] == want["train_state"]["step"]
    for name, tensor in want["model"].items():
        torch.testing.assert_close(got["model"][name], tensor, rtol=1e-5, atol=1e-6, msg=name)


def test_precision_auto_times_both_on_a_cuda_gpu_and_trains_in_the_faster(
    tmp_path: Path,
) -> None:
    """Catches auto not timing on a GPU with bf16 (the faster precision there depends on the
    model's size), a choice that is not the faster of the logged times, and a CUDA run whose
    loss is not finite."""
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    overrides = tiny_overrides(
        write_slice(tmp_path / "data"),
        tmp_path / "tokenizers",
        "trainer.device=cuda",
        "trainer.precision=auto",
        "trainer.max_steps=4",
    )
    out = run_cli(overrides, tmp_path / "run")
    assert out.returncode == 0, out.stdout + out.stderr
    timed = json.loads((tmp_path / "run" / "results.json").read_text())["precision_s_per_step"]
    assert set(timed) == {"fp32", "bf16"}
    chosen = "fp32" if timed["fp32"] <= timed["bf16"] else "bf16"
    log = (tmp_path / "run" / "train.log").read_text()
    assert f"precision auto: {chosen} on this GPU" in log
    assert f"precision {chosen}" in log
    steps = [r for r in read_step_log(tmp_path / "run" / LOG_NAME) if r.get("type") == "train"]
    assert steps
    assert all(torch.isfinite(torch.tensor(float(r["loss"]))) for r in steps)


def test_auto_timing_on_cuda_leaves_no_trace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A CUDA run whose auto chose fp32 trains as a run asked for fp32: the timed steps put back
    the weights, the optimizer and the GPU's random generator, which dropout draws from (not
    bitwise: CUDA's backward sums in no fixed order)."""
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    monkeypatch.setattr(seq2seq.train.precision, "faster", lambda times: Precision.fp32)
    runs = {}
    for precision in ("auto", "fp32"):
        trainer = auto_trainer(tmp_path / precision, precision, ["trainer.device=cuda"])
        trainer.fit()
        trainer.close()
        assert trainer.precision == Precision.fp32
        runs[precision] = {n: t.detach().cpu() for n, t in trainer.model.state_dict().items()}
    for name, tensor in runs["fp32"].items():
        torch.testing.assert_close(runs["auto"][name], tensor, rtol=1e-5, atol=1e-6, msg=name)
