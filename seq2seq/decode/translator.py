"""The Python API: a trained model as an object that translates lists of strings, no Hydra.

    from seq2seq import Translator

    translator = Translator.from_checkpoint("outputs/.../checkpoints/best.pt", device="cpu")
    translator.translate(["a man rides a bike ."], beam_size=5)          # -> ["ein Mann ..."]
    translator.translate_nbest(["a man rides a bike ."], nbest=3)      # -> [[Translation], ...]
    translator.translate(["a man rides a bike ."], method="sample", top_p=0.9, seed=7)
    Translator.from_checkpoint(["a.pt", "b.pt"])                          # an ensemble
    translator.translate_nbest(texts, attention=True)[0][0].alignment()   # -> [(0, 0), ...]

It decodes as the checkpoint's run was tested (`decode` of its config); keyword arguments
change single settings (the fields of config.DecodeConfig). seq2seq-translate and
seq2seq-evaluate use it.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor

from seq2seq import kernels
from seq2seq.config.checks import check_decode
from seq2seq.config.commands import WeightType
from seq2seq.config.schema import DecodeConfig, LengthPenaltyKind, SearchKind, TrainConfig
from seq2seq.data.tokenizer import Tokenizer
from seq2seq.decode.alignment import check_layer, hard_alignment, translation_attention
from seq2seq.decode.ensemble import SearchModel
from seq2seq.decode.load import (
    Backends,
    choose_products,
    load_ensemble,
    load_for_inference,
    remember_products,
)
from seq2seq.decode.quantize import quantize_int8
from seq2seq.decode.schedule import translate_ids
from seq2seq.errors import ConfigError
from seq2seq.model.transformer import EncoderDecoder

log = logging.getLogger(__name__)


@dataclass
class Translation:
    """One hypothesis: its detokenized text and its score (search.Hypothesis.score)."""

    text: str
    score: float
    tokens: list[int] = field(default_factory=list)  # its ids, without EOS
    # when asked for: cross-attention (L, T + 1, S + 1) of each decoder layer, heads averaged;
    # rows: its tokens then EOS, columns: the source tokens then EOS (seq2seq/decode/alignment.py)
    attention: Tensor | None = None

    def alignment(self, layer: int = -1) -> list[tuple[int, int]]:
        """(source index, target index) pairs, 0-based tokens without EOS: each target token's
        most attended source token in decoder layer `layer` (needs `attention`)."""
        if self.attention is None:
            raise ValueError("no attention: translate with attention=True")
        return hard_alignment(self.attention[check_layer(layer, self.attention.size(0))])


class Translator:
    """A checkpoint's model and tokenizers, loaded once. `translate` may be called from several
    threads: the model is used by one call at a time."""

    def __init__(
        self, model: SearchModel, src_tok: Tokenizer, tgt_tok: Tokenizer, cfg: TrainConfig
    ) -> None:
        """A model in eval mode, its tokenizers and the config it was trained with."""
        self.model, self.src_tok, self.tgt_tok, self.cfg = model, src_tok, tgt_tok, cfg
        self.decode = cfg.decode  # the settings its run was tested with
        self.lock = threading.Lock()
        self.weights = WeightType.float32  # int8 once quantized (from_checkpoint)

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path | Sequence[str | Path],
        device: str = "auto",
        quantize: WeightType | str = WeightType.float32,
    ) -> Translator:
        """Load a checkpoint (best.pt, last.pt, an average): a CheckpointError names a bad one.
        Several paths make an ensemble (seq2seq/decode/ensemble.py) that decodes with the first
        one's settings; their tokenizers must be the same. quantize="int8": every linear layer
        in int8 (seq2seq/decode/quantize.py; CPU only)."""
        kernels.setup_process(kernels.resolve_device(device))  # before the first product
        weights = WeightType(quantize)
        if isinstance(path, (str, Path)) or len(path) == 1:
            one = path if isinstance(path, (str, Path)) else path[0]
            translator = cls(*load_for_inference(one, device))
        else:
            translator = cls(*load_ensemble(path, device))
        if weights == WeightType.int8:
            count = quantize_int8(translator.model)
            translator.weights = weights
            log.info("quantize=int8: %d linear layers in int8", count)
        return translator

    def decoder_layers(self) -> int:
        """The model's decoder layers (an ensemble's first model's)."""
        model = self.model if isinstance(self.model, EncoderDecoder) else self.model.members[0]
        return len(model.decoder)

    def single(self, what: str) -> EncoderDecoder:
        """The model itself; an ensemble is a ConfigError: `what` needs one checkpoint."""
        if not isinstance(self.model, EncoderDecoder):
            raise ConfigError(f"{what} takes one checkpoint, not an ensemble: give ckpt=PATH")
        return self.model

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
        """The best translation of each text, in order; a blank text gives "". Greedy search
        skips the scores nobody reads here (DecodeConfig.scores) unless `scores` is given."""
        return [n[0].text for n in self.translate_nbest(texts, **{"scores": False, **changes})]

    def translate_nbest(
        self, texts: Sequence[str], attention: bool = False, **changes: Any
    ) -> list[list[Translation]]:
        """Up to `nbest` (a decoding setting) translations of each text, best first (samples:
        in the order drawn), with their scores; with `attention`, their cross-attention too."""
        return self.hypotheses(texts, self.settings(**changes), attention)

    def products(self, decode: DecodeConfig, sentences: int | None = None) -> Backends | None:
        """Where the float32 products of searches with `decode` over `sentences` (None: at
        least a batch) run here (load.choose_products: timed once a machine for these settings,
        the batch the sentences fill and torch threads, then read back), set process-wide;
        None when nothing is chosen (int8 weights, another device, the reference kernels)."""
        if self.weights != WeightType.float32:
            return None
        vocab = self.tgt_tok.vocab_size
        return choose_products(self.model, self.cfg.model, decode, vocab, sentences)[0]

    def use_products(
        self, decode: DecodeConfig, chosen: Backends, sentences: int | None = None
    ) -> None:
        """Take `chosen` as products(decode, sentences)'s answer here, untimed (a worker given
        its parent's timing, seq2seq/decode/workers.py)."""
        remember_products(self.cfg.model, decode, self.tgt_tok.vocab_size, chosen, sentences)

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """The source ids of `texts`, with a warning naming (1-based) the lines over the model's
        data.max_len tokens, which the searches truncate to it."""
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
        return ids

    def hypotheses(
        self,
        texts: Sequence[str],
        decode: DecodeConfig,
        attention: bool = False,
        numbers: Sequence[int] | None = None,
    ) -> list[list[Translation]]:
        """Translations of `texts` with the settings `decode` (and their `attention` when
        asked); `numbers`: each text's index in the whole input, which seeds its samples
        (default: its index in `texts`; seq2seq/decode/workers.py gives each worker's share the
        whole input's draws). Words or characters unseen in training become <unk>; texts over
        the model's data.max_len tokens are truncated to it, with a warning naming them
        (1-based, Translator.encode). In float32 on a CPU, the products run on the fastest of
        oneDNN and ATen here for these settings, timed on a few decoding steps of the model the
        first time on this machine, for the small weights and for the large ones (the output
        layer) apart, at the rows these texts fill (load.choose_products)."""
        ids = self.encode(texts)
        max_len = self.cfg.data.max_len
        with self.lock:
            self.products(decode, len(texts))
            found = translate_ids(self.model, ids, decode, max_len, numbers=numbers)
            weights: list[list[Tensor | None]] = [[None] * len(n) for n in found]
            if attention:
                weights = [
                    list(w)
                    for w in translation_attention(
                        self.model, ids, found, max_len, decode.batch_size
                    )
                ]
        return [
            [
                Translation(
                    self.tgt_tok.decode(h.tokens) if text.strip() else "", h.score, h.tokens, w
                )
                for h, w in zip(n, ws, strict=True)
            ]
            for text, n, ws in zip(texts, found, weights, strict=True)
        ]
