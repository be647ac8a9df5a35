"""Measuring a model while it trains: validation (loss, perplexity, and BLEU and chrF of
greedy translations), which validation is the best (trainer.best_metric), and the window of
training statistics behind each TensorBoard log line."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
from torch.utils.tensorboard import SummaryWriter

from seq2seq.config.schema import BestMetric, SearchKind, TrainConfig
from seq2seq.data.batching import collate, token_batches
from seq2seq.data.text import Split
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.decode.schedule import translate_ids
from seq2seq.evaluation.scoring import score
from seq2seq.model.transformer import EncoderDecoder
from seq2seq.train.checkpoint import TrainState
from seq2seq.train.distributed import NullWriter


@torch.no_grad()
def validate(
    model: EncoderDecoder,
    data: Split,
    tgt_tok: Tokenizer,
    cfg: TrainConfig,
    autocast: Callable[[], contextlib.AbstractContextManager[Any]],
) -> dict[str, float]:
    """Teacher-forced loss (NLL per target token, EOS included, no label smoothing) and
    perplexity on `data`, and BLEU and chrF of greedy translations of its first
    trainer.valid_bleu_sentences sentences (0: all), against lowercased references when the
    target tokenizer folds case. TER is left to the test splits: it costs
    ~2 s per 1,000 sentences, 15x chrF, at every validation."""
    device = next(model.parameters()).device
    model.eval()
    nll_sum, tokens = 0.0, 0
    lens = [max(len(a), len(b)) + 1 for a, b in zip(data.src_ids, data.tgt_ids)]
    for index in token_batches(lens, lens, cfg.trainer.max_tokens, shuffle=False):
        batch = collate(index, data.src_ids, data.tgt_ids).to(device)
        with autocast():
            _, nll = model(batch.src, batch.tgt_in, batch.tgt_out, 0.0)
        nll_sum, tokens = nll_sum + nll.item(), tokens + batch.tgt_tokens
    limit = cfg.trainer.valid_bleu_sentences or len(data)
    greedy = replace(cfg.decode, method=SearchKind.greedy, scores=False)  # text only
    hyps = translate_ids(model, data.src_ids[:limit], greedy, cfg.data.max_len)
    texts = [tgt_tok.decode(h[0].tokens) for h in hyps]
    model.train()
    refs = data.tgt_text[:limit]
    if tgt_tok.lowercase:  # the model writes lowercase only: score it against lowercase
        refs = [ref.lower() for ref in refs]
    scores = score(texts, refs, ter=False)
    return {
        "loss": nll_sum / tokens,
        "ppl": math.exp(min(nll_sum / tokens, 50)),
        **{name: float(scores[name]) for name in ("bleu", "chrf")},  # type: ignore[arg-type]
    }


# the direction in which each trainer.best_metric improves, and its name in messages
LOWER_IS_BETTER = {BestMetric.bleu: False, BestMetric.chrf: False, BestMetric.loss: True}
LABELS = {"loss": "loss", "ppl": "ppl", "bleu": "BLEU", "chrf": "chrF", "ter": "TER"}


def update_best(state: TrainState, metrics: dict[str, float], metric: BestMetric) -> bool:
    """Record a validation in `state`: the new best (True) when `metric` strictly improved on
    the best so far (or is the first), else one more stale validation (early stopping)."""
    value = metrics[metric.value]
    improved = improves(value, state.best_score, metric)
    if improved:
        state.best_score, state.best_step, state.stale_validations = value, state.step, 0
        state.best_valid = dict(metrics)
    else:
        state.stale_validations += 1
    return improved


def improves(value: float, best: float | None, metric: BestMetric) -> bool:
    """`value` of `metric` is strictly better than `best` (None: nothing to beat)."""
    if best is None:
        return True
    return value < best if LOWER_IS_BETTER[metric] else value > best


def gain(metric: BestMetric) -> str:
    """What counts as progress in messages: "BLEU gain", "chrF gain" or "loss decrease"."""
    return f"{LABELS[metric.value]} {'decrease' if LOWER_IS_BETTER[metric] else 'gain'}"


def format_best(state: TrainState) -> str:
    """ "BLEU 12.34 at step 400": the best validation so far."""
    value = math.nan if state.best_score is None else state.best_score
    return f"{format_valid({state.best_metric: value})} at step {state.best_step}"


def format_valid(metrics: dict[str, float]) -> str:
    """ "loss 1.234 ppl 3.43 BLEU 12.34 chrF 40.00 TER 70.00" (the metrics present)."""
    return " ".join(
        f"{LABELS.get(k, k)} {v:.3f}" if k == "loss" else f"{LABELS.get(k, k)} {v:.2f}"
        for k, v in metrics.items()
    )


class Window:
    """Training statistics since the last log line."""

    def __init__(self) -> None:
        self.loss = self.nll = 0.0
        self.tokens, self.steps, self.start = 0, 0, time.monotonic()

    def add(self, stats: dict[str, float]) -> None:
        """Count one optimizer step's statistics (loss, nll, tokens)."""
        self.loss += stats["loss"] * stats["tokens"]
        self.nll += stats["nll"] * stats["tokens"]
        self.tokens += int(stats["tokens"])
        self.steps += 1

    def log(self, writer: SummaryWriter | NullWriter, step: int, lr: float) -> dict[str, str]:
        """Write the window's scalars to TensorBoard, start a new window; returns what the
        progress report shows."""
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
