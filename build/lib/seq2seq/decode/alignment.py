"""Cross-attention of finished translations, and the word alignments read off it.

The searches never form attention weights (the fused kernels do not return them). Once a
translation is chosen, its decoder is run again teacher-forced on the output (BOS + tokens), and
every decoder layer's cross-attention weights are written out (MultiHeadAttention.weights): the
attention the search computed for that hypothesis, to float rounding, in greedy, beam or sampling
search alike. Row t of a sentence's weights is the step that emitted target token t (the last row,
EOS); column i is source token i (the last column, the source's EOS).

Alignments follow the usual convention (fairseq's --print-alignment, Garg et al. 2019): each
target token is aligned to the source token it attends to most, heads averaged, in one decoder
layer; EOS is left out on both sides, and pairs are "i-j" with source index i and target index j,
0-based subword tokens.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor
from torch.utils.hooks import RemovableHandle

from seq2seq.data.tokenizer import BOS_ID, PAD_ID
from seq2seq.decode.ensemble import SearchModel
from seq2seq.decode.search import Hypothesis, pad_sources
from seq2seq.errors import ConfigError
from seq2seq.model.layers import DecoderLayer
from seq2seq.model.transformer import EncoderDecoder


@torch.inference_mode()
def model_attention(model: EncoderDecoder, src: Tensor, outputs: list[list[int]]) -> Tensor:
    """Cross-attention weights (N, L, T, S), averaged over heads, of each decoder layer for
    sources src (N, S) and outputs (N lists of ids without EOS; T = the longest + 1)."""
    rows = [torch.tensor([BOS_ID, *ids]) for ids in outputs]
    tgt_in = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=PAD_ID)
    captured: list[Tensor] = []
    hooks: list[RemovableHandle] = [
        layer.cross_attn.register_forward_hook(
            lambda attn, args, _: captured.append(attn.weights(*args).mean(1))  # (N, T, S)
        )
        for layer in cast(list[DecoderLayer], list(model.decoder))
    ]
    try:
        memory, src_mask = model.encode(src)  # (N, S, D), (N, S)
        model.decode_states(tgt_in.to(src.device), memory, src_mask)
    finally:
        for hook in hooks:
            hook.remove()
    return torch.stack(captured, 1).float().cpu()  # (N, L, T, S)


def search_model_attention(model: SearchModel, src: Tensor, outputs: list[list[int]]) -> Tensor:
    """model_attention of a model, or the mean of an ensemble's models' (which need equally
    many decoder layers)."""
    if isinstance(model, EncoderDecoder):
        return model_attention(model, src, outputs)
    if len(set(model.depths)) > 1:
        raise ConfigError(
            f"config: align/attention_dir with an ensemble needs models with equally many "
            f"decoder layers, these have {model.depths}; translate with one checkpoint"
        )
    return torch.stack([model_attention(m, src, outputs) for m in model.members]).mean(0)


def translation_attention(
    model: SearchModel,
    src_ids: list[list[int]],
    found: list[list[Hypothesis]],
    max_src_len: int,
    batch_size: int,
) -> list[list[Tensor]]:
    """For each source (ids, truncated to max_src_len like the search's) and each of its
    hypotheses, its cross-attention (L, T + 1, S + 1): L layers, T target tokens and EOS, S
    source tokens and EOS."""
    pairs = [(i, h) for i, hyps in enumerate(found) for h in hyps]
    device = next(model.parameters()).device
    flat: list[Tensor] = []
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        src = pad_sources([src_ids[i] for i, _ in chunk], max_src_len, device)  # (N, S)
        weights = search_model_attention(model, src, [h.tokens for _, h in chunk])
        for row, (i, h) in zip(weights, chunk, strict=True):
            s = min(len(src_ids[i]), max_src_len) + 1
            flat.append(row[:, : len(h.tokens) + 1, :s])
    out: list[list[Tensor]] = []
    for hyps in found:
        out.append(flat[: len(hyps)])
        flat = flat[len(hyps) :]
    return out


def check_layer(layer: int, layers: int, key: str = "align_layer") -> int:
    """`layer` as an index 0..layers-1 (negative counts from the last), or a ConfigError."""
    if not -layers <= layer < layers:
        raise ConfigError(
            f"config: {key}={layer} is invalid; the model has {layers} decoder layers, so it "
            f"must be in [{-layers}, {layers - 1}] (-1 = the last)"
        )
    return layer % layers


def hard_alignment(weights: Tensor) -> list[tuple[int, int]]:
    """Pairs (i, j): target token j's most attended source token i, for one layer's weights
    (T + 1, S + 1) of a translation (EOS rows and columns last, left out)."""
    if weights.size(0) < 2 or weights.size(1) < 2:
        return []
    best = weights[:-1, :-1].argmax(-1).tolist()  # (T,)
    return [(i, j) for j, i in enumerate(best)]


def format_alignment(pairs: list[tuple[int, int]]) -> str:
    """Pairs as "i-j i-j ..." (fairseq's and fast_align's format)."""
    return " ".join(f"{i}-{j}" for i, j in pairs)
