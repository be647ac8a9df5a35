"""Deployment speed: a trained checkpoint exported by seq2seq-export to CTranslate2 (float32 and
int8), against our own beam search, text in and text out, on the same sentences.

    python benchmarks/export_speed.py --ckpt RUN/checkpoints/average.pt [--split test_2016_flickr]
        [--sentences 1000] [--repeats 3] [--threads 2] [--data DIR]

1. Exports the checkpoint with the product's exporter (seq2seq.export.writer.export_checkpoint)
   in float32 and int8;
   each export's self-check (greedy agreement with ours on the validation split, BLEU of both)
   is recorded.
2. Decodes the first --sentences lines of --split with beam 5 in each engine, each in its own
   process, the repeats alternating the order: ours (seq2seq.Translator, the checkpoint's length
   penalty), CTranslate2 float32 and int8 (SentencePiece in, translate_batch, SentencePiece out;
   the same beam, batch size and length penalty). Sentences/s is the mean ± std over repeats.
3. Checks the premise before any ratio: the share of the float32 export's beam outputs that are
   identical to ours, and the BLEU of every engine's outputs against the references.
Writes benchmarks/results/export_speed.json and the docs/BENCHMARKS.md section `export_speed`.
The CTranslate2 worker never imports torch (its OpenMP runtime would slow CTranslate2 down).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from common import multi30k_root, peak_rss_mb, run_json, split_file, update_doc, write_json

HERE = Path(__file__).resolve().parent
BEAM = 5
BATCH = 64  # sentences a batch, every engine
ENGINES = ("ours", "ct2_float32", "ct2_int8")
# CTranslate2's GEMM backend choice: unset, it takes MKL on Intel CPUs only (its backend.cc)
CT2_USE_MKL = os.environ.get("CT2_USE_MKL", "unset")


def worker(engine: str, inputs_path: str) -> None:
    """Decode the inputs once after a warm-up batch; print outputs and seconds as JSON."""
    inputs = json.loads(Path(inputs_path).read_text())
    texts, threads = inputs["texts"], inputs["threads"]
    decode = ours_decoder(inputs) if engine == "ours" else ct2_decoder(inputs, engine, threads)
    decode(texts[:BATCH])  # warm-up
    start = time.perf_counter()
    out = decode(texts)
    seconds = time.perf_counter() - start
    print(json.dumps({"outputs": out, "seconds": seconds, "peak_rss_mb": peak_rss_mb()}))


def ours_decoder(inputs: dict[str, Any]) -> Any:
    import torch

    from seq2seq.decode.translator import Translator

    torch.set_num_threads(inputs["threads"])
    translator = Translator.from_checkpoint(inputs["ckpt"], device="cpu")
    return lambda texts: translator.translate(texts, beam_size=BEAM, batch_size=BATCH)


def ct2_decoder(inputs: dict[str, Any], engine: str, threads: int) -> Any:
    import ctranslate2
    import sentencepiece as spm

    folder = inputs["folders"][engine]
    translator = ctranslate2.Translator(
        folder, device="cpu", compute_type="default", inter_threads=1, intra_threads=threads
    )
    src = spm.SentencePieceProcessor(model_file=f"{folder}/source.spm")
    tgt = spm.SentencePieceProcessor(model_file=f"{folder}/target.spm")

    def decode(texts: list[str]) -> list[str]:
        results = translator.translate_batch(
            src.encode(texts, out_type=str),
            max_batch_size=BATCH,
            beam_size=BEAM,
            length_penalty=inputs["length_penalty"],
            max_decoding_length=inputs["max_decoding_length"],
            suppress_sequences=[["<pad>"], ["<s>"]],
        )
        return [tgt.decode(r.hypotheses[0]) for r in results]

    return decode


def export_both(ckpt: Path, work: Path, data: Path, check_lines: int) -> dict[str, Any]:
    """float32 and int8 exports (each with its self-check on `check_lines` validation
    sentences) in `work`."""
    from seq2seq.config.schema import ExportConfig, Quantization
    from seq2seq.export.writer import export_checkpoint as export

    checks = {}
    for q in (Quantization.float32, Quantization.int8):
        out = work / f"ct2_{q.value}"
        cfg = ExportConfig(
            ckpt=str(ckpt), out=str(out), quantization=q, force=True, check_lines=check_lines
        )
        cfg.data_root = str(data)
        check = export(cfg)
        checks[q.value] = None if check is None else check.__dict__
    return checks


def inputs_for(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """What every worker reads: the sentences, the checkpoint, the folders, the settings."""
    from seq2seq.config.schema import LengthPenaltyKind
    from seq2seq.data.text import read_lines
    from seq2seq.decode.translator import Translator

    data = multi30k_root(args.data)
    t = Translator.from_checkpoint(args.ckpt, "cpu")
    lang = t.cfg.data.src_lang
    texts = read_lines(split_file(data, f"{args.split}.{lang}"))[: args.sentences]
    refs = read_lines(split_file(data, f"{args.split}.{t.cfg.data.tgt_lang}"))[: args.sentences]
    d = t.decode
    if d.length_penalty == LengthPenaltyKind.gnmt:
        raise SystemExit("CTranslate2 has no GNMT length penalty: test with decode.length_penalty")
    return {
        "texts": texts,
        "refs": refs,
        "ckpt": str(args.ckpt),
        "threads": args.threads,
        "folders": {f"ct2_{q}": str(work / f"ct2_{q}") for q in ("float32", "int8")},
        # ours: score / length^alpha ("average") or none; CTranslate2's length_penalty is alpha
        "length_penalty": d.alpha if d.length_penalty == LengthPenaltyKind.average else 0.0,
        "max_decoding_length": 256,
        "decode": {"length_penalty": d.length_penalty.value, "alpha": d.alpha},
    }


def measure(args: argparse.Namespace, inputs_path: Path) -> dict[str, list[dict]]:
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    runs: dict[str, list[dict]] = {e: [] for e in ENGINES}
    for rep in range(args.repeats):
        order = ENGINES[rep % len(ENGINES) :] + ENGINES[: rep % len(ENGINES)]
        for engine in order:
            cmd = [sys.executable, __file__, "--worker", engine, str(inputs_path)]
            result = run_json(cmd, env, engine)
            runs[engine].append(result)
            rate = args.sentences / result["seconds"]
            print(f"repeat {rep + 1} {engine:12s} {rate:7.1f} sent/s", flush=True)
    return runs


def summarize(runs: dict[str, list[dict]], refs: list[str], n: int) -> dict[str, Any]:
    import sacrebleu

    ours = runs["ours"][0]["outputs"]
    out: dict[str, Any] = {}
    for engine, results in runs.items():
        rates = [n / r["seconds"] for r in results]
        hyps = results[0]["outputs"]
        out[engine] = {
            "sentences_per_s": rates,
            "mean": statistics.mean(rates),
            "std": statistics.stdev(rates) if len(rates) > 1 else 0.0,
            "bleu": sacrebleu.BLEU().corpus_score(hyps, [refs]).score,
            "identical_to_ours": sum(a == b for a, b in zip(hyps, ours, strict=True)),
            "deterministic": all(r["outputs"] == hyps for r in results),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in results),
        }
    return out


def report(args: argparse.Namespace, summary: dict[str, Any], checks: dict[str, Any]) -> str:
    n, ours = args.sentences, summary["ours"]
    lines = [
        f"Checkpoint `{args.ckpt}`; the first {n} sentences of {args.split}; beam {BEAM}, "
        f"batches of {BATCH} sentences, {args.threads} threads, {args.repeats} repeats "
        f"(mean ± std); text in, text out; CT2_USE_MKL={CT2_USE_MKL}.",
        "",
        "| engine | sentences/s | vs ours | BLEU | outputs identical to ours | peak RSS MB |",
        "|---|---|---|---|---|---|",
    ]
    for engine, s in summary.items():
        lines.append(
            f"| {engine} | {s['mean']:.1f} ± {s['std']:.1f} | {s['mean'] / ours['mean']:.2f}x | "
            f"{s['bleu']:.2f} | {s['identical_to_ours']}/{n} | {s['peak_rss_mb']:.0f} |"
        )
    lines += ["", "Export self-checks (greedy, the checkpoint's validation split):", ""]
    for q, c in checks.items():
        if c is not None:
            lines.append(
                f"- {q}: {c['identical']}/{c['sentences']} greedy outputs identical to ours; "
                f"BLEU ours {c['bleu_ours']:.2f}, export {c['bleu_exported']:.2f}; reference "
                f"log-probabilities differ by at most {c['max_logprob_diff']:.2g}"
            )
    return "\n".join(lines)


def sha256_file(path: Path) -> str:
    from seq2seq.data.prepared import sha256_file as digest

    return digest(path)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3])
        return
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ckpt", type=Path, required=True)
    p.add_argument("--split", default="test_2016_flickr")
    p.add_argument("--sentences", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--data", default=None, help="Multi30k folder (default: common.multi30k_root)")
    p.add_argument("--work", type=Path, default=Path(".cache/export_speed"))
    p.add_argument("--check-lines", type=int, default=1000, help="the exports' self-checks")
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    checks = export_both(args.ckpt, args.work, multi30k_root(args.data), args.check_lines)
    inputs = inputs_for(args, args.work)
    args.sentences = len(inputs["texts"])
    path = args.work / "inputs.json"
    path.write_text(json.dumps(inputs))
    runs = measure(args, path)
    summary = summarize(runs, inputs["refs"], args.sentences)
    write_json(
        "export_speed",
        {
            "summary": summary,
            "checks": checks,
            "decode": inputs["decode"],
            "ct2_use_mkl": CT2_USE_MKL,
            "checkpoint_sha256": sha256_file(args.ckpt),
        },
    )
    body = report(args, summary, checks)
    update_doc("export_speed", "Deployment: CTranslate2 exports vs our beam search", body)
    print(body)


if __name__ == "__main__":
    main()
