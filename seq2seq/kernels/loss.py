"""The output layer fused with the training loss, for CPU training: chunked, with its gradients
computed in forward, so that the (N, V) logits never exist. The label-smoothed loss
(`linear_label_smoothed_nll`) and R-Drop's loss of two passes (`linear_rdrop`): one loss
concept, here and in reference.py."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from seq2seq.kernels import onednn

# rows of gradient, at most this many bytes, that share one weight-gradient matmul
GROUP_BYTES = 16 * 2**20
# below this probability -log p(target) is taken from a log-sum-exp (p may have underflowed)
TINY = 1e-30


def _chunk_terms(
    logits: Tensor, probs: Tensor, target: Tensor, eps: float, branchless: bool
) -> tuple[Tensor, Tensor]:
    """Summed loss and NLL of a chunk from its float32 logits (c, V) and their softmax (c, V):
    -log p(t) = lse - x_t, so lse comes from p(t) unless p(t) may have underflowed. Those rows
    get a log-sum-exp: only they on a CPU, all rows when `branchless` (on a GPU a data-dependent
    branch would wait for the device)."""
    x_t = logits.gather(-1, target[:, None]).squeeze(-1)  # (c,)
    p_t = probs.gather(-1, target[:, None]).squeeze(-1)  # (c,)
    nll = -p_t.log()  # (c,)
    tiny = p_t < TINY  # (c,)
    if branchless:
        nll = torch.where(tiny, logits.logsumexp(-1) - x_t, nll)  # (c,)
    elif bool(tiny.any()):
        nll[tiny] = logits[tiny].logsumexp(-1) - x_t[tiny]
    lse = x_t + nll  # (c,) log-sum-exp of the logits
    loss = (1.0 - eps) * nll - eps * (logits.mean(-1) - lse)  # (c,)
    return loss.sum(), nll.sum()


class _LinearSmoothedNLL(torch.autograd.Function):
    """Summed label-smoothed loss and NLL of hidden states (N, D) through the output layer
    (V, D), chunk by chunk: the (N, V) logits never exist (the idea of Liger Kernel's fused
    linear cross-entropy, Hsu et al. 2024). The gradients are computed in forward and scaled by
    the incoming gradient in backward, so the loss must be summed (it is).

    Per chunk of c rows: logits (autocast's dtype), a float32 copy and its softmax, made into
    d loss / d logits and written into a group buffer, all in buffers allocated once. The
    weight gradient is one matmul per group of chunks (up to GROUP_BYTES of gradient rows),
    accumulated in float32: faster than allocating each chunk's buffers and accumulating every
    chunk.
    """

    @staticmethod
    def forward(
        ctx: Any, hidden: Tensor, weight: Tensor, target: Tensor, eps: float, chunk: int
    ) -> tuple[Tensor, Tensor]:
        dtype = hidden.dtype
        if torch.is_autocast_enabled(hidden.device.type):
            dtype = torch.get_autocast_dtype(hidden.device.type)
        with torch.autocast(hidden.device.type, enabled=False):
            h_all, w = hidden.to(dtype), weight.to(dtype)  # (N, D), (V, D)
            grads = _chunked_loss_and_grads(h_all, w, target, eps, chunk)
        loss, nll, grad_hidden, grad_weight = grads
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.dtypes = (hidden.dtype, weight.dtype)
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, _grad_nll: Tensor) -> tuple[Tensor | None, ...]:
        grad_hidden, grad_weight = ctx.saved_tensors
        dh, dw = ctx.dtypes
        return (grad_hidden * grad_loss).to(dh), (grad_weight * grad_loss).to(dw), None, None, None


def _chunked_loss_and_grads(
    h_all: Tensor, w: Tensor, target: Tensor, eps: float, chunk: int
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Summed loss and NLL, d loss / d hidden (N, D) and d loss / d weight (V, D, float32) of
    hidden states (N, D) and output weights (V, D) of one dtype (see _LinearSmoothedNLL)."""
    (n, _), (v, _) = h_all.shape, w.shape
    fp32, branchless = h_all.dtype == torch.float32, h_all.device.type != "cpu"
    fast = onednn.usable(h_all, w)  # float32 products on oneDNN (see onednn.py)
    w_packed = onednn.pack(w) if fast else w  # (V, D) in oneDNN's layout, for the logits
    chunk = max(1, min(chunk, n))
    h_pad = _padded_rows(h_all, chunk)  # (N', D): N' = N rounded up to whole chunks
    n_pad = h_pad.size(0)
    per_group = max(1, GROUP_BYTES // (chunk * v * h_all.element_size()))  # chunks
    logits = h_all.new_empty(0 if fast else chunk, v)  # (c, V) in `dtype`; oneDNN makes its own
    # float32 copies of the logits and their softmax (in fp32: the logits, and the group rows)
    x32 = logits if fp32 else logits.new_empty(chunk, v, dtype=torch.float32)  # (c, V)
    probs = None if fp32 else torch.empty_like(x32)  # (c, V)
    group = h_all.new_empty(min(per_group * chunk, n_pad), v)  # (g, V) rows of d loss / d logits
    grad_hidden = h_all.new_empty(n_pad, h_all.size(1))  # (N', D)
    grad_weight = onednn.weight_grad_zeros(v, w.size(1), h_all)  # (V, D) float32
    loss = nll = torch.zeros((), device=h_all.device)
    for start in range(0, n_pad, chunk):
        end, g0 = start + chunk, start - start % group.size(0)  # g0: the group's start
        rows = min(end, n) - start  # real rows of this chunk; the rest are padding
        h, t = h_pad[start:end], target[start : start + rows]
        grad = group[start - g0 : end - g0]  # (c, V)
        if fast:
            x = onednn.matmul_t(h, w_packed)[:rows]  # (r, V) float32, a new tensor
        else:
            torch.mm(h, w.T, out=logits)  # (c, V)
            x = x32[:rows] if fp32 else x32[:rows].copy_(logits[:rows])  # (r, V) float32
        p = torch.softmax(x, -1, out=grad[:rows] if probs is None else probs[:rows])  # (r, V)
        loss_c, nll_c = _chunk_terms(x, p, t, eps, branchless)
        loss, nll = loss + loss_c, nll + nll_c
        smoothed_grad(p, t, eps)  # (r, V) in float32
        if probs is not None:
            grad[:rows].copy_(p)  # (r, V) in `dtype`
        if rows < chunk:
            grad[rows:].zero_()  # padding rows: no gradient
        grad_hidden[start:end] = onednn.matmul_t(grad, w.T)  # (c, D)
        if end == n_pad or end - g0 == group.size(0):  # the group is complete
            g, hg = group[: end - g0], h_pad[g0:end]  # (g, V), (g, D)
            if fp32 and not fast:
                grad_weight.addmm_(g.T, hg)  # (V, D)
            else:  # in bf16, autocast's dtype as for any linear layer, summed in float32
                grad_weight.add_(onednn.weight_grad(g, hg))  # (V, D)
    return loss, nll, grad_hidden[:n], grad_weight


def _padded_rows(h: Tensor, chunk: int) -> Tensor:
    """h (N, D) with zero rows up to a multiple of `chunk` (h itself if it is one): every
    product of the loss then has one of a few shapes, whatever a batch's token count (oneDNN
    builds a kernel for every new shape it meets)."""
    extra = -h.size(0) % chunk
    return h if extra == 0 else torch.cat((h, h.new_zeros(extra, h.size(1))))  # (N', D)


def linear_label_smoothed_nll(
    hidden: Tensor, weight: Tensor, target: Tensor, eps: float, chunk: int = 256
) -> tuple[Tensor, Tensor]:
    """label_smoothed_nll(hidden @ weight.T, target, eps) for hidden states (N, D), output
    weights (V, D) and targets (N,) without padding, computed `chunk` rows at a time: on a CPU
    the (N, V) logits' passes over memory would dominate the time. Only the loss carries a
    gradient."""
    # torch's Function.apply has no annotations
    losses: tuple[Tensor, Tensor] = _LinearSmoothedNLL.apply(  # type: ignore[no-untyped-call]
        hidden, weight, target, eps, chunk
    )
    return losses


def smoothed_grad(probs: Tensor, target: Tensor, eps: float) -> Tensor:
    """d loss / d logits = softmax - (1 - eps) * onehot - eps / V, written into `probs` (N, V)."""
    probs.sub_(eps / probs.size(-1))
    return probs.scatter_add_(-1, target[:, None], probs.new_full((target.numel(), 1), eps - 1.0))


class _LinearRDrop(torch.autograd.Function):
    """R-Drop's loss (Liang et al. 2021, "R-Drop: Regularized Dropout for Neural Networks") of
    two passes' hidden states (N, D) through the output layer (V, D), chunk by chunk: per chunk
    of c rows both passes' logits (c, V), their log-softmaxes, the two label-smoothed losses
    and the symmetric KL, and the gradients written out, so that neither pass's (N, V) logits
    exist. The authors' code (github.com/dropreg/R-Drop, fairseq
    reg_label_smoothed_cross_entropy.py) sums F.kl_div both ways over the vocabulary and the
    non-pad tokens and halves it, as here; it sums the two passes' losses where we take their
    mean (so their alpha is twice ours). Gradients in forward, scaled in backward (the loss
    is summed), as _LinearSmoothedNLL's.
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        again: Tensor,
        weight: Tensor,
        target: Tensor,
        eps: float,
        alpha: float,
        chunk: int,
    ) -> tuple[Tensor, Tensor]:
        dtype = hidden.dtype
        if torch.is_autocast_enabled(hidden.device.type):
            dtype = torch.get_autocast_dtype(hidden.device.type)
        with torch.autocast(hidden.device.type, enabled=False):
            h1, h2, w = hidden.to(dtype), again.to(dtype), weight.to(dtype)  # (N, D) x2, (V, D)
            loss, nll, grad_h1, grad_h2, grad_w = _chunked_rdrop(
                h1, h2, w, target, eps, alpha, chunk
            )
        ctx.save_for_backward(grad_h1, grad_h2, grad_w)
        ctx.dtypes = (hidden.dtype, again.dtype, weight.dtype)
        ctx.mark_non_differentiable(nll)
        return loss, nll

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor, _grad_nll: Tensor) -> tuple[Tensor | None, ...]:
        grad_h1, grad_h2, grad_w = ctx.saved_tensors
        d1, d2, dw = ctx.dtypes
        grads = (grad_h1 * grad_loss).to(d1), (grad_h2 * grad_loss).to(d2)
        return (*grads, (grad_w * grad_loss).to(dw), None, None, None, None)


def _chunked_rdrop(
    h1: Tensor, h2: Tensor, w: Tensor, target: Tensor, eps: float, alpha: float, chunk: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """R-Drop's summed loss, the mean summed NLL, and d loss / d h1, h2 (N, D) and d loss / d w
    (V, D, float32), for hidden states h1, h2 (N, D) and weights w (V, D) of one dtype."""
    (n, d), v = h1.shape, w.size(0)
    fast = onednn.usable(h1, w)  # float32 products on oneDNN (see onednn.py)
    w_packed = onednn.pack(w) if fast else w  # (V, D), for the logits
    chunk = max(1, min(chunk, n))
    h1, h2 = _padded_rows(h1, chunk), _padded_rows(h2, chunk)  # (N', D) each, as in
    n_pad = h1.size(0)  # _chunked_loss_and_grads: a few product shapes whatever N
    grad_h1, grad_h2 = torch.empty_like(h1), torch.empty_like(h2)  # (N', D) each
    grad_w = onednn.weight_grad_zeros(v, d, h1)  # (V, D) float32
    loss = nll = torch.zeros((), device=h1.device)
    for start in range(0, n_pad, chunk):
        end = start + chunk
        rows = min(end, n) - start  # real rows of this chunk; the rest are padding
        a, b, t = h1[start:end], h2[start:end], target[start : start + rows]  # (c, D) x2, (r,)
        x1 = onednn.matmul_t(a, w_packed)[:rows].float()  # (r, V)
        x2 = onednn.matmul_t(b, w_packed)[:rows].float()  # (r, V)
        loss_c, nll_c, g1, g2 = rdrop_chunk(x1, x2, t, eps, alpha)
        loss, nll = loss + loss_c, nll + nll_c
        pad = (0, 0, 0, chunk - rows)  # padding rows: no gradient
        g1, g2 = F.pad(g1.to(h1.dtype), pad), F.pad(g2.to(h1.dtype), pad)  # (c, V) each
        grad_h1[start:end] = onednn.matmul_t(g1, w.T)  # (c, D)
        grad_h2[start:end] = onednn.matmul_t(g2, w.T)  # (c, D)
        grad_w.add_(onednn.weight_grad(g1, a)).add_(onednn.weight_grad(g2, b))  # (V, D)
    return loss, nll, grad_h1[:n], grad_h2[:n], grad_w


def rdrop_chunk(
    x1: Tensor, x2: Tensor, target: Tensor, eps: float, alpha: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """From both passes' float32 logits (c, V) of a chunk: the summed loss
    sum(0.5 (ce1 + ce2) + alpha (KL(p1 || p2) + KL(p2 || p1)) / 2), the summed mean NLL, and
    d loss / d x1, d x2 (c, V). With a = log p1 - log p2, d KL(p1 || p2) / d x1 =
    p1 (a - KL(p1 || p2)) and d KL(p2 || p1) / d x1 = p1 - p2 (the other pass symmetric)."""
    l1, l2 = x1.log_softmax(-1), x2.log_softmax(-1)  # (c, V) each
    p1, p2 = l1.exp(), l2.exp()  # (c, V) each
    nll1 = -l1.gather(-1, target[:, None]).squeeze(-1)  # (c,)
    nll2 = -l2.gather(-1, target[:, None]).squeeze(-1)  # (c,)
    ce = (1.0 - eps) * (nll1 + nll2) - eps * (l1.mean(-1) + l2.mean(-1))  # (c,) ce1 + ce2
    a = l1 - l2  # (c, V)
    kl12, kl21 = (p1 * a).sum(-1), -(p2 * a).sum(-1)  # (c,) KL(p1 || p2), KL(p2 || p1)
    loss = (0.5 * ce + 0.5 * alpha * (kl12 + kl21)).sum()
    shared = p1 - p2  # (c, V)
    g1 = p1 * (a - kl12[:, None]) + shared  # (c, V) d (kl12 + kl21) / d x1
    g2 = p2 * (-a - kl21[:, None]) - shared  # (c, V) d (kl12 + kl21) / d x2
    g1 = 0.5 * smoothed_grad(p1, target, eps) + (0.5 * alpha) * g1  # p1 no longer needed
    g2 = 0.5 * smoothed_grad(p2, target, eps) + (0.5 * alpha) * g2
    return loss, (0.5 * (nll1 + nll2)).sum(), g1, g2


def linear_rdrop(
    hidden: Tensor,
    again: Tensor,
    weight: Tensor,
    target: Tensor,
    eps: float,
    alpha: float,
    chunk: int = 256,
) -> tuple[Tensor, Tensor]:
    """reference.rdrop_loss(hidden, again, weight, target, eps, alpha), computed `chunk` rows
    at a time (_LinearRDrop): hidden states (N, D) of two passes, output weights (V, D),
    targets (N,) without padding. Only the loss carries a gradient."""
    # torch's Function.apply has no annotations
    losses: tuple[Tensor, Tensor] = _LinearRDrop.apply(  # type: ignore[no-untyped-call]
        hidden, again, weight, target, eps, alpha, chunk
    )
    return losses
