"""seq2seq.loss: the label-smoothed loss's hand-written gradient against PyTorch's autograd."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from seq2seq.loss import label_smoothed_nll
from seq2seq.tokenizer import PAD_ID


def reference(logits: torch.Tensor, target: torch.Tensor, eps: float) -> torch.Tensor:
    """Summed label-smoothed loss through torch's autograd (padding ignored)."""
    return F.cross_entropy(
        logits.float(), target, ignore_index=PAD_ID, reduction="sum", label_smoothing=eps
    )


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_label_smoothed_nll_gradient_matches_autograd(eps: float) -> None:
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(20, 11, generator=gen) * 3).requires_grad_()
    target = torch.randint(1, 11, (20,), generator=gen)
    target[[0, 7]] = PAD_ID
    ours, _ = label_smoothed_nll(logits, target, eps)
    (ours * 0.7).backward()
    got = logits.grad.clone()
    logits.grad = None
    (reference(logits, target, eps) * 0.7).backward()
    torch.testing.assert_close(got, logits.grad)
    assert got[[0, 7]].abs().max() == 0  # padding gets no gradient
