"""Would a torch.compile'd decoder step pay? Eager against Inductor, one step at a time.

    python benchmarks/decode_compiled.py [--threads 2] [--rows 1 5 64] [--steps 24]
        [--freezing] [--cpp-wrapper] [--mode default]

A one-off check for issue #29 (decoding at CTranslate2's pace), quoted in docs/BENCHMARKS.md
where it is used; it writes nothing. The model is decode_ops.py's (the Multi30k recipe's shape,
model=tiny, vocabulary 8,000, randomly initialised; sinusoidal). The compiled engine is
`torch.compile(model.decode, dynamic=True)` on the plain-PyTorch kernels (kernels mode
reference: the CPU fast paths keep Python state that Dynamo would break its graph on), with
the model's own key/value cache (seq2seq.model.cache.LayerCache), so the searches could call it
unchanged. For each number of rows (1: one sentence; 5: its beams; 64: a batch), both engines
decode greedily from BOS for --steps steps over random sources, and the script prints the
compile time (every shape first, two source lengths each), Dynamo's frames, recompilations and
graph breaks, each engine's milliseconds per step (the mean over the steps, after two untimed
rounds), and whether both chose the same tokens.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
from torch import Tensor

from seq2seq import kernels
from seq2seq.config.schema import ModelConfig
from seq2seq.data.tokenizer import BOS_ID
from seq2seq.model.absolute import Sinusoidal
from seq2seq.model.cache import LayerCache
from seq2seq.model.transformer import EncoderDecoder

VOCAB = 8000
Decode = Callable[[Tensor, Tensor, Tensor, list[LayerCache]], Tensor]


def build() -> EncoderDecoder:
    """model=tiny (the Multi30k recipe's shape), random weights, eval mode."""
    torch.manual_seed(0)
    cfg = ModelConfig(dropout=0.3)
    pos = Sinusoidal(cfg.d_model, 1024)
    return EncoderDecoder(cfg, VOCAB, VOCAB, pos, Sinusoidal(cfg.d_model, 1024)).eval()


def run(
    model: EncoderDecoder, decode: Decode, rows: int, steps: int, src_len: int, seed: int
) -> tuple[float, list[list[int]]]:
    """Milliseconds per step of `steps` greedy steps of `rows` random sources, and the tokens."""
    src = torch.randint(4, VOCAB, (rows, src_len), generator=torch.Generator().manual_seed(seed))
    with torch.inference_mode():
        memory, mask = model.encode(src)  # (B, S, D), (B, S)
        cache = model.new_cache(steps)
        token = torch.full((rows, 1), BOS_ID, dtype=torch.long)  # (B, 1)
        out = []
        start = time.perf_counter()
        for _ in range(steps):
            token = decode(token, memory, mask, cache)[:, -1].argmax(-1, keepdim=True)  # (B, 1)
            out.append(token)
        seconds = time.perf_counter() - start
    return seconds / steps * 1e3, torch.cat(out, 1).tolist()


def compiled_decode(model: EncoderDecoder, args: argparse.Namespace) -> Decode:
    """model.decode through torch.compile (dynamic shapes), on the reference kernels."""
    torch._inductor.config.freezing = args.freezing
    torch._inductor.config.cpp_wrapper = args.cpp_wrapper
    raw = torch.compile(model.decode, mode=args.mode, dynamic=True)

    def decode(tgt: Tensor, memory: Tensor, mask: Tensor, cache: list[LayerCache]) -> Tensor:
        with kernels.use("reference"):
            out: Tensor = raw(tgt, memory, mask, cache)
        return out

    return decode


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rows", type=int, nargs="+", default=[1, 5, 64])
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--mode", default="default", help="torch.compile's mode")
    p.add_argument("--freezing", action="store_true", help="Inductor's freezing (weights packed)")
    p.add_argument("--cpp-wrapper", action="store_true", help="Inductor's C++ wrapper")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from torch._dynamo.utils import counters

    model = build()
    compiled = compiled_decode(model, args)
    start = time.perf_counter()
    for rows in args.rows:
        for src_len in (13, 17):
            run(model, compiled, rows, args.steps, src_len, seed=0)
    print(
        f"compile: {time.perf_counter() - start:.1f} s; frames {dict(counters['frames'])}; "
        f"recompiles {sum(counters['recompiles'].values())}; "
        f"graph breaks {len(counters['graph_break'])}"
    )
    for rows in args.rows:
        for _ in range(2):  # untimed rounds
            run(model, model.decode, rows, args.steps, 13, seed=0)
            run(model, compiled, rows, args.steps, 13, seed=0)
        eager, eager_out = run(model, model.decode, rows, args.steps, 15, seed=1)
        fast, fast_out = run(model, compiled, rows, args.steps, 15, seed=1)
        print(
            f"rows {rows}: eager {eager:.3f} ms/step, compiled {fast:.3f} ms/step, "
            f"compiled / eager speed {eager / fast:.2f}x, same tokens {eager_out == fast_out}"
        )


if __name__ == "__main__":
    main()
