"""The seq2seq-evaluate entry point (the scores themselves are `scoring.py`'s and
`likelihood.py`'s).

`seq2seq-evaluate hyp=out.txt ref=test.de` scores a hypothesis file; `seq2seq-evaluate
ckpt=run/checkpoints/best.pt split=test` translates a split of the checkpoint's data and scores it.
Both print BLEU, chrF and TER with their sacreBLEU signatures; `json=-` prints them as JSON.
`by_length=true` adds BLEU, chrF and count per source-length bucket (`src=` gives the sources of
a hypothesis file); `score_refs=true` (with ckpt) adds the model's log-probabilities of the
references: one JSON line per sentence, corpus perplexity and perplexity by target position.

Comparisons: `hyp=[base.txt,new.txt] ref=test.de` (files) or `systems=[base.pt,new.pt]` (each
checkpoint translates `split` on its own) test every system against the first with sacreBLEU's
paired tests (`paired=bs|ar|both`), Holm-adjusted over the report (evaluation/comparison.py),
on lowercased BLEU and chrF with `lowercase=true`; a list of lists gives each system's training
seeds, tested over seeds too (evaluation/seeds.py).
`ckpt=` takes one checkpoint here: in seq2seq-translate a list of them is an ensemble, so a list
is refused rather than guessed at.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seq2seq.cli.app import decode_settings, entry_point
from seq2seq.config.checks import check_comparison, check_decode
from seq2seq.config.commands import EvaluateConfig, WeightType, register_configs
from seq2seq.data.text import DataError, read_lines
from seq2seq.errors import ConfigError
from seq2seq.evaluation.comparison import compare_systems, comparison_to_dict, render_comparison
from seq2seq.evaluation.scoring import format_by_length, format_scores, score, scores_by_length
from seq2seq.evaluation.seeds import compare as compare_seeds
from seq2seq.evaluation.seeds import render_markdown, report_to_dict
from seq2seq.evaluation.significance import PairedSettings

if TYPE_CHECKING:
    from seq2seq.decode.translator import Translator

log = logging.getLogger(__name__)


def translate_split(
    translator: Translator, pairs: list[tuple[str, str]], cfg: EvaluateConfig
) -> list[str]:
    """Translations of the pairs' sources with the checkpoint's decoding settings and the
    command line's changes (app.decode_settings)."""
    decode = decode_settings(cfg.decode, translator.decode)
    decode = dataclasses.replace(decode, scores=False)  # text only: greedy skips its scores
    return [n[0].text for n in translator.hypotheses([p[0] for p in pairs], decode)]


def read_checkpoint_split(
    cfg: EvaluateConfig, ckpt: str | None = None
) -> tuple[Translator, list[tuple[str, str]]]:
    """The model of checkpoint `ckpt` (default: cfg.ckpt) and the (source, reference) pairs of
    `split` of its data (under data_root when given)."""
    from seq2seq.decode.translator import Translator
    from seq2seq.train.corpus import read_split

    if cfg.score_refs and WeightType(cfg.quantize) == WeightType.int8:
        raise ConfigError(
            "score_refs=true scores with the model as trained: leave quantize=float32"
        )
    path = ckpt or one_path(cfg.ckpt, "ckpt") or ""
    translator = Translator.from_checkpoint(path, cfg.device, cfg.quantize)
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
    hyps, refs = read_lines(Path(cfg.hyp)), read_lines(Path(cfg.ref))
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
        if translator.tgt_tok.lowercase and not cfg.lowercase:
            log.warning(
                "%s writes lowercase only (its tokenizer folds case): cased BLEU and chrF count "
                "every capital as an error. fix: add lowercase=true for scores that compare",
                cfg.ckpt,
            )
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


def show(text: str, data: dict[str, Any], cfg: EvaluateConfig) -> None:
    """The report on stdout, or its JSON with json=-; JSON to the file json=PATH too."""
    if cfg.json == "-":
        json.dump(data, sys.stdout, indent=2)
        print()
    else:
        print(text)
        if cfg.json:
            Path(cfg.json).write_text(json.dumps(data, indent=2) + "\n")


def run(cfg: EvaluateConfig) -> dict[str, object]:
    """Score a hypothesis file, or a checkpoint on a split, or compare systems, as cfg says."""
    check_decode(cfg.decode)  # a bad value is an error even where it would go unused
    hyps = cfg.hyp if isinstance(cfg.hyp, list) else []
    if cfg.systems is not None or len(hyps) > 1 or any(isinstance(h, list) for h in hyps):
        return compare(cfg)
    if cfg.names or cfg.blocked_seeds:
        raise ConfigError("names= and blocked_seeds= are for comparisons: hyp=[a,b] or systems=")
    cfg = dataclasses.replace(cfg, ckpt=one_path(cfg.ckpt, "ckpt"), hyp=one_path(cfg.hyp, "hyp"))
    name, scores = evaluate(cfg)
    show(report(name, scores, cfg), scores, cfg)
    return scores


# ----------------------------------------------------------------------------- comparisons


def one_path(value: object, key: str) -> str | None:
    """A setting that names one file (a path, or a list of one) as a string; None when unset."""
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):  # hyp=7 comes as an int
        return str(value)
    if key == "ckpt" and isinstance(value, list):
        raise ConfigError(
            f"ckpt={value} is a list: seq2seq-evaluate takes one checkpoint. To compare "
            "checkpoints, each translating the split, give systems=[a.pt,b.pt]; to score an "
            "ensemble, translate with seq2seq-translate ckpt=[a.pt,b.pt] and give its output "
            "as hyp="
        )
    raise ConfigError(f"{key}={value!r} is not a path")


def a_path(value: object, key: str) -> str:
    """One path of a list-valued setting (a string, or an int as Hydra parses hyp=[7,8])."""
    path = None if isinstance(value, list) else one_path(value, key)
    if path is None:
        raise ConfigError(f"{key}=: {value!r} is not a path")
    return path


@dataclasses.dataclass(frozen=True)
class Systems:
    """What a comparison compares: each system's name and paths, one per run (training seed)."""

    key: str  # the setting that named them: "hyp" (files) or "systems" (checkpoints)
    names: list[str]
    runs: list[list[str]]
    seeds: bool  # whether each system has several runs (a list of lists)


def system_names(runs: list[list[str]], seeds: bool, names: list[str], key: str) -> list[str]:
    """names= (one per system), or each system's path(s) as given; distinct."""
    if names and len(names) != len(runs):
        raise ConfigError(f"names= gives {len(names)} names for the {len(runs)} systems of {key}=")
    chosen = names or [f"[{','.join(r)}]" if seeds else r[0] for r in runs]
    twice = sorted({n for n in chosen if chosen.count(n) > 1})
    if twice:
        raise ConfigError(f"{key}=: {', '.join(twice)} given twice; names= can tell systems apart")
    return chosen


def parse_systems(value: object, key: str, names: list[str]) -> Systems:
    """hyp= or systems= as a list of systems: paths (one run each) or lists of paths (seeds)."""
    if not isinstance(value, list) or len(value) < 2:
        raise ConfigError(
            f"{key}= compares two or more systems: {key}=[a,b] or {key}=[[a1,a2],[b1,b2]]"
        )
    seeds = isinstance(value[0], list)
    if any(isinstance(item, list) != seeds for item in value):
        raise ConfigError(f"{key}= mixes paths and lists: give every system one path, or a list")
    runs = [[a_path(p, key) for p in (item if seeds else [item])] for item in value]
    counts = [len(r) for r in runs]
    if seeds and (len(set(counts)) != 1 or counts[0] < 2):
        raise ConfigError(
            f"{key}=: every system needs the same number (2 or more) of runs, got {counts}"
        )
    return Systems(key, system_names(runs, seeds, names, key), runs, seeds)


def systems_to_compare(cfg: EvaluateConfig) -> Systems:
    """The systems to compare; a ConfigError for settings a comparison cannot honour."""
    check_comparison(cfg)
    files = cfg.systems is None
    unused = {
        "ckpt": cfg.ckpt is not None,
        "hyp": not files and cfg.hyp is not None,
        "ref": not files and cfg.ref is not None,
        "src": cfg.src is not None,
        "by_length": cfg.by_length,
        "score_refs": cfg.score_refs,
    }
    if any(unused.values()):
        given = ", ".join(f"{k}=" for k, v in unused.items() if v)
        what = "hyp=[...] ref=REF compares files" if files else "systems=[...] compares checkpoints"
        raise ConfigError(f"{what}; it does not take {given}")
    if files and cfg.ref is None:
        raise ConfigError("hyp=[...] needs ref=: the reference file every system is scored against")
    systems = parse_systems(
        cfg.hyp if files else cfg.systems, "hyp" if files else "systems", cfg.names
    )
    if cfg.blocked_seeds and not systems.seeds:
        raise ConfigError("blocked_seeds=true needs several runs per system (a list of lists)")
    return systems


def read_hypotheses(systems: Systems, ref: str) -> tuple[list[list[list[str]]], list[str]]:
    """Every run's hypothesis file and the references, checked to align (else DataError)."""
    refs = read_lines(Path(ref))
    outputs = []
    for runs in systems.runs:
        outputs.append([read_lines(Path(path)) for path in runs])
        for path, hyps in zip(runs, outputs[-1], strict=True):
            if len(hyps) != len(refs):
                raise DataError(
                    f"hyp {path} has {len(hyps)} lines but ref={ref} has {len(refs)}: every "
                    "system must translate the same sentences"
                )
    return outputs, refs


def check_same_references(
    ckpt: str, pairs: list[tuple[str, str]], first: str, first_pairs: list[tuple[str, str]]
) -> None:
    """A checkpoint's split must hold the first checkpoint's sentences (else DataError)."""
    if len(pairs) != len(first_pairs):
        raise DataError(
            f"checkpoint {ckpt}'s split has {len(pairs)} lines but {first}'s has "
            f"{len(first_pairs)}: compared systems must translate the same sentences"
        )
    diff = next((i for i, (a, b) in enumerate(zip(pairs, first_pairs)) if a != b), None)
    if diff is not None:
        raise DataError(
            f"checkpoint {ckpt}'s split differs from {first}'s at line {diff + 1}: compared "
            "systems must translate the same sentences (data_root= sets one root for all)"
        )


def translate_checkpoints(
    systems: Systems, cfg: EvaluateConfig
) -> tuple[list[list[list[str]]], list[str]]:
    """Every run's translations of `split`, each checkpoint loaded on its own, and the split's
    references (the same for all)."""
    first: tuple[str, list[tuple[str, str]]] | None = None
    outputs: list[list[list[str]]] = []
    for runs in systems.runs:
        outputs.append([])
        for ckpt in runs:
            translator, pairs = read_checkpoint_split(cfg, ckpt)
            first = first or (ckpt, pairs)
            check_same_references(ckpt, pairs, *first)
            log.info("translating %s with %s", cfg.split, ckpt)
            outputs[-1].append(translate_split(translator, pairs, cfg))
    assert first is not None
    return outputs, [p[1] for p in first[1]]


def compare(cfg: EvaluateConfig) -> dict[str, object]:
    """Compare systems with the first (evaluation.comparison; with seeds, evaluation.seeds)."""
    systems = systems_to_compare(cfg)
    logging.getLogger("sacrebleu").setLevel(logging.WARNING)  # its per-metric progress lines
    if systems.key == "hyp":
        outputs, refs = read_hypotheses(systems, cfg.ref or "")
    else:
        outputs, refs = translate_checkpoints(systems, cfg)
    tests = PairedSettings(
        method=cfg.paired.value,
        bs_samples=cfg.paired_bs_n,
        ar_trials=cfg.paired_ar_n,
        seed=cfg.paired_seed,
        lowercase=cfg.lowercase,  # BLEU and chrF (TER is case-insensitive already)
    )
    if systems.seeds:
        named = dict(zip(systems.names, outputs, strict=True))
        report = compare_seeds(named, refs, tests, alpha=cfg.alpha, blocked_seeds=cfg.blocked_seeds)
        text, data = render_markdown(report), report_to_dict(report)
    else:
        named_runs = {name: runs[0] for name, runs in zip(systems.names, outputs, strict=True)}
        comparison = compare_systems(named_runs, refs, tests, alpha=cfg.alpha)
        text, data = render_comparison(comparison), comparison_to_dict(comparison)
    data["paths"] = dict(zip(systems.names, systems.runs, strict=True))
    show(text, data, cfg)
    return data


register_configs()
main = entry_point("evaluate", run)  # seq2seq-evaluate; user errors exit 1 with one line


if __name__ == "__main__":
    main()
