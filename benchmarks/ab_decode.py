"""Decoding speed of two checkouts of seq2seq, for a change that must not move it (a refactor).

    python benchmarks/ab_decode.py --before /path/to/old/checkout [--after .] [--repeats 5]

Each side decodes in its own process with PYTHONPATH set to its checkout: the same randomly
initialised model (d=256, 3+3 layers, post-norm, sinusoidal, seed 0) and the same 200 random
sources (5-30 tokens, vocabulary 8,000), greedy and beam 5, batches of 32, every output forced
to 32 tokens so that both sides do the same work. The sides alternate; the outputs of the two
must be identical (else the run stops: the comparison's premise), then the medians and the
after/before ratio are printed and written to benchmarks/results/ab_decode.json. Prints nothing
to docs/: a one-off check, quoted where it is used.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from common import ROOT, median, run_json, write_json

CHILD = """
import hashlib, json, sys, time, torch
try:  # the package by concept (seq2seq/config/, model/, decode/)
    from seq2seq.config.schema import DecodeConfig, LengthPenaltyKind, ModelConfig
    from seq2seq.config.schema import PosEncodingConfig, SearchKind
    from seq2seq.model.transformer import EncoderDecoder, build_positional
    from seq2seq.decode.schedule import translate_ids
except ImportError:  # checkouts before it: one flat folder
    from seq2seq.config import DecodeConfig, LengthPenaltyKind, ModelConfig, PosEncodingConfig
    from seq2seq.config import SearchKind
    from seq2seq.model import EncoderDecoder
    from seq2seq.positional import build_positional
    from seq2seq.search import translate_ids
try:
    from seq2seq import kernels
    kernels.setup_process(torch.device("cpu"))
except ImportError:  # checkouts before seq2seq/kernels/: importing onednn set the caches up
    import seq2seq.onednn
torch.set_num_threads(2)
m = ModelConfig(d_model=256, n_heads=4, enc_layers=3, dec_layers=3, d_ff=1024, norm_first=False)
torch.manual_seed(0)
pos = PosEncodingConfig()
model = EncoderDecoder(m, 8000, 8000, build_positional(pos, 256, 4, causal=False),
                       build_positional(pos, 256, 4, causal=True)).eval()
gen = torch.Generator().manual_seed(1)
lengths = torch.randint(5, 31, (200,), generator=gen).tolist()
src = [torch.randint(4, 8000, (n,), generator=gen).tolist() for n in lengths]
out = {}
for name, beam in (("greedy", 1), ("beam5", 5)):
    cfg = DecodeConfig(method=SearchKind.beam if beam > 1 else SearchKind.greedy, beam_size=beam,
                       length_penalty=LengthPenaltyKind.average, alpha=1.0, batch_size=32,
                       max_len_a=0.0, max_len_b=32)
    translate_ids(model, src[:32], cfg, min_len=32)  # warm-up
    start = time.perf_counter()
    hyps = translate_ids(model, src, cfg, min_len=32)
    seconds = time.perf_counter() - start
    tokens = json.dumps([h[0].tokens for h in hyps]).encode()
    out[name] = {"sent_per_s": len(src) / seconds, "outputs": hashlib.sha256(tokens).hexdigest()}
print(json.dumps(out))
"""


def side(path: Path) -> dict[str, dict[str, object]]:
    """One decoding run of the checkout at `path`, in its own process."""
    env = {**os.environ, "PYTHONPATH": str(path), "OMP_NUM_THREADS": "2"}
    return run_json([sys.executable, "-c", CHILD], env, f"{path}: decoding", cwd=path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the other checkout")
    parser.add_argument("--after", type=Path, default=ROOT)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    sides = {"before": args.before.resolve(), "after": args.after.resolve()}
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for repeat in range(args.repeats):
        for name in ("before", "after") if repeat % 2 == 0 else ("after", "before"):
            runs[name].append(side(sides[name]))
    result: dict[str, object] = {"sides": {k: str(v) for k, v in sides.items()}}
    for mode in ("greedy", "beam5"):
        hashes = {runs[s][0][mode]["outputs"] for s in runs}
        if len(hashes) != 1:
            raise SystemExit(f"{mode}: the two checkouts decode different outputs: no ratio")
        speed = {s: median([r[mode]["sent_per_s"] for r in runs[s]]) for s in runs}
        result[mode] = {
            **speed,
            "after_over_before": speed["after"] / speed["before"],
            "repeats": {s: [r[mode]["sent_per_s"] for r in runs[s]] for s in runs},
        }
        print(
            f"{mode}: before {speed['before']:.1f}, after {speed['after']:.1f} sent/s "
            f"(after/before {speed['after'] / speed['before']:.3f}); outputs identical"
        )
    write_json("ab_decode", result)


if __name__ == "__main__":
    main()
