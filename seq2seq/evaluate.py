"""Scoring with sacreBLEU, and the seq2seq-evaluate entry point.

`seq2seq-evaluate hyp=out.txt ref=test.de` scores a hypothesis file; `seq2seq-evaluate
ckpt=run/checkpoints/best.pt split=test` translates a split of the checkpoint's data and scores it.
Both print BLEU and chrF with their sacreBLEU signatures; `json=-` prints them as JSON.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import sacrebleu

from seq2seq.cli import entry_point
from seq2seq.config import ConfigError, DecodeConfig, EvaluateConfig, check_decode, register_configs

log = logging.getLogger(__name__)


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


def translate_split(
    ckpt: str, split: str, data_root: str | None, decode: DecodeConfig, device: str
) -> tuple[list[str], list[str]]:
    """Translate `split` of the checkpoint's data set; returns hypotheses and references."""
    from seq2seq.build import load_for_inference, read_split
    from seq2seq.search import translate_ids

    model, src_tok, tgt_tok, cfg = load_for_inference(ckpt, device)
    if data_root is not None:
        cfg.data.root = data_root
    pairs = read_split(cfg.data, split)
    ids = src_tok.encode_batch([p[0] for p in pairs])
    hyps = translate_ids(model, ids, decode, cfg.data.max_len)
    return [tgt_tok.decode(h[0].tokens) for h in hyps], [p[1] for p in pairs]


def run(cfg: EvaluateConfig) -> dict[str, object]:
    """Score a hypothesis file, or a checkpoint on a split, as cfg says."""
    from seq2seq.data import read_lines

    check_decode(cfg.decode)  # a bad value is an error even where it would go unused
    if cfg.hyp is not None:
        if cfg.ref is None:
            raise ConfigError("hyp= needs ref=: the reference file to score against")
        hyps, refs = read_lines(Path(cfg.hyp)), read_lines(Path(cfg.ref))
        name = Path(cfg.hyp).name
    elif cfg.ckpt is not None:
        hyps, refs = translate_split(cfg.ckpt, cfg.split, cfg.data_root, cfg.decode, cfg.device)
        name = cfg.split
    else:
        raise ConfigError("give ckpt=PATH (with split=NAME) or hyp=FILE ref=FILE")
    scores = score(hyps, refs, cfg.lowercase)
    if cfg.json == "-":
        json.dump(scores, sys.stdout, indent=2)
        print()
    else:
        print(format_scores(name, scores))
        if cfg.json:
            Path(cfg.json).write_text(json.dumps(scores, indent=2) + "\n")
    return scores


register_configs()
main = entry_point("evaluate", run)  # seq2seq-evaluate; user errors exit 1 with one line


if __name__ == "__main__":
    main()
