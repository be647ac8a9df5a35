"""Scoring translations with sacreBLEU: corpus BLEU, chrF and TER with their signatures, and
BLEU and chrF by source-length bucket.

Used by validation (`metrics.py`), the test splits (`trainer.py`), `seq2seq-evaluate` and the
sweep report (`scripts/compare_runs.py`, which shares the length buckets). It does not import
torch, so that `seq2seq-evaluate hyp=... ref=...` starts quickly.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence

import sacrebleu
from sacrebleu.metrics.bleu import BLEUScore

# Source-length buckets: by whitespace words (1-10, 11-20, 21-30, 31-40, then "41+"), or by
# comma-separated items (the numbers data: one bucket per count).
WORD_BUCKETS = ((1, 10), (11, 20), (21, 30), (31, 40))
# BLEU of a bucket uses the effective n-gram order: standard corpus BLEU whenever the references
# hold 4-grams, but not 0 by definition for a bucket of references shorter than 4 tokens
BUCKET_BLEU = sacrebleu.BLEU(effective_order=True)
BUCKET_CHRF = sacrebleu.CHRF()


def score(
    hyps: list[str], refs: list[str], lowercase: bool = False, ter: bool = True
) -> dict[str, object]:
    """Corpus BLEU (13a, cased), chrF and, unless `ter` is False, TER (sacreBLEU's default:
    case-insensitive), plus lowercased BLEU when asked, with signatures."""
    if len(hyps) != len(refs):
        from seq2seq.data.text import DataError  # imports torch: only when it is needed

        raise DataError(f"{len(hyps)} hypotheses but {len(refs)} references: they must align")
    result: dict[str, object] = {"n": len(hyps)}
    metrics = {"bleu": sacrebleu.BLEU(), "chrf": sacrebleu.CHRF()}
    if ter:
        metrics["ter"] = sacrebleu.TER()
    if lowercase:
        metrics["bleu_lc"] = sacrebleu.BLEU(lowercase=True)
    for name, metric in metrics.items():
        result[name] = round(metric.corpus_score(hyps, [refs]).score, 2)
        result[f"{name}_signature"] = str(metric.get_signature())
    return result


LABELS = {"bleu": "BLEU", "bleu_lc": "BLEU lc", "chrf": "chrF", "ter": "TER"}


def format_scores(name: str, scores: dict[str, object]) -> str:
    """Human-readable lines: BLEU, (lowercased BLEU,) chrF and TER with signatures."""
    return "\n".join(
        f"{name}: {label} {scores[key]:.2f}  ({scores[f'{key}_signature']})"
        for key, label in LABELS.items()
        if key in scores
    )


# ----------------------------------------------------------------------------- by length


def count_items(src: str) -> int:
    """Number of comma-separated items in a source sentence (numbers data)."""
    return sum(1 for part in src.split(",") if part.strip())


def length_bucket(src: str, by: str) -> str:
    """Bucket label of a source sentence: its item count ("items"), or a word-count range
    ("words")."""
    if by == "items":
        return str(count_items(src))
    return token_bucket(len(src.split()), WORD_BUCKETS)


def leading_int(text: str) -> int:
    """The number a text starts with (sys.maxsize when none)."""
    match = re.match(r"\d+", text)
    return int(match.group()) if match else sys.maxsize


def bucket_key(bucket: str) -> tuple[int, str]:
    """Sort key: "all" first, then buckets by their leading number."""
    return (-1, bucket) if bucket == "all" else (leading_int(bucket), bucket)


def length_groups(srcs: list[str], by: str) -> dict[str, list[int]]:
    """The indices of the sentences in each non-empty length bucket, shortest bucket first."""
    groups: dict[str, list[int]] = {}
    for i, src in enumerate(srcs):
        groups.setdefault(length_bucket(src, by), []).append(i)
    return {b: groups[b] for b in sorted(groups, key=bucket_key)}


def bucket_scores(hyps: list[str], refs: list[str]) -> tuple[float, float]:
    """BLEU (effective order) and chrF of one bucket, to 2 decimals."""
    bleu = BUCKET_BLEU.corpus_score(hyps, [refs]).score
    return round(bleu, 2), round(BUCKET_CHRF.corpus_score(hyps, [refs]).score, 2)


def length_ratio(hyps: list[str], refs: list[str]) -> float:
    """Total hypothesis length over total reference length (sacreBLEU's tokens; BLEU's brevity
    penalty reads the same ratio), to 3 decimals."""
    return _ratio(BUCKET_BLEU.corpus_score(hyps, [refs]))


def _ratio(bleu: BLEUScore) -> float:
    return round(float(bleu.sys_len) / max(float(bleu.ref_len), 1.0), 3)


def bucket_cell(hyps: list[str], refs: list[str]) -> dict[str, object]:
    """{n, bleu, chrf, len_ratio} of one bucket (BLEU and the ratio from one BLEU pass)."""
    bleu = BUCKET_BLEU.corpus_score(hyps, [refs])
    chrf = BUCKET_CHRF.corpus_score(hyps, [refs]).score
    return {
        "n": len(hyps),
        "bleu": round(bleu.score, 2),
        "chrf": round(chrf, 2),
        "len_ratio": _ratio(bleu),
    }


def scores_by_length(
    srcs: list[str], hyps: list[str], refs: list[str], by: str
) -> list[dict[str, object]]:
    """{bucket, n, bleu, chrf} for the whole corpus ("all") and each source-length bucket."""
    rows: list[dict[str, object]] = []
    for bucket, idx in {"all": list(range(len(hyps))), **length_groups(srcs, by)}.items():
        bleu, chrf = bucket_scores([hyps[i] for i in idx], [refs[i] for i in idx])
        rows.append({"bucket": bucket, "n": len(idx), "bleu": bleu, "chrf": chrf})
    return rows


def format_by_length(rows: list[dict[str, object]], by: str) -> str:
    """The rows of scores_by_length as a table, with the signatures of its BLEU and chrF."""
    lines = [f"{'source ' + by:>14} {'n':>6} {'BLEU':>7} {'chrF':>7}"]
    lines += [f"{r['bucket']:>14} {r['n']:>6} {r['bleu']:>7.2f} {r['chrf']:>7.2f}" for r in rows]
    lines.append(f"BLEU {BUCKET_BLEU.get_signature()}  chrF {BUCKET_CHRF.get_signature()}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- trained short


def token_buckets(max_src_len: int) -> list[tuple[int, int]]:
    """Source-token buckets around a training cap L (data.train_max_src_len): halves of L up to
    3L, then one open bucket, so that a table shows 2-3x the training length and beyond apart;
    L=10 gives 1-5, 6-10, ..., 26-30, 31+."""
    half = max(1, max_src_len // 2)
    edges = list(range(half, 3 * max_src_len + 1, half))
    if edges[-1] != 3 * max_src_len:
        edges.append(3 * max_src_len)
    buckets, lo = [], 1
    for hi in edges:
        buckets.append((lo, hi))
        lo = hi + 1
    return buckets


def token_bucket(n: int, buckets: Sequence[tuple[int, int]]) -> str:
    """The label of the bucket holding a source of `n` tokens (or words): "lo-hi", or "lo+" past
    the last bucket."""
    for lo, hi in buckets:
        if n <= hi:
            return f"{lo}-{hi}"
    return f"{buckets[-1][1] + 1}+"


def length_generalization(
    src_lens: list[int], hyps: list[str], refs: list[str], max_src_len: int
) -> dict[str, object]:
    """Scores of a model trained on sources of at most `max_src_len` tokens, on test sentences
    of every length: {"all", "long": sources over the cap, "buckets": by source tokens}, each
    {n, bleu, chrf, len_ratio} (bucket BLEU and chrF: effective order, as scores_by_length;
    len_ratio: hypothesis / reference length, BLEU's tokens, which tells a model that stops
    early on long sources from one that rambles)."""
    buckets = token_buckets(max_src_len)
    groups: dict[str, list[int]] = {}
    for i, n in enumerate(src_lens):
        groups.setdefault(token_bucket(n, buckets), []).append(i)

    def cell(idx: list[int]) -> dict[str, object]:
        return bucket_cell([hyps[i] for i in idx], [refs[i] for i in idx])

    long = [i for i, n in enumerate(src_lens) if n > max_src_len]
    return {
        "max_src_len": max_src_len,
        "unit": "source tokens (the run's tokenizer, EOS not counted)",
        "all": cell(list(range(len(hyps)))),
        "long": cell(long) if long else {"n": 0, "bleu": None, "chrf": None, "len_ratio": None},
        "buckets": {b: cell(groups[b]) for b in sorted(groups, key=bucket_key)},
    }
