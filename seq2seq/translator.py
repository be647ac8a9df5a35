"""The Python API: a trained model as an object that translates lists of strings, no Hydra.

    from seq2seq import Translator

    translator = Translator.from_checkpoint("outputs/.../checkpoints/best.pt", device="cpu")
    translator.translate(["a man rides a bike ."], beam_size=5)          # -> ["ein Mann ..."]
    translator.translate_nbest(["a man rides a bike ."], nbest=3)      # -> [[Translation], ...]

It decodes as the checkpoint's run was tested (`decode` of its config); keyword arguments
change single settings (the fields of config.DecodeConfig). seq2seq-translate and
seq2seq-evaluate use it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from seq2seq import kernels
from seq2seq.build import load_for_inference
from seq2seq.config import (
    DecodeConfig,
    LengthPenaltyKind,
    SearchKind,
    TrainConfig,
    check_decode,
)
from seq2seq.model import EncoderDecoder
from seq2seq.search import translate_ids
from seq2seq.tokenizer import Tokenizer

log = logging.getLogger(__name__)


@dataclass
class Translation:
    """One hypothesis: its detokenized text and its score (search.Hypothesis.score)."""

    text: str
    score: float


class Translator:
    """A checkpoint's model and tokenizers, loaded once. `translate` may be called from several
    threads: the model is used by one call at a time."""

    def __init__(
        self, model: EncoderDecoder, src_tok: Tokenizer, tgt_tok: Tokenizer, cfg: TrainConfig
    ) -> None:
        """A model in eval mode, its tokenizers and the config it was trained with."""
        self.model, self.src_tok, self.tgt_tok, self.cfg = model, src_tok, tgt_tok, cfg
        self.decode = cfg.decode  # the settings its run was tested with
        self.lock = threading.Lock()

    @classmethod
    def from_checkpoint(cls, path: str | Path, device: str = "auto") -> Translator:
        """Load a checkpoint (best.pt, last.pt, an average): a CheckpointError names a bad one."""
        kernels.setup_process()  # oneDNN's cache caps, before the first product
        return cls(*load_for_inference(path, device))

    def settings(self, **changes: Any) -> DecodeConfig:
        """The checkpoint's decoding settings with `changes` (DecodeConfig's fields). Giving
        beam_size alone also chooses the search: beam above 1, greedy at 1."""
        unknown = set(changes) - {f.name for f in dataclasses.fields(DecodeConfig)}
        if unknown:
            names = ", ".join(f.name for f in dataclasses.fields(DecodeConfig))
            raise TypeError(f"unknown decoding settings {sorted(unknown)}; they are: {names}")
        if "beam_size" in changes and "method" not in changes:
            changes["method"] = SearchKind.beam if changes["beam_size"] > 1 else SearchKind.greedy
        if isinstance(changes.get("method"), str):
            changes["method"] = SearchKind(changes["method"])
        if isinstance(changes.get("length_penalty"), str):
            changes["length_penalty"] = LengthPenaltyKind(changes["length_penalty"])
        decode = dataclasses.replace(self.decode, **changes)
        check_decode(decode)
        return decode

    def translate(self, texts: Sequence[str], **changes: Any) -> list[str]:
        """The best translation of each text, in order; a blank text gives ""."""
        return [n[0].text for n in self.translate_nbest(texts, **changes)]

    def translate_nbest(self, texts: Sequence[str], **changes: Any) -> list[list[Translation]]:
        """Up to `nbest` (a decoding setting) translations of each text, best first, with
        their scores."""
        return self.hypotheses(texts, self.settings(**changes))

    def hypotheses(self, texts: Sequence[str], decode: DecodeConfig) -> list[list[Translation]]:
        """Translations of `texts` with the settings `decode`. Words or characters unseen in
        training become <unk>; texts over the model's data.max_len tokens are truncated to it,
        with a warning naming them (1-based)."""
        ids = self.src_tok.encode_batch(list(texts))
        max_len = self.cfg.data.max_len
        long = [i + 1 for i, x in enumerate(ids) if len(x) > max_len]
        if long:
            shown = ", ".join(map(str, long[:5])) + (", ..." if len(long) > 5 else "")
            log.warning(
                "%d input lines exceed %d tokens (data.max_len of the model) and are truncated "
                "to it: lines %s",
                len(long),
                max_len,
                shown,
            )
        with self.lock:
            found = translate_ids(self.model, ids, decode, max_len)
        return [
            [Translation(self.tgt_tok.decode(h.tokens) if text.strip() else "", h.score) for h in n]
            for text, n in zip(texts, found, strict=True)
        ]
