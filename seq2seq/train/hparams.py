"""A run's settings and final scores for TensorBoard's HParams dashboard, in the run's tb/.

At the end of a run (train/run.py, rank 0, before results.json) `write_hparams` adds to
<run>/tb/ the hparams plugin's summaries (the settings a sweep varies or compares: encoding,
seed, the training length cap data.train_max_src_len, precision, model size) and the metrics
they are judged by (test BLEU and chrF per split, the best validation, BLEU and chrF on the
long split of a run trained short), each metric also as a scalar under its `hparams/...` tag.
`tensorboard --logdir multirun/pos_sweep` then shows one row per run in its HPARAMS tab.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams

from seq2seq.config.schema import PosEncodingConfig, TrainConfig

HParam = bool | int | float | str


def side_label(pos: PosEncodingConfig) -> str:
    """An encoding's kind, with the switches that change it without changing its kind."""
    switches = []
    if pos.share_layers is not None:
        switches.append(f"share_layers={pos.share_layers}")
    if pos.alibi_directional:
        switches.append("alibi_directional")
    if pos.t5_zero_init:
        switches.append("t5_zero_init")
    return pos.kind.value + (f"[{','.join(switches)}]" if switches else "")


def encoding_label(cfg: TrainConfig) -> str:
    """`rope`, or `enc=<kind>/dec=<kind>` when encoder_pos or decoder_pos set a side apart."""
    enc = side_label(cfg.encoder_pos or cfg.pos_encoding)
    dec = side_label(cfg.decoder_pos or cfg.pos_encoding)
    return enc if enc == dec else f"enc={enc}/dec={dec}"


def run_hparams(cfg: TrainConfig, summary: dict[str, Any]) -> dict[str, HParam]:
    """The run's settings: what a sweep varies (encoding, seed) and what its scores depend on."""
    m, t = cfg.model, cfg.trainer
    return {
        "name": cfg.name,
        "data": cfg.data.name,
        "encoding": encoding_label(cfg),
        "seed": t.seed,
        "train_max_src_len": cfg.data.train_max_src_len,  # 0: no cap
        "precision": str(summary["precision"]),  # the one trained in (auto's choice)
        "params": int(summary["params"]),
        "d_model": m.d_model,
        "layers": f"{m.enc_layers}+{m.dec_layers}",
        "heads": m.n_heads,
        "d_ff": m.d_ff,
        "max_steps": t.max_steps,
        "max_tokens": t.max_tokens,
        "lr": cfg.optim.lr,
    }


def run_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The run's final scores by tag: hparams/test/<split>/{bleu,chrf} (and test_average/ with
    trainer.average_last), hparams/best_valid/<metric> (and valid_average/<metric>, the averaged
    checkpoint's, which chooses the run's model), hparams/long/{bleu,chrf} (trained short),
    hparams/steps."""
    out: dict[str, float] = {}
    for board in ("test", "test_average"):
        for split, scores in summary.get(board, {}).items():
            for metric in ("bleu", "chrf"):
                out[f"hparams/{board}/{split}/{metric}"] = float(scores[metric])
    for board in ("best_valid", "valid_average"):
        for metric, value in summary.get(board, {}).items():
            if metric in ("loss", "ppl", "bleu", "chrf", "ter"):
                out[f"hparams/{board}/{metric}"] = float(value)
    long = (summary.get("length") or {}).get("long") or {}
    if long.get("n"):
        out["hparams/long/bleu"] = float(long["bleu"])
        out["hparams/long/chrf"] = float(long["chrf"])
    out["hparams/steps"] = float(summary["steps"])
    return out


def write_hparams(tb_dir: Path, cfg: TrainConfig, summary: dict[str, Any]) -> None:
    """Add the run's settings and final scores (`summary`, results.json's) to tb_dir."""
    metrics = run_metrics(summary)
    # torch ships no annotations for it
    experiment, start, end = hparams(run_hparams(cfg, summary), metrics)  # type: ignore[no-untyped-call]
    with SummaryWriter(str(tb_dir)) as writer:
        for proto in (experiment, start, end):
            writer.file_writer.add_summary(proto)
        for tag, value in metrics.items():
            writer.add_scalar(tag, value, int(summary["steps"]))
