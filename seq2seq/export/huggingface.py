"""Our model as a Hugging Face MarianMTModel (Junczys-Dowmunt et al. 2018, "Marian: Fast Neural
Machine Translation in C++"; the transformers port) with its MarianTokenizer.

Marian computes our function when our model is post-norm with sinusoidal positions on both sides
(embeddings scaled by sqrt(D), ReLU). Marian's sinusoids put the sines in the first half of the
vector where ours interleave sines and cosines, so every weight is copied with its model dimension
permuted (Marian's feature j is our feature perm[j]); Marian then keeps its own position tables.
Source and target embeddings may be one matrix or two, and the output layer tied or not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from seq2seq.config.schema import ModelConfig
from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, SentencePieceTokenizer, Tokenizer
from seq2seq.export.ctranslate2 import ExportError, vocabulary
from seq2seq.model.absolute import Sinusoidal
from seq2seq.model.transformer import EncoderDecoder

if TYPE_CHECKING:
    from transformers import MarianConfig, MarianMTModel


def check_marian(model: EncoderDecoder, src_tok: Tokenizer, tgt_tok: Tokenizer) -> None:
    """An ExportError naming what MarianMTModel cannot express, if anything."""
    for side, pos in (("encoder", model.enc_pos), ("decoder", model.dec_pos)):
        if type(pos) is not Sinusoidal:
            raise ExportError(
                f"format=huggingface cannot express the {side}'s positional encoding "
                f"{type(pos).__name__}: MarianMTModel has sinusoidal positions only "
                "(format=ctranslate2 takes more)"
            )
    if model.cfg.norm_first:
        raise ExportError(
            "format=huggingface cannot express model.norm_first=true: MarianMTModel is post-norm "
            "(format=ctranslate2 takes pre-norm)"
        )
    for name, tok in (("source", src_tok), ("target", tgt_tok)):
        if not isinstance(tok, SentencePieceTokenizer):
            raise ExportError(
                f"format=huggingface needs SentencePiece tokenizers (tokenizer=bpe or unigram): "
                f"MarianTokenizer reads SentencePiece models, and the {name} side is "
                f"{getattr(tok, 'kind', type(tok).__name__)}"
            )


def marian_permutation(d_model: int) -> torch.Tensor:
    """Marian feature j is our feature perm[j]: [sin 0, sin 1, ..., cos 0, cos 1, ...]."""
    return torch.cat((torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)))  # (D,)


def marian_config(
    m: ModelConfig,
    vocab: tuple[int, int],
    max_positions: int = 512,
    dropout: bool = False,
) -> MarianConfig:
    """A MarianConfig of our model's shape for (source, target) vocabulary sizes; `dropout`
    takes our model's dropout rates (for training), else none (for decoding)."""
    from transformers import MarianConfig

    rates = (m.dropout, m.attn_dropout, m.ffn_dropout) if dropout else (0.0, 0.0, 0.0)
    return MarianConfig(
        vocab_size=vocab[0],
        decoder_vocab_size=vocab[1],
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
        share_encoder_decoder_embeddings=m.share_embeddings,
        tie_word_embeddings=m.tie_output,
    )


def marian_state(model: EncoderDecoder) -> dict[str, torch.Tensor]:
    """Our weights under Marian's names, model dimension permuted (see marian_permutation)."""
    cfg = model.cfg
    p = marian_permutation(cfg.d_model)
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    out = {}
    if cfg.share_embeddings:
        out["model.shared.weight"] = sd["src_embed.weight"][:, p]  # (V, D)
    else:
        out["model.encoder.embed_tokens.weight"] = sd["src_embed.weight"][:, p]
        out["model.decoder.embed_tokens.weight"] = sd["tgt_embed.weight"][:, p]
    if not cfg.tie_output:
        out["lm_head.weight"] = sd["out.weight"][:, p]  # (V, D)
    for side, n in (("encoder", cfg.enc_layers), ("decoder", cfg.dec_layers)):
        for i in range(n):
            out.update(_layer_state(sd, side, i, p))
    return out


def load_into(marian: MarianMTModel, model: EncoderDecoder) -> None:
    """Give `marian` our model's weights; a RuntimeError names what did not map."""
    state = marian_state(model)
    missing, unexpected = marian.load_state_dict(state, strict=False)
    derived = ("embed_positions", "embed_tokens", "lm_head", "final_logits_bias", "shared")
    left = [k for k in missing if k not in state and not any(n in k for n in derived)]
    if left or unexpected:
        raise RuntimeError(f"Marian conversion: missing {left}, unexpected {unexpected}")
    with torch.no_grad():
        marian.final_logits_bias.zero_()
    names = ("lm_head.weight", "model.shared.weight", "model.decoder.embed_tokens.weight")
    expected = next(state[k] for k in names if k in state)  # the untied head, else the tied
    if not torch.equal(marian.lm_head.weight, expected):
        raise RuntimeError("Marian conversion: the output layer does not hold our output weights")


def _attention(
    sd: dict[str, torch.Tensor], ours: str, theirs: str, p: torch.Tensor
) -> dict[str, torch.Tensor]:
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


def _layer_state(
    sd: dict[str, torch.Tensor], side: str, i: int, p: torch.Tensor
) -> dict[str, torch.Tensor]:
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


def to_marian(model: EncoderDecoder, max_positions: int) -> MarianMTModel:
    """A MarianMTModel (eval mode) computing our model's function."""
    from transformers import MarianMTModel

    vocab = (model.src_embed.num_embeddings, model.tgt_embed.num_embeddings)
    marian: MarianMTModel = MarianMTModel(marian_config(model.cfg, vocab, max_positions)).eval()
    load_into(marian, model)
    generation = marian.generation_config
    generation.bad_words_ids = [[PAD_ID], [BOS_ID]]  # our searches never output them
    generation.max_length = max_positions  # transformers' default (20 tokens) cuts sentences
    return marian


def save_tokenizer(src_tok: Tokenizer, tgt_tok: Tokenizer, out_dir: Path) -> None:
    """MarianTokenizer's files: source.spm, target.spm and the vocabularies (piece -> our id)."""
    from transformers import MarianTokenizer

    for name, tok in (("source.spm", src_tok), ("target.spm", tgt_tok)):
        proto = tok.state()["model"]
        (out_dir / name).write_bytes(proto)  # type: ignore[arg-type]
    src_vocab = {t: i for i, t in enumerate(vocabulary(src_tok))}
    tgt_vocab = {t: i for i, t in enumerate(vocabulary(tgt_tok))}
    separate = src_vocab != tgt_vocab
    (out_dir / "vocab.json").write_text(json.dumps(src_vocab, ensure_ascii=False))
    target_vocab = None
    if separate:
        target_vocab = out_dir / "target_vocab.json"
        target_vocab.write_text(json.dumps(tgt_vocab, ensure_ascii=False))
    tokenizer = MarianTokenizer(
        str(out_dir / "source.spm"),
        str(out_dir / "target.spm"),
        str(out_dir / "vocab.json"),
        target_vocab_file=None if target_vocab is None else str(target_vocab),
        separate_vocabs=separate,
    )
    tokenizer.save_pretrained(out_dir)


def save(
    model: EncoderDecoder, src_tok: Tokenizer, tgt_tok: Tokenizer, out_dir: Path, max_pos: int
) -> None:
    """Write the MarianMTModel (config, safetensors weights) and its tokenizer into out_dir."""
    check_marian(model, src_tok, tgt_tok)
    to_marian(model, max_pos).save_pretrained(out_dir)
    save_tokenizer(src_tok, tgt_tok, out_dir)
