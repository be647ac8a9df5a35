"""Tests for seq2seq.cli.evaluate: scores by source length, the model's scores of the references
(score_refs), and their errors, in-process and through `python -m seq2seq.cli.evaluate` (the code of
the seq2seq-evaluate console script)."""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import subprocess
from pathlib import Path

import pytest
import sacrebleu

import seq2seq.cli.evaluate
from seq2seq.cli.evaluate import check_same_references
from seq2seq.config.commands import EvaluateConfig, LengthUnit, PairedTest, WeightType
from seq2seq.config.schema import SearchKind
from seq2seq.data.text import DataError
from seq2seq.errors import ConfigError
from seq2seq.evaluation.scoring import length_groups
from seq2seq.train.run import train
from tests.cli.test_translate import python
from tests.tiny_run import compose_train, tiny_overrides, write_slice

SIZES = {"train": 150, "valid": 20, "test": 30}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """best.pt of a tiny model trained for 12 steps on the numbers data."""
    root = tmp_path_factory.mktemp("evaluate")
    write_slice(root / "data", SIZES)
    cfg = compose_train(tiny_overrides(root / "data", root / "cache", "trainer.max_steps=12"))
    train(cfg, root / "run")
    return root / "run" / "checkpoints" / "best.pt"


def config(ckpt: Path, tmp_path: Path, **changes: object) -> EvaluateConfig:
    cfg = EvaluateConfig(ckpt=str(ckpt), split="test", device="cpu", **changes)  # type: ignore[arg-type]
    cfg.decode.method = SearchKind.greedy
    cfg.ref_logprobs = str(tmp_path / "refs.jsonl")
    return cfg


def test_int8_scores_the_split_and_refuses_to_score_references(ckpt: Path, tmp_path: Path) -> None:
    """Catches quantize=int8 not reaching the evaluated model, and reference scoring (teacher
    forcing through the float output layer) silently run on an int8 model."""
    scores = seq2seq.cli.evaluate.run(config(ckpt, tmp_path, quantize=WeightType.int8))
    assert scores["n"] == SIZES["test"]
    with pytest.raises(ConfigError, match="leave quantize=float32"):
        seq2seq.cli.evaluate.run(config(ckpt, tmp_path, quantize=WeightType.int8, score_refs=True))


def test_by_length_buckets_cover_the_split_and_match_sacrebleu(ckpt: Path, tmp_path: Path) -> None:
    cfg = config(ckpt, tmp_path, by_length=True, length_by=LengthUnit.items)
    scores = seq2seq.cli.evaluate.run(cfg)
    rows = scores["by_length"]
    assert isinstance(rows, list)
    assert rows[0]["bucket"] == "all"
    assert rows[0]["n"] == sum(r["n"] for r in rows[1:]) == SIZES["test"] == scores["n"]
    translator, pairs = seq2seq.cli.evaluate.read_checkpoint_split(cfg)
    hyps = seq2seq.cli.evaluate.translate_split(translator, pairs, cfg)
    groups = length_groups([src for src, _ in pairs], "items")
    assert [r["bucket"] for r in rows[1:]] == list(groups)
    assert len(groups) > 1
    for row in rows[1:]:
        idx = groups[row["bucket"]]
        sub_hyps, sub_refs = [hyps[i] for i in idx], [pairs[i][1] for i in idx]
        bleu = sacrebleu.BLEU(effective_order=True).corpus_score(sub_hyps, [sub_refs])
        assert row["bleu"] == round(bleu.score, 2)


def test_score_refs_perplexity_is_validations(ckpt: Path, tmp_path: Path) -> None:
    """Corpus perplexity of the references is exp(validation loss) on the same sentences: the
    teacher-forced NLL per token, EOS included, without label smoothing."""
    from seq2seq.decode.load import load_for_inference
    from seq2seq.train.corpus import encode_split
    from seq2seq.train.validation import validate

    cfg = config(ckpt, tmp_path, score_refs=True)
    refs = seq2seq.cli.evaluate.run(cfg)["ref_scores"]
    assert isinstance(refs, dict)
    model, src_tok, tgt_tok, train_cfg = load_for_inference(ckpt, "cpu")
    _translator, pairs = seq2seq.cli.evaluate.read_checkpoint_split(cfg)
    split = encode_split("test", pairs, src_tok, tgt_tok)
    train_cfg.trainer.valid_bleu_sentences = 1
    loss = validate(model, split, tgt_tok, train_cfg, contextlib.nullcontext)["loss"]
    assert refs["ppl"] == pytest.approx(math.exp(loss), rel=1e-5)
    lines = [json.loads(x) for x in Path(refs["output"]).read_text().splitlines()]
    assert [x["index"] for x in lines] == list(range(SIZES["test"]))
    assert sum(x["tokens"] for x in lines) == refs["tokens"]
    assert sum(x["nll"] for x in lines) / refs["tokens"] == pytest.approx(loss, rel=1e-5)


def test_systems_translate_the_split_each(ckpt: Path, tmp_path: Path) -> None:
    """systems=[best.pt,copy.pt]: each checkpoint translates the split on its own; a copy of
    the baseline scores the same, with p = 1 by both tests; the scores are those of ckpt=."""
    copy = tmp_path / "copy.pt"
    shutil.copy(ckpt, copy)
    cfg = config(ckpt, tmp_path, systems=[str(ckpt), str(copy)], names=["best", "copy"])
    cfg.ckpt, cfg.paired, cfg.paired_bs_n, cfg.paired_ar_n = None, PairedTest.both, 100, 100
    data = seq2seq.cli.evaluate.run(cfg)
    assert data["systems"] == ["best", "copy"]
    assert data["n_sentences"] == SIZES["test"]
    assert data["paths"] == {"best": [str(ckpt)], "copy": [str(copy)]}
    alone = seq2seq.cli.evaluate.run(config(ckpt, tmp_path))
    results = data["results"]
    assert isinstance(results, list)
    assert len(results) == 6
    for base, other in zip(results[::2], results[1::2], strict=True):
        assert base["score"] == other["score"]
        assert round(base["score"], 2) == alone[base["key"]]
        assert [(t["test"], t["p_value"]) for t in other["tests"]] == [("bs", 1.0), ("ar", 1.0)]


def test_checkpoints_must_translate_the_same_sentences() -> None:
    first = [("one", "eins"), ("two", "zwei")]
    check_same_references("b.pt", list(first), "a.pt", first)
    with pytest.raises(DataError, match=r"b\.pt's split has 1 lines but a\.pt's has 2"):
        check_same_references("b.pt", first[:1], "a.pt", first)
    with pytest.raises(DataError, match=r"b\.pt's split differs from a\.pt's at line 2"):
        check_same_references("b.pt", [first[0], ("three", "drei")], "a.pt", first)


def evaluate_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return python(["-m", "seq2seq.cli.evaluate", *args], cwd)


def test_console_script(ckpt: Path, tmp_path: Path) -> None:
    args = [f"ckpt={ckpt}", "split=valid", "device=cpu", "decode=greedy"]
    done = evaluate_cli([*args, "by_length=true", "score_refs=true", "json=-"], tmp_path)
    assert done.returncode == 0, done.stderr
    scores = json.loads(done.stdout)
    assert {"bleu", "chrf", "ter", "ter_signature", "by_length", "ref_scores"} <= scores.keys()
    assert scores["ter_signature"].startswith("nrefs:1|")
    default = tmp_path / "valid.ref_logprobs.jsonl"  # the default path, in the working directory
    assert scores["ref_scores"]["output"] == default.name
    assert len(default.read_text().splitlines()) == SIZES["valid"]
    table = evaluate_cli([*args, "by_length=true", "length_by=items"], tmp_path)
    assert table.returncode == 0, table.stderr
    assert "source items" in table.stdout
    assert "valid: TER" in table.stdout


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"by_length": True}, "by_length=true with hyp= needs src="),
        ({"score_refs": True}, "score_refs=true needs a model"),
        ({"src": "s.txt", "by_length": True}, "s.txt has 1 lines but ref="),
    ],
)
def test_bad_combinations_are_clear_errors(
    tmp_path: Path, changes: dict[str, object], message: str
) -> None:
    (tmp_path / "h.txt").write_text("sieben\nzwölf\n", encoding="utf-8")
    (tmp_path / "r.txt").write_text("sieben\nzwölf\n", encoding="utf-8")
    (tmp_path / "s.txt").write_text("seven\n", encoding="utf-8")
    if "src" in changes:
        changes["src"] = str(tmp_path / "s.txt")
    cfg = EvaluateConfig(hyp=str(tmp_path / "h.txt"), ref=str(tmp_path / "r.txt"), **changes)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=message):
        seq2seq.cli.evaluate.run(cfg)


def test_by_length_of_a_hypothesis_file(tmp_path: Path) -> None:
    (tmp_path / "h.txt").write_text("sieben\nzwölf, drei\n", encoding="utf-8")
    (tmp_path / "r.txt").write_text("sieben\nzwölf, vier\n", encoding="utf-8")
    (tmp_path / "s.txt").write_text("seven\ntwelve, four\n", encoding="utf-8")
    cfg = EvaluateConfig(
        hyp=str(tmp_path / "h.txt"),
        ref=str(tmp_path / "r.txt"),
        src=str(tmp_path / "s.txt"),
        by_length=True,
        length_by=LengthUnit.items,
    )
    rows = seq2seq.cli.evaluate.run(cfg)["by_length"]
    assert [(r["bucket"], r["n"]) for r in rows] == [("all", 2), ("1", 1), ("2", 1)]  # type: ignore[union-attr,index]
    assert rows[1]["bleu"] == 100.0  # type: ignore[index]
    assert rows[2]["bleu"] < 100.0  # type: ignore[index]
