"""Scoring a trained checkpoint on the run's test splits, as seq2seq.train.run does at the end,
and choosing the run's model: the averaged checkpoint for a run that made its planned steps,
else best.pt or the average, by the validation set.

Every test split is translated with the run's decoding settings, written to {split}{tag}.hyp and
scored with sacreBLEU (BLEU, chrF, TER; case-insensitive BLEU too). With a length cap
(data.train_max_src_len or data.length_cap) the test splits are also scored together by
source-token bucket and on the "long" split (evaluation.scoring.length_generalization).
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from seq2seq.config.schema import BestMetric, TrainerConfig, length_cap
from seq2seq.decode.schedule import translate_ids
from seq2seq.evaluation.scoring import format_scores, length_generalization, score
from seq2seq.train.checkpoint import TrainState, load_checkpoint, load_model_state
from seq2seq.train.trainer import Trainer
from seq2seq.train.validation import format_valid, improves

log = logging.getLogger(__name__)


def load_weights(trainer: Trainer, path: Path) -> None:
    """Checkpoint `path`'s weights into the trainer's model, checked against it."""
    load_model_state(trainer.model, load_checkpoint(path, trainer.device)["model"], path)


def score_checkpoint(
    trainer: Trainer, path: Path, tag: str = ""
) -> tuple[dict[str, dict[str, object]], dict[str, Any] | None]:
    """The scores of checkpoint `path` on every test split, and its length-experiment scores
    (None without a cap). Loads the checkpoint into the trainer's model; `tag` names the files
    and the TensorBoard board (".average": the averaged checkpoint)."""
    cfg = trainer.cfg
    load_weights(trainer, path)
    results: dict[str, dict[str, object]] = {}
    lens: list[int] = []  # source lengths, hypotheses, references over every test split
    hyps: list[str] = []
    refs: list[str] = []
    decode = replace(cfg.decode, scores=False)  # the text is scored, not the search's scores
    for name in cfg.data.test:
        data = trainer.splits[name]
        out = translate_ids(trainer.model, data.src_ids, decode, cfg.data.max_len)
        texts = [trainer.tgt_tok.decode(h[0].tokens) for h in out]
        (trainer.run_dir / f"{name}{tag}.hyp").write_text("".join(t + "\n" for t in texts))
        results[name] = score(texts, data.tgt_text, lowercase=True)
        board = "test" if not tag else f"test{tag.replace('.', '_')}"
        trainer.writer.add_scalar(f"{board}/{name}_bleu", results[name]["bleu"], trainer.state.step)
        log.info("\n%s", format_scores(f"{name} [{path.name}]", results[name]))
        lens.extend(len(ids) for ids in data.src_ids)
        hyps.extend(texts)
        refs.extend(data.tgt_text)
    cap = length_cap(cfg.data)
    if not (cap and hyps):
        return results, None
    length = {"splits": list(cfg.data.test), **length_generalization(lens, hyps, refs, cap)}
    log.info("by source tokens [%s]: %s", path.name, length)
    return results, length


def validate_checkpoint(trainer: Trainer, path: Path) -> dict[str, float]:
    """Checkpoint `path`'s validation metrics, measured as training measures best.pt's (loaded
    into the trainer's model)."""
    load_weights(trainer, path)
    return trainer.validate()


def completed(state: TrainState, trainer: TrainerConfig) -> bool:
    """The run stopped at its planned end (trainer.max_steps or max_epochs), not early (the time
    cap, patience)."""
    return state.step >= trainer.max_steps or state.epoch >= trainer.max_epochs


def choose_checkpoint(state: TrainState, average: dict[str, float], done: bool) -> dict[str, Any]:
    """The run's model. A run that made its planned steps (`done`: max_steps or max_epochs) takes
    average.pt; one stopped early (time cap, patience) takes average.pt only where its validation
    is strictly better than best.pt's by trainer.best_metric, else best.pt: its average can reach
    back to barely trained checkpoints. The test sets choose nothing.

    Why the average whatever the validation says, in a completed run: best.pt's score is the
    highest of the run's validations, picked on the same sentences, so a comparison with it
    favours best.pt. On five 8,000-step Multi30k runs, the val comparison lost to always taking
    the average on held-out halves of val (scripts/choice_check.py; docs/RESULTS.md, runs 51-55).
    """
    metric = BestMetric(state.best_metric)
    best = state.best_score
    value = average[metric.value]
    better = best is not None and improves(value, best, metric)
    chosen = "average.pt" if done or better else "best.pt"
    rule = "completed: the average" if done else "stopped early: the better on val"
    log.log(
        logging.WARNING if chosen == "best.pt" else logging.INFO,
        "the run's model (%s): %s (validation: average.pt %s; best.pt, step %d: %s)",
        rule,
        chosen,
        format_valid({metric.value: value}),
        state.best_step,
        format_valid({metric.value: math.nan if best is None else best}),
    )
    return {
        "checkpoint": chosen,
        "rule": rule,
        "metric": metric.value,
        "best": best,
        "average": value,
    }
