"""seq2seq.kernels.onednn: float32 products on oneDNN equal torch's, forward and backward; the
packed weights of decoding follow every change of a weight."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from seq2seq.kernels import cpu, onednn, timing
from seq2seq.model.layers import Linear

pytestmark = pytest.mark.skipif(not onednn.AVAILABLE, reason="this torch build has no oneDNN ops")


def _grads(fn, *tensors: torch.Tensor, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """fn's output and the gradients of its inputs under a fixed random upstream gradient."""
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    out = fn(*leaves)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    out.backward(upstream)
    return (out.detach(), *(t.grad for t in leaves))


@pytest.mark.parametrize("relu", [False, True], ids=["plain", "relu"])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize(("d_in", "d_out"), [(16, 8), (8, 24), (12, 12)])
def test_training_linear_matches_f_linear(relu: bool, bias: bool, d_in: int, d_out: int) -> None:
    """Output and all three gradients, for narrowing, widening (packed weight) and square
    layers, through the ReLU (negative pre-activations get no gradient)."""
    gen = torch.Generator().manual_seed(d_in * d_out)
    x = torch.randn(3, 5, d_in, generator=gen)  # (B, T, K)
    w = torch.randn(d_out, d_in, generator=gen)
    b = torch.randn(d_out, generator=gen) if bias else None

    def reference(x: torch.Tensor, w: torch.Tensor, *b: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, w, b[0] if b else None)
        return F.relu(out) if relu else out

    def ours(x: torch.Tensor, w: torch.Tensor, *b: torch.Tensor) -> torch.Tensor:
        out = onednn.linear(x, w, b[0] if b else None, relu)
        assert type(out.grad_fn).__name__ == "_LinearBackward"  # the oneDNN backward
        return out

    args = (x, w) if b is None else (x, w, b)
    for got, want in zip(_grads(ours, *args), _grads(reference, *args), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_training_linear_with_a_non_contiguous_upstream_gradient() -> None:
    """The gradient reaching a projection is often a transposed view (attention heads)."""
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(2, 6, 8, generator=gen), torch.randn(8, 8, generator=gen)

    def through_heads(fn):
        return lambda x, w: fn(x, w).view(2, 6, 2, 4).transpose(1, 2)  # (B, H, T, Dh)

    got = _grads(through_heads(lambda x, w: onednn.linear(x, w, None)), x, w)
    want = _grads(through_heads(lambda x, w: F.linear(x, w)), x, w)
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("n", "k"), [(6, 20), (20, 6), (9, 9)], ids=["n<k", "n>k", "n=k"])
def test_weight_grad_both_orientations(n: int, k: int) -> None:
    gen = torch.Generator().manual_seed(n + k)
    grad, x = torch.randn(33, n, generator=gen), torch.randn(33, k, generator=gen)
    got = onednn.weight_grad(grad, x)
    assert got.shape == (n, k)
    torch.testing.assert_close(got, grad.T @ x, rtol=1e-5, atol=1e-5)


def test_matmul_t_with_a_packed_weight() -> None:
    gen = torch.Generator().manual_seed(2)
    a, b = torch.randn(7, 16, generator=gen), torch.randn(40, 16, generator=gen)
    torch.testing.assert_close(onednn.matmul_t(a, onednn.pack(b)), a @ b.T)
    torch.testing.assert_close(onednn.matmul_t(a, b), a @ b.T)
    a_t, b_t = a.T.contiguous().T, b.T.contiguous().T  # transposed layouts
    torch.testing.assert_close(onednn.matmul_t(a_t, b_t), a @ b.T)


def test_usable_only_for_float32_cpu_outside_autocast(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.randn(2, 3)
    assert onednn.usable(x, x)
    assert not onednn.usable(x, x.bfloat16())
    assert not onednn.usable(x.double())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not onednn.usable(x, x)
    monkeypatch.setattr(onednn, "ENABLED", False)
    assert not onednn.usable(x, x)


def test_layers_linear_trains_on_onednn_in_float32_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """seq2seq.model.layers.Linear takes the oneDNN backward in float32 training, F.linear's under
    bf16 autocast or with oneDNN switched off."""
    layer, x = Linear(8, 16), torch.randn(4, 8, requires_grad=True)
    assert type(layer(x).grad_fn).__name__ == "_LinearBackward"
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert type(layer(x).grad_fn).__name__ == "AddmmBackward0"
    monkeypatch.setattr(onednn, "ENABLED", False)
    assert type(layer(x).grad_fn).__name__ == "AddmmBackward0"


def test_linear_decoding_path_matches_f_linear_and_follows_weight_updates() -> None:
    """Without autograd, Linear may run on oneDNN with a cached packed weight (more rows than
    cpu.SMALL_ROWS): same results as F.linear, also after an in-place update of the weight (its
    version moves), and training still gets gradients."""
    torch.manual_seed(0)
    layer, x = Linear(16, 8), torch.randn(5, 4, 16)
    assert x.numel() // 16 > cpu.SMALL_ROWS  # rows
    with torch.inference_mode():
        got = layer(x, relu=True)
    torch.testing.assert_close(got, F.relu(F.linear(x, layer.weight, layer.bias)))
    with torch.no_grad():
        layer.weight.mul_(-2.0)
        got = layer(x)
    torch.testing.assert_close(got, F.linear(x, layer.weight, layer.bias))
    layer(x).square().sum().backward()
    assert layer.weight.grad is not None
    assert layer.weight.grad.abs().sum() > 0


class _SilentStep(torch.optim.Optimizer):
    """Writes its parameters without bumping their versions, as fused AdamW's kernel does."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        super().__init__(params, {})

    @torch.no_grad()
    def step(self, closure: object = None) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                p.data.mul_(-1.0)  # .data: a view with its own version counter


def test_any_optimizer_step_drops_the_packed_weights_it_stepped() -> None:
    """A packed copy outlives no optimizer step, even one that leaves the weight's version as
    it was; weights the step did not touch keep theirs."""
    layer, other, x = Linear(16, 8), Linear(16, 8), torch.randn(12, 16)  # > cpu.SMALL_ROWS
    with torch.no_grad():
        layer(x), other(x)
        assert layer.weight in onednn._PACKED
        assert other.weight in onednn._PACKED
        version = layer.weight._version
        _SilentStep([layer.weight]).step()
        assert layer.weight._version == version  # the version alone would not tell
        assert layer.weight not in onednn._PACKED
        assert other.weight in onednn._PACKED
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))


def test_set_products_moves_every_float32_product(monkeypatch: pytest.MonkeyPatch) -> None:
    """ "aten" sends float32 products to F.linear (training and decoding alike), "onednn" back;
    an unknown name is refused."""
    layer, x = Linear(8, 16), torch.randn(4, 8, requires_grad=True)
    onednn.set_products("aten")
    assert onednn.products() == "aten"
    assert not onednn.usable(x, x)
    assert type(layer(x).grad_fn).__name__ == "AddmmBackward0"
    onednn.set_products("onednn")
    assert onednn.products() == "onednn"
    assert onednn.usable(x, x)
    assert type(layer(x).grad_fn).__name__ == "_LinearBackward"
    with pytest.raises(ValueError, match="mkl"):
        onednn.set_products("mkl")


def _routes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records which backend each kernels.cpu.linear call takes ("onednn" or "aten")."""
    taken: list[str] = []
    for name, module in (("onednn", onednn), ("aten", cpu.reference)):
        real = module.linear
        monkeypatch.setattr(module, "linear", lambda *a, r=real, n=name: taken.append(n) or r(*a))
    return taken


@pytest.mark.parametrize(("small", "large"), [("aten", "onednn"), ("onednn", "aten")])
def test_decoding_products_by_large_weights_take_their_own_backend(
    monkeypatch: pytest.MonkeyPatch, small: str, large: str
) -> None:
    """Catches the output layer's product (a weight of LARGE_WEIGHT elements or more) following
    the small weights' choice when decoding, at any rows (even under SMALL_ROWS, where small
    weights take F.linear), or training's products leaving the process-wide choice; each route
    gives F.linear's values."""
    monkeypatch.setattr(onednn, "LARGE_WEIGHT", 40 * 8)
    gen = torch.Generator().manual_seed(0)
    wide, narrow = torch.randn(40, 8, generator=gen), torch.randn(16, 8, generator=gen)
    few, many = torch.randn(1, 8, generator=gen), torch.randn(3 * cpu.SMALL_ROWS, 8, generator=gen)
    onednn.set_products(small, large)
    assert (onednn.products(), onednn.large_products()) == (small, large)
    taken = _routes(monkeypatch)
    with torch.no_grad():
        for x, w in ((few, wide), (many, wide), (few, narrow), (many, narrow)):
            torch.testing.assert_close(cpu.linear(x, w, None), F.linear(x, w))
    assert taken == [large, large, "aten", small]
    taken.clear()
    cpu.linear(many.requires_grad_(), wide, None).sum().backward()  # training: one choice
    assert taken == [small]


def test_set_products_refuses_an_unknown_large_backend() -> None:
    with pytest.raises(ValueError, match="mkl"):
        onednn.set_products("aten", "mkl")
    assert (onednn.products(), onednn.large_products()) == ("onednn", "onednn")


def test_time_products_alternates_after_an_untimed_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """Catches timing the warm-up, not alternating, or averaging instead of the median: on a
    clock that moves by scripted seconds per round (no real timing)."""
    scripted = {"onednn": [50.0, 3.0, 1.0, 2.0], "aten": [0.1, 4.0, 9.0, 5.0]}
    clock, calls = [0.0], []

    def products(operands: list, name: str) -> None:
        calls.append(name)
        clock[0] += scripted[name][calls.count(name) - 1]

    monkeypatch.setattr(onednn, "_train_products", products)
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    times = onednn.time_products([(4, 8, 16)])
    assert calls == ["onednn", "aten"] * (onednn.TIMED_ROUNDS + 1)
    assert times == {"onednn": 2.0, "aten": 5.0}
    assert onednn.faster_products(times) == "onednn"


def test_time_products_runs_both_backends_products() -> None:
    """The real products, forward and backward, on each backend: both timed, nothing left set."""
    times = onednn.time_products([(6, 8, 16), (6, 16, 8)], rounds=1)
    assert set(times) == {"onednn", "aten"}
    assert min(times.values()) > 0
    assert onednn.products() == "onednn"


def test_product_backends_are_those_this_torch_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    assert onednn.product_backends() == (("onednn", "aten") if onednn.AVAILABLE else ("aten",))
    monkeypatch.setattr(onednn, "AVAILABLE", False)
    assert onednn.product_backends() == ("aten",)


def test_faster_products_takes_the_shorter_and_onednn_on_a_tie() -> None:
    assert onednn.faster_products({"onednn": 2.0, "aten": 1.0}) == "aten"
    assert onednn.faster_products({"onednn": 1.0, "aten": 2.0}) == "onednn"
    assert onednn.faster_products({"aten": 1.0, "onednn": 1.0}) == "onednn"
