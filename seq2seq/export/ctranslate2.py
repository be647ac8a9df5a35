"""Our model as a CTranslate2 TransformerSpec (Klein et al. 2020, "Efficient and High-Quality
Neural Machine Translation with OpenNMT"; CTranslate2's encoder-decoder Transformer spec).

The spec computes our function directly, no retraining and no permutation: embeddings scaled by
sqrt(D), pre- or post-norm layers with the final LayerNorm of a pre-norm stack, fused
query/key/value projections ([q; k; v] rows, ours are [q] and [k; v]), ReLU feed-forward, and an
output layer that may be tied to the target embeddings (CTranslate2 stores a shared matrix once).

Positional encodings, per side:
- sinusoidal, learned, none: an absolute table added to the embeddings (sinusoidal: our
  interleaved sin/cos table written out; none: a zero table);
- relative (Shaw et al. 2018): per-layer relative key and value tables;
- t5_bias (Raffel et al. 2020): per-layer bucket bias tables with their max distance;
- rope (Su et al. 2021): rotary on all head dimensions, halves layout (not interleaved);
- alibi (Press et al. 2022): the decoder only. CTranslate2's encoder has no ALiBi, so a model with
  ALiBi in its encoder is refused with an ExportError naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from seq2seq.data.tokenizer import BOS_ID, EOS_ID, SPECIAL_TOKENS, UNK_ID, Tokenizer
from seq2seq.errors import UserError
from seq2seq.model.absolute import Learned, Rotary, Sinusoidal, sinusoid_table
from seq2seq.model.layers import MultiHeadAttention
from seq2seq.model.positional import PerLayer, PositionalEncoding
from seq2seq.model.relative import ALiBi, ShawRelative, T5Bias
from seq2seq.model.transformer import EncoderDecoder

LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm's default, which our layers use


class ExportError(UserError, ValueError):
    """A model the chosen format cannot express, or an export that does not check out."""


def _np(t: Tensor) -> Any:
    """A copy: CTranslate2's quantization rewrites the spec's arrays in place, and a view would
    change the model's own weights."""
    return t.detach().float().cpu().numpy().copy()


def _kind(pos: PositionalEncoding) -> str:
    """The encoding's name in messages (as seq2seq/config/pos_encoding names it)."""
    names = {
        Sinusoidal: "sinusoidal",
        Learned: "learned",
        Rotary: "rope",
        ALiBi: "alibi",
        T5Bias: "t5_bias",
        ShawRelative: "relative",
        PositionalEncoding: "none",
    }
    return names.get(type(pos), type(pos).__name__)


def side_options(pos: PositionalEncoding, side: str) -> dict[str, Any]:
    """The spec constructor's keyword arguments for one side's positional encoding (per-layer
    tables: the kind of layer 0's; each layer's own tables are written by _set_attention)."""
    if isinstance(pos, PerLayer):
        pos = pos.first
    if isinstance(pos, ShawRelative):
        return {"relative_position": True}
    if isinstance(pos, T5Bias):
        return {"relative_attention_bias": True}
    if isinstance(pos, Rotary):
        half = pos.inv_freq.numel()  # inv_freq[i] = base^(-i / half)
        base = float(pos.inv_freq[1]) ** -half if half > 1 else 10000.0
        return {"rotary_dim": 0, "rotary_interleave": False, "rotary_base": base}
    if isinstance(pos, ALiBi) and side == "decoder":
        return {"alibi": True, "alibi_use_positive_positions": False, "scale_alibi": False}
    if type(pos) in (Sinusoidal, Learned, PositionalEncoding):
        return {}
    raise ExportError(
        f"format=ctranslate2 cannot express pos_encoding {_kind(pos)} in the {side}: "
        "CTranslate2's encoder-decoder Transformer has absolute tables (sinusoidal, learned, "
        "none), Shaw relative, T5 bias and rotary on both sides, and ALiBi in the decoder only"
    )


def _absolute_table(pos: PositionalEncoding, d_model: int, rows: int) -> Tensor | None:
    """The (rows, D) table an absolute encoding adds, None for a relative one."""
    if isinstance(pos, Sinusoidal):
        return sinusoid_table(rows, d_model)
    if isinstance(pos, Learned):
        return pos.table.weight
    if type(pos) is PositionalEncoding:
        return torch.zeros(rows, d_model)
    return None


def _set_linear(spec: Any, linear: nn.Linear, rows: slice | None = None) -> None:
    weight, bias = linear.weight, linear.bias
    spec.weight = _np(weight if rows is None else weight[rows])
    if bias is not None:
        spec.bias = _np(bias if rows is None else bias[rows])


def _set_norm(spec: Any, norm: nn.Module) -> None:
    assert isinstance(norm, nn.LayerNorm)
    spec.gamma, spec.beta = _np(norm.weight), _np(norm.bias)


def _set_attention(spec: Any, attn: MultiHeadAttention, self_attention: bool) -> None:
    """Projections, plus the layer's relative tables (Shaw keys/values, T5 buckets)."""
    q, kv = attn.q_proj, attn.kv_proj
    if self_attention:  # one fused [q; k; v] projection
        spec.linear[0].weight = _np(torch.cat((q.weight, kv.weight)))  # (3D, D)
        spec.linear[0].bias = _np(torch.cat((q.bias, kv.bias)))  # (3D,)
    else:  # q, then the fused [k; v] of the encoder output
        _set_linear(spec.linear[0], q)
        _set_linear(spec.linear[1], kv)
    _set_linear(spec.linear[-1], attn.out_proj)
    pos = attn.pos
    if isinstance(pos, ShawRelative):
        spec.relative_position_keys = _np(pos.keys.weight)  # (2k+1, Dh)
        spec.relative_position_values = _np(pos.vals.weight)  # (2k+1, Dh)
    elif isinstance(pos, T5Bias):
        import numpy as np

        spec.relative_attention_bias = _np(pos.table.weight)  # (buckets, H)
        spec.relative_attention_max_distance = np.dtype("int32").type(pos.max_distance)


def _set_stack(spec: Any, model: EncoderDecoder, side: str, table_rows: int) -> None:
    """Embeddings, position table, layers and final norm of the encoder or the decoder."""
    decoder = side == "decoder"
    layers = model.decoder if decoder else model.encoder
    pos = model.dec_pos if decoder else model.enc_pos
    embed = model.tgt_embed if decoder else model.src_embed
    if decoder:
        spec.embeddings.weight = _np(embed.weight)
        spec.projection.weight = _np(model.out.weight)
    else:
        spec.embeddings[0].weight = _np(embed.weight)
    table = _absolute_table(pos, model.cfg.d_model, table_rows)
    if table is not None:
        spec.position_encodings.encodings = _np(table)
    if model.cfg.norm_first:
        _set_norm(spec.layer_norm, model.dec_norm if decoder else model.enc_norm)
    for layer_spec, layer in zip(spec.layer, layers, strict=True):
        _set_layer(layer_spec, layer, decoder)


def _set_layer(spec: Any, layer: Any, decoder: bool) -> None:
    """One EncoderLayer or DecoderLayer: attention(s), feed-forward, their LayerNorms."""
    first = layer.res_self if decoder else layer.res_attn
    _set_attention(spec.self_attention, layer.self_attn, self_attention=True)
    _set_norm(spec.self_attention.layer_norm, first.norm)
    if decoder:
        _set_attention(spec.attention, layer.cross_attn, self_attention=False)
        _set_norm(spec.attention.layer_norm, layer.res_cross.norm)
    _set_linear(spec.ffn.linear_0, layer.ffn.up)
    _set_linear(spec.ffn.linear_1, layer.ffn.down)
    _set_norm(spec.ffn.layer_norm, layer.res_ffn.norm)


def vocabulary(tok: Tokenizer) -> list[str]:
    """Token strings by id (the four specials first, as our ids have them)."""
    tokens = [tok.id_to_token(i) for i in range(tok.vocab_size)]
    tokens[: len(SPECIAL_TOKENS)] = SPECIAL_TOKENS
    if len(set(tokens)) != len(tokens):
        raise ExportError("the vocabulary has repeated token strings; CTranslate2 maps by string")
    return tokens


def build_spec(model: EncoderDecoder, src_tok: Tokenizer, tgt_tok: Tokenizer, rows: int) -> Any:
    """The filled TransformerSpec (not yet saved); `rows` positions for absolute tables."""
    from ctranslate2.specs import transformer_spec

    cfg = model.cfg
    common = {"num_heads": cfg.n_heads, "pre_norm": cfg.norm_first}
    encoder = transformer_spec.TransformerEncoderSpec(
        cfg.enc_layers, **common, **side_options(model.enc_pos, "encoder")
    )
    decoder = transformer_spec.TransformerDecoderSpec(
        cfg.dec_layers, **common, **side_options(model.dec_pos, "decoder")
    )
    spec = transformer_spec.TransformerSpec(encoder, decoder)
    with torch.no_grad():
        _set_stack(spec.encoder, model, "encoder", rows)
        _set_stack(spec.decoder, model, "decoder", rows)
    # CTranslate2 adds the EOS our sources end with, and starts the decoder from our BOS
    spec.config.add_source_eos = True
    spec.config.unk_token = SPECIAL_TOKENS[UNK_ID]
    spec.config.bos_token = spec.config.decoder_start_token = SPECIAL_TOKENS[BOS_ID]
    spec.config.eos_token = SPECIAL_TOKENS[EOS_ID]
    spec.config.layer_norm_epsilon = LAYER_NORM_EPS
    spec.register_source_vocabulary(vocabulary(src_tok))
    spec.register_target_vocabulary(vocabulary(tgt_tok))
    return spec


def save(spec: Any, out_dir: Path, quantization: str) -> None:
    """Validate, quantize (float32 keeps the weights as they are) and write model.bin."""
    spec.validate()
    spec.optimize(quantization=None if quantization == "float32" else quantization)
    spec.save(str(out_dir))
