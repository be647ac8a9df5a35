"""The training build layer: typed configs into plain objects (optimizer and schedule, the
process set-up, the Trainer with its corpus, tokenizers and model).

Nothing below this layer sees a config container; modules get typed values or dataclasses. The
disk work of a training run (reading the corpus, training tokenizers) and the process set-up
(threads, seeds, torchrun's process group) happen here, in build_trainer, not in the Trainer.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from seq2seq import kernels
from seq2seq.config.schema import (
    Kernels,
    OptimConfig,
    Schedule,
    TrainConfig,
    TrainerConfig,
)
from seq2seq.data.tokenizer import tokenizer_from_state
from seq2seq.kernels import resolve_device
from seq2seq.model.transformer import build_model
from seq2seq.train.checkpoint import CheckpointError, load_model_state
from seq2seq.train.compiled import CPU_ADVICE
from seq2seq.train.corpus import load_corpus
from seq2seq.train.distributed import DistInfo, init_distributed
from seq2seq.train.finetune import Source, adopt, load_source
from seq2seq.train.resume import Resume

if TYPE_CHECKING:
    from seq2seq.train.trainer import Trainer

log = logging.getLogger(__name__)
# AdamW(fused=True) runs on CPU tensors from torch 2.4
FUSED_ADAMW_ON_CPU = tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 4)


def build_optimizer(
    model: torch.nn.Module, cfg: OptimConfig, device: torch.device, max_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW with linear warmup then cfg.schedule's decay (`lr_factor`); max_steps: the run's
    trainer.max_steps, where a cosine or linear decay ends when cfg.decay_steps is 0.

    AdamW is fused (one kernel for all parameters) on CUDA and, from torch 2.4, on the CPU,
    where foreach loops over the tensors one by one (the timings: docs/BENCHMARKS.md, kernel
    notes).
    """
    fused = device.type == "cuda" or (device.type == "cpu" and FUSED_ADAMW_ON_CPU)
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(
        params,
        lr=cfg.lr,
        betas=(cfg.betas[0], cfg.betas[1]),
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        fused=fused or None,
    )
    factor = lr_factor(cfg, cfg.decay_steps or max_steps)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def lr_factor(cfg: OptimConfig, decay_steps: int) -> Callable[[int], float]:
    """The learning rate as a multiple of cfg.lr, given the steps taken so far (LambdaLR's
    argument). The step about to be taken is step = taken + 1 (1-based, as eq. 3's step_num):
    the first step gets lr / warmup, step `warmup` the peak. After it, inverse_sqrt is Vaswani
    et al. 2017's eq. 3; cosine and linear fall from lr to cfg.min_lr at step `decay_steps`
    and stay there."""
    warmup = max(1, cfg.warmup_steps)
    floor = cfg.min_lr / cfg.lr
    span = max(1, decay_steps - warmup)

    def factor(taken: int) -> float:
        step = taken + 1
        if step <= warmup:
            return step / warmup
        if cfg.schedule == Schedule.inverse_sqrt:
            return float((warmup / step) ** 0.5)
        done = min(1.0, (step - warmup) / span)  # share of the decay behind us
        left = 0.5 * (1 + math.cos(math.pi * done)) if cfg.schedule == Schedule.cosine else 1 - done
        return floor + (1 - floor) * left

    return factor


def checkpoint_bytes(cfg: TrainConfig) -> int:
    """About how large a training checkpoint of cfg's model is (weights and two Adam moments,
    float32), with tokenizer.vocab_size as the vocabulary; built on the meta device (no memory)."""
    with torch.device("meta"):
        model = build_model(cfg, cfg.tokenizer.vocab_size, cfg.tokenizer.vocab_size)
    return 3 * 4 * sum(p.numel() for p in model.parameters()) + 2**20


Process = tuple[DistInfo, torch.device]  # this process's place in the job, and its device


def init_process(t: TrainerConfig, process: Process | None = None) -> Process:
    """Set a training process up before anything draws random numbers: torch's threads, the
    seeds, torchrun's process group (unless `process` says it was joined) and the kernels.
    Returns this process's place in the job and its device."""
    if t.threads > 0:
        torch.set_num_threads(t.threads)
    random.seed(t.seed)
    torch.manual_seed(t.seed)
    dist, device = process or init_distributed(resolve_device(t.device))
    # torch.compile fuses plain PyTorch itself and cannot lower our oneDNN calls
    mode = Kernels.reference if t.compile else t.kernels
    if t.compile and device.type == "cpu":
        log.warning(CPU_ADVICE)
    kernels.setup_process(device, training=True, mode=mode)
    return dist, device


def build_trainer(
    cfg: TrainConfig,
    run_dir: Path,
    resume: Resume | None = None,
    source: Source | None = None,
    process: Process | None = None,
) -> Trainer:
    """The Trainer of cfg's run in run_dir, continuing from `resume` (a checkpoint's path and
    contents) when given; with trainer.init_from, starting from `source` (loaded and adopted
    here when not given: the caller that gives it has adopted its model settings). `process`:
    the process group already joined (seq2seq.train.run.train), else joined here.

    Sets the process up (init_process), reads and encodes the corpus (with the checkpoint's
    tokenizers when resuming), then builds the model and the optimizer. The seeds come first and
    the random generators are then drawn on in this fixed order (tokenizers, model
    initialisation), so that a run is reproducible; a resumed run's Trainer then sets them to
    the checkpoint's states.
    """
    # imported here: seq2seq-translate imports this module for load_for_inference and needs none
    # of the training stack (TensorBoard, sacreBLEU: 0.1 s more at start-up)
    from seq2seq.train.trainer import Trainer

    dist, device = init_process(cfg.trainer, process)
    saved = None
    if cfg.trainer.init_from and source is None:  # fine-tuning: the source's model settings
        source = load_source(cfg.trainer.init_from)  # (a resume's too)
        adopt(cfg, source)
    if resume is not None:
        state, source = resume[1]["tokenizers"], None
        saved = (tokenizer_from_state(state["src"]), tokenizer_from_state(state["tgt"]))
    elif source is not None:  # and at the start, its tokenizers and weights
        state = source.state["tokenizers"]
        saved = (tokenizer_from_state(state["src"]), tokenizer_from_state(state["tgt"]))
    corpus = load_corpus(cfg, saved)
    src_tok, tgt_tok = corpus.tokenizers
    model = build_model(cfg, src_tok.vocab_size, tgt_tok.vocab_size).to(device)
    if source is not None:
        load_model_state(model, source.state["model"], source.path)
    optimizer, scheduler = build_optimizer(model, cfg.optim, device, cfg.trainer.max_steps)
    if source is not None and not cfg.trainer.init_reset:
        if "optimizer" not in source.state:
            raise CheckpointError(
                f"{source.path} holds no optimizer state (an averaged checkpoint?): fine-tune "
                "with trainer.init_reset=true"
            )
        ours = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
        optimizer.load_state_dict(source.state["optimizer"])  # its moments (AdamW's state)
        for group, settings in zip(optimizer.param_groups, ours, strict=True):
            group.update(settings)  # this run's lr, schedule and betas, not the source's
    return Trainer(cfg, model, optimizer, scheduler, corpus, run_dir, dist, resume)
