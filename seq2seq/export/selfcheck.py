"""The self-check of an exported model folder against our own search.

The exported model translates the first `check_lines` sentences of the checkpoint's validation
split greedily, next to our greedy search: the check reports how many outputs are token-for-token
identical, both BLEU scores, and the largest difference of the references' teacher-forced
log-probabilities. A float32 export whose log-probabilities differ by more than CHECK_TOLERANCE
is a broken conversion (an ExportError).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from seq2seq.config.commands import ExportConfig, Quantization
from seq2seq.config.schema import SearchKind
from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from seq2seq.decode.schedule import translate_ids
from seq2seq.decode.search import max_lengths, pad_sources
from seq2seq.decode.translator import Translator
from seq2seq.export.ctranslate2 import ExportError

log = logging.getLogger(__name__)

CHECK_TOLERANCE = 1e-3  # float32: the largest log-probability difference a faithful export has


class Exported(Protocol):
    """An exported model loaded back, driven with our token ids."""

    def greedy(self, src: list[list[int]], limit: int) -> list[list[int]]:
        """Greedy outputs (no BOS/EOS) of sources (no EOS), at most `limit` tokens each."""
        ...

    def logprobs(self, src: list[list[int]], tgt: list[list[int]]) -> list[list[float]]:
        """Teacher-forced log-probabilities of each target token and its EOS."""
        ...


class CTranslate2Model:
    """A CTranslate2 folder (ctranslate2.Translator) fed our tokens as strings."""

    def __init__(self, path: Path, src_vocab: list[str], tgt_vocab: list[str]) -> None:
        import ctranslate2

        self.translator = ctranslate2.Translator(str(path), device="cpu")
        self.src_vocab, self.tgt_index = src_vocab, {t: i for i, t in enumerate(tgt_vocab)}
        self.tgt_vocab = tgt_vocab

    def greedy(self, src: list[list[int]], limit: int) -> list[list[int]]:
        """Greedy outputs (no BOS/EOS) of sources (no EOS), at most `limit` tokens each."""
        results = self.translator.translate_batch(
            [[self.src_vocab[i] for i in s] for s in src],
            beam_size=1,
            max_decoding_length=limit,
            min_decoding_length=0,
            suppress_sequences=[[self.tgt_vocab[PAD_ID]], [self.tgt_vocab[BOS_ID]]],
        )
        return [[self.tgt_index[t] for t in r.hypotheses[0]] for r in results]

    def logprobs(self, src: list[list[int]], tgt: list[list[int]]) -> list[list[float]]:
        """Teacher-forced log-probabilities of each target token and its EOS."""
        results = self.translator.score_batch(
            [[self.src_vocab[i] for i in s] for s in src],
            [[self.tgt_vocab[i] for i in t] for t in tgt],
        )
        return [list(r.log_probs) for r in results]


class MarianModel:
    """A Hugging Face MarianMTModel folder, loaded with from_pretrained."""

    def __init__(self, path: Path) -> None:
        from transformers import MarianMTModel

        self.model = MarianMTModel.from_pretrained(str(path)).eval()

    @torch.inference_mode()
    def greedy(self, src: list[list[int]], limit: int) -> list[list[int]]:
        """Greedy outputs (no BOS/EOS) of sources (no EOS), at most `limit` tokens each."""
        ids = pad_sources(src, 10**9, torch.device("cpu"))  # (B, S)
        out = self.model.generate(
            input_ids=ids,
            attention_mask=ids.ne(PAD_ID),
            num_beams=1,
            do_sample=False,
            max_new_tokens=limit,
        )  # (B, 1 + T)
        rows = [row[1:].tolist() for row in out]
        return [r[: r.index(EOS_ID)] if EOS_ID in r else r for r in rows]

    @torch.inference_mode()
    def logprobs(self, src: list[list[int]], tgt: list[list[int]]) -> list[list[float]]:
        """Teacher-forced log-probabilities of each target token and its EOS."""
        ids, tgt_in = teacher_forced(src, tgt, torch.device("cpu"))
        logits = self.model(
            input_ids=ids, attention_mask=ids.ne(PAD_ID), decoder_input_ids=tgt_in
        ).logits  # (B, T, V)
        return target_logprobs(logits, tgt)


def teacher_forced(
    src: list[list[int]], tgt: list[list[int]], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded sources (each + EOS) and decoder inputs (BOS + target) for teacher forcing."""
    ids = pad_sources(src, 10**9, device)  # (B, S)
    tgt_in = pad_sources([[BOS_ID, *t] for t in tgt], 10**9, device)[:, :-1]  # (B, T)
    return ids, tgt_in


def target_logprobs(logits: torch.Tensor, tgt: list[list[int]]) -> list[list[float]]:
    """Log-probabilities of each target token and its EOS, from logits (B, T, V)."""
    lp = logits.float().log_softmax(-1)  # (B, T, V)
    return [[float(lp[b, i, k]) for i, k in enumerate([*t, EOS_ID])] for b, t in enumerate(tgt)]


@dataclass
class CheckResult:
    """What the self-check measured on the first `sentences` validation sentences."""

    split: str
    sentences: int
    identical: int  # greedy outputs identical token for token
    max_logprob_diff: float  # teacher-forced log-probabilities of the references
    bleu_ours: float
    bleu_exported: float
    differing_lines: list[int]  # 1-based lines of the split whose outputs differ (first 10)


def our_logprobs(t: Translator, src: list[list[int]], tgt: list[list[int]]) -> list[list[float]]:
    """Our teacher-forced log-probabilities of each target token and its EOS."""
    model = t.single("seq2seq-export")
    ids, tgt_in = teacher_forced(src, tgt, next(model.parameters()).device)
    with torch.inference_mode():
        return target_logprobs(model.logits(ids, tgt_in), tgt)  # logits (B, T, V)


def greedy_by_limit(engine: Exported, src: list[list[int]], limits: list[int]) -> list[list[int]]:
    """The exported model's greedy outputs, each sentence with its own length limit (batched by
    limit: the engines take one limit per call)."""
    out: list[list[int]] = [[] for _ in src]
    for limit in sorted(set(limits)):
        index = [i for i, x in enumerate(limits) if x == limit]
        for i, hyp in zip(index, engine.greedy([src[i] for i in index], limit), strict=True):
            out[i] = hyp
    return out


def self_check(t: Translator, engine: Exported, split: str, n: int) -> CheckResult:
    """Greedy outputs and reference log-probabilities of ours and the export on the first n
    pairs of `split` of the checkpoint's data."""
    import sacrebleu

    from seq2seq.data.text import DataError
    from seq2seq.train.corpus import read_split

    try:
        pairs = read_split(t.cfg.data, split)[:n]
    except DataError as err:
        raise DataError(
            f"{err} (the export's self-check reads split {split!r} of the checkpoint's data: "
            "pass data_root=DIR or check_split=NAME, or check_lines=0 to skip the check)"
        ) from err
    cap = t.cfg.data.max_len
    src = [s[:cap] for s in t.src_tok.encode_batch([p[0] for p in pairs])]
    refs = [r[:cap] for r in t.tgt_tok.encode_batch([p[1] for p in pairs])]
    decode = t.settings(method=SearchKind.greedy, nbest=1, scores=False)
    ours = [h[0].tokens for h in translate_ids(t.model, src, decode, cap)]
    src_t = pad_sources(src, cap, torch.device("cpu"))  # (B, S)
    # our limit counts the EOS it forces; the engines' count the tokens before it
    limits = [int(x) - 1 for x in max_lengths(src_t, decode.max_len_a, decode.max_len_b)]
    theirs = greedy_by_limit(engine, src, limits)
    diff = max(
        abs(a - b)
        for x, y in zip(our_logprobs(t, src, refs), engine.logprobs(src, refs), strict=True)
        for a, b in zip(x, y, strict=True)
    )
    texts = [p[1] for p in pairs]
    bleu = sacrebleu.BLEU()
    same = [a == b for a, b in zip(ours, theirs, strict=True)]
    return CheckResult(
        split=split,
        sentences=len(pairs),
        identical=sum(same),
        max_logprob_diff=diff,
        bleu_ours=bleu.corpus_score([t.tgt_tok.decode(h) for h in ours], [texts]).score,
        bleu_exported=bleu.corpus_score([t.tgt_tok.decode(h) for h in theirs], [texts]).score,
        differing_lines=[i + 1 for i, s in enumerate(same) if not s][:10],
    )


def report(check: CheckResult, cfg: ExportConfig) -> None:
    """Log the check; an ExportError when a float32 export does not compute our model."""
    log.info(
        "check on the first %d sentences of %s: %d/%d greedy outputs identical to ours; "
        "BLEU ours %.2f, exported %.2f (difference %+.2f); reference log-probabilities differ "
        "by at most %.2g",
        check.sentences,
        check.split,
        check.identical,
        check.sentences,
        check.bleu_ours,
        check.bleu_exported,
        check.bleu_exported - check.bleu_ours,
        check.max_logprob_diff,
    )
    if check.differing_lines:
        log.info("lines whose outputs differ: %s", check.differing_lines)
    exact = cfg.quantization == Quantization.float32
    if exact and check.max_logprob_diff > CHECK_TOLERANCE:
        raise ExportError(
            f"the {cfg.format.value} export does not compute our model: reference "
            f"log-probabilities differ by {check.max_logprob_diff:.3g} (> {CHECK_TOLERANCE}); "
            "this is a bug, please report it with the checkpoint's config"
        )
