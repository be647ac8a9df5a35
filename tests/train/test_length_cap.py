"""The cap L of a length experiment: validation (and so best.pt) within L, the whole test
splits scored around L with each bucket's length ratio, and a reference run trained on every
length (data.length_cap) validated and scored like a capped one."""

from __future__ import annotations

from pathlib import Path

import pytest

from seq2seq.config.checks import check_data
from seq2seq.config.schema import DataConfig, TokenizerConfig, length_cap
from seq2seq.data.text import DataError, Split
from seq2seq.errors import ConfigError
from seq2seq.evaluation.scoring import length_ratio
from seq2seq.train.corpus import within_cap
from seq2seq.train.testing import score_checkpoint
from tests.train.test_trainer import tiny_trainer


def split_of(lengths: list[int]) -> Split:
    src = [" ".join(["w"] * n) for n in lengths]
    return Split(
        "valid",
        src,
        [f"t{i}" for i in range(len(lengths))],
        [[5] * n for n in lengths],
        [[6] for _ in lengths],
    )


def test_within_cap_keeps_exactly_the_short_sources_in_order() -> None:
    kept = within_cap(split_of([3, 9, 5, 6, 1]), 5)
    assert [len(ids) for ids in kept.src_ids] == [3, 5, 1]
    assert kept.tgt_text == ["t0", "t2", "t4"]  # the pairs stay together
    assert within_cap(split_of([3, 9]), 0).tgt_text == ["t0", "t1"]  # no cap: whole


def test_within_cap_refuses_a_split_with_nothing_short() -> None:
    with pytest.raises(DataError, match=r"no pair has a source of at most 2 tokens"):
        within_cap(split_of([3, 9]), 2)


def test_length_ratio_is_hypothesis_over_reference_tokens() -> None:
    refs = ["a b c d", "e f g h i j"]
    assert length_ratio(refs, refs) == 1.0
    assert length_ratio(["a b", "e f g"], refs) == round(5 / 10, 3)  # plain words: 13a tokens


def test_the_cap_of_a_reference_run_and_its_checks() -> None:
    assert length_cap(DataConfig(train_max_src_len=10)) == 10
    assert length_cap(DataConfig(length_cap=10)) == 10
    assert length_cap(DataConfig()) == 0
    with pytest.raises(ConfigError, match=r"data\.length_cap"):
        check_data(DataConfig(train_max_src_len=8, length_cap=10), TokenizerConfig())


@pytest.mark.parametrize("cap", ["data.train_max_src_len=6", "data.length_cap=6"])
def test_validation_is_within_the_cap_and_the_tests_are_whole(tmp_path: Path, cap: str) -> None:
    trainer = tiny_trainer(tmp_path, cap)
    try:
        whole = trainer.splits[trainer.cfg.data.valid]
        assert 0 < len(trainer.valid_split) < len(whole)
        assert all(len(ids) <= 6 for ids in trainer.valid_split.src_ids)
        assert len(trainer.valid_split) == sum(len(ids) <= 6 for ids in whole.src_ids)
        trainer.fit()
        results, length = score_checkpoint(trainer, trainer.ckpt_dir / "best.pt")
        assert length is not None
        test = trainer.splits["test"]
        assert length["all"]["n"] == len(test)  # the test split whole, not capped
        assert length["long"]["n"] == sum(len(ids) > 6 for ids in test.src_ids)
        assert all("len_ratio" in cell for cell in length["buckets"].values())
        assert results["test"]["bleu"] is not None
    finally:
        trainer.close()
