"""What benchmarks/decode.py decodes with: Multi30k sentences, a joint BPE vocabulary, our model
(trained briefly, but long enough that it ends its own sentences with EOS; then cached) and the
same weights exported by the product's exporters (seq2seq-export's modules) as a Hugging Face
Marian model and as CTranslate2 models, with a check that the Marian export computes our logits.

Our model is set up so that Marian can express it: post-norm, sinusoidal positions, embeddings
scaled by sqrt(D), one matrix for source, target and output, ReLU. The BOS embedding is kept at
zero, as when the CTranslate2 model was converted from Marian's (whose decoder starts from a zero
embedding): the cached model and the earlier figures stay comparable.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import common  # noqa: F401  before torch: MKL's Intel path on AMD (common.py)
import torch
from common import split_file

from seq2seq.config.schema import (
    ModelConfig,
    OptimConfig,
    PosEncodingConfig,
    PosKind,
    Precision,
    TrainConfig,
    TrainerConfig,
)
from seq2seq.data.text import read_lines
from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer, build_tokenizers
from seq2seq.model.transformer import EncoderDecoder, build_positional
from seq2seq.train.build import build_optimizer

MODEL = ModelConfig(
    d_model=256,
    n_heads=4,
    enc_layers=3,
    dec_layers=3,
    d_ff=1024,
    dropout=0.1,
    norm_first=False,
    tie_output=True,
    share_embeddings=True,
)
CHECK_SENTENCES = 32  # test sentences whose teacher-forced logits ours and Marian's compare


@dataclass(frozen=True)
class TrainSettings:
    """How the benchmark model is trained. The cache key holds all of it, so a change trains a
    new model. Early models repeat themselves up to the length cap before they learn to end
    their sentences; 300 steps of 4,096 tokens are past that phase with a margin (the shares
    at the cap by step count are in docs/BENCHMARKS.md, "Decoding speed" notes), and the run
    stops if more than 10% of our natural-length outputs still hit the cap."""

    steps: int = 300
    max_tokens: int = 4096  # padded tokens a batch (data.token_batches)
    lr: float = 1e-3
    warmup: int = 100
    # the Trainer's trainer.precision: auto takes the faster of fp32 and bf16 on this CPU (the
    # weights stay float32 either way)
    precision: str = "auto"


def load_tokenizer(root: Path, cache_dir: Path) -> Tokenizer:
    """Joint sentencepiece BPE, 8000 ids, trained on Multi30k train en + de (cached)."""
    en, de = read_lines(split_file(root, "train.en")), read_lines(split_file(root, "train.de"))
    tok, _ = build_tokenizers(
        "bpe", en, de, vocab_size=8000, joint=True, cache_dir=cache_dir / "tokenizers"
    )
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


def train(
    model: EncoderDecoder,
    tok: Tokenizer,
    pairs: tuple[list[str], list[str]],
    settings: TrainSettings,
) -> str:
    """A short training run with the product's Trainer.train_step (AdamW, warmup, label
    smoothing 0.1, clipping 1.0), only so that outputs end with EOS at natural lengths; the
    translation quality does not matter for speed."""
    from seq2seq.data.text import Split
    from seq2seq.train.corpus import corpus_from_splits
    from seq2seq.train.trainer import Trainer

    cfg = TrainConfig(
        model=MODEL,
        pos_encoding=PosEncodingConfig(kind=PosKind.sinusoidal, max_len=1024),
        optim=OptimConfig(lr=settings.lr, warmup_steps=settings.warmup),
        trainer=TrainerConfig(
            max_tokens=settings.max_tokens,
            seed=1,
            device="cpu",
            precision=Precision(settings.precision),
            progress=False,
        ),
    )
    src, tgt = tok.encode_batch(pairs[0]), tok.encode_batch(pairs[1])
    split = Split("train", *pairs, src, tgt)
    corpus = corpus_from_splits(cfg, split, {cfg.data.valid: split}, (tok, tok))
    optimizer, scheduler = build_optimizer(
        model, cfg.optim, torch.device("cpu"), cfg.trainer.max_steps
    )
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(cfg, model, optimizer, scheduler, corpus, Path(run_dir))
        batches = trainer.epoch_batches(0)
        model.train()
        for step in range(settings.steps):
            trainer.train_step([corpus.train.collate(batches[step % len(batches)])])
            _zero_bos(model)
        trainer.close()
    model.eval()
    return trainer.precision.value


def model_path(tok: Tokenizer, cache_dir: Path, settings: TrainSettings) -> Path:
    """Where the benchmark model's weights are cached, keyed by its model and training settings
    and its vocabulary."""
    proto = bytes(tok.state()["model"])  # type: ignore[arg-type]
    key = hashlib.sha256(repr((MODEL, settings)).encode() + proto).hexdigest()[:16]
    return cache_dir / f"decode_model_{key}.pt"


def load_model(
    root: Path, tok: Tokenizer, cache_dir: Path, settings: TrainSettings
) -> EncoderDecoder:
    """The benchmark model, trained as `settings` say on Multi30k (cached by settings)."""
    path = model_path(tok, cache_dir, settings)
    model = new_model(tok.vocab_size)
    _zero_bos(model)
    if path.exists():
        model.load_state_dict(torch.load(path, weights_only=True))
        return model.eval()
    precision = "none (untrained)"
    if settings.steps:
        en, de = read_lines(split_file(root, "train.en")), read_lines(split_file(root, "train.de"))
        precision = train(model, tok, (en, de), settings)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps({"precision": precision}))
    torch.save(model.state_dict(), path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)
    return model.eval()


def trained_precision(tok: Tokenizer, cache_dir: Path, settings: TrainSettings) -> str:
    """The precision the cached benchmark model was trained in (what precision=auto chose)."""
    side = model_path(tok, cache_dir, settings).with_suffix(".json")
    return json.loads(side.read_text())["precision"] if side.exists() else "not recorded"


def test_sources(root: Path, tok: Tokenizer, n: int, lang: str = "en") -> list[list[int]]:  # noqa: PT028 - the test split's, not a pytest test
    """Token ids of the first n sentences of test_2016_flickr.<lang> (no EOS)."""
    return tok.encode_batch(read_lines(split_file(root, f"test_2016_flickr.{lang}"))[:n])


# --------------------------------------------------------------------------- export


def vocabulary(tok: Tokenizer) -> list[str]:
    """Token strings by id, as the CTranslate2 export has them."""
    from seq2seq.export.ctranslate2 import vocabulary as ct2_vocabulary

    return ct2_vocabulary(tok)


def export_all(model: EncoderDecoder, tok: Tokenizer, base: Path) -> None:
    """The product's exporters (seq2seq.export.huggingface, seq2seq.export.ctranslate2): a
    MarianMTModel folder and CTranslate2 folders in float32 and int8."""
    from seq2seq.export import ctranslate2 as export_ct2
    from seq2seq.export import huggingface as export_hf

    if not (base / "marian" / "config.json").exists():
        export_hf.to_marian(model, max_positions=512).save_pretrained(base / "marian")
    for q in ("float32", "int8"):
        out = base / f"ct2_{q}"
        if not (out / "model.bin").exists():
            out.mkdir(parents=True, exist_ok=True)
            export_ct2.save(export_ct2.build_spec(model, tok, tok, 1024), out, q)


def prepare(
    root: Path, cache_dir: Path, settings: TrainSettings
) -> tuple[dict[str, str], Tokenizer, EncoderDecoder]:
    """Build everything once; returns the paths the engines load, the tokenizer and our model."""
    tok = load_tokenizer(root, cache_dir)
    model = load_model(root, tok, cache_dir, settings)
    key = hashlib.sha256(json.dumps(sorted(model.state_dict().keys())).encode())
    for value in model.state_dict().values():
        key.update(value.numpy().tobytes())
    # v2: the product's exporters (no extra vocabulary row, our own special tokens)
    base = cache_dir / f"decode_export_v2_{key.hexdigest()[:16]}"
    export_all(model, tok, base)
    paths = {
        "ours": str(model_path(tok, cache_dir, settings)),
        "marian": str(base / "marian"),
        "ct2_float32": str(base / "ct2_float32"),
        "ct2_int8": str(base / "ct2_int8"),
    }
    return paths, tok, model


def _teacher_forced(src_ids: list[list[int]], tgt_ids: list[list[int]]) -> dict[str, torch.Tensor]:
    """Padded sources (with EOS), decoder inputs (BOS + target) and the mask of real positions."""

    def pad(rows: list[list[int]]) -> torch.Tensor:
        width = max(len(r) for r in rows)
        return torch.tensor([r + [PAD_ID] * (width - len(r)) for r in rows])

    src = pad([[*s, EOS_ID] for s in src_ids])  # (B, S)
    tgt_in = pad([[BOS_ID, *t] for t in tgt_ids])  # (B, T)
    return {"src": src, "tgt_in": tgt_in, "real": tgt_in.ne(PAD_ID)}


@torch.inference_mode()
def export_check(
    model: EncoderDecoder, marian_dir: str, src_ids: list[list[int]], tgt_ids: list[list[int]]
) -> dict[str, Any]:
    """Teacher-forced logits of our model and of the exported Marian model (each attention
    implementation) on the same sentences: the largest absolute difference at real positions
    (the extra vocabulary row left out), next to the largest absolute logit."""
    from transformers import MarianMTModel
    from transformers.utils import logging

    logging.disable_progress_bar()  # a bar per model load, on every run
    batch = _teacher_forced(src_ids, tgt_ids)
    ours = model.eval().logits(batch["src"], batch["tgt_in"])[batch["real"]]  # (K, V)
    diffs = {}
    for attention in ("sdpa", "eager"):
        marian = MarianMTModel.from_pretrained(marian_dir, attn_implementation=attention).eval()
        theirs = marian(
            input_ids=batch["src"],
            attention_mask=batch["src"].ne(PAD_ID),
            decoder_input_ids=batch["tgt_in"],
        ).logits  # (B, T, V)
        diffs[attention] = float((theirs[batch["real"]] - ours).abs().max())
    return {
        "sentences": len(src_ids),
        "positions": int(batch["real"].sum()),
        "max_abs_logit_diff": diffs,
        "max_abs_logit": float(ours.abs().max()),
    }
