"""train/validation.py with tokenizer.lowercase: validation BLEU of a model whose tokenizer
folds case, and the option through the config."""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace

import pytest

import seq2seq.train.validation
from seq2seq.data.tokenizer import build_vocab, tokenizer_from_state
from seq2seq.model.transformer import build_model
from seq2seq.train.checkpoint import load_checkpoint
from seq2seq.train.corpus import encode_split
from seq2seq.train.run import train
from seq2seq.train.validation import validate
from tests.tiny_run import compose_train, tiny_overrides, write_slice

PAIRS = [(f"{n} Apples", f"Die {n} Äpfel Sind Rot") for n in range(12)]


@pytest.mark.parametrize("lowercase", [True, False])
def test_a_case_folding_model_is_scored_against_lowercased_references(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lowercase: bool
) -> None:
    """The greedy translations are the references themselves, lowercased (what a case-folding
    model writes at best): BLEU 100 when the tokenizer folds case, below it when it does not
    (its references keep their capitals)."""
    texts = [text for pair in PAIRS for text in pair]
    tok = build_vocab("word", texts, vocab_size=100, lowercase=lowercase)
    split = encode_split("valid", PAIRS, tok, tok)
    lowered = [SimpleNamespace(tokens=tok.encode(t.lower())) for _, t in PAIRS]

    def echo(_model: object, src_ids: list[list[int]], *_args: object) -> list[list[object]]:
        return [[lowered[i]] for i in range(len(src_ids))]

    monkeypatch.setattr(seq2seq.train.validation, "translate_ids", echo)
    cfg = compose_train(tiny_overrides(tmp_path, tmp_path, "trainer.valid_bleu_sentences=0"))
    model = build_model(cfg, tok.vocab_size, tok.vocab_size)
    scores = validate(model, split, tok, cfg, contextlib.nullcontext)
    assert (scores["bleu"] == pytest.approx(100.0)) is lowercase
    assert (scores["chrf"] == pytest.approx(100.0)) is lowercase


def test_tokenizer_lowercase_through_the_config(tmp_path: Path) -> None:
    """tokenizer.lowercase=true on capitalised text: the run's checkpoint carries a case-folding
    tokenizer, and the test split's translations are lowercase."""
    data = write_slice(tmp_path / "data")
    for path in data.iterdir():  # capitalise every word of the (lowercase) numbers data
        path.write_text(path.read_text(encoding="utf-8").title(), encoding="utf-8")
    extra = ["tokenizer.lowercase=true", "trainer.max_steps=4", "trainer.keep_last=0"]
    cfg = compose_train(tiny_overrides(data, tmp_path / "cache", *extra))
    assert cfg.tokenizer.lowercase
    train(cfg, tmp_path / "run")
    state = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["tokenizers"]
    assert tokenizer_from_state(state["tgt"]).lowercase
    assert tokenizer_from_state(state["src"]).lowercase
    hyps = (tmp_path / "run" / "test.hyp").read_text(encoding="utf-8")
    assert hyps.strip()
    assert hyps == hyps.lower()
