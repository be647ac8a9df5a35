"""The fixed cost of one decoder step, counted instead of timed: dispatcher ops, memory
allocations and Python calls per step of one sentence, greedy and beam 5, in each kernels mode
(auto: the CPU fast paths; reference: plain PyTorch).

    python benchmarks/decode_ops.py [--pos sinusoidal] [--detail] [--doc]

A sentence decoded alone pays a step's fixed cost at every step, and so do the last steps of a
batch (few rows left); at this size its time is mostly that cost, which clocks on a shared
machine measure badly. The counts here are the same on any machine with the same torch:
- dispatcher ops: every op the profiler records, the ops other ops call included;
- top-level ops: those called from Python (each one a Python -> C++ crossing);
- allocating ops: the ops that allocate memory of their own (a new tensor's storage), and the
  allocations outside any op, as the profiler attributes them (profile_memory=True);
- Python calls: function calls seen by sys.setprofile (Python functions and builtins, torch's
  bindings included).
A step's count is the difference between two forced-length decodes of the same sentence
(SHORT and LONG output tokens, EOS masked until then) divided by the extra steps, so that the
encoder, the set-up and the hypotheses' bookkeeping cancel out.

The model is the Multi30k recipe's shape (model=tiny: 4+4 layers, d=128, FFN 256, 4 heads,
pre-norm, tied embeddings; vocabulary 8,000), randomly initialised: the counts depend on shapes,
not on weights. --doc writes benchmarks/results/decode_ops.json and its docs/BENCHMARKS.md
section.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import common  # noqa: F401  before torch: MKL's Intel path on AMD (common.py)
import torch

from seq2seq import kernels
from seq2seq.config.schema import DecodeConfig, LengthPenaltyKind, ModelConfig, SearchKind
from seq2seq.decode.schedule import translate_ids
from seq2seq.model.transformer import EncoderDecoder

SHORT, LONG = 8, 24  # forced output lengths whose difference is counted
VOCAB = 8000
SOURCE = list(range(10, 23))  # 13 tokens (+ EOS), about a Multi30k sentence
SEARCHES = {"greedy": 1, "beam5": 5}
COUNTS = ("dispatcher_ops", "top_level_ops", "allocating_ops", "python_calls")


def tiny_model(pos: str, seed: int = 0) -> EncoderDecoder:
    """model=tiny with `pos` on both sides, vocabulary VOCAB, in eval mode."""
    from seq2seq.config.schema import PosEncodingConfig, PosKind
    from seq2seq.model.transformer import build_positional

    torch.manual_seed(seed)
    cfg, p = ModelConfig(), PosEncodingConfig(kind=PosKind(pos))
    d, h, n = cfg.d_model, cfg.n_heads, cfg.dec_layers
    enc = build_positional(p, d, h, causal=False, n_layers=cfg.enc_layers)
    dec = build_positional(p, d, h, causal=True, n_layers=n)
    return EncoderDecoder(cfg, VOCAB, VOCAB, enc, dec).eval()


def decode_config(beam: int, length: int) -> DecodeConfig:
    """Greedy (beam 1) or beam search, at most `length` tokens."""
    return DecodeConfig(
        method=SearchKind.beam if beam > 1 else SearchKind.greedy,
        beam_size=beam,
        length_penalty=LengthPenaltyKind.average,
        alpha=1.0,
        max_len_a=0.0,
        max_len_b=length,
    )


@contextmanager
def python_calls(counter: Counter[str], by_name: Counter[str] | None = None) -> Iterator[None]:
    """Count the Python calls (functions and builtins) made inside the block, in all and, when
    `by_name` is given, by function."""

    def hook(frame: Any, event: str, arg: Any) -> None:
        if event in ("call", "c_call"):
            counter["python_calls"] += 1
            if by_name is not None:
                code = frame.f_code
                name = getattr(arg, "__qualname__", str(arg)) if event == "c_call" else None
                where = f"{code.co_filename.rsplit('/', 2)[-1]}:{code.co_name}"
                by_name[f"{name} (from {where})" if name else where] += 1

    sys.setprofile(hook)
    try:
        yield
    finally:
        sys.setprofile(None)


Counts = tuple[Counter[str], Counter[str], Counter[str], Counter[str]]


def count(run: Callable[[], object]) -> Counts:
    """The totals of COUNTS for one call of `run`, its dispatcher ops and its top-level ops by
    name, and its Python calls by function."""
    from torch.profiler import ProfilerActivity, profile

    totals: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    with python_calls(totals, calls):
        run()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    by_name: Counter[str] = Counter()
    top: Counter[str] = Counter()
    for event in prof.events():
        totals["allocating_ops"] += event.self_cpu_memory_usage > 0
        if event.name == "[memory]":  # an allocation outside any op
            continue
        by_name[event.name] += 1
        top[event.name] += event.cpu_parent is None
    totals["dispatcher_ops"] = sum(by_name.values())
    totals["top_level_ops"] = sum(top.values())
    return totals, by_name, top, calls


def per_step(model: EncoderDecoder, beam: int, mode: str) -> dict[str, Any]:
    """COUNTS per decoder step (LONG minus SHORT forced steps), the ops and top-level ops by
    name and the Python calls by function."""
    found = {}
    with kernels.use(mode):
        for length in (SHORT, LONG):
            cfg = decode_config(beam, length)

            def run(cfg: DecodeConfig = cfg, length: int = length) -> object:
                return translate_ids(model, [SOURCE], cfg, min_len=length)

            run()  # warm-up: packed weights, grown tables
            found[length] = count(run)
    short, long = found[SHORT], found[LONG]
    totals, ops, top, calls = (_per_step(a, b) for a, b in zip(short, long, strict=True))
    return {**{k: totals.get(k, 0.0) for k in COUNTS}, "ops": ops, "top": top, "calls": calls}


def _per_step(short: Counter[str], long: Counter[str]) -> dict[str, float]:
    """(long - short) / the extra steps, by key, largest first, zeros left out."""
    diff = {k: (long[k] - short[k]) / (LONG - SHORT) for k in long | short}
    return {k: v for k, v in sorted(diff.items(), key=lambda kv: -kv[1]) if v}


def measure(pos: str) -> dict[str, dict[str, dict[str, Any]]]:
    """result[search][mode] for every search and kernels mode."""
    torch.set_num_threads(1)
    model = tiny_model(pos)
    return {
        search: {mode: per_step(model, beam, mode) for mode in kernels.MODES}
        for search, beam in SEARCHES.items()
    }


def markdown(result: dict[str, dict[str, dict[str, Any]]], pos: str) -> str:
    lines = [
        f"One sentence of {len(SOURCE)} tokens, model=tiny ({pos}), vocabulary {VOCAB}; per "
        f"decoder step ({LONG} forced steps minus {SHORT}), torch {torch.__version__}.",
        "",
        "| search | kernels | dispatcher ops | top-level ops | allocating ops | Python calls |",
        "|---|---|---|---|---|---|",
    ]
    for search, modes in result.items():
        for mode, row in modes.items():
            cells = " | ".join(f"{row[k]:.1f}" for k in COUNTS)
            lines.append(f"| {search} | {mode} | {cells} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pos", default="sinusoidal", help="the positional encoding")
    parser.add_argument(
        "--detail", type=int, default=0, help="print a step's N most frequent ops and calls"
    )
    parser.add_argument("--doc", action="store_true", help="write the results and the doc")
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="NAME=INT",
        help="a kernels.cpu setting, e.g. SMALL_ROWS=0 (the A/B of a fast-path choice)",
    )
    args = parser.parse_args()
    for setting in args.set:
        from seq2seq.kernels import cpu

        name, value = setting.split("=")
        setattr(cpu, name, int(value))
    result = measure(args.pos)
    body = markdown(result, args.pos)
    print(body)
    for search, modes in result.items():
        for mode, row in modes.items():
            for kind in ("ops", "top", "calls") if args.detail else ():
                print(f"\n{search} {mode}, {kind}:")
                for name, n in list(row[kind].items())[: args.detail]:
                    print(f"  {n:7.2f}  {name}")
    if args.doc:
        from common import update_doc, write_json

        write_json("decode_ops", {"pos": args.pos, "per_step": result})
        update_doc("decode_ops", "Decoder step: ops, allocations and Python calls", body)


if __name__ == "__main__":
    main()
