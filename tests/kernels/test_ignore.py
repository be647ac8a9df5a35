"""kernels.output_loss and kernels.rdrop_loss with `ignore`: every position passed, the padded
labels skipped, as the loss of the real rows alone (what a compiled step with static shapes
computes: EncoderDecoder.forward(all_positions=True))."""

from __future__ import annotations

import pytest
import torch

from seq2seq import kernels
from seq2seq.data.tokenizer import PAD_ID


def case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Hidden states (300, 16) of two passes, an output weight (50, 16) and targets (300,)
    of which about a third are PAD."""
    gen = torch.Generator().manual_seed(5)
    hidden, again = torch.randn(2, 300, 16, generator=gen)
    weight = torch.randn(50, 16, generator=gen)
    target = torch.randint(4, 50, (300,), generator=gen)
    target[torch.rand(300, generator=gen) < 0.3] = PAD_ID
    return hidden, again, weight, target


def loss_and_grads(
    rdrop: bool,
    hidden: torch.Tensor,
    again: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    ignore: int | None,
) -> list[torch.Tensor]:
    """The loss, the NLL and the gradients of the hidden states and the weight."""
    h, a, w = (x.clone().requires_grad_() for x in (hidden, again, weight))
    if rdrop:
        loss, nll = kernels.rdrop_loss(h, a, w, target, 0.1, 0.7, ignore)
    else:
        loss, nll = kernels.output_loss(h, w, target, 0.1, ignore)
    loss.backward()
    return [loss, nll, h.grad, a.grad if rdrop else torch.zeros(()), w.grad]  # type: ignore[list-item]


@pytest.mark.parametrize("mode", kernels.MODES)
@pytest.mark.parametrize("rdrop", [False, True], ids=["loss", "rdrop"])
def test_ignored_rows_add_nothing(mode: str, rdrop: bool) -> None:
    """Catches a kernel that counts the padded rows (label smoothing or the KL of their
    logits) or lets them get a gradient: the sums and the weight's gradient equal those of the
    real rows alone, and the padded rows' states get an exactly zero gradient."""
    hidden, again, weight, target = case()
    real = target.ne(PAD_ID)
    with kernels.use(mode):
        full = loss_and_grads(rdrop, hidden, again, weight, target, PAD_ID)
        kept = loss_and_grads(rdrop, hidden[real], again[real], weight, target[real], None)
    for i in (0, 1, 4):  # loss, NLL, weight gradient
        torch.testing.assert_close(full[i], kept[i], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(full[2][real], kept[2], rtol=1e-5, atol=1e-5)
    assert full[2][~real].eq(0).all()
    if rdrop:
        torch.testing.assert_close(full[3][real], kept[3], rtol=1e-5, atol=1e-5)
        assert full[3][~real].eq(0).all()
