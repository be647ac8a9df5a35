"""Independent references the tests compare the package against, written out from the papers'
formulas rather than calling the code under test."""

from __future__ import annotations

import torch

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
