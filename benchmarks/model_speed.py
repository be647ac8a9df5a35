"""Our own speed on the embedded data: training tokens/s and greedy / beam-5 sentences/s.

    python benchmarks/model_speed.py [--model tiny|small] [--repeats 3] [--threads 2]

Random weights (speed does not depend on them), the numbers test split, the tiny model by
default. Medians of the repeats go to benchmarks/results/model_speed.json and docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch
from common import median, peak_rss_mb, update_doc, write_json
from hydra import compose, initialize_config_dir

from seq2seq.build import build_model, build_optimizer, load_corpus
from seq2seq.config import CONFIG_DIR, SearchKind, register_configs
from seq2seq.data import collate, token_batches
from seq2seq.search import translate_ids
from seq2seq.train import label_smoothed_nll


def train_tokens_per_s(model, optimizer, split, max_tokens: int, steps: int) -> float:
    lens = [len(s) + 1 for s in split.src_ids]
    batches = token_batches(lens, lens, max_tokens, shuffle=True, seed=0)[:steps]
    model.train()
    start, tokens = time.perf_counter(), 0
    for index in batches:
        batch = collate(index, split.src_ids, split.tgt_ids)
        logits = model(batch.src, batch.tgt_in)
        loss, _ = label_smoothed_nll(logits.flatten(0, 1), batch.tgt_out.flatten(), 0.1)
        (loss / batch.tgt_tokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        tokens += batch.src_tokens + batch.tgt_tokens
    return tokens / (time.perf_counter() - start)


def decode_sentences_per_s(model, src_ids, decode) -> float:
    start = time.perf_counter()
    translate_ids(model, src_ids, decode)
    return len(src_ids) / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--sentences", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    register_configs()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("train", [f"model={args.model}", "experiment=numbers"])
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_object(cfg)
    src_tok, tgt_tok, splits = load_corpus(cfg.data, cfg.tokenizer)
    model = build_model(cfg, src_tok.vocab_size, tgt_tok.vocab_size)
    optimizer, _ = build_optimizer(model, cfg.optim, torch.device("cpu"))
    test = splits["test"].src_ids[: args.sentences]
    greedy = replace(cfg.decode, method=SearchKind.greedy, batch_size=32)
    beam = replace(cfg.decode, method=SearchKind.beam, beam_size=5, batch_size=32)
    runs: dict[str, list[float]] = {"train_tokens_per_s": [], "greedy_sent_per_s": [],
                                    "beam5_sent_per_s": []}  # fmt: skip
    for _ in range(args.repeats):
        runs["train_tokens_per_s"].append(
            train_tokens_per_s(model, optimizer, splits["train"], 4096, args.steps)
        )
        runs["greedy_sent_per_s"].append(decode_sentences_per_s(model, test, greedy))
        runs["beam5_sent_per_s"].append(decode_sentences_per_s(model, test, beam))
    result = {name: median(v) for name, v in runs.items()}
    result.update(model=args.model, params=model.num_params(), peak_rss_mb=peak_rss_mb(),
                  threads=args.threads, repeats=args.repeats)  # fmt: skip
    write_json("model_speed", result)
    update_doc(
        "model_speed",
        f"Own speed on the numbers data ({args.model} model)",
        "| train src+tgt tokens/s | greedy sent/s | beam-5 sent/s | params | peak RSS |\n"
        "|---|---|---|---|---|\n"
        f"| {result['train_tokens_per_s']:.0f} | {result['greedy_sent_per_s']:.1f} | "
        f"{result['beam5_sent_per_s']:.1f} | {result['params']:,} | "
        f"{result['peak_rss_mb']:.0f} MB |\n\nMedians of {args.repeats} repeats; train "
        f"batches of 4096 tokens, decoding {len(test)} test sentences in batches of 32.",
    )
    print(result)


if __name__ == "__main__":
    main()
