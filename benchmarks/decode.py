"""Decoding speed: ours vs Hugging Face transformers vs CTranslate2 (float32 and int8).

    python benchmarks/decode.py [--data DIR] [--repeats 3] [--threads 2] [--engines ...]

One model for all: d=256, 3+3 layers, 4 heads, FFN 1024, a joint 8000-piece BPE vocabulary
(Multi30k train en+de), post-norm, sinusoidal positions, tied embeddings, briefly trained (see
decode_setup.py), exported to Marian and converted to CTranslate2, so that every engine computes
the same function. The first 200 sentences of Multi30k test_2016_flickr.en, batches of 32,
greedy and beam 5, each with the output forced to 32 tokens (EOS masked until then) and at
natural length (at most 64 tokens). Every (engine, mode) runs in its own process; the repeats
alternate between engines; medians go to benchmarks/results/decode.json and docs/BENCHMARKS.md.

Internally, `--worker ENGINE MODE INPUTS` runs one engine in one mode and prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
from pathlib import Path

from common import ONEDNN_DEFAULT_CACHES

HERE = Path(__file__).resolve().parent
ENGINE_NAMES = ["ours", "hf", "ct2_float32", "ct2_int8"]


def worker(engine: str, mode: str, inputs_path: str, profile: bool) -> None:
    """Run one engine in one mode and print its result as one line of JSON."""
    from decode_engines import ENGINES, MODES, Inputs

    inputs = Inputs(**json.loads(Path(inputs_path).read_text()))
    if profile:
        from decode_profile import profile_ours

        print(json.dumps(profile_ours(inputs, MODES[mode])))
        return
    outputs, lengths, seconds = ENGINES[engine](inputs, MODES[mode])
    print(json.dumps({"seconds": seconds, "tokens": sum(lengths), "outputs": outputs,
                      "peak_rss_mb": peak_rss_mb()}))  # fmt: skip


def peak_rss_mb() -> float:
    """Peak resident memory of this process. getrusage's ru_maxrss survives execve, so a worker
    would report its parent's peak if larger: read the kernel's VmHWM where there is one."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def spawn(engine: str, mode: str, inputs_path: Path, threads: int, profile: bool = False) -> dict:
    """One worker process; threads pinned through the environment as well."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
    if engine != "ours":  # as users run them: oneDNN's default caches (ours: onednn.py)
        env.update(ONEDNN_DEFAULT_CACHES)
    cmd = [sys.executable, __file__, "--worker", engine, mode, str(inputs_path)]
    done = subprocess.run(cmd + (["--profile"] if profile else []), env=env, capture_output=True,
                          text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{engine} {mode} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def prepare_inputs(args: argparse.Namespace) -> Path:
    """Tokenizer, model, exports (all cached), and the inputs file every worker reads."""
    import torch
    from decode_setup import data_root, prepare, test_sources, vocabulary

    from seq2seq.data import sentence_batches

    torch.set_num_threads(args.threads)
    root, cache = data_root(args.data), Path(args.cache_dir)
    paths, tok = prepare(root, cache, args.train_steps)
    src_ids = test_sources(root, tok, args.sentences)
    inputs = {"src_ids": src_ids, "vocab": vocabulary(tok), "paths": paths,
              "batches": sentence_batches([len(s) for s in src_ids], args.batch),
              "threads": args.threads}  # fmt: skip
    path = cache / "decode_inputs.json"
    path.write_text(json.dumps(inputs))
    return path


def measure(args: argparse.Namespace, inputs_path: Path) -> dict[str, dict[str, list[dict]]]:
    """runs[mode][engine]: one result per repeat; engines alternate inside every repeat."""
    runs: dict[str, dict[str, list[dict]]] = {m: {e: [] for e in args.engines} for m in args.modes}
    for rep in range(args.repeats):
        order = args.engines[rep % len(args.engines) :] + args.engines[: rep % len(args.engines)]
        for mode in args.modes:
            for engine in order:
                result = spawn(engine, mode, inputs_path, args.threads)
                runs[mode][engine].append(result)
                print(f"repeat {rep + 1} {mode:15s} {engine:12s} "
                      f"{args.sentences / result['seconds']:7.1f} sent/s", flush=True)  # fmt: skip
    return runs


def agreement(outputs: list[list[int]], ours: list[list[int]], tokens: int) -> float:
    """Share of sentences whose first `tokens` output tokens are ours."""
    same = [a[:tokens] == b[:tokens] for a, b in zip(outputs, ours, strict=True)]
    return sum(same) / len(same)


def summarize(runs: dict[str, dict[str, list[dict]]], sentences: int) -> dict[str, dict]:
    """Medians per (mode, engine), agreement with our outputs, and our speed ratios."""
    from decode_engines import MODES

    table: dict[str, dict] = {}
    for mode, engines in runs.items():
        ours = engines.get("ours", [{}])[0].get("outputs")
        table[mode] = {}
        for engine, results in engines.items():
            seconds = statistics.median(r["seconds"] for r in results)
            outputs = results[0]["outputs"]
            # at the limit ours ends with EOS where the others stop without one: limit - 1 tokens
            limit = MODES[mode].limit
            same = agreement(outputs, ours, limit - 1) if ours else None
            half = agreement(outputs, ours, limit // 2) if ours else None
            table[mode][engine] = {
                "sent_per_s": sentences / seconds, "tokens_per_s": results[0]["tokens"] / seconds,
                "seconds": seconds, "tokens": results[0]["tokens"],
                "peak_rss_mb": statistics.median(r["peak_rss_mb"] for r in results),
                "same_output_as_ours": same, "same_first_half_as_ours": half,
                "repeats": [r["seconds"] for r in results],
            }  # fmt: skip
        if "ours" in engines:
            for row in table[mode].values():
                row["ours_speedup"] = table[mode]["ours"]["sent_per_s"] / row["sent_per_s"]
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=3, metavar=("ENGINE", "MODE", "INPUTS"))
    parser.add_argument("--profile", action="store_true", help="worker: profile ours instead")
    parser.add_argument("--data", default=None, help="Multi30k folder (default $MULTI30K_ROOT, "
                        "else ../shared/data/multi30k)")  # fmt: skip
    parser.add_argument("--cache-dir", default=str(HERE.parent / ".cache" / "bench"))
    parser.add_argument("--sentences", type=int, default=200)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--train-steps", type=int, default=150)
    parser.add_argument("--engines", nargs="+", default=ENGINE_NAMES, choices=ENGINE_NAMES)
    parser.add_argument("--modes", nargs="+", default=None)
    parser.add_argument("--no-doc", action="store_true", help="print only, write no results")
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker, profile=args.profile)
        return
    from decode_engines import MODES
    from decode_report import report

    args.modes = args.modes or list(MODES)
    inputs_path = prepare_inputs(args)
    table = summarize(measure(args, inputs_path), args.sentences)
    profile = spawn("ours", "beam5_forced", inputs_path, args.threads, profile=True)
    report(args, table, profile, write=not args.no_doc)


if __name__ == "__main__":
    main()
