"""Results of benchmarks/decode.py: benchmarks/results/decode.json, docs/BENCHMARKS.md. Every number
printed comes from the run's own results; the fixed text only says what was done."""

from __future__ import annotations

import argparse
from typing import Any

from common import update_doc, write_json
from decode_engines import ALONE_REPEATS, BEAM, FORCED, LIMIT, split_run

LABELS = {
    "ours": "ours (PyTorch)",
    "hf_sdpa": "HF transformers (sdpa)",
    "hf_eager": "HF transformers (eager)",
    "ct2_float32": "CTranslate2 float32",
    "ct2_int8": "CTranslate2 int8",
}
FLOAT32 = ("hf_sdpa", "hf_eager", "ct2_float32")  # the engines that compute ours in float32


def label(run: str) -> str:
    """A run's label: its engine's; a CTranslate2 run's with its CT2_USE_MKL
    ('ct2_int8_mkl0'); a run with one worker a thread says so ('ours_inter')."""
    engine, backend, inter = split_run(run)
    settings = [f"CT2_USE_MKL={backend}"] if backend else []
    if inter:
        settings.append("a replica a thread" if backend else "a worker a thread")
    base = LABELS[engine]
    if not settings:
        return base
    if base.endswith(")"):  # 'ours (PyTorch)' -> 'ours (PyTorch, a worker a thread)'
        return f"{base[:-1]}, {', '.join(settings)})"
    return f"{base} ({', '.join(settings)})"


METHOD = f"""\
All engines decode the same function: the product's exporters
(seq2seq/export/huggingface.py, seq2seq/export/ctranslate2.py) copy our weights into a Hugging
Face Marian model (model dimension permuted to Marian's sin/cos layout) and into CTranslate2
models (float32, int8). Forced modes:
every output is {FORCED} tokens, {FORCED} decoder steps (EOS masked until then; ours counts its
final EOS as token {FORCED}, HF and CTranslate2 stop at {FORCED} tokens without one), so every
output is at the cap there. Natural modes: greedy stops at EOS, beam search once {BEAM} hypotheses
are finished (HF: early_stopping=True), at most {LIMIT} tokens; beam length penalty: average,
exponent 1. "at cap": share of outputs with at least {LIMIT} - 1 tokens before any EOS (the
run fails when ours exceeds 10% in a natural mode). "same output": share of sentences whose
output equals ours token for token ("same 1st half": their first half); in forced beam modes
ours charges log p(EOS) at the limit where the others stop without one, which can change the
final pick. Peak RSS is the whole process (Python, libraries, model; with workers, the
parent's only). "A replica a thread": CTranslate2 with inter_threads = threads and
intra_threads 1, its documented CPU throughput setting, handed every batch in one call
(max_batch_size = the batch size: it sorts by length and splits, as our batches are made);
"a worker a thread": ours in that many processes forked with one thread each, sentence i to
worker i mod N (seq2seq-translate workers=N); HF's generate has no such setting. "ours /
engine": ours' fastest run over the row's; above 1, ours is faster."""


def markdown(result: dict[str, Any]) -> str:
    head = (
        "| mode | engine | sent/s | tokens/s | tokens/sent | at cap | peak RSS | same output "
        "| same 1st half | ours / engine |"
    )
    lines = [head, "|---" * 10 + "|"]
    for mode, engines in result["results"].items():
        for engine, row in engines.items():
            same, half = row["same_output_as_ours"], row["same_first_half_as_ours"]
            lines.append(
                f"| {mode} | {label(engine)} | {row['sent_per_s']:.1f} | "
                f"{row['tokens_per_s']:.0f} | {row['tokens_per_sentence']:.1f} | "
                f"{row['at_cap']:.0%} | {row['peak_rss_mb']:.0f} MB | {_share(same)} | "
                f"{_share(half)} | {_ratio(row.get('ours_speedup'))} |"
            )
    found = [
        logits_sentence(result["setup"]["logits"]),
        agreement_sentence(result["results"]),
        faster_hf_sentence(result["faster_hf"]),
        ct2_sentence(result.get("ct2", {})),
        alone_sentence(result["results"]),
        profile_sentence(result["profile"]),
    ]
    return "\n".join(lines) + "\n\n" + METHOD + "\n\n" + "\n\n".join(s for s in found if s)


def logits_sentence(check: dict[str, Any]) -> str:
    diffs = ", ".join(f"{d:.1e} ({name})" for name, d in check["max_abs_logit_diff"].items())
    return (
        f"Export check: teacher-forced logits of ours and of the Marian export on the first "
        f"{check['sentences']} test sentences with their German references "
        f"({check['positions']} positions): largest absolute difference {diffs}, "
        f"for logits up to {check['max_abs_logit']:.1f} in absolute value."
    )


def agreement_sentence(table: dict[str, dict]) -> str:
    """Per mode, the range of 'same output' (and 'same 1st half') over the float32 engines."""
    parts = []
    for mode, engines in table.items():
        rows = [row for e, row in engines.items() if split_run(e)[0] in FLOAT32]
        if not rows or rows[0]["same_output_as_ours"] is None:
            continue
        same = _span([r["same_output_as_ours"] for r in rows])
        half = _span([r["same_first_half_as_ours"] for r in rows])
        parts.append(f"{mode} {same} ({half} in the first half)")
    if not parts:
        return ""
    return "Outputs of the float32 engines equal to ours: " + "; ".join(parts) + "."


def faster_hf_sentence(faster: dict[str, dict[str, Any]]) -> str:
    if not faster:
        return ""
    parts = [
        f"{mode} {f['ours_speedup']:.2f}x ({LABELS[f['engine']]})" for mode, f in faster.items()
    ]
    return "Ours over the faster HF attention: " + ", ".join(parts) + "."


def ct2_sentence(figures: dict[str, dict[str, dict[str, Any]]]) -> str:
    """CTranslate2's figure per mode: the fastest of its runs, and ours' fastest over it."""
    parts = [
        f"{mode} {LABELS[engine]} {f['sent_per_s']:.1f} sent/s with CT2_USE_MKL="
        f"{f['ct2_use_mkl']}{', a replica a thread' if f.get('inter_threads') else ''} "
        f"(ours {f['ours_speedup']:.2f}x, {label(f.get('ours', 'ours'))})"
        for mode, engines in figures.items()
        for engine, f in engines.items()
    ]
    if not parts:
        return ""
    return (
        "CTranslate2 ran with CT2_USE_MKL=0 (oneDNN) and =1 (MKL), and where there are several "
        "threads also with a replica a thread; its figure is the fastest: " + "; ".join(parts) + "."
    )


def alone_sentence(table: dict[str, dict]) -> str:
    """The one-sentence step times measured in the greedy forced mode."""
    engines = table.get("greedy_forced", {})
    parts = [
        f"{label(e)} {row['alone_step_ms']:.2f} ms"
        for e, row in engines.items()
        if row["alone_step_ms"] is not None
    ]
    if not parts:
        return ""
    return (
        f"One sentence decoded alone (greedy, forced to {FORCED} tokens, its encoder pass "
        f"included, median of {ALONE_REPEATS}), time per decoder step: " + ", ".join(parts) + "."
    )


def profile_sentence(profile: dict[str, Any]) -> str:
    shares = ", ".join(f"{name} {share:.0%}" for name, share in profile["share"].items())
    seconds = profile["profiled_seconds"]
    return (
        f"Where our time goes ({profile['mode']}, torch.profiler self time over "
        f"{seconds:.1f} s, profiler overhead included): {shares}."
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


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _span(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:.0%}" if low == high else f"{low:.0%}-{high:.0%}"


def model_text(setup: dict[str, Any]) -> str:
    t, m = setup["train"], setup["model"]
    precision = f"precision {t['precision']}: {t.get('chosen', 'not recorded')}"
    return (
        f"Model: d={m['d_model']}, {m['enc_layers']}+{m['dec_layers']} layers, "
        f"{m['n_heads']} heads, FFN {m['d_ff']}, joint BPE vocabulary of {setup['vocab']}, "
        f"{setup['parameters'] / 1e6:.1f}M parameters, trained {t['steps']} steps of at most "
        f"{t['max_tokens']} padded tokens ({precision}; AdamW, peak lr {t['lr']:g} after "
        f"{t['warmup']} warmup steps) so that it ends its own outputs."
    )


def report(args: argparse.Namespace, result: dict[str, Any], write: bool) -> None:
    body = markdown(result)
    print(body)
    if not write:
        return
    payload = {
        "sentences": args.sentences,
        "batch": args.batch,
        "threads": args.threads,
        "repeats": args.repeats,
        "versions": versions(),
        **result,
    }
    write_json("decode", payload)
    update_doc(
        "decode",
        "Decoding speed: ours vs Hugging Face transformers vs CTranslate2",
        f"Versions: {', '.join(f'{k} {v}' for k, v in versions().items())}. "
        f"Multi30k test_2016_flickr.en, first {args.sentences} sentences, batches of "
        f"{args.batch}, {args.threads} threads for every engine, each engine in its own process; "
        f"medians of {args.repeats} alternating repeats. {model_text(result['setup'])}\n\n" + body,
    )
