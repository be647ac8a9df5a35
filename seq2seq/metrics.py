"""Measuring a model while it trains: validation (loss, perplexity and greedy BLEU), and the
window of training statistics behind each TensorBoard log line."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch.utils.tensorboard import SummaryWriter

from seq2seq.config import SearchKind, TrainConfig
from seq2seq.data import Split, collate, token_batches
from seq2seq.distributed import NullWriter
from seq2seq.loss import label_smoothed_nll
from seq2seq.model import EncoderDecoder
from seq2seq.scoring import score
from seq2seq.search import translate_ids
from seq2seq.tokenizer import Tokenizer


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

    def log(self, writer: SummaryWriter | NullWriter, step: int, lr: float) -> dict[str, str]:
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


def log_positional_images(
    writer: SummaryWriter | NullWriter, model: EncoderDecoder, step: int
) -> None:
    """Heatmaps of the positional tables or biases (those that have one) to TensorBoard."""
    for side, pos in (("encoder", model.enc_pos), ("decoder", model.dec_pos)):
        image = pos.image()  # (rows, cols) or None
        if image is not None:
            image = image.detach().float().cpu()
            span = (image.max() - image.min()).clamp(min=1e-8)
            writer.add_image(
                f"positional/{side}", (image - image.min()) / span, step, dataformats="HW"
            )
