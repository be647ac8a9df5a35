"""benchmarks/train_profile.py: the kind of each op by its name, and the phase of each profiled
op from the frames around it (a real profile of a forward, backward and AdamW step)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def train_profile(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))
    import train_profile as module

    return module


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("mkldnn::_linear_pointwise", "matmul"),
        ("aten::addmm", "matmul"),
        ("aten::mm", "matmul"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
        ("aten::bmm", "attention"),
        ("aten::_softmax_backward_data", "attention"),
        ("aten::_log_softmax_backward_data", "loss and softmax"),
        ("aten::nll_loss_forward", "loss and softmax"),
        ("aten::native_layer_norm_backward", "layer norm"),
        ("aten::_fused_adamw_", "optimizer math"),
        ("aten::native_dropout", "dropout"),
        ("aten::copy_", "copies and casts"),
        ("aten::index_select", "indexing"),
        ("aten::threshold_backward", "other elementwise"),
        ("aten::empty", "other"),
    ],
)
def test_kind_of_names_each_op_kind(train_profile: ModuleType, name: str, kind: str) -> None:
    assert train_profile.kind_of(name) == kind


def test_classify_tells_forward_backward_and_optimizer(train_profile: ModuleType) -> None:
    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 8)
    optimizer = torch.optim.AdamW(layer.parameters(), lr=0.1)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with torch.profiler.record_function("forward"):
            loss = layer(torch.randn(4, 8)).square().sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(layer.parameters(), 1.0)
        optimizer.step()
    phases: dict[str, set[str]] = {}
    for event in prof.events():
        phases.setdefault(train_profile.classify(event)[0], set()).add(event.name)
    assert "aten::addmm" in phases["forward"]
    assert any(name.startswith("autograd::engine") for name in phases["backward"])
    assert any("mm" in name for name in phases["backward"])  # the gradients' products
    assert phases["optimizer"]  # AdamW's own ops
    assert not phases["optimizer"] & {"aten::addmm"}
    assert "clip and rest" in phases  # clipping's norm, outside forward, backward and step


def test_arguments_give_train_throughputs_config_every_setting(
    train_profile: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    argv = ["train_profile.py", "--data", str(tmp_path), "--precision", "bf16"]
    monkeypatch.setattr(sys, "argv", argv)
    cfg = train_profile.tt.train_config(train_profile.arguments())
    assert cfg.trainer.precision.value == "bf16"
    assert cfg.trainer.rdrop_alpha == 0
    assert cfg.trainer.max_tokens == 4096


def test_classify_counts_our_fused_losss_softmax_as_loss(train_profile: ModuleType) -> None:
    """Inside kernels.output_loss (CPU path) the softmax is the loss's; its products stay
    matmuls."""
    from seq2seq.kernels import output_loss

    torch.manual_seed(0)
    hidden = torch.randn(6, 8, requires_grad=True)
    weight = torch.randn(11, 8, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        output_loss(hidden, weight, torch.randint(0, 11, (6,)), 0.1)
    kinds = {e.name: train_profile.classify(e)[1] for e in prof.events()}
    assert kinds["aten::_softmax"] == "loss and softmax"
    assert "matmul" in kinds.values()
