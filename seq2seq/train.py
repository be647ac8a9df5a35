"""Training: the seq2seq-train entry point and a loop that reads top to bottom.

main -> Trainer(cfg) -> fit():  for each epoch, for each group of batches:
    train_step (teacher forcing, label-smoothed loss, clip, AdamW, inverse-sqrt lr)
    every valid_every steps: validate (loss, ppl, greedy BLEU) and save last/best
then test(): best checkpoint, decode the test splits, score with sacreBLEU.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from torch import Tensor
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from seq2seq.build import build_model, build_optimizer, load_corpus, resolve_device
from seq2seq.checkpoint import load_checkpoint, rotate_checkpoints, save_checkpoint
from seq2seq.config import (
    CONFIG_DIR,
    DecodeConfig,
    Precision,
    SearchKind,
    TrainConfig,
    check_config,
    register_configs,
)
from seq2seq.data import Batch, collate, token_batches
from seq2seq.evaluate import format_scores, score
from seq2seq.search import translate_ids
from seq2seq.tokenizer import PAD_ID

log = logging.getLogger(__name__)


def label_smoothed_nll(logits: Tensor, target: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """Summed label-smoothed loss and summed NLL over non-pad targets (Szegedy et al. 2016).

    loss = (1 - eps) * nll + eps * mean over the vocabulary of -log p; logits (N, V), target (N,).
    """
    lprobs = logits.float().log_softmax(-1)  # (N, V)
    keep = target.ne(PAD_ID)  # (N,)
    nll = -lprobs.gather(-1, target[:, None]).squeeze(-1)  # (N,)
    smooth = -lprobs.mean(-1)  # (N,)
    loss = (1.0 - eps) * nll + eps * smooth
    return loss[keep].sum(), nll[keep].sum()


@dataclass
class TrainState:
    """Counters that a checkpoint stores so that a run can resume where it stopped."""

    step: int = 0  # optimizer steps taken
    epoch: int = 0  # current epoch (its batch order is a function of seed and epoch)
    batch: int = 0  # batches of the current epoch already consumed
    best_bleu: float = -1.0  # best validation BLEU so far
    tokens: int = 0  # target tokens trained on


class Trainer:
    """One training run: data, model, optimizer, logging and checkpoints."""

    def __init__(self, cfg: TrainConfig, run_dir: Path) -> None:
        self.cfg, self.run_dir = cfg, run_dir
        t = cfg.trainer
        if t.threads > 0:
            torch.set_num_threads(t.threads)
        random.seed(t.seed)
        torch.manual_seed(t.seed)
        self.device = resolve_device(t.device)
        self.src_tok, self.tgt_tok, self.splits = load_corpus(cfg.data, cfg.tokenizer)
        self.train_data = self.splits[cfg.data.train]
        self.model = build_model(cfg, self.src_tok.vocab_size, self.tgt_tok.vocab_size)
        self.model.to(self.device)
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg.optim, self.device)
        self.scaler = torch.amp.GradScaler(enabled=t.precision == Precision.fp16)
        self.state = TrainState()
        self.ckpt_dir = run_dir / "checkpoints"
        self.writer = SummaryWriter(str(run_dir / "tb"))
        log.info(
            "model: %d parameters; vocab %d/%d; train %d pairs; device %s",
            self.model.num_params(), self.src_tok.vocab_size, self.tgt_tok.vocab_size,
            len(self.train_data), self.device,
        )  # fmt: skip

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """bf16/fp16 autocast as configured (fp32: no-op)."""
        precision = self.cfg.trainer.precision
        if precision == Precision.fp32:
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if precision == Precision.bf16 else torch.float16
        return torch.autocast(self.device.type, dtype=dtype)

    def epoch_batches(self, epoch: int) -> list[list[int]]:
        data, t = self.train_data, self.cfg.trainer
        src_lens = [len(s) + 1 for s in data.src_ids]
        tgt_lens = [len(s) + 1 for s in data.tgt_ids]
        return token_batches(
            src_lens, tgt_lens, t.max_tokens, shuffle=True, seed=t.seed, epoch=epoch
        )

    def train_step(self, group: list[Batch]) -> dict[str, float]:
        """One optimizer step over `group` (gradient accumulation); returns loss statistics."""
        total_tokens = sum(b.tgt_tokens for b in group)
        loss_sum = nll_sum = 0.0
        for batch in group:
            with self.autocast():
                logits = self.model(batch.src, batch.tgt_in)  # (B, T, V)
            loss, nll = label_smoothed_nll(
                logits.flatten(0, 1),
                batch.tgt_out.flatten(),
                self.cfg.trainer.label_smoothing,
            )
            self.scaler.scale(loss / total_tokens).backward()
            loss_sum, nll_sum = loss_sum + loss.item(), nll_sum + nll.item()
        self.scaler.unscale_(self.optimizer)
        clip = self.cfg.optim.clip_norm
        grad_norm = torch.nn.utils.clip_grad_norm_(
            self.model.parameters(), clip if clip > 0 else math.inf
        )
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.state.step += 1
        self.state.tokens += total_tokens
        return {"loss": loss_sum / total_tokens, "nll": nll_sum / total_tokens,
                "grad_norm": float(grad_norm), "tokens": total_tokens}  # fmt: skip

    def fit(self) -> None:
        """Train until max_steps, max_epochs or max_minutes; validate and save on the way."""
        t, s = self.cfg.trainer, self.state
        start, window = time.monotonic(), _Window()
        bar = tqdm(total=t.max_steps, initial=s.step, disable=not t.progress, desc="train")
        while s.epoch < t.max_epochs and s.step < t.max_steps:
            batches = self.epoch_batches(s.epoch)
            while s.batch < len(batches) and s.step < t.max_steps:
                ids = batches[s.batch : s.batch + t.accum_steps]
                s.batch += len(ids)
                group = [self._collate(i) for i in ids]
                window.add(self.train_step(group))
                bar.update(1)
                if s.step % t.log_every == 0:
                    bar.set_postfix(
                        window.log(self.writer, s.step, self.scheduler.get_last_lr()[0])
                    )
                if s.step % t.valid_every == 0:
                    self.validate_and_save()
                if t.max_minutes and time.monotonic() - start > 60 * t.max_minutes:
                    log.info("max_minutes=%s reached at step %d", t.max_minutes, s.step)
                    s.epoch = t.max_epochs  # ends both loops
                    break
            else:
                s.epoch, s.batch = s.epoch + 1, 0
        bar.close()
        if s.step % t.valid_every != 0:
            self.validate_and_save()

    def _collate(self, index: list[int]) -> Batch:
        return collate(index, self.train_data.src_ids, self.train_data.tgt_ids).to(self.device)

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """Teacher-forced loss and perplexity, and BLEU of greedy translations, on valid."""
        data = self.splits[self.cfg.data.valid]
        self.model.eval()
        nll_sum, tokens = 0.0, 0
        lens = [max(len(a), len(b)) + 1 for a, b in zip(data.src_ids, data.tgt_ids)]
        for index in token_batches(lens, lens, self.cfg.trainer.max_tokens, shuffle=False):
            batch = collate(index, data.src_ids, data.tgt_ids).to(self.device)
            with self.autocast():
                logits = self.model(batch.src, batch.tgt_in)
            nll_sum += label_smoothed_nll(logits.flatten(0, 1), batch.tgt_out.flatten(), 0.0)[
                1
            ].item()
            tokens += batch.tgt_tokens
        limit = self.cfg.trainer.valid_bleu_sentences or len(data)
        greedy = _greedy(self.cfg.decode)
        hyps = translate_ids(self.model, data.src_ids[:limit], greedy, self.cfg.data.max_len)
        texts = [self.tgt_tok.decode(h[0].tokens) for h in hyps]
        self.model.train()
        bleu = score(texts, data.tgt_text[:limit])["bleu"]
        return {
            "loss": nll_sum / tokens,
            "ppl": math.exp(min(nll_sum / tokens, 50)),
            "bleu": float(bleu),
        }

    def validate_and_save(self) -> None:
        metrics = self.validate()
        step = self.state.step
        for name, value in metrics.items():
            self.writer.add_scalar(f"valid/{name}", value, step)
        improved = metrics["bleu"] > self.state.best_bleu
        if improved:
            self.state.best_bleu = metrics["bleu"]
        self.log_positional_images(step)
        log.info("step %d: valid loss %.3f ppl %.2f BLEU %.2f%s", step, metrics["loss"],
                 metrics["ppl"], metrics["bleu"], " (best)" if improved else "")  # fmt: skip
        self.save(improved)

    def log_positional_images(self, step: int) -> None:
        """Heatmaps of the positional tables or biases (those that have one) to TensorBoard."""
        for side, pos in (("encoder", self.model.enc_pos), ("decoder", self.model.dec_pos)):
            image = pos.image()  # (rows, cols) or None
            if image is not None:
                image = image.detach().float().cpu()
                span = (image.max() - image.min()).clamp(min=1e-8)
                self.writer.add_image(f"positional/{side}", (image - image.min()) / span, step,
                                      dataformats="HW")  # fmt: skip

    def checkpoint_state(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "train_state": asdict(self.state),
            "rng": {"torch": torch.get_rng_state(), "python": repr(random.getstate())},
            "config": OmegaConf.to_container(OmegaConf.structured(self.cfg), enum_to_str=True),
            "tokenizers": {"src": self.src_tok.state(), "tgt": self.tgt_tok.state()},
        }

    def save(self, best: bool) -> None:
        """Write last.pt (and best.pt when validation BLEU improved), atomically."""
        state = self.checkpoint_state()
        save_checkpoint(state, self.ckpt_dir / "last.pt")
        if self.cfg.trainer.keep_last > 0:
            save_checkpoint(state, self.ckpt_dir / f"step_{self.state.step}.pt")
            rotate_checkpoints(self.ckpt_dir, self.cfg.trainer.keep_last)
        if best:
            save_checkpoint(state, self.ckpt_dir / "best.pt")

    def test(self) -> dict[str, dict[str, object]]:
        """Score the best checkpoint on every test split with cfg.decode."""
        best = self.ckpt_dir / "best.pt"
        self.model.load_state_dict(load_checkpoint(best, self.device)["model"])
        results = {}
        for name in self.cfg.data.test:
            data = self.splits[name]
            hyps = translate_ids(self.model, data.src_ids, self.cfg.decode, self.cfg.data.max_len)
            texts = [self.tgt_tok.decode(h[0].tokens) for h in hyps]
            (self.run_dir / f"{name}.hyp").write_text("".join(t + "\n" for t in texts))
            results[name] = score(texts, data.tgt_text, lowercase=True)
            self.writer.add_scalar(f"test/{name}_bleu", results[name]["bleu"], self.state.step)
            log.info("\n%s", format_scores(name, results[name]))
        return results


def _greedy(decode: DecodeConfig) -> DecodeConfig:
    return replace(decode, method=SearchKind.greedy)


class _Window:
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
        elapsed = max(time.monotonic() - self.start, 1e-9)
        scalars = {
            "loss": self.loss / self.tokens,
            "ppl": math.exp(min(self.nll / self.tokens, 50)),
            "lr": lr,
            "tokens_per_s": self.tokens / elapsed,
        }
        for name, value in scalars.items():
            writer.add_scalar(f"train/{name}", value, step)
        self.__init__()
        return {
            "loss": f"{scalars['loss']:.3f}",
            "tok/s": f"{scalars['tokens_per_s']:.0f}",
        }


def train(cfg: TrainConfig, run_dir: Path) -> dict[str, dict[str, object]]:
    """Train, test, and write results.json into run_dir; returns the test scores."""
    check_config(cfg)
    start = time.monotonic()
    trainer = Trainer(cfg, run_dir)
    fit_start = time.monotonic()
    trainer.fit()
    fit_seconds = time.monotonic() - fit_start
    results = trainer.test()
    trainer.writer.close()
    summary = {"test": results, "best_valid_bleu": trainer.state.best_bleu,
               "steps": trainer.state.step, "minutes": (time.monotonic() - start) / 60,
               "train_minutes": fit_seconds / 60, "params": trainer.model.num_params(),
               "train_tokens_per_s": trainer.state.tokens / fit_seconds}  # fmt: skip
    (run_dir / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"checkpoints: {trainer.ckpt_dir}\ntensorboard: tensorboard --logdir {run_dir / 'tb'}")
    for name, scores in results.items():
        print(f"test BLEU ({name}): {scores['bleu']:.2f}")
    return results


register_configs()


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="train")
def main(cfg: DictConfig) -> float:
    """Entry point of seq2seq-train; returns the first test split's BLEU (for sweeps)."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    results = train(OmegaConf.to_object(cfg), run_dir)  # type: ignore[arg-type]
    return float(next(iter(results.values()))["bleu"]) if results else 0.0


if __name__ == "__main__":
    main()
