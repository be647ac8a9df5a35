"""Tests for seq2seq.evaluation.scoring: corpus scores with signatures, and scores by source
length (the buckets of the sweep report and of seq2seq-evaluate by_length=true)."""

from __future__ import annotations

import sacrebleu

from seq2seq.evaluation.scoring import (
    bucket_key,
    format_by_length,
    format_scores,
    length_bucket,
    length_generalization,
    length_groups,
    score,
    scores_by_length,
    token_bucket,
    token_buckets,
)

SRCS = ["one", "two, three", "four", "five, six, seven", "eight, nine"]
REFS = ["eins", "zwei, drei", "vier", "fünf, sechs, sieben", "acht, neun"]
HYPS = ["eins", "zwei, vier", "vier", "fünf, sechs", "acht, neun"]


def test_length_buckets() -> None:
    assert length_bucket("forty-two, seven hundred and one", "items") == "2"
    assert length_bucket("seven", "items") == "1"
    assert length_bucket(" ".join(["w"] * 10), "words") == "1-10"
    assert length_bucket(" ".join(["w"] * 11), "words") == "11-20"
    assert length_bucket(" ".join(["w"] * 40), "words") == "31-40"
    assert length_bucket(" ".join(["w"] * 41), "words") == "41+"
    assert sorted(["41+", "11-20", "all", "1-10"], key=bucket_key) == [
        "all",
        "1-10",
        "11-20",
        "41+",
    ]
    assert sorted(["10", "2", "all"], key=bucket_key) == ["all", "2", "10"]


def test_score_has_ter_with_its_signature() -> None:
    scores = score(HYPS, REFS, lowercase=True)
    ter = sacrebleu.TER()
    assert scores["ter"] == round(ter.corpus_score(HYPS, [REFS]).score, 2)
    assert scores["ter_signature"] == str(ter.get_signature())
    assert scores["ter"] > 0
    assert score(REFS, REFS)["ter"] == 0.0
    text = format_scores("x", scores)
    assert [line.split()[1] for line in text.splitlines()] == ["BLEU", "BLEU", "chrF", "TER"]


def test_scores_by_length_cover_the_corpus_and_match_sacrebleu_on_each_subset() -> None:
    rows = scores_by_length(SRCS, HYPS, REFS, "items")
    assert [r["bucket"] for r in rows] == ["all", "1", "2", "3"]
    assert rows[0]["n"] == len(SRCS) == sum(int(r["n"]) for r in rows[1:])  # type: ignore[call-overload]
    groups = length_groups(SRCS, "items")
    assert groups == {"1": [0, 2], "2": [1, 4], "3": [3]}
    for row in rows[1:]:
        idx = groups[str(row["bucket"])]
        hyps, refs = [HYPS[i] for i in idx], [REFS[i] for i in idx]
        bleu = sacrebleu.BLEU(effective_order=True).corpus_score(hyps, [refs]).score
        assert row["bleu"] == round(bleu, 2)
        assert row["chrf"] == round(sacrebleu.CHRF().corpus_score(hyps, [refs]).score, 2)
    assert rows[1]["bleu"] == 100.0  # type: ignore[arg-type]
    assert float(rows[2]["bleu"]) < 100.0  # type: ignore[arg-type]
    table = format_by_length(rows, "items")
    assert "eff:yes" in table
    assert len(table.splitlines()) == len(rows) + 2


def test_token_buckets_halve_the_cap_up_to_three_times_it() -> None:
    assert token_buckets(10) == [(1, 5), (6, 10), (11, 15), (16, 20), (21, 25), (26, 30)]
    assert token_buckets(5) == [
        (1, 2),
        (3, 4),
        (5, 6),
        (7, 8),
        (9, 10),
        (11, 12),
        (13, 14),
        (15, 15),
    ]
    assert token_buckets(1) == [(1, 1), (2, 2), (3, 3)]
    buckets = token_buckets(16)
    assert [token_bucket(n, buckets) for n in (1, 8, 9, 16, 17, 32, 33, 48, 49, 90)] == [
        "1-8",
        "1-8",
        "9-16",
        "9-16",
        "17-24",
        "25-32",
        "33-40",
        "41-48",
        "49+",
        "49+",
    ]


def test_length_generalization_splits_by_the_cap() -> None:
    """The long split holds exactly the sources over the cap; buckets partition the set; a
    perfect copy scores 100 everywhere and a wrong long half pulls only long scores down."""
    lens = [3, 8, 9, 16, 17, 20, 40]
    refs = [f"das ist satz nummer {i} und er ist gut" for i in range(len(lens))]
    perfect = length_generalization(lens, refs, refs, 16)
    assert perfect["max_src_len"] == 16
    assert perfect["all"]["n"] == len(lens)
    assert perfect["long"]["n"] == 3
    assert perfect["long"]["bleu"] == 100.0
    assert {b: c["n"] for b, c in perfect["buckets"].items()} == {
        "1-8": 2,
        "9-16": 2,
        "17-24": 2,
        "33-40": 1,
    }
    hyps = [r if n <= 16 else "völlig falsch" for n, r in zip(lens, refs, strict=True)]
    broken = length_generalization(lens, hyps, refs, 16)
    assert broken["buckets"]["9-16"]["bleu"] == 100.0
    assert broken["long"]["bleu"] < 5
    assert broken["all"]["bleu"] < 100
    none_long = length_generalization([1, 2], refs[:2], refs[:2], 16)
    assert none_long["long"] == {"n": 0, "bleu": None, "chrf": None, "len_ratio": None}
