"""Scoring a trained checkpoint on the run's test splits, as seq2seq.train.run does at the end,
and choosing the run's model: best.pt or the averaged checkpoint, by the validation set.

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

from seq2seq.config.schema import BestMetric, length_cap
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


def choose_checkpoint(state: TrainState, average: dict[str, float]) -> dict[str, Any]:
    """The run's model: average.pt where its validation is strictly better than best.pt's by
    trainer.best_metric, else best.pt. The test sets choose nothing. An average can lose: a run
    stopped early (time cap, patience) averages checkpoints reaching back to barely trained ones.
    """
    metric = BestMetric(state.best_metric)
    best = state.best_score
    value = average[metric.value]
    chosen = "average.pt" if best is not None and improves(value, best, metric) else "best.pt"
    level = logging.WARNING if chosen == "best.pt" else logging.INFO
    log.log(
        level,
        "chosen on the validation set: %s (average.pt: %s; best.pt, step %d: %s)",
        chosen,
        format_valid({metric.value: value}),
        state.best_step,
        format_valid({metric.value: math.nan if best is None else best}),
    )
    return {"checkpoint": chosen, "metric": metric.value, "best": best, "average": value}
