"""Results of benchmarks/decode.py: benchmarks/results/decode.json, docs/BENCHMARKS.md."""

from __future__ import annotations

import argparse

from common import update_doc, write_json
from decode_engines import FORCED, LIMIT

LABELS = {"ours": "ours (PyTorch)", "hf": "HF transformers", "ct2_float32": "CTranslate2 float32",
          "ct2_int8": "CTranslate2 int8"}  # fmt: skip
NOTES = f"""\
All engines decode the same function: our weights are copied into a Hugging Face Marian model
(model dimension permuted to Marian's sin/cos layout; teacher-forced logits agree to ~1e-6),
which CTranslate2 converts. Forced modes: every output is {FORCED} tokens, {FORCED} decoder
steps (EOS masked until then; ours counts its final EOS as token {FORCED}, HF and
CTranslate2 stop at {FORCED} tokens without one). Natural modes: each engine's own stopping rule,
at most {LIMIT} tokens; beam length penalty: average, exponent 1. "same output" is the share
of sentences whose output equals ours token for token ("same 1st half": their first half).
Greedy outputs agree; forced beam outputs share their first half but not the final pick, since
at the limit ours scores the forced EOS (log p(EOS) is charged) where the others stop without
one. Peak RSS is the whole process (Python, libraries, model). Ratios above 1: ours is faster.

Natural length: a batch ends with a few long outputs, and a step with few rows is all fixed cost:
measured apart, a one-sentence greedy step takes ~1.1 ms here (~170 PyTorch ops dispatched from
Python) against ~0.25 ms in CTranslate2's C++ loop, which is most of the natural-length gap."""


def markdown(table: dict[str, dict], profile: dict) -> str:
    lines = ["| mode | engine | sent/s | tokens/s | peak RSS | same output | same 1st half "
             "| ours / engine |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for mode, engines in table.items():
        for engine, row in engines.items():
            same, half = row["same_output_as_ours"], row["same_first_half_as_ours"]
            lines.append(
                f"| {mode} | {LABELS[engine]} | {row['sent_per_s']:.1f} | "
                f"{row['tokens_per_s']:.0f} | {row['peak_rss_mb']:.0f} MB | {_share(same)} | "
                f"{_share(half)} | {row.get('ours_speedup', 0):.2f} |"
            )
    shares = ", ".join(f"{name} {share:.0%}" for name, share in profile["share"].items())
    return (
        "\n".join(lines) + "\n\n" + NOTES + "\n\n"
        f"Where our time goes ({profile['mode']}, torch.profiler self time over "
        f"{profile['profiled_seconds']:.1f} s, profiler overhead included): {shares}."
    )


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("torch", "transformers", "ctranslate2"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed"
    return found


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def report(args: argparse.Namespace, table: dict[str, dict], profile: dict, write: bool) -> None:
    body = markdown(table, profile)
    print(body)
    if not write:
        return
    payload = {"sentences": args.sentences, "batch": args.batch, "threads": args.threads,
               "repeats": args.repeats, "train_steps": args.train_steps, "versions": versions(),
               "results": table, "profile": profile}  # fmt: skip
    write_json("decode", payload)
    update_doc(
        "decode",
        "Decoding speed: ours vs Hugging Face transformers vs CTranslate2",
        f"Versions: {', '.join(f'{k} {v}' for k, v in versions().items())}. "
        f"Multi30k test_2016_flickr.en, first {args.sentences} sentences, batches of "
        f"{args.batch}, {args.threads} threads for every engine, each engine in its own process; "
        f"medians of {args.repeats} alternating repeats. Model: d=256, 3+3 layers, 4 heads, "
        "FFN 1024, joint BPE vocabulary of 8000, 7.6M parameters, trained "
        f"{args.train_steps} small steps so that it ends its outputs itself.\n\n" + body,
    )
