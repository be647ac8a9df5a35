"""Our own speed on the embedded data: training tokens/s and greedy / beam-5 sentences/s.

    python benchmarks/model_speed.py [--model tiny|small] [--repeats 3] [--threads 2]
                                     [--precision fp32|bf16|auto]

Training is timed through the product's `Trainer.train_step` (the step seq2seq-train takes:
fused output layer + loss, clipping, AdamW, the schedule, the step log), on a Trainer built from
in-memory objects: the numbers corpus, a freshly initialised model and its optimizer; its logs go
to a temporary directory. Decoding uses the same model. The numbers test split, the tiny model by
default. Medians of the repeats go to benchmarks/results/model_speed.json and docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from common import median, peak_rss_mb, update_doc, write_json
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from seq2seq.config.commands import register_configs
from seq2seq.config.schema import CONFIG_DIR, DecodeConfig, SearchKind, TrainConfig
from seq2seq.data.batching import Batch
from seq2seq.decode.schedule import translate_ids
from seq2seq.model.transformer import EncoderDecoder, build_model
from seq2seq.train.build import build_optimizer, init_process
from seq2seq.train.corpus import load_corpus
from seq2seq.train.trainer import Trainer

MAX_TOKENS = 4096  # padded tokens a training batch
FORCED = 32  # output tokens of every decoded sentence (EOS included)


def make_trainer(cfg: TrainConfig, run_dir: Path) -> Trainer:
    """The product's Trainer, from objects: the corpus, a new model and its optimizer."""
    _, device = init_process(cfg.trainer)  # threads, seeds and kernels, as seq2seq-train sets them
    corpus = load_corpus(cfg)
    src_tok, tgt_tok = corpus.tokenizers
    model = build_model(cfg, src_tok.vocab_size, tgt_tok.vocab_size).to(device)
    optimizer, scheduler = build_optimizer(model, cfg.optim, device, cfg.trainer.max_steps)
    return Trainer(cfg, model, optimizer, scheduler, corpus, run_dir)


def first_batches(trainer: Trainer, steps: int) -> list[Batch]:
    """The first `steps` batches of epoch 0, as the Trainer draws them."""
    refs = trainer.epoch_batches(0)[:steps]
    return [trainer.train_data.collate(r).to(trainer.device) for r in refs]


def train_tokens_per_s(trainer: Trainer, batches: list[Batch]) -> float:
    """Source + target tokens per second of Trainer.train_step, one batch a step."""
    tokens = sum(b.src_tokens + b.tgt_tokens for b in batches)
    start = time.perf_counter()
    for batch in batches:
        trainer.train_step([batch])
    return tokens / (time.perf_counter() - start)


def decode_sentences_per_s(
    model: EncoderDecoder, src_ids: list[list[int]], decode: DecodeConfig
) -> tuple[float, float]:
    """Sentences per second, and output tokens per sentence (EOS included). Every output is
    forced to FORCED tokens: a model this early in training ends its outputs anywhere (beam
    search often at once), and the speed would measure that instead of the decoder."""
    start = time.perf_counter()
    hyps = translate_ids(model, src_ids, decode, min_len=FORCED)
    seconds = time.perf_counter() - start
    return len(src_ids) / seconds, sum(len(h[0].tokens) + 1 for h in hyps) / len(src_ids)


def config(args: argparse.Namespace) -> TrainConfig:
    register_configs()
    overrides = [
        f"model={args.model}",
        "experiment=numbers",
        f"trainer.threads={args.threads}",
        f"trainer.precision={args.precision}",
        f"trainer.max_tokens={MAX_TOKENS}",
        "trainer.accum_steps=1",
        "trainer.device=cpu",
        "trainer.progress=false",
    ]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return OmegaConf.to_object(compose("train", overrides))  # type: ignore[return-value]


def measure(trainer: Trainer, args: argparse.Namespace) -> dict[str, float]:
    """Medians over the repeats of training tokens/s, then of greedy and beam-5 sentences/s
    with the weights that training left (the same for every decoding repeat), the output
    tokens per sentence and the number of test sentences decoded."""
    batches = first_batches(trainer, args.steps)
    test = trainer.splits["test"].src_ids[: args.sentences]
    fixed = replace(trainer.cfg.decode, batch_size=32, max_len_a=0.0, max_len_b=FORCED)
    greedy = replace(fixed, method=SearchKind.greedy)
    beam = replace(fixed, method=SearchKind.beam, beam_size=5)
    runs: dict[str, list[float]] = {
        "train_tokens_per_s": [],
        "greedy_sent_per_s": [],
        "beam5_sent_per_s": [],
    }
    for _ in range(args.repeats):
        runs["train_tokens_per_s"].append(train_tokens_per_s(trainer, batches))
    lengths = {}
    for _ in range(args.repeats):
        for name, decode in (("greedy", greedy), ("beam5", beam)):
            speed, lengths[name] = decode_sentences_per_s(trainer.model, test, decode)
            runs[f"{name}_sent_per_s"].append(speed)
    return {
        **{name: median(v) for name, v in runs.items()},
        "sentences": len(test),
        "greedy_tokens_per_sentence": lengths["greedy"],
        "beam5_tokens_per_sentence": lengths["beam5"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "auto"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = make_trainer(config(args), Path(run_dir))
        try:
            result: dict[str, object] = {**measure(trainer, args)}
        finally:
            trainer.close()
    result.update(
        model=args.model,
        params=trainer.model.num_params(),
        peak_rss_mb=peak_rss_mb(),
        threads=args.threads,
        repeats=args.repeats,
        precision=trainer.precision.value,
    )
    write_json("model_speed", result)
    update_doc(
        "model_speed",
        f"Own speed on the numbers data ({args.model} model)",
        "| train src+tgt tokens/s | greedy sent/s | beam-5 sent/s | params | peak RSS |\n"
        "|---|---|---|---|---|\n"
        f"| {result['train_tokens_per_s']:.0f} | {result['greedy_sent_per_s']:.1f} | "
        f"{result['beam5_sent_per_s']:.1f} | {result['params']:,} | "
        f"{result['peak_rss_mb']:.0f} MB |\n\nMedians of {args.repeats} repeats; training: "
        f"Trainer.train_step in {result['precision']} on batches of {MAX_TOKENS} tokens; "
        f"decoding {result['sentences']} test sentences in batches of 32 with the weights of "
        f"{args.steps * args.repeats} training steps, every output forced to "
        f"{result['greedy_tokens_per_sentence']:.0f} (greedy) and "
        f"{result['beam5_tokens_per_sentence']:.0f} (beam 5) tokens, EOS included (a barely "
        "trained model ends its outputs anywhere; benchmarks/decode.py decodes a trained "
        "model at natural length).",
    )
    print(result)


if __name__ == "__main__":
    main()
