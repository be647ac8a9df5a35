"""Deployment speed: a trained checkpoint exported by seq2seq-export to CTranslate2 (float32 and
int8), against our own searches, text in and text out, on the same sentences.

    python benchmarks/export_speed.py --ckpt RUN/checkpoints/average.pt [--split test_2016_flickr]
        [--sentences 1000] [--repeats 3] [--threads 2] [--data DIR] [--searches beam5 greedy]

1. Exports the checkpoint with the product's exporter (seq2seq.export.writer.export_checkpoint)
   in float32 and int8;
   each export's self-check (greedy agreement with ours on the validation split, BLEU of both)
   is recorded.
2. Decodes the first --sentences lines of --split with beam 5 and greedily in each engine, each
   run in its own process, the repeats alternating the order, every engine with one stopping rule
   (EOS, or MAX_LENGTH tokens): ours (seq2seq.Translator, the checkpoint's length penalty),
   CTranslate2 float32 and int8 (SentencePiece in, translate_batch, SentencePiece out; the same
   beam, batch size and length penalty), and ours with int8 linear layers (ours_int8:
   seq2seq-translate quantize=int8).
   CTranslate2 runs twice per compute type, with CT2_USE_MKL=0 (oneDNN) and =1 (MKL): unset,
   it takes MKL on Intel CPUs only, and oneDNN can be much the faster there (issue #29: 371
   against 162 sentences/s on an AMX Xeon). Every engine also runs in both thread layouts:
   one worker on all --threads (intra-op threads), and --threads workers of one thread each
   (`_inter`: CTranslate2's inter_threads=N, intra_threads=1, its documented throughput
   setting; ours: seq2seq-translate workers=N, seq2seq.decode.workers). All are reported; the
   fastest of each engine is its figure, with the settings it needed, and the ratio is ours'
   figure over CTranslate2's. Sentences/s is the mean ± std over repeats.
3. Checks the premise before any ratio: the share of each export's outputs that are identical
   to ours, and the BLEU of every engine's outputs against the references.
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
SEARCHES = {"beam5": 5, "greedy": 1}  # beam size of each search
BATCH = 64  # sentences a batch, every engine
MAX_LENGTH = 256  # output tokens at most, every engine (CTranslate2's max_decoding_length)
ENGINES = ("ours", "ct2_float32", "ct2_int8")
# CTranslate2's GEMM backend, CT2_USE_MKL: 0 oneDNN, 1 MKL; unset, it takes MKL on Intel CPUs
# only (its backend.cc). Every CTranslate2 engine runs with each, in a process of its own.
CT2_BACKENDS = ("0", "1")
# thread layouts: "" one worker on all the threads; "_inter" one worker a thread (CTranslate2's
# inter_threads, our seq2seq-translate workers=N)
LAYOUTS = ("", "_inter")
# ours_int8: our search with every linear layer in int8 (seq2seq-translate quantize=int8)
RUNS = (
    "ours",
    "ours_inter",
    "ours_int8",
    *(f"{e}_mkl{b}{layout}" for e in ENGINES[1:] for b in CT2_BACKENDS for layout in LAYOUTS),
)


def split_run(run: str) -> tuple[str, str | None, bool]:
    """'ct2_float32_mkl0_inter' -> ('ct2_float32', '0', True); 'ours' -> ('ours', None, False)."""
    inter = run.endswith("_inter")
    engine, _, backend = run.removesuffix("_inter").partition("_mkl")
    return engine, backend or None, inter


def worker(run: str, search: str, inputs_path: str) -> None:
    """Decode the inputs once after a warm-up batch; print outputs and seconds as JSON."""
    inputs = json.loads(Path(inputs_path).read_text())
    texts, threads, beam = inputs["texts"], inputs["threads"], SEARCHES[search]
    engine, _, inter = split_run(run)
    workers = threads if inter else 1
    if engine in ("ours", "ours_int8"):
        quantize = "int8" if engine == "ours_int8" else "float32"
        decode = ours_decoder(inputs, beam, quantize, workers)
    else:
        decode = ct2_decoder(inputs, engine, threads, beam, workers)
    decode(texts[: BATCH * workers])  # warm-up, a batch for each worker
    start = time.perf_counter()
    out, lengths = decode(texts)
    seconds = time.perf_counter() - start
    result = {"outputs": out, "lengths": lengths, "seconds": seconds}
    print(json.dumps({**result, "peak_rss_mb": peak_rss_mb()}))


def ours_decoder(inputs: dict[str, Any], beam: int, quantize: str, workers: int = 1) -> Any:
    """Our search in this process, or (workers > 1) in a seq2seq.decode.workers pool of that
    many processes sharing the threads, started here, before the clock."""
    import torch

    from seq2seq.decode.translator import Translator
    from seq2seq.decode.workers import WorkerPool

    torch.set_num_threads(inputs["threads"])
    translator = Translator.from_checkpoint(inputs["ckpt"], device="cpu", quantize=quantize)
    # CTranslate2's stopping rule: one length limit for every sentence (it has no a * |src| + b)
    changes = {
        "method": "beam" if beam > 1 else "greedy",
        "beam_size": beam,
        "batch_size": BATCH,
        "max_len_a": 0.0,
        "max_len_b": inputs["max_decoding_length"],
        "scores": False,  # CTranslate2 returns none here (return_scores=False): the same work
    }
    if workers > 1:
        pool = WorkerPool(translator, inputs["ckpt"], workers, threads=inputs["threads"])
        settings = translator.settings(**changes)

    def decode(texts: list[str]) -> tuple[list[str], list[int]]:
        if workers > 1:
            found = pool.hypotheses(texts, settings)
        else:
            found = translator.translate_nbest(texts, **changes)
        best = [n[0] for n in found]
        return [t.text for t in best], [len(t.tokens) for t in best]

    return decode


def ct2_decoder(
    inputs: dict[str, Any], engine: str, threads: int, beam: int, workers: int = 1
) -> Any:
    """CTranslate2 on all the threads (workers=1), or with `workers` replicas of threads /
    workers threads each (inter_threads: translate_batch runs its batches side by side)."""
    import ctranslate2
    import sentencepiece as spm

    folder = inputs["folders"][engine]
    translator = ctranslate2.Translator(
        folder,
        device="cpu",
        compute_type="default",
        inter_threads=workers,
        intra_threads=max(1, threads // workers),
    )
    src = spm.SentencePieceProcessor(model_file=f"{folder}/source.spm")
    tgt = spm.SentencePieceProcessor(model_file=f"{folder}/target.spm")

    def decode(texts: list[str]) -> tuple[list[str], list[int]]:
        results = translator.translate_batch(
            src.encode(texts, out_type=str),
            max_batch_size=BATCH,
            beam_size=beam,
            length_penalty=inputs["length_penalty"],
            max_decoding_length=inputs["max_decoding_length"],
            suppress_sequences=[["<pad>"], ["<s>"]],
        )
        best = [r.hypotheses[0] for r in results]
        return [tgt.decode(h) for h in best], [len(h) for h in best]

    return decode


def export_both(ckpt: Path, work: Path, data: Path, check_lines: int) -> dict[str, Any]:
    """float32 and int8 exports (each with its self-check on `check_lines` validation
    sentences) in `work`."""
    from seq2seq.config.commands import ExportConfig, Quantization
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
        # both engines' stopping rule (ours: max_len_a=0, max_len_b=this): with our default
        # a * |src| + b, a sentence that never emits EOS stopped at ~1.5x its source in ours and
        # ran on to 256 tokens in CTranslate2, different work behind one ratio
        "max_decoding_length": MAX_LENGTH,
        "decode": {"length_penalty": d.length_penalty.value, "alpha": d.alpha},
    }


def run_env(run: str, threads: int) -> dict[str, str]:
    """The worker's environment: threads pinned; CT2_USE_MKL as the run says (ours: unset)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    env.pop("CT2_USE_MKL", None)
    backend = split_run(run)[1]
    if backend is not None:
        env["CT2_USE_MKL"] = backend
    return env


def measure(args: argparse.Namespace, inputs_path: Path) -> dict[str, dict[str, list[dict]]]:
    """runs[search][run]: one result per repeat (a run that failed: its error, once)."""
    runs: dict[str, dict[str, list[dict]]] = {s: {r: [] for r in RUNS} for s in args.searches}
    for rep in range(args.repeats):
        order = RUNS[rep % len(RUNS) :] + RUNS[: rep % len(RUNS)]
        for search in args.searches:
            for run in order:
                done = runs[search][run]
                if done and "error" in done[0]:
                    continue  # e.g. a CTranslate2 build without MKL
                cmd = [sys.executable, __file__, "--worker", run, search, str(inputs_path)]
                try:
                    result = run_json(cmd, run_env(run, args.threads), f"{run} {search}")
                except RuntimeError as err:
                    done.append({"error": str(err)[-500:]})
                    print(f"repeat {rep + 1} {search} {run}: failed", flush=True)
                    continue
                done.append(result)
                rate = args.sentences / result["seconds"]
                print(f"repeat {rep + 1} {search:6s} {run:18s} {rate:7.1f} sent/s", flush=True)
    return runs


def summarize(runs: dict[str, list[dict]], refs: list[str], n: int) -> dict[str, Any]:
    """Per run of one search: speed over the repeats, BLEU, agreement with ours; a failed run:
    its error."""
    import sacrebleu

    ours = runs["ours"][0]["outputs"]
    out: dict[str, Any] = {}
    for engine, results in runs.items():
        if results and "error" in results[0]:
            out[engine] = {"error": results[0]["error"]}
            continue
        rates = [n / r["seconds"] for r in results]
        hyps = results[0]["outputs"]
        out[engine] = {
            "sentences_per_s": rates,
            "mean": statistics.mean(rates),
            "std": statistics.stdev(rates) if len(rates) > 1 else 0.0,
            "bleu": sacrebleu.BLEU().corpus_score(hyps, [refs]).score,
            "identical_to_ours": sum(a == b for a, b in zip(hyps, ours, strict=True)),
            # outputs the length limit stopped (ours forces EOS as its last token, CTranslate2
            # stops after it): where engines disagree, mostly loops of a model short of training
            "at_limit": sum(n >= MAX_LENGTH - 1 for n in results[0]["lengths"]),
            "deterministic": all(r["outputs"] == hyps for r in results),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in results),
        }
    return out


def fastest(summary: dict[str, Any], engine: str) -> str | None:
    """The run of `engine` ("ours" or a CTranslate2 engine) with the most sentences/s, over its
    backends and thread layouts; None if every one failed."""
    done = [run for run, s in summary.items() if split_run(run)[0] == engine and "error" not in s]
    return max(done, key=lambda run: summary[run]["mean"]) if done else None


def ct2_figures(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per CTranslate2 engine of one search: its fastest run (CTranslate2's figure), the
    settings it took, and ours' fastest run over it (above 1: ours is faster)."""
    ours = fastest(summary, "ours")
    assert ours is not None, "our own runs failed"
    figures = {}
    for engine in ENGINES[1:]:
        best = fastest(summary, engine)
        if best is not None:
            _, backend, inter = split_run(best)
            mean = summary[best]["mean"]
            figures[engine] = {
                "ct2_use_mkl": backend,
                "inter_threads": inter,
                "mean": mean,
                "ours": ours,
                "ours_over_ct2": summary[ours]["mean"] / mean,
            }
    return figures


def table(summary: dict[str, Any], n: int, threads: int) -> list[str]:
    """One search's rows: every run (CTranslate2 with each CT2_USE_MKL), each thread layout;
    "ours / engine" is ours' fastest run over the row's."""
    ours = summary[fastest(summary, "ours") or "ours"]["mean"]
    lines = [
        "| engine | CT2_USE_MKL | workers x threads | sentences/s | ours / engine | BLEU "
        f"| identical to ours | stopped at {MAX_LENGTH} tokens | peak RSS MB (a process) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run, s in summary.items():
        engine, backend, inter = split_run(run)
        layout = f"{threads} x 1" if inter else f"1 x {threads}"
        if "error" in s:
            lines.append(f"| {engine} | {backend} | {layout} | failed | - | - | - | - | - |")
            continue
        lines.append(
            f"| {engine} | {backend or '-'} | {layout} | {s['mean']:.1f} ± {s['std']:.1f} | "
            f"{ours / s['mean']:.2f} | {s['bleu']:.2f} | {s['identical_to_ours']}/{n} | "
            f"{s['at_limit']} | {s['peak_rss_mb']:.0f} |"
        )
    return lines


def report(args: argparse.Namespace, result: dict[str, Any], checks: dict[str, Any]) -> str:
    n = args.sentences
    lines = [
        f"Checkpoint `{args.ckpt}`; the first {n} sentences of {args.split}; batches of {BATCH} "
        f"sentences, {args.threads} threads, {args.repeats} repeats (mean ± std); text in, text "
        f"out; every engine stops a sentence at EOS or {MAX_LENGTH} tokens and returns no "
        "scores (CTranslate2's return_scores=False, our decode.scores=false: greedy search "
        "takes the argmax of the logits, no softmax). CTranslate2 runs "
        "with CT2_USE_MKL=0 (oneDNN) and =1 (MKL), each in its own process, and every engine "
        f"with one worker on {args.threads} threads and with {args.threads} workers of one "
        "thread (CTranslate2's inter_threads, our workers=N); each engine's figure is its "
        "fastest run. The peak RSS of a run with workers is its parent's only.",
    ]
    for search, summary in result["summary"].items():
        lines += ["", f"**{search}**", "", *table(summary, n, args.threads), ""]
        for engine, f in result["ct2"][search].items():
            ours = summary[f["ours"]]["mean"]
            lines.append(
                f"- {engine}: CTranslate2's figure {f['mean']:.1f} sentences/s "
                f"(CT2_USE_MKL={f['ct2_use_mkl']}, inter_threads "
                f"{args.threads if f['inter_threads'] else 1}); ours {ours:.1f} ({f['ours']}); "
                f"ours / CTranslate2 {f['ours_over_ct2']:.2f}"
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
        worker(sys.argv[2], sys.argv[3], sys.argv[4])
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
    p.add_argument("--searches", nargs="+", default=list(SEARCHES), choices=list(SEARCHES))
    args = p.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    checks = export_both(args.ckpt, args.work, multi30k_root(args.data), args.check_lines)
    inputs = inputs_for(args, args.work)
    args.sentences = len(inputs["texts"])
    path = args.work / "inputs.json"
    path.write_text(json.dumps(inputs))
    runs = measure(args, path)
    summary = {s: summarize(r, inputs["refs"], args.sentences) for s, r in runs.items()}
    result = {"summary": summary, "ct2": {s: ct2_figures(v) for s, v in summary.items()}}
    write_json(
        "export_speed",
        {
            **result,
            "checks": checks,
            "decode": inputs["decode"],
            "checkpoint_sha256": sha256_file(args.ckpt),
        },
    )
    body = report(args, result, checks)
    update_doc("export_speed", "Deployment: CTranslate2 exports vs our beam search", body)
    print(body)


if __name__ == "__main__":
    main()
