"""The seq2seq-evaluate entry point (the scores themselves are `scoring.py`'s and
`likelihood.py`'s).

`seq2seq-evaluate hyp=out.txt ref=test.de` scores a hypothesis file; `seq2seq-evaluate
ckpt=run/checkpoints/best.pt split=test` translates a split of the checkpoint's data and scores it.
Both print BLEU, chrF and TER with their sacreBLEU signatures; `json=-` prints them as JSON.
`by_length=true` adds BLEU, chrF and count per source-length bucket (`src=` gives the sources of
a hypothesis file); `score_refs=true` (with ckpt) adds the model's log-probabilities of the
references: one JSON line per sentence, corpus perplexity and perplexity by target position.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from seq2seq.cli.app import decode_settings, entry_point
from seq2seq.config.checks import check_decode
from seq2seq.config.schema import EvaluateConfig, register_configs
from seq2seq.errors import ConfigError
from seq2seq.evaluation.scoring import format_by_length, format_scores, score, scores_by_length

if TYPE_CHECKING:
    from seq2seq.decode.translator import Translator

log = logging.getLogger(__name__)


def translate_split(
    translator: Translator, pairs: list[tuple[str, str]], cfg: EvaluateConfig
) -> list[str]:
    """Translations of the pairs' sources with the checkpoint's decoding settings and the
    command line's changes (app.decode_settings)."""
    decode = decode_settings(cfg.decode, translator.decode)
    return [n[0].text for n in translator.hypotheses([p[0] for p in pairs], decode)]


def read_checkpoint_split(cfg: EvaluateConfig) -> tuple[Translator, list[tuple[str, str]]]:
    """The checkpoint's model and the (source, reference) pairs of `split` of its data (under
    data_root when given)."""
    from seq2seq.decode.translator import Translator
    from seq2seq.train.corpus import read_split

    translator = Translator.from_checkpoint(str(cfg.ckpt), cfg.device)
    data = translator.cfg.data
    if cfg.data_root is not None:
        data.root = cfg.data_root
    return translator, read_split(data, cfg.split)


def score_references(
    translator: Translator, pairs: list[tuple[str, str]], cfg: EvaluateConfig
) -> dict[str, object]:
    """Teacher-forced log-probabilities of the references: written as JSON lines to
    cfg.ref_logprobs (default <split>.ref_logprobs.jsonl), summed up as perplexities."""
    from seq2seq.evaluation.likelihood import perplexity, reference_logprobs, write_logprobs

    src_ids = translator.src_tok.encode_batch([p[0] for p in pairs])
    tgt_ids = translator.tgt_tok.encode_batch([p[1] for p in pairs])
    max_tokens = translator.cfg.trainer.max_tokens
    logprobs = reference_logprobs(translator.single("score_refs"), src_ids, tgt_ids, max_tokens)
    path = Path(cfg.ref_logprobs or f"{cfg.split}.ref_logprobs.jsonl")
    write_logprobs(path, logprobs, tgt_ids, translator.tgt_tok)
    return {**perplexity(logprobs), "output": str(path)}


def hypothesis_files(cfg: EvaluateConfig) -> tuple[list[str], list[str], list[str] | None]:
    """Hypotheses, references and (when src= is given) sources, checked to align."""
    from seq2seq.data.text import read_lines

    if cfg.ref is None:
        raise ConfigError("hyp= needs ref=: the reference file to score against")
    if cfg.score_refs:
        raise ConfigError("score_refs=true needs a model: give ckpt=PATH split=NAME, not hyp=")
    if cfg.by_length and cfg.src is None:
        raise ConfigError("by_length=true with hyp= needs src=: the source file of ref=")
    hyps, refs = read_lines(Path(cfg.hyp)), read_lines(Path(cfg.ref))  # type: ignore[arg-type]
    srcs = read_lines(Path(cfg.src)) if cfg.src is not None else None
    if srcs is not None and len(srcs) != len(refs):
        raise ConfigError(f"src={cfg.src} has {len(srcs)} lines but ref={cfg.ref} {len(refs)}")
    return hyps, refs, srcs


def evaluate(cfg: EvaluateConfig) -> tuple[str, dict[str, object]]:
    """The name of what was scored, and its scores (by length and of the references too, when
    asked)."""
    refscores = None
    if cfg.hyp is not None:
        hyps, refs, srcs = hypothesis_files(cfg)
        name = Path(cfg.hyp).name
    elif cfg.ckpt is not None:
        translator, pairs = read_checkpoint_split(cfg)
        if cfg.score_refs:
            refscores = score_references(translator, pairs, cfg)
        hyps = translate_split(translator, pairs, cfg)
        srcs, refs, name = [p[0] for p in pairs], [p[1] for p in pairs], cfg.split
    else:
        raise ConfigError("give ckpt=PATH (with split=NAME) or hyp=FILE ref=FILE")
    scores = score(hyps, refs, cfg.lowercase)
    if cfg.by_length and srcs is not None:
        scores["by_length"] = scores_by_length(srcs, hyps, refs, cfg.length_by.value)
    if refscores is not None:
        scores["ref_scores"] = refscores
    return name, scores


def report(name: str, scores: dict[str, object], cfg: EvaluateConfig) -> str:
    """The human-readable report: scores, the by-length table, the perplexities."""
    from seq2seq.evaluation.likelihood import format_perplexity

    parts = [format_scores(name, scores)]
    if "by_length" in scores:
        parts.append(format_by_length(scores["by_length"], cfg.length_by.value))  # type: ignore[arg-type]
    if "ref_scores" in scores:
        refs: dict[str, object] = scores["ref_scores"]  # type: ignore[assignment]
        parts.append(f"{format_perplexity(refs)}\nper-sentence log-probs: {refs['output']}")
    return "\n\n".join(parts)


def run(cfg: EvaluateConfig) -> dict[str, object]:
    """Score a hypothesis file, or a checkpoint on a split, as cfg says."""
    check_decode(cfg.decode)  # a bad value is an error even where it would go unused
    name, scores = evaluate(cfg)
    if cfg.json == "-":
        json.dump(scores, sys.stdout, indent=2)
        print()
    else:
        print(report(name, scores, cfg))
        if cfg.json:
            Path(cfg.json).write_text(json.dumps(scores, indent=2) + "\n")
    return scores


register_configs()
main = entry_point("evaluate", run)  # seq2seq-evaluate; user errors exit 1 with one line


if __name__ == "__main__":
    main()
