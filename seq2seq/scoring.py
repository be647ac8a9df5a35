"""Scoring translations with sacreBLEU: corpus BLEU and chrF with their signatures.

Used by validation (`metrics.py`), the test splits (`trainer.py`) and `seq2seq-evaluate`. It does
not import torch, so that `seq2seq-evaluate hyp=... ref=...` starts quickly.
"""

from __future__ import annotations

import sacrebleu


def score(hyps: list[str], refs: list[str], lowercase: bool = False) -> dict[str, object]:
    """Corpus BLEU (13a, cased) and chrF, plus lowercased BLEU when asked, with signatures."""
    if len(hyps) != len(refs):
        from seq2seq.data import DataError  # imports torch: only when it is needed

        raise DataError(f"{len(hyps)} hypotheses but {len(refs)} references: they must align")
    bleu = sacrebleu.BLEU()
    chrf = sacrebleu.CHRF()
    result: dict[str, object] = {
        "n": len(hyps),
        "bleu": round(bleu.corpus_score(hyps, [refs]).score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "chrf": round(chrf.corpus_score(hyps, [refs]).score, 2),
        "chrf_signature": str(chrf.get_signature()),
    }
    if lowercase:
        bleu_lc = sacrebleu.BLEU(lowercase=True)
        result["bleu_lc"] = round(bleu_lc.corpus_score(hyps, [refs]).score, 2)
        result["bleu_lc_signature"] = str(bleu_lc.get_signature())
    return result


def format_scores(name: str, scores: dict[str, object]) -> str:
    """Human-readable lines: BLEU, chrF (and lowercased BLEU) with signatures."""
    lines = [f"{name}: BLEU {scores['bleu']:.2f}  ({scores['bleu_signature']})"]
    if "bleu_lc" in scores:
        lines.append(f"{name}: BLEU lc {scores['bleu_lc']:.2f}  ({scores['bleu_lc_signature']})")
    lines.append(f"{name}: chrF {scores['chrf']:.2f}  ({scores['chrf_signature']})")
    return "\n".join(lines)
