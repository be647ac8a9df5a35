"""The seq2seq-evaluate entry point (the scores themselves are `scoring.py`'s).

`seq2seq-evaluate hyp=out.txt ref=test.de` scores a hypothesis file; `seq2seq-evaluate
ckpt=run/checkpoints/best.pt split=test` translates a split of the checkpoint's data and scores it.
Both print BLEU and chrF with their sacreBLEU signatures; `json=-` prints them as JSON.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from seq2seq.cli import entry_point
from seq2seq.config import ConfigError, DecodeConfig, EvaluateConfig, check_decode, register_configs
from seq2seq.scoring import format_scores, score

log = logging.getLogger(__name__)


def translate_split(
    ckpt: str, split: str, data_root: str | None, decode: DecodeConfig, device: str
) -> tuple[list[str], list[str]]:
    """Translate `split` of the checkpoint's data set with the checkpoint's decoding settings
    and the command line's changes (translate.decode_settings); returns hypotheses and
    references."""
    from seq2seq.corpus import read_split
    from seq2seq.translate import decode_settings
    from seq2seq.translator import Translator

    translator = Translator.from_checkpoint(ckpt, device)
    decode = decode_settings(decode, translator.decode)
    data = translator.cfg.data
    if data_root is not None:
        data.root = data_root
    pairs = read_split(data, split)
    hyps = translator.hypotheses([p[0] for p in pairs], decode)
    return [n[0].text for n in hyps], [p[1] for p in pairs]


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
