"""Label-smoothed cross-entropy (Szegedy et al. 2016) on logits, with a hand-written gradient.

Validation and the benchmarks score logits with it. Training fuses it with the output layer
(seq2seq.kernels.output_loss), which shares `smoothed_grad`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from seq2seq.tokenizer import PAD_ID


def _smoothed_terms(lprobs: Tensor, target: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """Per-token label-smoothed loss and NLL (N,) from log-probabilities (N, V)."""
    nll = -lprobs.gather(-1, target[:, None]).squeeze(-1)  # (N,)
    return (1.0 - eps) * nll - eps * lprobs.mean(-1), nll


def smoothed_grad(probs: Tensor, target: Tensor, eps: float) -> Tensor:
    """d loss / d logits = softmax - (1 - eps) * onehot - eps / V, written into `probs` (N, V)."""
    probs.sub_(eps / probs.size(-1))
    return probs.scatter_add_(-1, target[:, None], probs.new_full((target.numel(), 1), eps - 1.0))


class _SmoothedNLL(torch.autograd.Function):
    """Per-token label-smoothed loss and NLL of logits (N, V), with a hand-written backward.

    Backward writes g * (softmax - (1 - eps) * onehot - eps / V) into one (N, V) buffer; autograd
    through log_softmax, gather and mean makes several passes over (N, V) and as many buffers.
    """

    @staticmethod
    def forward(ctx: Any, logits: Tensor, target: Tensor, eps: float) -> tuple[Tensor, Tensor]:
        lprobs = logits.log_softmax(-1)  # (N, V)
        loss, nll = _smoothed_terms(lprobs, target, eps)  # (N,) each
        ctx.save_for_backward(lprobs, target)
        ctx.eps = eps
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, _grad_nll: Tensor) -> tuple[Tensor, None, None]:
        lprobs, target = ctx.saved_tensors
        grad = smoothed_grad(lprobs.exp(), target, ctx.eps)  # (N, V)
        return grad.mul_(grad_loss[:, None]), None, None


def label_smoothed_nll(logits: Tensor, target: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """Summed label-smoothed loss and summed NLL over non-pad targets.

    loss = (1 - eps) * nll + eps * mean over the vocabulary of -log p; logits (N, V), target (N,).
    Computed in float32 whatever the logits' dtype; only the loss carries a gradient.
    """
    keep = target.ne(PAD_ID)  # (N,)
    if not bool(keep.all()):
        logits, target = logits[keep], target[keep]  # (N', V), (N',)
    loss, nll = _SmoothedNLL.apply(logits.float(), target, eps)  # (N',) each
    return loss.sum(), nll.sum()
