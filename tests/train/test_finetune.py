"""finetune.py: trainer.init_from starts a new run from another run's weights and tokenizers."""

from __future__ import annotations

import gzip
import json
import logging
import re
from pathlib import Path

import pytest
import torch

from seq2seq.errors import ConfigError
from seq2seq.train.build import build_trainer
from seq2seq.train.checkpoint import CheckpointError, load_checkpoint
from seq2seq.train.finetune import adopt, check_overrides, load_source
from seq2seq.train.resume import find_checkpoint
from seq2seq.train.run import train
from tests.tiny_run import NUMBERS, compose_train, tiny_overrides, write_slice


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny run of 12 steps: its last.pt is what the tests fine-tune from."""
    root = tmp_path_factory.mktemp("finetune")
    data = write_slice(root / "data")
    train(compose_train(tiny_overrides(data, root / "cache")), root / "source")
    return root


def overrides(root: Path, *extra: str) -> list[str]:
    init = f"trainer.init_from={root / 'source' / 'checkpoints' / 'last.pt'}"
    return tiny_overrides(root / "data", root / "cache", init, *extra)


def test_a_finetuning_run_starts_at_step_0_from_the_source_weights(
    source: Path, tmp_path: Path
) -> None:
    cfg = compose_train(overrides(source, "trainer.init_reset=false"))
    for name in ("tuned", "fresh"):
        (tmp_path / name).mkdir()
    tuned = build_trainer(cfg, tmp_path / "tuned")
    path = source / "source" / "checkpoints" / "last.pt"
    resumed = build_trainer(
        compose_train(overrides(source)), source / "source", find_checkpoint("auto", path.parent)
    )
    try:
        assert tuned.state.step == 0
        assert tuned.state.epoch == 0
        assert resumed.state.step == 12
        for name, tensor in resumed.model.state_dict().items():
            assert torch.equal(tensor, tuned.model.state_dict()[name]), name
        assert tuned.validate()["loss"] == pytest.approx(resumed.validate()["loss"], rel=1e-6)
        moments = lambda t: [v for s in t.optimizer.state.values() for v in s.values()]  # noqa: E731
        assert all(torch.equal(a, b) for a, b in zip(moments(tuned), moments(resumed), strict=True))
        assert tuned.optimizer.param_groups[0]["initial_lr"] == cfg.optim.lr
    finally:
        tuned.close()
        resumed.close()
    fresh = build_trainer(compose_train(overrides(source)), tmp_path / "fresh")
    assert not fresh.optimizer.state  # init_reset (the default): a new optimizer
    fresh.close()


def test_a_finetuning_run_logs_its_source_and_resumes(
    source: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    args = overrides(source, "trainer.max_steps=4")
    train(compose_train(args), tmp_path / "tuned", args)
    assert any("step 0 (the weights of" in r.getMessage() for r in caplog.records)
    results = json.loads((tmp_path / "tuned" / "results.json").read_text())
    path = source / "source" / "checkpoints" / "last.pt"
    assert results["init_from"]["path"] == str(path)
    assert len(results["init_from"]["sha256"]) == 64
    assert results["steps"] == 4
    steps = [json.loads(line) for line in (tmp_path / "tuned" / "train_log.jsonl").open()]
    assert next(r["step"] for r in steps if r.get("type") == "train") == 1  # from step 0
    more = overrides(source, "trainer.max_steps=6")
    train(compose_train(more), tmp_path / "tuned", more)  # resumes the fine-tuning run
    resumed = json.loads((tmp_path / "tuned" / "results.json").read_text())
    assert resumed["steps"] == 6
    assert resumed["resumed_from"].endswith("last.pt")


def test_a_conflicting_model_override_is_refused(source: Path) -> None:
    src = load_source(str(source / "source" / "checkpoints" / "last.pt"))
    cfg = compose_train(overrides(source, "model.d_model=64"))
    with pytest.raises(ConfigError, match=r"model\.d_model is 64 on the command line but 32"):
        check_overrides(cfg, src, ["model.d_model=64"])
    check_overrides(compose_train(overrides(source)), src, ["model.d_model=32"])  # agrees


def test_a_finetuning_run_chooses_its_own_subword_sampling(source: Path) -> None:
    """tokenizer.sampling trains, it fixes nothing in the model: the command line's is kept,
    on its own or with the tokenizer group named (the source was trained without it)."""
    src = load_source(str(source / "source" / "checkpoints" / "last.pt"))
    for extra in (
        ["tokenizer.sampling.bpe_dropout=0.1"],
        ["tokenizer=bpe", "tokenizer.sampling.bpe_dropout=0.1"],
    ):
        cfg = compose_train(overrides(source, *extra))
        check_overrides(cfg, src, extra)
        adopt(cfg, src)
        assert cfg.tokenizer.sampling.bpe_dropout == 0.1
        assert src.cfg.tokenizer.sampling.bpe_dropout == 0.0
        assert cfg.tokenizer.vocab_size == src.cfg.tokenizer.vocab_size
    cfg = compose_train(overrides(source, "tokenizer=unigram"))
    with pytest.raises(ConfigError, match=r"tokenizer is .* on the command line"):
        check_overrides(cfg, src, ["tokenizer=unigram"])  # the vocabulary stays the source's


def test_a_checkpoint_of_another_vocabulary_is_a_clear_error(source: Path, tmp_path: Path) -> None:
    state = load_checkpoint(source / "source" / "checkpoints" / "last.pt")
    tokens = ["<pad>", "<s>", "</s>", "<unk>", "a", "b"]
    state["tokenizers"] = {side: {"kind": "char", "tokens": tokens} for side in ("src", "tgt")}
    torch.save(state, tmp_path / "other.pt")
    cfg = compose_train([*overrides(source), f"trainer.init_from={tmp_path / 'other.pt'}"])
    with pytest.raises(CheckpointError, match=r"other\.pt: its weights do not fit"):
        build_trainer(cfg, tmp_path / "tuned")


def numbers_lines(split: str, lang: str) -> list[str]:
    with gzip.open(NUMBERS / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def test_finetuning_on_longer_phrases_raises_their_bleu(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A numbers model trained on short phrases, fine-tuned on long ones: the BLEU of held-out
    long phrases (the validation split) goes up from the source weights' (step 0)."""
    caplog.set_level(logging.INFO)
    data = tmp_path / "data"
    data.mkdir()
    for lang in ("en", "de"):
        long = numbers_lines("test_long", lang)
        splits = {"train": numbers_lines("train", lang)[:3000], "test": long[:20]}
        splits["valid"] = numbers_lines("valid", lang)[:50]
        splits |= {"long": long[:400], "longval": long[400:450]}
        for split, lines in splits.items():
            (data / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    model = ["model.d_model=64", "model.d_ff=128", "model.enc_layers=2", "model.dec_layers=2"]
    common = [*model, "model.dropout=0.0", "trainer.max_tokens=1024", "trainer.max_steps=300"]
    common += ["trainer.valid_every=1000", "trainer.valid_bleu_sentences=50"]
    first = tiny_overrides(data, tmp_path / "cache", *common, "optim.lr=0.005")
    first.append("optim.warmup_steps=30")
    train(compose_train(first), tmp_path / "source", first)
    source = tmp_path / "source" / "checkpoints" / "last.pt"
    tune = [*common, "data.train=[long]", "data.valid=longval", f"trainer.init_from={source}"]
    tune = tiny_overrides(data, tmp_path / "cache", *tune, "optim.lr=0.002")
    tune.append("optim.warmup_steps=0")
    train(compose_train(tune), tmp_path / "tuned", tune)
    start = next(r.getMessage() for r in caplog.records if "step 0 (the weights" in r.getMessage())
    bleu_at_0 = float(re.search(r"BLEU ([\d.]+)", start).group(1))  # type: ignore[union-attr]
    results = json.loads((tmp_path / "tuned" / "results.json").read_text())
    assert results["steps"] == 300
    assert results["best_valid_bleu"] > bleu_at_0 + 5
