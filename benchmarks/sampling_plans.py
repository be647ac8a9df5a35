"""What subword sampling does to a recipe's batches, under each tokenizer.sampling.plan.

    python benchmarks/sampling_plans.py [--data DIR] [--experiment multi30k_en_de]
        [--bpe-dropout 0.1] [--epochs 2] [--seed 1] [--no-doc]

For the recipe without sampling and with BPE-dropout under plan=prepared and plan=sampled, each
epoch's batches are read back as training reads them (TrainData.passes) and counted: optimizer
steps, passes (a batch cut by fit_budget is several), target tokens, the share of real tokens in
the padded passes, and the peak of target tokens in one step. These counts depend on the data,
the tokenizer and the seed only, not on the CPU. Also reported, and CPU-dependent: the seconds
plan=sampled takes to draw an epoch before its first batch (the first epoch is drawn in the
caller; later ones in a background thread while the previous trains, here while this script
counts). Results: benchmarks/results/sampling_plans.json and docs/BENCHMARKS.md (sampling_plans).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from common import multi30k_root, update_doc, write_json
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from seq2seq.config.commands import register_configs
from seq2seq.config.schema import CONFIG_DIR, TrainConfig
from seq2seq.data.epochs import TrainData
from seq2seq.data.tokenizer import PAD_ID
from seq2seq.train.corpus import load_corpus


def config(args: argparse.Namespace, extra: list[str]) -> TrainConfig:
    register_configs()
    overrides = [
        f"experiment={args.experiment}",
        f"data.root={multi30k_root(args.data)}",
        f"trainer.seed={args.seed}",
        *extra,
    ]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return OmegaConf.to_object(compose("train", overrides))  # type: ignore[return-value]


def count_epoch(train: TrainData, epoch: int) -> dict[str, Any]:
    """Epoch `epoch`'s steps, passes, tokens and padding, as training reads them."""
    started = time.perf_counter()
    refs = train.epoch_batches(epoch)
    plan_s = time.perf_counter() - started
    steps = [train.passes(ref) for ref in refs]
    passes = [p for step in steps for p in step]
    real = sum(int(p.src.ne(PAD_ID).sum() + p.tgt_out.ne(PAD_ID).sum()) for p in passes)
    padded = sum(p.src.numel() + p.tgt_out.numel() for p in passes)
    per_step = [sum(int(p.tgt_out.ne(PAD_ID).sum()) for p in step) for step in steps]
    return {
        "epoch": epoch,
        "steps": len(steps),
        "passes": len(passes),
        "target_tokens": sum(per_step),
        "target_tokens_per_step": sum(per_step) / len(steps),
        "max_target_tokens_in_a_step": max(per_step),
        "real_share": real / padded,
        "plan_seconds": plan_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=None, help="the Multi30k folder (MULTI30K_ROOT)")
    parser.add_argument("--experiment", default="multi30k_en_de")
    parser.add_argument("--bpe-dropout", type=float, default=0.1)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-doc", action="store_true", help="leave docs/BENCHMARKS.md alone")
    args = parser.parse_args()
    sampling = f"tokenizer.sampling.bpe_dropout={args.bpe_dropout}"
    setups = {
        "no sampling": [],
        "plan=prepared": [sampling, "tokenizer.sampling.plan=prepared"],
        "plan=sampled": [sampling, "tokenizer.sampling.plan=sampled"],
    }
    rows: dict[str, list[dict[str, Any]]] = {}
    for name, extra in setups.items():
        train = load_corpus(config(args, extra)).train
        rows[name] = [count_epoch(train, e) for e in range(args.epochs)]
        train.close()
    write_json("sampling_plans", {"bpe_dropout": args.bpe_dropout, "plans": rows})
    lines = [
        "| setup | epoch | steps | passes | target tokens a step (max) | real tokens | "
        "epoch plan (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, epochs in rows.items():
        for r in epochs:
            lines.append(
                f"| {name} | {r['epoch']} | {r['steps']} | {r['passes']} | "
                f"{r['target_tokens_per_step']:,.0f} ({r['max_target_tokens_in_a_step']:,}) | "
                f"{100 * r['real_share']:.1f}% | {r['plan_seconds']:.2f} |"
            )
        print(name, epochs, flush=True)
    if not args.no_doc:
        body = (
            f"The {args.experiment} recipe's epochs read back as training reads them, "
            f"bpe_dropout={args.bpe_dropout}, seed {args.seed} (the counts depend on the data "
            "and seed only; the plan seconds on the CPU and on what else runs).\n\n"
            + "\n".join(lines)
            + "\n"
        )
        update_doc("sampling_plans", "Subword sampling: the batches of each plan", body)


if __name__ == "__main__":
    main()
