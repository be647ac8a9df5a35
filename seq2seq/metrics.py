"""Measuring a model while it trains: the label-smoothed loss, validation (loss, perplexity and
greedy BLEU), and the window of training statistics behind each TensorBoard log line."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor
from torch.utils.tensorboard import SummaryWriter

from seq2seq.build import Split
from seq2seq.config import SearchKind, TrainConfig
from seq2seq.data import collate, token_batches
from seq2seq.evaluate import score
from seq2seq.model import EncoderDecoder
from seq2seq.search import translate_ids
from seq2seq.tokenizer import PAD_ID, Tokenizer


def _smoothed_terms(lprobs: Tensor, target: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """Per-token label-smoothed loss and NLL (N,) from log-probabilities (N, V)."""
    nll = -lprobs.gather(-1, target[:, None]).squeeze(-1)  # (N,)
    return (1.0 - eps) * nll - eps * lprobs.mean(-1), nll


def _smoothed_grad(probs: Tensor, target: Tensor, eps: float) -> Tensor:
    """d loss / d logits = softmax - (1 - eps) * onehot - eps / V, written into `probs` (N, V)."""
    probs.sub_(eps / probs.size(-1))
    return probs.scatter_add_(-1, target[:, None], probs.new_full((target.numel(), 1), eps - 1.0))


class _SmoothedNLL(torch.autograd.Function):
    """Per-token label-smoothed loss and NLL of logits (N, V), with a hand-written backward.

    Backward writes g * (softmax - (1 - eps) * onehot - eps / V) into one (N, V) buffer; autograd
    through log_softmax, gather and mean makes ~8 passes over (N, V) and as many buffers, which
    is most of a small model's loss time on a CPU.
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
        grad = _smoothed_grad(lprobs.exp(), target, ctx.eps)  # (N, V)
        return grad.mul_(grad_loss[:, None]), None, None


def label_smoothed_nll(logits: Tensor, target: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """Summed label-smoothed loss and summed NLL over non-pad targets (Szegedy et al. 2016).

    loss = (1 - eps) * nll + eps * mean over the vocabulary of -log p; logits (N, V), target (N,).
    Computed in float32 whatever the logits' dtype; only the loss carries a gradient.
    """
    keep = target.ne(PAD_ID)  # (N,)
    if not bool(keep.all()):
        logits, target = logits[keep], target[keep]  # (N', V), (N',)
    loss, nll = _SmoothedNLL.apply(logits.float(), target, eps)  # (N',) each
    return loss.sum(), nll.sum()


class _LinearSmoothedNLL(torch.autograd.Function):
    """Summed label-smoothed loss and NLL of hidden states (N, D) through the output layer
    (V, D), chunk by chunk: each chunk's logits, loss and gradients are made while its (c, V)
    logits are still in cache, and the (N, V) logits never exist (the idea of Liger Kernel's
    fused linear cross-entropy, Hsu et al. 2024). The gradients are computed in forward and
    scaled by the incoming gradient in backward, so the loss must be summed (it is)."""

    @staticmethod
    def forward(
        ctx: Any, hidden: Tensor, weight: Tensor, target: Tensor, eps: float, chunk: int
    ) -> tuple[Tensor, Tensor]:
        dtype = torch.get_autocast_dtype(hidden.device.type)
        if not torch.is_autocast_enabled(hidden.device.type):
            dtype = hidden.dtype
        with torch.autocast(hidden.device.type, enabled=False):
            h_all, w = hidden.to(dtype), weight.to(dtype)  # (N, D), (V, D)
            grad_hidden = torch.empty_like(h_all)  # (N, D)
            grad_weight = torch.zeros_like(weight, dtype=torch.float32)  # (V, D)
            loss = nll = torch.zeros((), device=hidden.device)
            for start in range(0, h_all.size(0), chunk):
                h, t = h_all[start : start + chunk], target[start : start + chunk]
                lprobs = (h @ w.T).float().log_softmax(-1)  # (c, V)
                loss_c, nll_c = _smoothed_terms(lprobs, t, eps)  # (c,) each
                loss, nll = loss + loss_c.sum(), nll + nll_c.sum()
                grad = _smoothed_grad(lprobs.exp_(), t, eps).to(dtype)  # (c, V)
                grad_hidden[start : start + chunk] = grad @ w  # (c, D)
                if dtype == torch.float32:
                    grad_weight.addmm_(grad.T, h)  # (V, D)
                else:  # each chunk's product in autocast's dtype, as for any linear layer
                    grad_weight.add_(grad.T @ h)  # (V, D)
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.dtypes = (hidden.dtype, weight.dtype)
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, _grad_nll: Tensor) -> tuple[Tensor | None, ...]:
        grad_hidden, grad_weight = ctx.saved_tensors
        dh, dw = ctx.dtypes
        return (grad_hidden * grad_loss).to(dh), (grad_weight * grad_loss).to(dw), None, None, None


def linear_label_smoothed_nll(
    hidden: Tensor, weight: Tensor, target: Tensor, eps: float, chunk: int = 256
) -> tuple[Tensor, Tensor]:
    """label_smoothed_nll(hidden @ weight.T, target, eps) for hidden states (N, D), output
    weights (V, D) and targets (N,) without padding, computed `chunk` rows at a time: on a CPU
    about twice as fast as making the (N, V) logits first (their passes over memory dominate).
    Only the loss carries a gradient."""
    return _LinearSmoothedNLL.apply(hidden, weight, target, eps, chunk)


@torch.no_grad()
def validate(
    model: EncoderDecoder,
    data: Split,
    tgt_tok: Tokenizer,
    cfg: TrainConfig,
    autocast: Callable[[], contextlib.AbstractContextManager[Any]],
) -> dict[str, float]:
    """Teacher-forced loss and perplexity, and BLEU of greedy translations, on `data`."""
    device = next(model.parameters()).device
    model.eval()
    nll_sum, tokens = 0.0, 0
    lens = [max(len(a), len(b)) + 1 for a, b in zip(data.src_ids, data.tgt_ids)]
    for index in token_batches(lens, lens, cfg.trainer.max_tokens, shuffle=False):
        batch = collate(index, data.src_ids, data.tgt_ids).to(device)
        with autocast():
            logits = model(batch.src, batch.tgt_in)
        nll = label_smoothed_nll(logits.flatten(0, 1), batch.tgt_out.flatten(), 0.0)[1]
        nll_sum, tokens = nll_sum + nll.item(), tokens + batch.tgt_tokens
    limit = cfg.trainer.valid_bleu_sentences or len(data)
    greedy = replace(cfg.decode, method=SearchKind.greedy)
    hyps = translate_ids(model, data.src_ids[:limit], greedy, cfg.data.max_len)
    texts = [tgt_tok.decode(h[0].tokens) for h in hyps]
    model.train()
    bleu = score(texts, data.tgt_text[:limit])["bleu"]
    return {
        "loss": nll_sum / tokens,
        "ppl": math.exp(min(nll_sum / tokens, 50)),
        "bleu": float(bleu),  # type: ignore[arg-type]
    }


class Window:
    """Training statistics since the last log line."""

    def __init__(self) -> None:
        self.loss = self.nll = 0.0
        self.tokens, self.steps, self.start = 0, 0, time.monotonic()

    def add(self, stats: dict[str, float]) -> None:
        self.loss += stats["loss"] * stats["tokens"]
        self.nll += stats["nll"] * stats["tokens"]
        self.tokens += int(stats["tokens"])
        self.steps += 1

    def log(self, writer: SummaryWriter, step: int, lr: float) -> dict[str, str]:
        """Write the window's scalars to TensorBoard, start a new window; returns the progress
        bar's postfix."""
        elapsed = max(time.monotonic() - self.start, 1e-9)
        scalars = {
            "loss": self.loss / self.tokens,
            "ppl": math.exp(min(self.nll / self.tokens, 50)),
            "lr": lr,
            "tokens_per_s": self.tokens / elapsed,
        }
        for name, value in scalars.items():
            writer.add_scalar(f"train/{name}", value, step)
        self.__init__()  # type: ignore[misc]
        return {
            "loss": f"{scalars['loss']:.3f}",
            "tok/s": f"{scalars['tokens_per_s']:.0f}",
        }
