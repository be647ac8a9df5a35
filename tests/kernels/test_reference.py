"""seq2seq.kernels.reference: the attention mask, and the plain PyTorch kernels against
written-out formulas."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from seq2seq.kernels import reference
from seq2seq.kernels.reference import attention_mask
from tests.references import smoothed_loss

Y, N = True, False  # short names keep the mask tables readable
CPU = torch.device("cpu")

# --------------------------------------------------------------------------- attention_mask


def test_attention_mask_none_when_everything_is_allowed() -> None:
    assert attention_mask(None, causal=False, q_len=3, k_len=3, device=CPU) is None
    # a single causal query (incremental decoding) sees every cached key
    assert attention_mask(None, causal=True, q_len=1, k_len=4, device=CPU) is None


def test_attention_mask_padding_only() -> None:
    key_mask = torch.tensor([[Y, Y, N], [Y, N, N]])
    mask = attention_mask(key_mask, causal=False, q_len=2, k_len=3, device=CPU)
    assert mask is not None
    assert mask.shape == (2, 1, 1, 3)
    assert mask[:, 0, 0].tolist() == [[Y, Y, N], [Y, N, N]]


def test_attention_mask_causal_square() -> None:
    mask = attention_mask(None, causal=True, q_len=3, k_len=3, device=CPU)
    assert mask is not None
    assert mask.shape == (1, 1, 3, 3)
    assert mask[0, 0].tolist() == [[Y, N, N], [Y, Y, N], [Y, Y, Y]]


def test_attention_mask_causal_with_cached_keys() -> None:
    # 2 new queries at positions 2 and 3 after 2 cached tokens: 4 keys
    mask = attention_mask(None, causal=True, q_len=2, k_len=4, device=CPU)
    assert mask is not None
    assert mask[0, 0].tolist() == [[Y, Y, Y, N], [Y, Y, Y, Y]]


def test_attention_mask_causal_and_padding_combine() -> None:
    key_mask = torch.tensor([[Y, Y, Y], [Y, Y, N]])
    mask = attention_mask(key_mask, causal=True, q_len=3, k_len=3, device=CPU)
    assert mask is not None
    assert mask.shape == (2, 1, 3, 3)
    assert mask[0, 0].tolist() == [[Y, N, N], [Y, Y, N], [Y, Y, Y]]
    assert mask[1, 0].tolist() == [[Y, N, N], [Y, Y, N], [Y, Y, N]]


def test_attention_mask_single_query_keeps_padding() -> None:
    key_mask = torch.tensor([[Y, N]])
    mask = attention_mask(key_mask, causal=True, q_len=1, k_len=2, device=CPU)
    assert mask is not None
    assert mask.view(-1).tolist() == [Y, N]


# --------------------------------------------------------------------------- kernels


def test_linear_and_dropout_are_torch_s() -> None:
    gen = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(3, 4, 8, generator=gen), torch.randn(5, 8, generator=gen), torch.randn(5)
    torch.testing.assert_close(reference.linear(x, w, b), x @ w.T + b)
    torch.testing.assert_close(reference.linear(x, w, None, relu=True), (x @ w.T).clamp(min=0))
    assert reference.dropout(x, 0.3, training=False) is x
    assert reference.dropout(x, 0.0, training=True) is x
    torch.manual_seed(3)
    dropped = reference.dropout(x, 0.5, training=True)
    torch.manual_seed(3)
    torch.testing.assert_close(dropped, F.dropout(x, 0.5, True))


@pytest.mark.parametrize("causal", [False, True], ids=["bidir", "causal"])
@pytest.mark.parametrize("padded", [False, True], ids=["nopad", "pad"])
@pytest.mark.parametrize("biased", [False, True], ids=["nobias", "bias"])
def test_attention_is_the_softmax_formula(causal: bool, padded: bool, biased: bool) -> None:
    """Each SDPA call (no mask, is_causal, a boolean or float mask) and the explicit-weights
    path equal softmax(q k^T / sqrt(Dh) + bias, masked) v."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, 6, 4, generator=gen) for _ in range(3))  # (B, H, T, Dh)
    bias = torch.randn(1, 3, 6, 6, generator=gen) if biased else None
    key_mask = torch.tensor([[Y] * 6, [Y] * 4 + [N] * 2]) if padded else None
    logits = q @ k.transpose(-1, -2) / math.sqrt(4) + (0 if bias is None else bias)
    mask = attention_mask(key_mask, causal, 6, 6, CPU)
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    want = logits.softmax(-1) @ v  # (B, H, T, Dh)
    got = reference.attention(q, k, v, bias, key_mask, causal, 0.0, None)
    torch.testing.assert_close(got, want)
    doubled = reference.attention(q, k, v, bias, key_mask, causal, 0.0, lambda w: w @ v)
    torch.testing.assert_close(doubled, 2 * want)  # `values` sees the weights


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_output_loss_is_the_label_smoothed_loss_of_the_logits(eps: float) -> None:
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(9, 8, generator=gen, requires_grad=True)
    weight = torch.randn(13, 8, generator=gen)
    target = torch.randint(1, 13, (9,), generator=gen)
    loss, nll = reference.output_loss(hidden, weight, target, eps)
    want_loss, want_nll = smoothed_loss(hidden @ weight.T, target, eps)
    torch.testing.assert_close(loss, want_loss)
    torch.testing.assert_close(nll, want_nll)
    assert loss.requires_grad
    assert not nll.requires_grad
