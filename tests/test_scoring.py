"""Tests for seq2seq.scoring: corpus scores with signatures, and scores by source length (the
buckets of the sweep report and of seq2seq-evaluate by_length=true)."""

from __future__ import annotations

import sacrebleu

from seq2seq.scoring import (
    bucket_key,
    format_by_length,
    format_scores,
    length_bucket,
    length_groups,
    score,
    scores_by_length,
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
    assert scores["ter"] > 0 and score(REFS, REFS)["ter"] == 0.0
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
    assert rows[1]["bleu"] == 100.0 and float(rows[2]["bleu"]) < 100.0  # type: ignore[arg-type]
    table = format_by_length(rows, "items")
    assert "eff:yes" in table and len(table.splitlines()) == len(rows) + 2
