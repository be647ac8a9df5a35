"""What benchmarks/decode.py decodes with: Multi30k sentences, a joint BPE vocabulary, our model
(briefly trained so that it ends sentences with EOS, then cached) and the same weights exported
as a Hugging Face Marian model and converted to CTranslate2.

Our model is set up to compute Marian's function: post-norm, sinusoidal positions, embeddings
scaled by sqrt(D), one matrix for source, target and output, ReLU. Two details are matched on
our side: the BOS embedding is kept at zero (CTranslate2 starts Marian's decoder from a zero
embedding) and Marian's sinusoids put the sines in the first half of the vector where ours
interleave sines and cosines, so every weight is copied with its model dimension permuted.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from seq2seq.build import build_optimizer
from seq2seq.config import ModelConfig, OptimConfig, PosEncodingConfig, PosKind
from seq2seq.data import collate, read_lines, token_batches
from seq2seq.loss import label_smoothed_nll
from seq2seq.model import EncoderDecoder
from seq2seq.positional import build_positional
from seq2seq.tokenizer import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, Tokenizer, build_tokenizers

if TYPE_CHECKING:
    from transformers import MarianConfig

ROOT = Path(__file__).resolve().parent.parent
MODEL = ModelConfig(d_model=256, n_heads=4, enc_layers=3, dec_layers=3, d_ff=1024, dropout=0.1,
                    norm_first=False, tie_output=True, share_embeddings=True)  # fmt: skip
NEG = -1e4  # logit bias of the extra vocabulary row CTranslate2's Marian loader drops


def data_root(arg: str | None) -> Path:
    """--data, else $MULTI30K_ROOT, else ../shared/data/multi30k beside the repository."""
    root = arg or os.environ.get("MULTI30K_ROOT") or str(ROOT.parent / "shared/data/multi30k")
    return Path(root)


def split_file(root: Path, name: str) -> Path:
    for candidate in (root / name, root / f"{name}.gz"):
        if candidate.exists():
            return candidate
    raise FileNotFoundError(f"{root}: no {name}[.gz]; pass --data or set MULTI30K_ROOT")


def load_tokenizer(root: Path, cache_dir: Path) -> Tokenizer:
    """Joint sentencepiece BPE, 8000 ids, trained on Multi30k train en + de (cached)."""
    en, de = read_lines(split_file(root, "train.en")), read_lines(split_file(root, "train.de"))
    tok, _ = build_tokenizers("bpe", en, de, vocab_size=8000, joint=True,
                              cache_dir=cache_dir / "tokenizers")  # fmt: skip
    return tok


def new_model(vocab: int, seed: int = 0) -> EncoderDecoder:
    torch.manual_seed(seed)
    pos = PosEncodingConfig(kind=PosKind.sinusoidal, max_len=1024)
    d, h = MODEL.d_model, MODEL.n_heads
    enc, dec = build_positional(pos, d, h, causal=False), build_positional(pos, d, h, causal=True)
    return EncoderDecoder(MODEL, vocab, vocab, enc, dec)


def _zero_bos(model: EncoderDecoder) -> None:
    with torch.no_grad():
        model.tgt_embed.weight[BOS_ID].zero_()


def train(model: EncoderDecoder, src: list[list[int]], tgt: list[list[int]], steps: int) -> None:
    """A short training run (AdamW, warmup), only so that outputs end with EOS at natural
    lengths; translation quality does not matter for speed."""
    optim = OptimConfig(lr=1e-3, warmup_steps=max(1, steps // 4))
    optimizer, schedule = build_optimizer(model, optim, torch.device("cpu"))
    lens = [len(s) + 1 for s in src]
    batches = token_batches(lens, [len(t) + 1 for t in tgt], 1500, shuffle=True, seed=1)
    model.train()
    for step in range(steps):
        batch = collate(batches[step % len(batches)], src, tgt)
        logits = model(batch.src, batch.tgt_in)  # (B, T, V)
        loss, _ = label_smoothed_nll(logits.flatten(0, 1), batch.tgt_out.flatten(), 0.1)
        (loss / batch.tgt_tokens).backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        _zero_bos(model)
    model.eval()


def model_path(tok: Tokenizer, cache_dir: Path, steps: int) -> Path:
    """Where the benchmark model's weights are cached, keyed by its settings and vocabulary."""
    proto = bytes(tok.state()["model"])  # type: ignore[arg-type]
    key = hashlib.sha256(repr((MODEL, steps)).encode() + proto).hexdigest()[:16]
    return cache_dir / f"decode_model_{key}.pt"


def load_model(root: Path, tok: Tokenizer, cache_dir: Path, steps: int) -> EncoderDecoder:
    """The benchmark model: trained `steps` steps on Multi30k (cached by settings)."""
    path = model_path(tok, cache_dir, steps)
    model = new_model(tok.vocab_size)
    _zero_bos(model)
    if path.exists():
        model.load_state_dict(torch.load(path, weights_only=True))
        return model.eval()
    if steps:
        en, de = read_lines(split_file(root, "train.en")), read_lines(split_file(root, "train.de"))
        train(model, tok.encode_batch(en), tok.encode_batch(de), steps)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)
    return model.eval()


def test_sources(root: Path, tok: Tokenizer, n: int) -> list[list[int]]:
    """Token ids of the first n sentences of test_2016_flickr.en (no EOS)."""
    return tok.encode_batch(read_lines(split_file(root, "test_2016_flickr.en"))[:n])


# --------------------------------------------------------------------------- export


def marian_permutation(d_model: int) -> torch.Tensor:
    """Marian feature j is our feature perm[j]: [sin 0, sin 1, ..., cos 0, cos 1, ...]."""
    return torch.cat((torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)))  # (D,)


def marian_config(vocab: int) -> MarianConfig:
    from transformers import MarianConfig

    m = MODEL
    return MarianConfig(
        vocab_size=vocab + 1, d_model=m.d_model, encoder_layers=m.enc_layers,
        decoder_layers=m.dec_layers, encoder_attention_heads=m.n_heads,
        decoder_attention_heads=m.n_heads, encoder_ffn_dim=m.d_ff, decoder_ffn_dim=m.d_ff,
        activation_function="relu", dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        scale_embedding=True, max_position_embeddings=512, pad_token_id=PAD_ID,
        eos_token_id=EOS_ID, bos_token_id=BOS_ID, decoder_start_token_id=BOS_ID,
        forced_eos_token_id=None, share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
    )  # fmt: skip


def marian_state(model: EncoderDecoder) -> dict[str, torch.Tensor]:
    """Our weights under Marian's names, model dimension permuted (see marian_permutation)."""
    d = model.cfg.d_model
    p = marian_permutation(d)
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    emb = sd["src_embed.weight"][:, p]  # (V, D)
    out = {"model.shared.weight": torch.cat((emb, emb.new_zeros(1, d)))}  # (V + 1, D)
    for side, n in (("encoder", model.cfg.enc_layers), ("decoder", model.cfg.dec_layers)):
        for i in range(n):
            out.update(_layer_state(sd, side, i, p))
    return out


def _attention(sd: dict, ours: str, theirs: str, p: torch.Tensor) -> dict[str, torch.Tensor]:
    d = p.numel()
    kv_w, kv_b = sd[f"{ours}.kv_proj.weight"], sd[f"{ours}.kv_proj.bias"]  # (2D, D), (2D,)
    return {
        f"{theirs}.q_proj.weight": sd[f"{ours}.q_proj.weight"][:, p],
        f"{theirs}.q_proj.bias": sd[f"{ours}.q_proj.bias"],
        f"{theirs}.k_proj.weight": kv_w[:d][:, p], f"{theirs}.k_proj.bias": kv_b[:d],
        f"{theirs}.v_proj.weight": kv_w[d:][:, p], f"{theirs}.v_proj.bias": kv_b[d:],
        f"{theirs}.out_proj.weight": sd[f"{ours}.out_proj.weight"][p],
        f"{theirs}.out_proj.bias": sd[f"{ours}.out_proj.bias"][p],
    }  # fmt: skip


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
    out.update({
        f"{theirs}.fc1.weight": sd[f"{ours}.ffn.up.weight"][:, p],
        f"{theirs}.fc1.bias": sd[f"{ours}.ffn.up.bias"],
        f"{theirs}.fc2.weight": sd[f"{ours}.ffn.down.weight"][p],
        f"{theirs}.fc2.bias": sd[f"{ours}.ffn.down.bias"][p],
        f"{theirs}.final_layer_norm.weight": sd[f"{ours}.res_ffn.norm.weight"][p],
        f"{theirs}.final_layer_norm.bias": sd[f"{ours}.res_ffn.norm.bias"][p],
    })  # fmt: skip
    return out


def vocabulary(tok: Tokenizer) -> list[str]:
    """Token strings by id, plus the extra last row. Our PAD is renamed "<blank>": CTranslate2's
    Marian loader drops a trailing "<pad>", which is the extra row."""
    pieces = [tok.id_to_token(i) for i in range(tok.vocab_size)]  # type: ignore[attr-defined]
    pieces[: len(SPECIAL_TOKENS)] = ["<blank>", *SPECIAL_TOKENS[1:]]
    return [*pieces, "<pad>"]


def export_marian(model: EncoderDecoder, tok: Tokenizer, out_dir: Path) -> Path:
    """Save a MarianMTModel with our weights (and a word-level tokenizer for the converter)."""
    from transformers import MarianMTModel

    marian = MarianMTModel(marian_config(tok.vocab_size)).eval()
    state = marian_state(model)
    missing, unexpected = marian.load_state_dict(state, strict=False)
    derived = ("embed_positions", "embed_tokens", "lm_head", "final_logits_bias")  # fixed or tied
    left = [k for k in missing if not any(name in k for name in derived)]
    if left or unexpected:
        raise RuntimeError(f"Marian export: missing {left}, unexpected {unexpected}")
    if not torch.equal(marian.lm_head.weight, state["model.shared.weight"]):
        raise RuntimeError("Marian export: the output layer is not tied to the embeddings")
    with torch.no_grad():
        marian.final_logits_bias[0, -1] = NEG  # the extra row is never chosen
    marian.save_pretrained(out_dir)
    _save_tokenizer(vocabulary(tok), out_dir)
    return out_dir


def _save_tokenizer(vocab: list[str], out_dir: Path) -> None:
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    word_level = HfTokenizer(WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="<unk>"))
    fast = PreTrainedTokenizerFast(tokenizer_object=word_level, eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>")  # fmt: skip
    fast.save_pretrained(out_dir)


def convert_ct2(marian_dir: Path, out_dir: Path, quantization: str) -> Path:
    """CTranslate2 model (float32 or int8) converted from the saved Marian model."""
    import ctranslate2

    converter = ctranslate2.converters.TransformersConverter(str(marian_dir))
    converter.convert(str(out_dir), quantization=quantization, force=True)
    return out_dir


def prepare(root: Path, cache_dir: Path, steps: int) -> tuple[dict[str, str], Tokenizer]:
    """Build everything once; returns the paths the engines load, and the tokenizer."""
    tok = load_tokenizer(root, cache_dir)
    model = load_model(root, tok, cache_dir, steps)
    key = hashlib.sha256(json.dumps(sorted(model.state_dict().keys())).encode())
    for value in model.state_dict().values():
        key.update(value.numpy().tobytes())
    base = cache_dir / f"decode_export_{key.hexdigest()[:16]}"
    marian = base / "marian"
    if not (marian / "config.json").exists():
        export_marian(model, tok, marian)
    for q in ("float32", "int8"):
        if not (base / f"ct2_{q}" / "model.bin").exists():
            convert_ct2(marian, base / f"ct2_{q}", q)
    paths = {
        "ours": str(model_path(tok, cache_dir, steps)),
        "marian": str(marian),
        "ct2_float32": str(base / "ct2_float32"),
        "ct2_int8": str(base / "ct2_int8"),
    }
    return paths, tok
