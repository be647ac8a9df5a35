"""Independent references the tests compare the package against, written out from the papers'
formulas rather than calling the code under test."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from seq2seq.data.tokenizer import PAD_ID


def smoothed_loss(
    logits: torch.Tensor, target: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed label-smoothed loss and NLL over non-pad targets, written out (Szegedy et al.
    2016): (1 - eps) * -log p(y) + eps * mean over the vocabulary of -log p(v), in float32.
    Autograd through it gives the reference gradient."""
    keep = target.ne(PAD_ID)  # (N,)
    lprobs = logits.float()[keep].log_softmax(-1)  # (N', V)
    nll = -lprobs.gather(-1, target[keep][:, None]).squeeze(-1)  # (N',)
    loss = (1.0 - eps) * nll - eps * lprobs.mean(-1)  # (N',)
    return loss.sum(), nll.sum().detach()


def rdrop_loss(
    logits1: torch.Tensor, logits2: torch.Tensor, target: torch.Tensor, eps: float, alpha: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """R-Drop's loss written out (Liang et al. 2021, eq. 3, with the reduction of the authors'
    fairseq criterion, github.com/dropreg/R-Drop reg_label_smoothed_cross_entropy.py): the two
    passes' logits (N, V) -> the mean of their summed label-smoothed losses + alpha x
    (KL(p2 || p1) + KL(p1 || p2)) / 2, each F.kl_div(log p, q) summed over the vocabulary and the
    non-pad targets; and the mean summed NLL. Autograd through it (both passes, both directions:
    nothing detached, as the authors) gives the reference gradient."""
    keep = target.ne(PAD_ID)  # (N,)
    loss1, nll1 = smoothed_loss(logits1, target, eps)
    loss2, nll2 = smoothed_loss(logits2, target, eps)
    lp = logits1.float().log_softmax(-1)  # (N, V)
    lq = logits2.float().log_softmax(-1)  # (N, V)
    p_loss = F.kl_div(lp, lq.exp(), reduction="none")  # (N, V) q (log q - log p): KL(q || p)
    q_loss = F.kl_div(lq, lp.exp(), reduction="none")  # (N, V) KL(p || q)
    kl = (p_loss[keep].sum() + q_loss[keep].sum()) / 2
    return (loss1 + loss2) / 2 + alpha * kl, (nll1 + nll2) / 2
