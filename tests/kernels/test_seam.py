"""seq2seq.kernels: the two modes (auto: the fast CPU kernels; reference: plain PyTorch) run the
same model to float rounding, forward, backward and decoding; setup_process, not the import,
changes the process's settings; and no optimizer leaves decoding with stale packed weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from seq2seq import kernels
from seq2seq.config.schema import PosKind
from seq2seq.data.tokenizer import BOS_ID
from seq2seq.decode.search import greedy_search
from seq2seq.kernels import onednn
from seq2seq.model.layers import MultiHeadAttention
from seq2seq.model.transformer import EncoderDecoder, build_positional
from tests.conftest import MakeModel, MakeSources, tiny_pos_config

ALL_KINDS = list(PosKind)
# auto and reference run the same arithmetic with other kernels (oneDNN or MKL, matmuls or
# SDPA, padded keys, a chunked loss): float32 rounding apart, not bit for bit
TOL = {"rtol": 1e-4, "atol": 1e-5}


@pytest.fixture(autouse=True)
def auto_afterwards() -> Iterator[None]:
    """Each test leaves the process in auto mode, whatever it (or a Trainer) chose."""
    yield
    kernels.set_mode("auto")


def with_bos(tokens: torch.Tensor) -> torch.Tensor:
    return torch.cat((torch.full((tokens.size(0), 1), BOS_ID), tokens[:, :-1]), dim=1)


# --------------------------------------------------------------------------- mode and setup


def test_set_mode_and_use() -> None:
    assert kernels.get_mode() == "auto"
    with kernels.use("reference"):
        assert kernels.get_mode() == "reference"
    assert kernels.get_mode() == "auto"
    with pytest.raises(ValueError, match="'fast'"):
        kernels.set_mode("fast")


# A fresh interpreter: the environment variables that change between two points, as JSON.
ENV_PROBE = """
import json, os, sys
before = dict(os.environ)
import seq2seq.kernels, seq2seq.model.layers, seq2seq.model.transformer, seq2seq.decode.search
if sys.argv[1] != "import":
    seq2seq.kernels.setup_process(training=sys.argv[1] == "setup-training")
after = dict(os.environ)
keys = before.keys() | after.keys()
print(json.dumps({k: after.get(k) for k in keys if before.get(k) != after.get(k)}))
"""


def env_changes(step: str, **exported: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in onednn.CACHE_VARIABLES}
    run = subprocess.run(
        [sys.executable, "-c", ENV_PROBE, step],
        env={**env, **exported},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(run.stdout)


def test_importing_changes_no_environment_variable() -> None:
    assert env_changes("import") == {}


def test_setup_caps_onednn_caches_for_training_unless_the_user_set_them() -> None:
    cap = str(onednn.CACHE_CAPACITY)
    assert env_changes("setup-training") == dict.fromkeys(onednn.CACHE_VARIABLES, cap)
    exported = env_changes("setup-training", LRU_CACHE_CAPACITY="7")
    assert exported == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": cap}


def test_setup_for_decoding_keeps_onednns_default_caches() -> None:
    assert env_changes("setup-decoding") == {}


CUDNN_PROBE = """
import sys, torch
import seq2seq.kernels, seq2seq.model.transformer
if sys.argv[1] == "setup":
    seq2seq.kernels.setup_process()
print(torch.backends.cuda.cudnn_sdp_enabled())
"""


def test_setup_not_the_import_turns_off_cudnn_attention() -> None:
    def enabled(step: str) -> str:
        run = subprocess.run(
            [sys.executable, "-c", CUDNN_PROBE, step], capture_output=True, text=True, check=True
        )
        return run.stdout.strip()

    assert enabled("import") == "True"  # torch's default, untouched by importing us
    assert enabled("setup") == "False"


def test_setup_keeps_freed_memory_on_the_cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(kernels, "keep_freed_memory", lambda: calls.append("malloc") or True)
    kernels.setup_process(torch.device("cuda"), training=True)
    kernels.setup_process(None, training=False)
    assert calls == []
    assert kernels.get_mode() == "auto"
    kernels.setup_process(torch.device("cpu"), training=False)
    kernels.setup_process(torch.device("cpu"), training=True, mode="reference")
    assert calls == ["malloc", "malloc"]
    assert kernels.get_mode() == "reference"


# --------------------------------------------------------------------------- auto = reference


def both_modes(fn: object) -> dict[str, list[torch.Tensor]]:
    """fn()'s tensors in each mode (fn must seed itself if it draws random numbers)."""
    out = {}
    for mode in kernels.MODES:
        with kernels.use(mode):
            out[mode] = [t.detach().clone() for t in fn()]  # type: ignore[operator]
    return out


def assert_modes_agree(out: dict[str, list[torch.Tensor]], **tol: float) -> None:
    for got, want in zip(out["auto"], out["reference"], strict=True):
        torch.testing.assert_close(got, want, **(tol or TOL))


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
@pytest.mark.parametrize("norm_first", [True, False], ids=["pre", "post"])
def test_model_forward_backward_agree(
    kind: PosKind, norm_first: bool, make_model: MakeModel, make_sources: MakeSources
) -> None:
    """A training step's loss (the fused output layer + loss against F.cross_entropy on full
    logits), the teacher-forced logits, and every parameter's gradient, fp32, no dropout."""
    model = make_model(kind, layers=2, norm_first=norm_first).train()
    src = make_sources([7, 4, 2], seed=1)  # padded sources
    tgt = make_sources([6, 3, 5], seed=2)  # padded targets
    tgt_in = with_bos(tgt)

    def step() -> list[torch.Tensor]:
        model.zero_grad()
        loss, nll = model(src, tgt_in, tgt, 0.1)
        loss.backward()
        logits = model.logits(src, tgt_in)  # (B, T, V)
        return [loss, nll, logits, *(p.grad for p in model.parameters())]

    assert_modes_agree(both_modes(step))


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_dropout_agrees_in_shape_and_scale(p: float) -> None:
    """The masks differ (16-bit draws against bernoulli), not what they do: the same share of
    zeros, the same scale of what is kept, the same dtype and shape; off outside training."""
    x = torch.ones(300, 301)
    for mode in kernels.MODES:
        with kernels.use(mode):
            assert kernels.dropout(x, p, training=False) is x
            out = kernels.dropout(x, p, training=True)
        assert out.shape == x.shape
        assert out.dtype == x.dtype
        assert abs(out.eq(0).float().mean().item() - p) < 0.01
        torch.testing.assert_close(
            out[out.ne(0)].max(), torch.tensor(1 / (1 - p)), rtol=1e-4, atol=0
        )
        assert abs(out.mean().item() - 1.0) < 0.02


def test_model_with_dropout_agrees_in_shape_and_scale(
    make_model: MakeModel, make_sources: MakeSources
) -> None:
    """With dropout on, both modes train the same model: the losses of the same batch are close
    (the masks differ), and every parameter gets a finite gradient of the same shape."""
    model = make_model(PosKind.rope, layers=2, dropout=0.1).train()
    for module in model.modules():
        if isinstance(module, MultiHeadAttention):
            module.dropout = 0.1  # on the attention weights too
    src, tgt = make_sources([7, 4, 2], seed=1), make_sources([6, 3, 5], seed=2)
    tgt_in = with_bos(tgt)
    losses = {}
    for mode in kernels.MODES:
        model.zero_grad()
        torch.manual_seed(0)
        with kernels.use(mode):
            loss, _ = model(src, tgt_in, tgt, 0.1)
            loss.backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
        losses[mode] = loss.item()
    assert losses["auto"] != losses["reference"]  # different masks ...
    assert losses["auto"] == pytest.approx(losses["reference"], rel=0.1)  # ... same model


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
def test_output_loss_and_gradients_agree(autocast: bool) -> None:
    gen = torch.Generator().manual_seed(4)
    hidden = torch.randn(300, 16, generator=gen)  # more rows than one 256-row chunk
    weight = torch.randn(50, 16, generator=gen)
    target = torch.randint(1, 50, (300,), generator=gen)

    def loss_and_grads() -> list[torch.Tensor]:
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss, nll = kernels.output_loss(h, w, target, 0.1)
        (loss * 0.5).backward()
        assert loss.dtype == torch.float32
        assert not nll.requires_grad
        return [loss, nll, h.grad, w.grad]  # type: ignore[list-item]

    out = both_modes(loss_and_grads)
    if not autocast:
        assert_modes_agree(out)
        return
    for got, want in zip(out["auto"], out["reference"], strict=True):  # bf16 products
        torch.testing.assert_close(got, want, rtol=0.02, atol=0.02 * float(want.abs().max()))


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("length", [5, 20, 40])
def test_attention_agrees_for_every_positional_encoding(
    kind: PosKind, causal: bool, length: int
) -> None:
    """Self-attention with each variant's bias, rotation or relative values, a padding mask,
    causal or not, on either side of the CPU kernels' thresholds: output and the gradients of
    the input and of every parameter (the encoding's tables included)."""
    torch.manual_seed(0)
    pos = build_positional(tiny_pos_config(kind), 32, 4, causal=causal)
    for param in pos.parameters():
        torch.nn.init.normal_(param, std=0.5)
    attn = MultiHeadAttention(32, 4, 0.0, pos, causal=causal)
    x = torch.randn(3, length, 32)
    key_mask = torch.ones(3, length, dtype=torch.bool)
    key_mask[1, length - 2 :] = False
    key_mask[2, 1:] = False

    def forward_backward() -> list[torch.Tensor]:
        attn.zero_grad()
        inp = x.clone().requires_grad_()
        out = attn(inp, key_mask=key_mask)
        out.square().sum().backward()
        grads = [p.grad for p in attn.parameters() if p.grad is not None]  # learned: no table
        return [out, inp.grad, *grads]  # type: ignore[list-item]

    assert_modes_agree(both_modes(forward_backward))


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
def test_cached_decoding_agrees(
    kind: PosKind, make_model: MakeModel, make_sources: MakeSources
) -> None:
    """Step-by-step decoding with a cache (one query a step, beams folded into cross-attention
    rows): the logits of every step and the greedy translations."""
    model = make_model(kind, layers=2)
    src = make_sources([8, 3, 5], seed=3)
    tgt_in = with_bos(make_sources([8, 8, 8], seed=4))

    def decode() -> list[torch.Tensor]:
        with torch.inference_mode():
            memory, src_mask = model.encode(src)
            cache = model.new_cache()
            steps = [model.decode(tgt_in[:, i : i + 1], memory, src_mask, cache) for i in range(9)]
            hyps = greedy_search(model, src, torch.full((3,), 12))
        tokens = [torch.tensor(h.tokens, dtype=torch.float32) for h in hyps]
        return [torch.cat(steps, dim=1), *tokens]

    assert_modes_agree(both_modes(decode))


# --------------------------------------------------------------------------- packed weights


def fresh_copy(model: EncoderDecoder, make_model: MakeModel) -> EncoderDecoder:
    """A new model (nothing packed yet) holding `model`'s current weights."""
    twin = make_model(PosKind.sinusoidal, layers=2, seed=1)
    twin.load_state_dict(model.state_dict())
    return twin.eval()


@pytest.mark.parametrize(
    "optimizer",
    [lambda p: torch.optim.SGD(p, lr=0.5), lambda p: torch.optim.AdamW(p, lr=0.05, fused=True)],
    ids=["sgd", "fused-adamw"],
)
def test_decoding_after_any_optimizer_step_uses_the_new_weights(
    optimizer: object, make_model: MakeModel, make_sources: MakeSources
) -> None:
    """A model decoded (weights packed), trained a step by an optimizer built here, outside
    seq2seq.train.build, then decoded again equals a fresh model loaded with the updated weights:
    no stale packed weight survives the step (fused AdamW writes without bumping versions)."""
    model = make_model(PosKind.sinusoidal, layers=2)
    opt = optimizer(model.parameters())  # type: ignore[operator]
    src, tgt = make_sources([6, 4], seed=5), make_sources([5, 5], seed=6)
    for _ in range(2):
        model.eval()
        with torch.no_grad():
            model.logits(src, with_bos(tgt))  # decoding: packs the weights
        model.train()
        model(src, with_bos(tgt), tgt, 0.1)[0].backward()
        opt.step()
        opt.zero_grad()
        model.eval()
        with torch.no_grad():
            got = model.logits(src, with_bos(tgt))
            want = fresh_copy(model, make_model).logits(src, with_bos(tgt))
        assert torch.equal(got, want)
        with torch.inference_mode():
            got_hyps = greedy_search(model, src, torch.full((2,), 10))
            want_hyps = greedy_search(fresh_copy(model, make_model), src, torch.full((2,), 10))
        assert [h.tokens for h in got_hyps] == [h.tokens for h in want_hyps]


# --------------------------------------------------------------------------- the switch


def test_trainer_kernels_reference_trains_like_auto(tmp_path: Path) -> None:
    """trainer.kernels=reference trains the same model as auto: the same losses, to float
    rounding, over a few AdamW steps (no dropout)."""
    from tests.train.test_trainer import tiny_trainer, train_records

    losses = {}
    for mode in kernels.MODES:
        trainer = tiny_trainer(tmp_path / mode, f"trainer.kernels={mode}")
        assert kernels.get_mode() == mode
        trainer.fit()
        trainer.close()
        losses[mode] = [r["loss"] for r in train_records(trainer)]
    assert len(losses["auto"]) == 3
    assert losses["reference"] == pytest.approx(losses["auto"], rel=1e-4)
