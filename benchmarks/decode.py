"""Decoding speed: ours vs Hugging Face transformers (sdpa and eager attention) vs CTranslate2
(float32 and int8).

    python benchmarks/decode.py [--data DIR] [--repeats 3] [--threads 2] [--engines ...]

One model for all: d=256, 3+3 layers, 4 heads, FFN 1024, a joint 8000-piece BPE vocabulary
(Multi30k train en+de), post-norm, sinusoidal positions, tied embeddings, trained for a few
minutes (decode_setup.TrainSettings: long enough that it ends its own sentences), exported to
Marian and converted to CTranslate2, so that every engine computes the same function; the run
measures how closely (teacher-forced logits of ours and of the Marian export on 32 test
sentences). The first 200 sentences of Multi30k test_2016_flickr.en, batches of 32, greedy and
beam 5, each with the output forced to 32 tokens (EOS masked until then) and at natural length
(at most 64 tokens; the share of outputs that reach that cap is reported, and the run stops with
an error when ours exceeds 10% in a natural mode: the model would not be ending its sentences).
Every (engine, mode) runs in its own process; the repeats alternate between engines; in the
greedy forced mode each engine also times one sentence decoded alone. CTranslate2 runs twice,
with CT2_USE_MKL=0 (oneDNN) and =1 (MKL), its two documented CPU backends (unset, it takes MKL
on Intel CPUs only, where oneDNN can be far faster): both are reported and the faster is
CTranslate2's figure. Ours and CTranslate2 also run with one worker a thread (`_inter` runs:
CTranslate2's inter_threads, its documented CPU throughput setting; ours: one-thread processes,
as seq2seq-translate workers=N; see decode_engines.py); each engine's figure is its fastest run.
Medians go to benchmarks/results/decode.json and docs/BENCHMARKS.md; our speed ratio (ours'
fastest run over the engine's) is given against every engine, against the faster of HF's two
attention implementations, and against CTranslate2's figure.

Internally, `--worker ENGINE MODE INPUTS` runs one engine (ENGINE_inter: one worker a thread) in
one mode and prints JSON; that path
imports neither seq2seq nor torch for the CTranslate2 engines (tests/benchmarks/test_benchmarks.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from common import ONEDNN_DEFAULT_CACHES, multi30k_root, peak_rss_mb, run_json
from decode_engines import ENGINES, INTER, LIMIT, MODES, Inputs, runner, split_run

HERE = Path(__file__).resolve().parent
ENGINE_NAMES = list(ENGINES)
HF_ENGINES = ("hf_sdpa", "hf_eager")
CT2_ENGINES = ("ct2_float32", "ct2_int8")
CT2_BACKENDS = ("0", "1")  # CT2_USE_MKL: 0 oneDNN, 1 MKL
MAX_CAP_SHARE = 0.10  # natural modes: most of our outputs that may stop at the length cap
INTER_ENGINES = ("ours", *CT2_ENGINES)  # the engines with such a setting (not HF's generate)


def worker(name: str, mode: str, inputs_path: str, profile: bool) -> None:
    """Run one engine (name: the engine, + INTER for one worker a thread) in one mode and print
    its result as one line of JSON."""
    inputs = Inputs(**json.loads(Path(inputs_path).read_text()))
    if profile:
        from decode_profile import profile_ours

        print(json.dumps(profile_ours(inputs, MODES[mode])))
        return
    engine, _, inter = split_run(name)
    workers = inputs.threads if inter else 1
    result = runner(engine)(inputs, MODES[mode], workers=workers)
    print(json.dumps({**result, "peak_rss_mb": peak_rss_mb()}))


def expand_runs(engines: list[str], threads: int) -> list[str]:
    """The runs of `engines`: a CTranslate2 engine once per CT2_USE_MKL value
    ('ct2_float32_mkl0', 'ct2_float32_mkl1'); ours and CTranslate2 also with one worker a thread
    where there are several threads ('ours_inter', 'ct2_float32_mkl0_inter'); HF's once."""
    runs = []
    for e in engines:
        backends = [f"_mkl{b}" for b in CT2_BACKENDS] if e in CT2_ENGINES else [""]
        layouts = ["", INTER] if e in INTER_ENGINES and threads > 1 else [""]
        runs += [f"{e}{backend}{layout}" for backend in backends for layout in layouts]
    return runs


def spawn(run: str, mode: str, inputs_path: Path, threads: int, profile: bool = False) -> dict:
    """One worker process; threads pinned through the environment as well; CT2_USE_MKL as the
    run says (unset for the other engines); the worker is told the engine and the layout."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
    }
    env.pop("CT2_USE_MKL", None)
    engine, backend, inter = split_run(run)
    if backend is not None:
        env["CT2_USE_MKL"] = backend
    if engine != "ours":  # as users run them: oneDNN's default caches (ours: setup_process)
        env.update(ONEDNN_DEFAULT_CACHES)
    name = engine + (INTER if inter else "")
    cmd = [sys.executable, __file__, "--worker", name, mode, str(inputs_path)]
    return run_json(cmd + (["--profile"] if profile else []), env, f"{run} {mode}")


def prepare_inputs(args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    """Tokenizer, model, exports (all cached), the inputs file every worker reads, and what the
    setup measured (parameters, training settings, ours vs the Marian export's logits)."""
    from dataclasses import asdict

    import torch
    from decode_setup import (
        CHECK_SENTENCES,
        MODEL,
        TrainSettings,
        export_check,
        prepare,
        test_sources,
        trained_precision,
        vocabulary,
    )

    from seq2seq.data.batching import sentence_batches

    torch.set_num_threads(args.threads)
    settings = TrainSettings(**({} if args.train_steps is None else {"steps": args.train_steps}))
    root, cache = multi30k_root(args.data), Path(args.cache_dir)
    paths, tok, model = prepare(root, cache, settings)
    src_ids = test_sources(root, tok, args.sentences)
    n = min(CHECK_SENTENCES, args.sentences)
    check = export_check(model, paths["marian"], src_ids[:n], test_sources(root, tok, n, "de"))
    shape = {
        k: getattr(MODEL, k) for k in ("d_model", "n_heads", "enc_layers", "dec_layers", "d_ff")
    }
    setup = {
        "model": shape,
        "vocab": tok.vocab_size,
        "parameters": model.num_params(),
        "train": {**asdict(settings), "chosen": trained_precision(tok, cache, settings)},
        "logits": check,
    }
    inputs = {
        "src_ids": src_ids,
        "vocab": vocabulary(tok),
        "paths": paths,
        "batches": sentence_batches([len(s) for s in src_ids], args.batch),
        "threads": args.threads,
    }
    path = cache / "decode_inputs.json"
    path.write_text(json.dumps(inputs))
    return path, setup


def measure(args: argparse.Namespace, inputs_path: Path) -> dict[str, dict[str, list[dict]]]:
    """runs[mode][run]: one result per repeat; runs alternate inside every repeat (a
    CTranslate2 engine is two runs, see `expand_runs`)."""
    names = expand_runs(args.engines, args.threads)
    runs: dict[str, dict[str, list[dict]]] = {m: {e: [] for e in names} for m in args.modes}
    for rep in range(args.repeats):
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for mode in args.modes:
            for run in order:
                result = spawn(run, mode, inputs_path, args.threads)
                runs[mode][run].append(result)
                print(
                    f"repeat {rep + 1} {mode:15s} {run:16s} "
                    f"{args.sentences / result['seconds']:7.1f} sent/s",
                    flush=True,
                )
    return runs


def agreement(outputs: list[list[int]], ours: list[list[int]], tokens: int) -> float:
    """Share of sentences whose first `tokens` output tokens are ours."""
    same = [a[:tokens] == b[:tokens] for a, b in zip(outputs, ours, strict=True)]
    return sum(same) / len(same)


def at_cap(outputs: list[list[int]], limit: int) -> float:
    """Share of outputs that reach the length cap: limit - 1 tokens before any EOS (ours must
    spend its last step on EOS, the others stop at `limit` tokens without one), the same rule
    for every engine."""
    return sum(len(row) >= limit - 1 for row in outputs) / len(outputs)


def row(results: list[dict], ours: list[list[int]] | None, limit: int) -> dict[str, Any]:
    """Medians over the repeats of one (mode, engine); outputs from its first repeat."""
    seconds = statistics.median(r["seconds"] for r in results)
    outputs, tokens = results[0]["outputs"], sum(results[0]["lengths"])
    alone = [r["alone_step_ms"] for r in results if r["alone_step_ms"] is not None]
    # at the limit ours ends with EOS where the others stop without one: limit - 1 tokens
    return {
        "sent_per_s": len(outputs) / seconds,
        "tokens_per_s": tokens / seconds,
        "seconds": seconds,
        "tokens": tokens,
        "tokens_per_sentence": tokens / len(outputs),
        "at_cap": at_cap(outputs, limit),
        "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in results),
        "same_output_as_ours": agreement(outputs, ours, limit - 1) if ours else None,
        "same_first_half_as_ours": agreement(outputs, ours, limit // 2) if ours else None,
        "alone_step_ms": statistics.median(alone) if alone else None,
        "repeats": [r["seconds"] for r in results],
    }


def fastest(engines: dict[str, dict], engine: str) -> str | None:
    """The run of `engine` with the most sentences/s over its backends and layouts (None: it
    did not run)."""
    runs = [r for r in engines if split_run(r)[0] == engine]
    return max(runs, key=lambda r: engines[r]["sent_per_s"]) if runs else None


def summarize(runs: dict[str, dict[str, list[dict]]]) -> dict[str, dict]:
    """Per (mode, engine): medians, length-cap share, agreement with ours (its one-process
    run), our speed ratio (ours' fastest run over the engine's)."""
    table: dict[str, dict] = {}
    for mode, engines in runs.items():
        ours = engines["ours"][0]["outputs"] if "ours" in engines else None
        table[mode] = {e: row(results, ours, MODES[mode].limit) for e, results in engines.items()}
        best = fastest(table[mode], "ours")
        if best is not None:
            for values in table[mode].values():
                values["ours_speedup"] = table[mode][best]["sent_per_s"] / values["sent_per_s"]
    return table


def versus_faster_hf(table: dict[str, dict]) -> dict[str, dict[str, Any]]:
    """Per mode: the faster of HF's attention implementations, and our speed ratio to it."""
    faster = {}
    for mode, engines in table.items():
        present = [e for e in HF_ENGINES if e in engines]
        if present and "ours" in engines:
            best = max(present, key=lambda e: engines[e]["sent_per_s"])
            faster[mode] = {"engine": best, "ours_speedup": engines[best]["ours_speedup"]}
    return faster


def ct2_figures(table: dict[str, dict]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per mode and CTranslate2 engine: the fastest of its runs (CTranslate2's figure), the
    settings it took, ours' fastest run and our speed ratio (above 1: ours is faster)."""
    figures: dict[str, dict[str, dict[str, Any]]] = {}
    for mode, engines in table.items():
        ours = fastest(engines, "ours")
        for engine in CT2_ENGINES:
            best = fastest(engines, engine)
            if best is not None and ours is not None:
                _, backend, inter = split_run(best)
                figures.setdefault(mode, {})[engine] = {
                    "ct2_use_mkl": backend,
                    "inter_threads": inter,
                    "sent_per_s": engines[best]["sent_per_s"],
                    "ours": ours,
                    "ours_speedup": engines[best]["ours_speedup"],
                }
    return figures


def check_natural_lengths(table: dict[str, dict]) -> None:
    """Stop when our model runs into the length cap in a natural mode: it would not be ending
    its own sentences, and the natural modes would time forced lengths."""
    for mode, engines in table.items():
        share = engines.get("ours", {}).get("at_cap", 0.0)
        if not MODES[mode].forced and share > MAX_CAP_SHARE:
            raise SystemExit(
                f"{mode}: {share:.1%} of our outputs reach the {LIMIT}-token cap "
                f"(more than {MAX_CAP_SHARE:.0%}); train the model longer (--train-steps)"
            )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=3, metavar=("ENGINE", "MODE", "INPUTS"))
    parser.add_argument("--profile", action="store_true", help="worker: profile ours instead")
    parser.add_argument(
        "--data",
        default=None,
        help="Multi30k folder (default $MULTI30K_ROOT, else ../shared/data/multi30k)",
    )
    parser.add_argument("--cache-dir", default=str(HERE.parent / ".cache" / "bench"))
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--train-steps", type=int, default=None, help="default: decode_setup.TrainSettings.steps"
    )
    parser.add_argument("--engines", nargs="+", default=ENGINE_NAMES, choices=ENGINE_NAMES)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--no-doc", action="store_true", help="print only, write no results")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.worker:
        worker(*args.worker, profile=args.profile)
        return
    from decode_report import report

    inputs_path, setup = prepare_inputs(args)
    table = summarize(measure(args, inputs_path))
    check_natural_lengths(table)
    profile = spawn("ours", "beam5_forced", inputs_path, args.threads, profile=True)
    report(
        args,
        {
            "setup": setup,
            "results": table,
            "faster_hf": versus_faster_hf(table),
            "ct2": ct2_figures(table),
            "profile": profile,
        },
        write=not args.no_doc,
    )


if __name__ == "__main__":
    main()
