"""Our model as a Hugging Face MarianMTModel: the one converter the benchmarks share.

Marian computes our function when our model is post-norm with sinusoidal positions, embeddings
scaled by sqrt(D), one matrix for source, target and output, and ReLU. Marian's sinusoids put the
sines in the first half of the vector where ours interleave sines and cosines, so every weight is
copied with its model dimension permuted (Marian's feature j is our feature perm[j]); Marian then
keeps its own position tables. decode_setup.py exports the result for CTranslate2 (with one extra
vocabulary row, which CTranslate2's Marian loader drops), train_throughput.py trains it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from seq2seq.config import ModelConfig
from seq2seq.model import EncoderDecoder
from seq2seq.tokenizer import BOS_ID, EOS_ID, PAD_ID

if TYPE_CHECKING:
    from transformers import MarianConfig, MarianMTModel


def marian_permutation(d_model: int) -> torch.Tensor:
    """Marian feature j is our feature perm[j]: [sin 0, sin 1, ..., cos 0, cos 1, ...]."""
    return torch.cat((torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)))  # (D,)


def marian_config(
    m: ModelConfig, vocab: int, extra_row: bool, max_positions: int = 512, dropout: bool = False
) -> MarianConfig:
    """A MarianConfig of our model's shape; `dropout` takes our model's dropout rates (for
    training), else none (for decoding); `extra_row` adds a last vocabulary row (CTranslate2)."""
    from transformers import MarianConfig

    rates = (m.dropout, m.attn_dropout, m.ffn_dropout) if dropout else (0.0, 0.0, 0.0)
    return MarianConfig(
        vocab_size=vocab + extra_row,
        d_model=m.d_model,
        encoder_layers=m.enc_layers,
        decoder_layers=m.dec_layers,
        encoder_attention_heads=m.n_heads,
        decoder_attention_heads=m.n_heads,
        encoder_ffn_dim=m.d_ff,
        decoder_ffn_dim=m.d_ff,
        activation_function="relu",
        dropout=rates[0],
        attention_dropout=rates[1],
        activation_dropout=rates[2],
        scale_embedding=True,
        max_position_embeddings=max_positions,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        bos_token_id=BOS_ID,
        decoder_start_token_id=BOS_ID,
        forced_eos_token_id=None,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
    )


def marian_state(model: EncoderDecoder, extra_row: bool) -> dict[str, torch.Tensor]:
    """Our weights under Marian's names, model dimension permuted (see marian_permutation)."""
    d = model.cfg.d_model
    p = marian_permutation(d)
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    emb = sd["src_embed.weight"][:, p]  # (V, D)
    shared = torch.cat((emb, emb.new_zeros(1, d))) if extra_row else emb  # (V [+ 1], D)
    out = {"model.shared.weight": shared}
    for side, n in (("encoder", model.cfg.enc_layers), ("decoder", model.cfg.dec_layers)):
        for i in range(n):
            out.update(_layer_state(sd, side, i, p))
    return out


def load_into(marian: MarianMTModel, model: EncoderDecoder, extra_row: bool) -> None:
    """Give `marian` our model's weights; a RuntimeError names what did not map."""
    state = marian_state(model, extra_row)
    missing, unexpected = marian.load_state_dict(state, strict=False)
    derived = ("embed_positions", "embed_tokens", "lm_head", "final_logits_bias")  # fixed or tied
    left = [k for k in missing if not any(name in k for name in derived)]
    if left or unexpected:
        raise RuntimeError(f"Marian conversion: missing {left}, unexpected {unexpected}")
    if not torch.equal(marian.lm_head.weight, state["model.shared.weight"]):
        raise RuntimeError("Marian conversion: the output layer is not tied to the embeddings")


def _attention(sd: dict, ours: str, theirs: str, p: torch.Tensor) -> dict[str, torch.Tensor]:
    d = p.numel()
    kv_w, kv_b = sd[f"{ours}.kv_proj.weight"], sd[f"{ours}.kv_proj.bias"]  # (2D, D), (2D,)
    return {
        f"{theirs}.q_proj.weight": sd[f"{ours}.q_proj.weight"][:, p],
        f"{theirs}.q_proj.bias": sd[f"{ours}.q_proj.bias"],
        f"{theirs}.k_proj.weight": kv_w[:d][:, p],
        f"{theirs}.k_proj.bias": kv_b[:d],
        f"{theirs}.v_proj.weight": kv_w[d:][:, p],
        f"{theirs}.v_proj.bias": kv_b[d:],
        f"{theirs}.out_proj.weight": sd[f"{ours}.out_proj.weight"][p],
        f"{theirs}.out_proj.bias": sd[f"{ours}.out_proj.bias"][p],
    }


def _layer_state(sd: dict, side: str, i: int, p: torch.Tensor) -> dict[str, torch.Tensor]:
    ours, theirs = f"{side}.{i}", f"model.{side}.layers.{i}"
    blocks = [("self_attn", "res_attn" if side == "encoder" else "res_self", "self_attn")]
    if side == "decoder":
        blocks.append(("cross_attn", "res_cross", "encoder_attn"))
    out: dict[str, torch.Tensor] = {}
    for attn, res, name in blocks:
        out.update(_attention(sd, f"{ours}.{attn}", f"{theirs}.{name}", p))
        out[f"{theirs}.{name}_layer_norm.weight"] = sd[f"{ours}.{res}.norm.weight"][p]
        out[f"{theirs}.{name}_layer_norm.bias"] = sd[f"{ours}.{res}.norm.bias"][p]
    out.update(
        {
            f"{theirs}.fc1.weight": sd[f"{ours}.ffn.up.weight"][:, p],
            f"{theirs}.fc1.bias": sd[f"{ours}.ffn.up.bias"],
            f"{theirs}.fc2.weight": sd[f"{ours}.ffn.down.weight"][p],
            f"{theirs}.fc2.bias": sd[f"{ours}.ffn.down.bias"][p],
            f"{theirs}.final_layer_norm.weight": sd[f"{ours}.res_ffn.norm.weight"][p],
            f"{theirs}.final_layer_norm.bias": sd[f"{ours}.res_ffn.norm.bias"][p],
        }
    )
    return out
