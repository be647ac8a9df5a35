"""How far is our decoder step from the floor of eager PyTorch? One sentence's step, timed.

    python benchmarks/decode_floor.py [--ckpt runs/.../checkpoints/average.pt] [--rows 1 64]
        [--steps 32] [--rounds 9] [--threads 2]

A one-off check for issue #29 (one sentence's decoder step <= 0.6 ms), quoted in
docs/BENCHMARKS.md where it is used; it writes nothing. Two engines decode the same sources
greedily from BOS for --steps steps (EOS not stopping them), with the same weights, for each
number of rows in --rows (1: one sentence; 64: a batch, every source of the same length):
- ours: `model.decode` with the model's own key/value cache (kernels auto), as the searches
  call it (inside `decoding(model)`: parameters and submodules read directly), its float32
  products on the backend greedy search would choose for that many rows
  (seq2seq.decode.load.choose_products: the fastest of oneDNN and ATen for the small weights
  and for the large ones, timed here);
- floor: the same arithmetic written as few PyTorch calls as it takes, and nothing else: the
  weights taken out of the modules once (the self-attention's query, key and value products
  fused into one), a preallocated cache written in place, SDPA for both attentions, no module
  calls, no positional hooks, no kernel seam, no masks (the sources have no padding). It is not
  a product path: it knows only pre-norm layers with sinusoidal or rotary positions (the
  regularized Multi30k recipe's), float32, sources of one length.
Each round times both engines (alternating, the first round untimed); the script prints the
median milliseconds per step of each, their ratio, and whether both chose the same tokens (the
premise of the comparison). The search's own work around the model (log-probabilities, its
bookkeeping) is in neither: benchmarks/decode.py times whole searches.

The model is --ckpt's (a trained checkpoint) or, without one, decode_ops.py's random model=tiny
(the Multi30k recipe's shape, vocabulary 8,000); the first source is decode_ops.py's 13 ids,
the others are random ids of the same length.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import common  # noqa: F401  before torch: MKL's Intel path on AMD (common.py)
import torch
import torch.nn.functional as F
from common import machine, median
from decode_ops import SOURCE, tiny_model
from torch import Tensor

from seq2seq import kernels
from seq2seq.config.schema import DecodeConfig, SearchKind
from seq2seq.data.tokenizer import BOS_ID, EOS_ID
from seq2seq.decode.load import choose_products
from seq2seq.decode.schedule import decoding
from seq2seq.model.absolute import Rotary, Sinusoidal
from seq2seq.model.transformer import EncoderDecoder


@dataclass
class FloorLayer:
    """One decoder layer's weights as plain tensors, and its caches (N rows)."""

    norms: list[tuple[Tensor, Tensor]]  # (D,) weight and bias of the three pre-norms
    qkv: tuple[Tensor, Tensor]  # (3D, D), (3D,): self-attention's q, k, v products fused
    out: tuple[Tensor, Tensor]  # (D, D), (D,)
    cross_q: tuple[Tensor, Tensor]  # (D, D), (D,)
    cross_out: tuple[Tensor, Tensor]  # (D, D), (D,)
    up: tuple[Tensor, Tensor]  # (F, D), (F,)
    down: tuple[Tensor, Tensor]  # (D, F), (D,)
    cross_kv: tuple[Tensor, Tensor]  # (N, H, S, Dh) each: the sources' keys and values
    kv: Tensor  # (2, N, H, capacity, Dh): the self-attention keys and values so far


class Floor:
    """model.decode's greedy step for N rows, in as few PyTorch calls as it takes."""

    def __init__(self, model: EncoderDecoder, memory: Tensor, capacity: int) -> None:
        cfg, pos = model.cfg, model.dec_pos
        if not cfg.norm_first or not isinstance(pos, (Sinusoidal, Rotary)):
            raise SystemExit(
                "decode_floor: the floor knows pre-norm sinusoidal or rope models only"
            )
        self.d, self.h = cfg.d_model, cfg.n_heads
        self.scale, self.embed = model.scale, model.tgt_embed.weight  # (V, D)
        self.table: Tensor | None = None  # (capacity, D): sinusoidal positions, added
        self.rotary: tuple[Tensor, Tensor] | None = None  # (capacity, Dh) each: cos, sin
        if isinstance(pos, Sinusoidal):
            pos.embed(memory.new_zeros(1, capacity, self.d))  # the table grows to capacity
            self.table = pos.table[:capacity]
        else:  # Rotary's tables, channel i paired with i + Dh/2
            cos, sin = pos.tables(capacity, memory.device)  # (>= capacity, Dh) each
            self.rotary = cos[:capacity], sin[:capacity]
        self.final = (model.dec_norm.weight, model.dec_norm.bias)
        self.output = model.out.weight  # (V, D)
        self.layers = [self._layer(layer, memory, capacity) for layer in model.decoder]

    def _layer(self, layer: torch.nn.Module, memory: Tensor, capacity: int) -> FloorLayer:
        sa, ca, ffn = layer.self_attn, layer.cross_attn, layer.ffn
        k, v = ca.project_kv(memory)  # (N, H, S, Dh) each
        norms = [(r.norm.weight, r.norm.bias) for r in (layer.res_self, layer.res_cross)]
        norms.append((layer.res_ffn.norm.weight, layer.res_ffn.norm.bias))
        return FloorLayer(
            norms=norms,
            qkv=(
                torch.cat([sa.q_proj.weight, sa.kv_proj.weight]),  # (3D, D)
                torch.cat([sa.q_proj.bias, sa.kv_proj.bias]),  # (3D,)
            ),
            out=(sa.out_proj.weight, sa.out_proj.bias),
            cross_q=(ca.q_proj.weight, ca.q_proj.bias),
            cross_out=(ca.out_proj.weight, ca.out_proj.bias),
            up=(ffn.up.weight, ffn.up.bias),
            down=(ffn.down.weight, ffn.down.bias),
            cross_kv=(k.contiguous(), v.contiguous()),
            kv=memory.new_zeros(2, memory.size(0), self.h, capacity, self.d // self.h),
        )

    def step(self, tokens: Tensor, t: int) -> Tensor:
        """The most probable tokens (N,) after `tokens` (N,), the t-th inputs (from 0)."""
        return self.logits(tokens, t).argmax(-1)  # (N,)

    def logits(self, tokens: Tensor, t: int) -> Tensor:
        """The next-token logits (N, V) after `tokens` (N,), the t-th inputs (from 0); their
        keys and values join the caches."""
        d, h, n = self.d, self.h, tokens.size(0)
        x = self.embed[tokens] * self.scale  # (N, D)
        x = (x if self.table is None else x + self.table[t]).view(n, 1, d)  # (N, 1, D)
        for layer in self.layers:
            y = F.layer_norm(x, (d,), *layer.norms[0])  # (N, 1, D)
            qkv = F.linear(y, *layer.qkv).view(n, 3, h, -1)  # (N, 3, H, Dh)
            if self.rotary is not None:  # queries and keys turned by position t's angles
                qk, half = qkv[:, :2], qkv.size(-1) // 2  # (N, 2, H, Dh)
                turned = torch.cat((-qk[..., half:], qk[..., :half]), -1)  # (N, 2, H, Dh)
                qk = qk * self.rotary[0][t] + turned * self.rotary[1][t]
                qkv = torch.cat((qk, qkv[:, 2:]), 1)  # (N, 3, H, Dh)
            layer.kv[:, :, :, t] = qkv[:, 1:].transpose(0, 1)  # keys and values of position t
            q = qkv[:, 0].unsqueeze(2)  # (N, H, 1, Dh)
            keys, values = layer.kv[:, :, :, : t + 1].unbind(0)  # (N, H, t+1, Dh) each
            a = F.scaled_dot_product_attention(q, keys, values)  # (N, H, 1, Dh)
            x = x + F.linear(a.view(n, 1, d), *layer.out)  # (N, 1, D)
            y = F.layer_norm(x, (d,), *layer.norms[1])
            q = F.linear(y, *layer.cross_q).view(n, 1, h, -1).transpose(1, 2)  # (N, H, 1, Dh)
            a = F.scaled_dot_product_attention(q, *layer.cross_kv)  # (N, H, 1, Dh)
            x = x + F.linear(a.view(n, 1, d), *layer.cross_out)  # (N, 1, D)
            y = F.layer_norm(x, (d,), *layer.norms[2])
            x = x + F.linear(torch.relu(F.linear(y, *layer.up)), *layer.down)  # (N, 1, D)
        return F.linear(F.layer_norm(x, (d,), *self.final), self.output).view(n, -1)  # (N, V)


def ours(model: EncoderDecoder, memory: Tensor, mask: Tensor, steps: int) -> list[list[int]]:
    """`steps` greedy steps of model.decode from BOS, for every row of memory (N, S, D), inside
    `decoding(model)` as the searches run (eval mode, attributes read directly)."""
    cache, out = model.new_cache(steps), []
    token = torch.full((memory.size(0), 1), BOS_ID)  # (N, 1)
    with decoding(model):
        for _ in range(steps):
            logits = model.decode(token, memory, mask, cache)[:, -1]  # (N, V)
            token = logits.argmax(-1, keepdim=True)  # (N, 1)
            out.append(token.view(-1))
    return torch.stack(out, 1).tolist()


def floor(model: EncoderDecoder, memory: Tensor, steps: int) -> list[list[int]]:
    """The same steps on the floor engine (its set-up included: a few copies)."""
    engine, out = Floor(model, memory, steps), []
    token = torch.full((memory.size(0),), BOS_ID)  # (N,)
    for t in range(steps):
        token = engine.step(token, t)
        out.append(token)
    return torch.stack(out, 1).tolist()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ckpt", default=None, help="a trained checkpoint (default: random tiny)")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 64])
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--rounds", type=int, default=9, help="alternating rounds, the first untimed")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.ckpt:
        from seq2seq.decode.translator import Translator

        model = Translator.from_checkpoint(args.ckpt, device="cpu").single("decode_floor")
    else:
        model = tiny_model("sinusoidal")
    model.eval()
    print(machine())
    print(f"model: {args.ckpt or 'random model=tiny'}; {args.threads} threads; {args.steps} steps")
    for rows in args.rows:
        greedy = DecodeConfig(method=SearchKind.greedy, batch_size=rows)
        chosen, _ = choose_products(model, model.cfg, greedy, model.out.weight.size(0))
        shown = f"small weights {chosen[0]}, large weights {chosen[1]}" if chosen else "none"
        few = f" (at most {kernels.SMALL_ROWS} rows: small weights F.linear)"
        print(f"rows {rows}: products {shown}{few if rows <= kernels.SMALL_ROWS else ''}")
        compare(model, rows, args.steps, args.rounds)


def compare(model: EncoderDecoder, rows: int, steps: int, rounds: int) -> None:
    """Time both engines on `rows` sources and print the medians and whether they agree."""
    random = torch.randint(
        4,
        model.out.weight.size(0),
        (rows - 1, len(SOURCE)),
        generator=torch.Generator().manual_seed(0),
    )
    src = torch.cat([torch.tensor([SOURCE]), random]).long()  # (N, S - 1)
    src = torch.cat([src, torch.full((rows, 1), EOS_ID)], 1)  # (N, S)
    times: dict[str, list[float]] = {"ours": [], "floor": []}
    tokens: dict[str, list[list[int]]] = {}
    with torch.inference_mode():
        memory, mask = model.encode(src)  # (N, S, D), (N, S)
        for round_ in range(rounds):
            for name in times:
                start = time.perf_counter()
                if name == "ours":
                    tokens[name] = ours(model, memory, mask, steps)
                else:
                    tokens[name] = floor(model, memory, steps)
                if round_:
                    times[name].append((time.perf_counter() - start) * 1e3 / steps)
    ratio = median(times["ours"]) / median(times["floor"])
    print(
        f"rows {rows}: ours {median(times['ours']):.3f} ms per step, floor "
        f"{median(times['floor']):.3f} (medians of {rounds - 1} rounds); ours / floor "
        f"{ratio:.2f}x; same tokens: {tokens['ours'] == tokens['floor']}"
    )


if __name__ == "__main__":
    main()
