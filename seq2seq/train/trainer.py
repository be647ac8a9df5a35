"""The training loop: `Trainer` holds one run's data, model, optimizer, logs and checkpoints.

fit():  until a stop condition (max_steps, max_epochs, early stopping, max_minutes, a signal),
for each group of batches:
    train_step (teacher forcing, label-smoothed loss, clip, AdamW, the lr schedule; a step with
    a non-finite loss or gradient is skipped and counted)
    every valid_every steps: validate (loss, ppl, greedy BLEU/chrF), early stopping on
    trainer.best_metric, save last/best
restore(): continue exactly from a checkpoint. Testing is train/testing.py's.
docs/RELIABILITY.md lists how every fault is handled.

A Trainer is built from objects: a model, its optimizer and schedule, and a corpus.Corpus (the
training pairs, the encoded evaluation splits, the tokenizers); build.build_trainer makes them
from a config.
"""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from torch.utils.tensorboard import SummaryWriter

from seq2seq.config.schema import Precision, TrainConfig, length_cap
from seq2seq.data.batching import Batch
from seq2seq.data.epochs import BatchRef
from seq2seq.errors import UserError
from seq2seq.model.transformer import EncoderDecoder
from seq2seq.train.checkpoint import (
    TrainState,
    load_model_state,
    restore_rng,
    rng_state,
    rotate_checkpoints,
    save_checkpoint,
)
from seq2seq.train.compiled import WarmUp, compile_model
from seq2seq.train.corpus import Corpus, within_cap
from seq2seq.train.distributed import DistInfo, NullWriter, all_reduce_sum, broadcast, shard
from seq2seq.train.flops import FlopCounter, Throughput, peak_tflops
from seq2seq.train.interrupt import StopSignals, TrainingInterrupted
from seq2seq.train.precision import (
    DTYPES,
    check_mkl_path,
    dtype_times,
    no_trace,
    resolve,
    resolve_products,
    time_precisions,
)
from seq2seq.train.progress import Progress
from seq2seq.train.resume import Resume, ResumeError
from seq2seq.train.steplog import LOG_NAME, StepLog, state_fields
from seq2seq.train.validation import (
    Window,
    format_best,
    format_valid,
    gain,
    log_positional_images,
    update_best,
    validate,
)

log = logging.getLogger(__name__)


class NonFiniteLossError(UserError, RuntimeError):
    """Too many consecutive steps had a NaN or infinite loss or gradient norm."""


class Trainer:
    """One training run: data, model, optimizer, logging and checkpoints."""

    def __init__(
        self,
        cfg: TrainConfig,
        model: EncoderDecoder,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        data: Corpus,
        run_dir: Path,
        dist: DistInfo | None = None,
        resume: Resume | None = None,
    ) -> None:
        """A run of cfg in run_dir: `model` on the device it trains on, `data` its training
        pairs, evaluation splits (cfg.data's valid and test) and tokenizers. `dist`:
        this process's place in a torchrun job (None: a single process). `resume`: a
        checkpoint's path and contents to continue from, random generators included."""
        self.cfg, self.run_dir, t = cfg, run_dir, cfg.trainer
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.src_tok, self.tgt_tok = data.tokenizers
        self.splits, self.train_data = data.evals, data.train
        # validation (and best.pt) within a length experiment's cap; the test splits stay whole
        self.valid_split = within_cap(self.splits[cfg.data.valid], length_cap(cfg.data))
        self.fingerprint = data.fingerprint
        self.dist, self.device = dist or DistInfo(), next(model.parameters()).device
        self.scaler = torch.amp.GradScaler(enabled=t.precision == Precision.fp16)
        self.state = TrainState(world_size=self.dist.world, best_metric=t.best_metric.value)
        self.precision = t.precision  # auto is resolved below, once the model can take steps
        self.ckpt_dir = run_dir / "checkpoints"
        self.saved: tuple[Path, int] | None = None  # the newest checkpoint written, and its step
        self._batches: tuple[int, list[BatchRef]] = (-1, [])
        if resume is not None:
            self.restore(*resume)  # last: it sets the random generators
        self.wrap_model()
        self.choose_speed()
        self.open_meters()
        sizes = (self.model.num_params(), self.src_tok.vocab_size, self.tgt_tok.vocab_size)
        line = "model: %d parameters; vocab %d/%d; train %d pairs; device %s; precision %s"
        log.info(line, *sizes, len(self.train_data), self.device, self.precision.value)
        self.untrained = self.untrained_positions()
        for side, note in self.untrained.items():
            log.warning("%s positions: %s", side, note)

    def choose_speed(self) -> None:
        """Where float32 products run (timed, or as the run chose) and the precision trained in
        (auto: timed, or as the run chose), both kept in the state for a resume."""
        t, vocab = self.cfg.trainer, self.tgt_tok.vocab_size
        self.products, self.products_times = resolve_products(
            self.cfg, vocab, self.state.products, self.device
        )
        self.state.products = self.products
        self.state.mkl_intel_path = check_mkl_path(self.state.mkl_intel_path, self.products)
        products = partial(dtype_times, self.cfg, vocab)  # each precision's
        self.precision, self.precision_times = resolve(
            t.precision, self.state.precision, self.device, self.time_precisions, products
        )
        self.state.precision = self.precision.value

    def untrained_positions(self) -> dict[str, str]:
        """What the positional encodings cannot learn from this run's training pairs, by side:
        the encoder sees positions up to the longest source + EOS, the decoder up to BOS + the
        longest target (results.json keeps it: a comparison must know an untrained table)."""
        src, tgt = self.train_data.longest()
        notes = {
            "encoder": self.model.enc_pos.untrained(src + 1),
            "decoder": self.model.dec_pos.untrained(tgt + 1),
        }
        return {side: note for side, note in notes.items() if note is not None}

    def open_meters(self) -> None:
        """The FLOP counter and throughput meter (MFU against the precision's peak), and, on
        rank 0 alone, train_log.jsonl and TensorBoard, continuing where the checkpoint was."""
        m, t = self.cfg.model, self.cfg.trainer
        layers, passes = (m.enc_layers, m.dec_layers), 2 if t.rdrop_alpha else 1  # R-Drop: 2
        self.flops = FlopCounter(self.model, m.d_model, layers, self.tgt_tok.vocab_size, passes)
        peak = peak_tflops(self.device, t.peak_tflops, DTYPES[self.precision])
        peak *= 1e12 * self.dist.world
        self.throughput = Throughput(peak)
        self.steplog: StepLog | NullWriter = NullWriter()
        self.writer: SummaryWriter | NullWriter = NullWriter()
        if self.dist.is_main:  # rank 0 alone writes logs
            self.steplog = StepLog(self.run_dir / LOG_NAME, self.state.log_records)
            # hide TensorBoard events a killed process wrote after the checkpoint
            self.writer = SummaryWriter(str(self.run_dir / "tb"), purge_step=self.state.step + 1)

    def wrap_model(self) -> None:
        """self.ddp: the module whose gradients DDP averages over ranks (the model itself in a
        single process); self.forward: what the training step calls (torch.compile'd when
        trainer.compile; with fixed batch shapes, static ones: self.static). self.model stays
        the plain module (state dicts, validation)."""
        self.ddp: torch.nn.Module = self.model
        if self.dist.enabled:
            ids = [self.device] if self.device.type == "cuda" else None
            self.ddp = DistributedDataParallel(self.model, device_ids=ids)
        t, buckets = self.cfg.trainer, self.train_data.buckets
        self.static = t.compile and buckets is not None  # no shape may depend on the data
        self.forward: Any = (
            compile_model(self.ddp, buckets, t.compile_mode) if t.compile else self.ddp
        )
        self.warmup = WarmUp(t.compile)

    def grad_sync(self, last: bool) -> contextlib.AbstractContextManager[Any]:
        """Under DDP, gradients are all-reduced only on the last backward of a step."""
        if last or not self.dist.enabled:
            return contextlib.nullcontext()
        # self.ddp is DistributedDataParallel here, whose no_sync has no annotations
        return self.ddp.no_sync()  # type: ignore[operator, no-any-return]

    def step_counts(self, group: list[Batch]) -> dict[str, float]:
        """All ranks' target tokens, model FLOPs, and real and padded (src+tgt) tokens of a step."""
        tokens, flops, real, padded = all_reduce_sum(self.flops.counts(group), self.device)
        return {"tokens": int(tokens), "flops": flops, "real": real, "padded": padded}

    def restore(self, path: Path, ckpt: dict[str, Any]) -> None:
        """Continue from checkpoint `ckpt`: weights, optimizer, schedule, counters, RNG states."""
        if ckpt.get("data_fingerprint", self.fingerprint) != self.fingerprint:
            raise ResumeError(
                f"cannot resume from {path}: the training or validation data under "
                f"{self.cfg.data.root} changed since it was written. Restore the data, or start "
                "a new run in another hydra.run.dir"
            )
        load_model_state(self.model, ckpt["model"], path)
        self.optimizer.load_state_dict(ckpt["optimizer"])
        self.scheduler.load_state_dict(ckpt["scheduler"])
        self.scaler.load_state_dict(ckpt["scaler"])
        self.state = TrainState.from_dict(ckpt["train_state"])
        if self.state.world_size != self.dist.world:
            raise ResumeError(
                f"cannot resume from {path}: it was written by a run of {self.state.world_size} "
                f"process(es) and this one has {self.dist.world}; the position in the data "
                "depends on it. Resume with the same torchrun --nproc_per_node"
            )
        self.saved = (path, self.state.step)
        restore_rng(ckpt["rng"])
        s = self.state
        log.info("resumed from %s: step %d, epoch %d, batch %d", path, s.step, s.epoch, s.batch)

    def time_precisions(self) -> dict[Precision, float]:
        """Seconds per training step in each candidate precision, on this run's first batches
        (trainer.precision=auto, on a CPU or a CUDA GPU); the run goes on as if no step had been
        taken."""
        t = self.cfg.trainer
        batches = self.epoch_batches(0)
        first = [batches[i : i + t.accum_steps] for i in range(0, 2 * t.accum_steps, t.accum_steps)]
        groups = [[b for i in g for b in self._collate(i)] for g in first if g]
        groups = groups[:1] if t.compile else groups  # compiled in the untimed round only

        def step(precision: Precision, round_: int) -> None:
            self.precision = precision
            self.probe_step(groups[round_ % len(groups)])
            if self.device.type == "cuda":  # the clock stops when the GPU's work is done
                torch.cuda.synchronize(self.device)

        with no_trace(self.model, self.optimizer, self.scheduler):
            return time_precisions(step)

    def probe_step(self, group: list[Batch]) -> None:
        """A training step's work (forward, loss, backward, clipping, AdamW) without its
        bookkeeping: what trainer.precision=auto times."""
        tokens = sum(b.tgt_tokens for b in group)
        for i, batch in enumerate(group):
            with self.grad_sync(last=i == len(group) - 1):
                loss, _ = self.batch_loss(batch)
                (loss / tokens).backward()
        clip = self.cfg.optim.clip_norm
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip if clip > 0 else math.inf)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """bf16/fp16 autocast as configured (fp32: no-op)."""
        precision = self.precision
        if precision == Precision.fp32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=DTYPES[precision])

    def epoch_batches(self, epoch: int) -> list[BatchRef]:
        """This rank's batches of `epoch`, a pure function of the data, token budget, seed and
        epoch (epochs.TrainData)."""
        if self._batches[0] != epoch:
            batches = self.train_data.epoch_batches(epoch)
            self._batches = (epoch, shard(batches, self.dist))  # this rank's share
        return self._batches[1]

    def batch_loss(self, batch: Batch) -> tuple[Tensor, Tensor]:
        """Summed loss (label-smoothed; R-Drop's with trainer.rdrop_alpha) and NLL of a batch."""
        t = self.cfg.trainer
        with self.autocast():
            args = (batch.src, batch.tgt_in, batch.tgt_out, t.label_smoothing, t.rdrop_alpha)
            # the DDP-wrapped or compiled model; self.static: its all_positions
            losses: tuple[Tensor, Tensor] = self.forward(*args, self.static)
            return losses

    def train_step(self, group: list[Batch]) -> dict[str, float] | None:
        """One optimizer step over `group` (gradient accumulation); returns loss statistics,
        or None when the loss or gradient norm was not finite and the step was skipped."""
        counts = self.step_counts(group)
        # normalise by all ranks' tokens; DDP's average over ranks (x 1/world) is undone here
        total_tokens = int(counts["tokens"])
        denom = total_tokens / self.dist.world
        loss_sum = nll_sum = 0.0
        for i, batch in enumerate(group):
            with self.grad_sync(last=i == len(group) - 1):
                loss, nll = self.batch_loss(batch)
                self.scaler.scale(loss / denom).backward()
            loss_sum, nll_sum = loss_sum + loss.item(), nll_sum + nll.item()
        loss_sum, nll_sum = all_reduce_sum([loss_sum, nll_sum], self.device)
        self.scaler.unscale_(self.optimizer)
        clip = self.cfg.optim.clip_norm
        grad_norm = float(
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip if clip > 0 else math.inf)
        )
        stats = {
            "loss": loss_sum / total_tokens,
            "nll": nll_sum / total_tokens,
            "lr": self.optimizer.param_groups[0]["lr"],
            "grad_norm": grad_norm,
            "tokens": total_tokens,
            "flops": counts["flops"],
            "padding_efficiency": counts["real"] / counts["padded"],
        }
        # with fp16 the grad scaler itself skips steps with overflowing gradients
        finite_grad = math.isfinite(grad_norm) or self.scaler.is_enabled()
        if not (math.isfinite(loss_sum) and finite_grad):
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.update()
            self.skip_step(stats)
            return None
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        s = self.state
        s.step, s.tokens, s.bad_streak = s.step + 1, s.tokens + total_tokens, 0
        self.throughput.add(counts["flops"], counts["real"], counts["padded"])
        self.steplog.write({"type": "train", "step": s.step, "epoch": s.epoch, **stats})
        return stats

    def skip_step(self, stats: dict[str, float]) -> None:
        """Count a step skipped for a non-finite loss or gradient; stop after max_bad_steps."""
        s, limit = self.state, self.cfg.trainer.max_bad_steps
        s.bad_streak, s.skipped_steps = s.bad_streak + 1, s.skipped_steps + 1
        log.warning(
            "step %d: non-finite loss (%s) or gradient norm (%s); optimizer step skipped "
            "(%d in a row, %d in all)",
            s.step + 1,
            stats["loss"],
            stats["grad_norm"],
            s.bad_streak,
            s.skipped_steps,
        )
        self.writer.add_scalar("train/skipped_steps", s.skipped_steps, s.step)
        record = {"type": "skip", **state_fields(s, ("step", "epoch", "batch"))}
        losses = {"loss": stats["loss"], "grad_norm": stats["grad_norm"]}
        self.steplog.write({**record, **losses, "streak": s.bad_streak})
        if s.bad_streak >= limit:
            intact = (
                f"the last checkpoint {self.saved[0]} (step {self.saved[1]}) is intact"
                if self.saved
                else "no checkpoint had been written yet"
            )
            raise NonFiniteLossError(
                f"training stopped after step {s.step}: {s.bad_streak} consecutive steps had a "
                f"non-finite loss or gradient norm (trainer.max_bad_steps={limit}); {intact}. "
                "Try a lower optim.lr, a longer optim.warmup_steps, trainer.precision=fp32, or "
                "check the training data"
            )

    def stop_reason(self, stop: StopSignals, started: float) -> str | None:
        """Why training should stop now, or None to go on."""
        t, s = self.cfg.trainer, self.state
        if stop.poll() is not None:
            return f"{stop.name} received"
        if s.step >= t.max_steps:
            return f"max_steps={t.max_steps} reached"
        if s.epoch >= t.max_epochs:
            return f"max_epochs={t.max_epochs} reached"
        if t.patience and s.stale_validations >= t.patience:
            return (
                f"early stopping: no {gain(t.best_metric)} in {s.stale_validations} "
                f"validations (trainer.patience={t.patience}; best {format_best(s)})"
            )
        if t.max_minutes and time.monotonic() - started > 60 * t.max_minutes:
            return f"max_minutes={t.max_minutes} reached"
        return None

    def fit(self) -> None:
        """Train until a stop condition; validate and save on the way. On SIGTERM or SIGINT the
        current step is finished, last.pt saved and TrainingInterrupted raised."""
        t, s = self.cfg.trainer, self.state
        started, window = time.monotonic(), Window()
        progress = Progress(t.max_steps, s.step, t.progress and self.dist.is_main)
        self._validate_init_from()
        with StopSignals() as stop:
            # rank 0 decides (its clock, its signals), so that every rank stops at the same step
            while (reason := broadcast(self.stop_reason(stop, started))) is None:
                batches = self.epoch_batches(s.epoch)
                if s.batch >= len(batches):
                    s.epoch, s.batch = s.epoch + 1, 0
                    continue
                if s.batch == 0:  # the epoch's shapes and padding, from its plan
                    record = {"type": "epoch", "epoch": s.epoch, "step": s.step}
                    self.steplog.write({**record, **self.train_data.epoch_padding(s.epoch)})
                ids = batches[s.batch : s.batch + t.accum_steps]
                s.batch += len(ids)
                group = [b for i in ids for b in self._collate(i)]
                self.train_data.prefetch(batches[s.batch : s.batch + t.accum_steps])  # next ones
                with self.warmup.step(group, self.precision.value, s.step + 1):
                    stats = self.train_step(group)
                if stats is None:
                    continue
                window.add(stats)
                progress.step()
                if s.step % t.log_every == 0:
                    progress.report(s.step, window.log(self.writer, s.step, stats["lr"]))
                    for name, value in self.throughput.scalars().items():
                        self.writer.add_scalar(f"train/{name}", value, s.step)
                if s.step % t.valid_every == 0:
                    self.validate_and_save()
            progress.close()
            self.warmup.summary()
            log.info("training stopped at step %d: %s", s.step, reason)
            if stop.signum is not None or reason.endswith(" received"):  # rank 0's signal
                self.save(best=False, periodic=False)
                signum = stop.signum if stop.signum is not None else signal.SIGTERM
                raise TrainingInterrupted(signum, self.interrupted_message(reason.split()[0]))
        if s.valid_step != s.step:
            self.validate_and_save()

    def _validate_init_from(self) -> None:
        """Where fine-tuning starts (step 0 of a run with trainer.init_from): validate and log
        the loaded weights, on rank 0."""
        t, s = self.cfg.trainer, self.state
        if s.step == 0 and t.init_from and self.dist.is_main:
            m = self.validate()
            log.info("step 0 (the weights of %s): valid %s", t.init_from, format_valid(m))
            for name, value in m.items():
                self.writer.add_scalar(f"valid/{name}", value, 0)

    def interrupted_message(self, signal_name: str) -> str:
        """TrainingInterrupted's message: the step, the checkpoint, how to resume."""
        return (
            f"{signal_name}: stopped at step {self.state.step} after saving "
            f"{self.ckpt_dir / 'last.pt'}; resume with `make resume RUN={self.run_dir}` (or the "
            f"same command with hydra.run.dir={self.run_dir})"
        )

    def _collate(self, ref: BatchRef) -> list[Batch]:  # > 1 pass: sampled segmentations
        return [b.to(self.device) for b in self.train_data.passes(ref)]

    def validate(self) -> dict[str, float]:
        """Teacher-forced loss and perplexity, and BLEU, chrF and TER of greedy translations,
        on valid."""
        cfg = self.cfg
        return validate(self.model, self.valid_split, self.tgt_tok, cfg, self.autocast)

    def validate_and_save(self) -> None:
        """Validate, update the best score (trainer.best_metric) and early-stopping counters,
        log, and save."""
        # rank 0 validates; every rank takes its metrics, so early stopping agrees everywhere
        metrics = broadcast(self.validate() if self.dist.is_main else None)
        s, t = self.state, self.cfg.trainer
        improved = update_best(s, metrics, t.best_metric)
        s.valid_step = s.step
        for name, value in metrics.items():
            self.writer.add_scalar(f"valid/{name}", value, s.step)
        log_positional_images(self.writer, self.model, s.step)
        note = " (best)"
        if not improved:
            note = f" (best {format_best(s)}; {s.stale_validations} without {gain(t.best_metric)}"
            note += f", patience {t.patience})" if t.patience else ")"
        log.info("step %d: valid %s%s", s.step, format_valid(metrics), note)
        best = ("best_metric", "best_score", "best_step", "stale_validations")
        self.steplog.write({"type": "valid", "step": s.step, **metrics, **state_fields(s, best)})
        self.save(improved)

    def checkpoint_state(self) -> dict[str, Any]:
        """Everything a run needs to resume exactly, as tensors and plain values."""
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "train_state": asdict(self.state),
            "rng": rng_state(self.device.type == "cuda"),
            "config": OmegaConf.to_container(OmegaConf.structured(self.cfg), enum_to_str=True),
            "tokenizers": {"src": self.src_tok.state(), "tgt": self.tgt_tok.state()},
            "data_fingerprint": self.fingerprint,
        }

    def save(self, best: bool, periodic: bool = True) -> None:
        """Write step_N.pt (periodic, the last keep_last kept), best.pt (when the validation's
        trainer.best_metric improved) and last.pt, each atomically. last.pt, which resuming
        reads, comes last: a run killed between the writes resumes from the previous last.pt
        and writes them again.
        Non-finite weights are never written (every rank checks: they hold the same weights, so
        all stop together). Ranks other than 0 write nothing."""
        if not all(bool(torch.isfinite(p).all()) for p in self.model.parameters()):
            raise NonFiniteLossError(
                f"step {self.state.step}: the weights are not finite; no checkpoint written"
            )
        if not self.dist.is_main:
            return
        self.state.log_records = self.steplog.records
        state = self.checkpoint_state()
        if periodic and self.cfg.trainer.keep_last > 0:
            save_checkpoint(state, self.ckpt_dir / f"step_{self.state.step}.pt")
            rotate_checkpoints(self.ckpt_dir, self.cfg.trainer.keep_last)
        if best:
            save_checkpoint(state, self.ckpt_dir / "best.pt")
        save_checkpoint(state, self.ckpt_dir / "last.pt")
        self.saved = (self.ckpt_dir / "last.pt", self.state.step)

    def close(self) -> None:
        """Close the training data, the TensorBoard writer and the step log."""
        self.train_data.close()
        self.writer.close()
        self.steplog.close()
