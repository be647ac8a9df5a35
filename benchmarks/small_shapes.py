"""Do kernels.cpu's small-shape thresholds hold on this CPU? One sentence at a time, timed.

    python benchmarks/small_shapes.py --ckpt runs/.../checkpoints/average.pt [--data DIR]
        [--sentences 20] [--rounds 7] [--threads 2]

A one-off check for issue #29 (choices measured, not fixed on one CPU), quoted in
docs/BENCHMARKS.md where it is used; it writes nothing. Two constants of seq2seq/kernels/cpu.py
were chosen on an AMD EPYC and decide how a sentence decoded alone runs:
- SMALL_ROWS: float32 products of at most this many rows by small weights go to F.linear
  (ATen) instead of the products' backend (oneDNN or ATen, load.choose_products); 0 sends them
  to the backend too;
- FEW_QUERY_ROWS: attention of at most this many query rows in all runs on SDPA, one call,
  instead of two batched matmuls around a softmax; 0 sends them to the matmuls.
The checkpoint translates the first --sentences sentences of test_2016_flickr one at a time,
greedy and beam 5 at natural length, with the constants as set and with each one at 0; the
settings alternate in every round, the first round is not counted, and the script prints the
median milliseconds a sentence of each and whether its translations are the ones "as set" gave.
"""

from __future__ import annotations

import argparse
import gzip
import time

import common  # noqa: F401  before torch: MKL's Intel path on AMD (common.py)
import torch
from common import machine, median, multi30k_root, split_file

from seq2seq.decode.translator import Translator
from seq2seq.kernels import cpu

SETTINGS: dict[str, dict[str, int]] = {
    "as set": {},
    "SMALL_ROWS=0": {"SMALL_ROWS": 0},
    "FEW_QUERY_ROWS=0": {"FEW_QUERY_ROWS": 0},
}
FIXED = {name: getattr(cpu, name) for name in ("SMALL_ROWS", "FEW_QUERY_ROWS")}


def apply(change: dict[str, int]) -> None:
    """kernels.cpu's thresholds as set, with `change` over them ({}: as set)."""
    for constant, value in FIXED.items():
        setattr(cpu, constant, change.get(constant, value))


def timed(translator: Translator, texts: list[str], beam: int) -> tuple[float, list[str]]:
    """Milliseconds a sentence, each translated alone, and the translations."""
    out = []
    start = time.perf_counter()
    for text in texts:
        out += translator.translate([text], beam_size=beam)
    return 1000 * (time.perf_counter() - start) / len(texts), out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ckpt", required=True, help="a trained checkpoint (average.pt)")
    p.add_argument("--data", default=None, help="Multi30k folder (default: $MULTI30K_ROOT)")
    p.add_argument("--sentences", type=int, default=20)
    p.add_argument("--rounds", type=int, default=7, help="alternating rounds, the first untimed")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    translator = Translator.from_checkpoint(args.ckpt, device="cpu")
    src = split_file(multi30k_root(args.data), f"test_2016_flickr.{translator.cfg.data.src_lang}")
    opener = gzip.open if src.suffix == ".gz" else open
    with opener(src, "rt", encoding="utf-8") as f:
        texts = [line.strip() for _, line in zip(range(args.sentences), f, strict=False)]
    print(machine())
    for beam in (1, 5):
        times: dict[str, list[float]] = {name: [] for name in SETTINGS}
        outputs: dict[str, list[str]] = {}
        for round_ in range(args.rounds):
            for name, change in SETTINGS.items():
                apply(change)
                ms, outputs[name] = timed(translator, texts, beam)
                if round_:
                    times[name].append(ms)
        apply({})
        for name, ms_list in times.items():
            same = outputs[name] == outputs["as set"]
            print(
                f"beam {beam}, {name}: {median(ms_list):.2f} ms a sentence "
                f"(median of {len(ms_list)}; same translations as set: {same})"
            )


if __name__ == "__main__":
    main()
