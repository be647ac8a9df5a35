"""Parity with CTranslate2 at a realistic size: a 6+6-layer Transformer of width 512 (the
"base" shape) on sentences of 100-250 tokens, where a wrong cache, a mask that leaks past
padding, a positional table cut short or an off-by-one in the length penalty shows that the toy
models of test_export.py (2 layers, width 32, a dozen tokens) cannot. Teacher-forced
log-probabilities agree within 1e-4 and beam 5 with a length penalty gives the same tokens.
Marian is checked at the same size for the log-probabilities (transformers' beam search ranks
finished hypotheses by its own rule, so outputs are compared with CTranslate2 only)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

from seq2seq.config.schema import (
    DecodeConfig,
    LengthPenaltyKind,
    ModelConfig,
    PosEncodingConfig,
    SearchKind,
    TrainConfig,
)
from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, SPECIAL_TOKENS, VocabTokenizer
from seq2seq.decode.schedule import translate_ids
from seq2seq.decode.translator import Translator
from seq2seq.export.ctranslate2 import build_spec, save
from seq2seq.export.huggingface import to_marian
from seq2seq.export.selfcheck import CTranslate2Model, MarianModel, our_logprobs
from seq2seq.model.transformer import EncoderDecoder, build_positional

ctranslate2 = pytest.importorskip("ctranslate2")
pytest.importorskip("transformers")

pytestmark = pytest.mark.slow  # ~30 s on 2 CPU cores: make test-slow (CI runs it)

VOCAB = 1000
LIMIT = 260  # decoding limit: every output may be as long as the longest source


def base_model(pos: str, norm_first: bool = True) -> EncoderDecoder:
    """A randomly initialised 6+6 x 512 model whose output distribution is peaked (the output
    matrix scaled up, as training makes it), so that beam search meets no float-level ties. An
    untrained model soon repeats one token for ever; its EOS row is made 0.75 of that token's,
    so that EOS competes and hypotheses end at different lengths (the length penalty decides)."""
    torch.manual_seed(0)
    cfg = ModelConfig(
        d_model=512,
        n_heads=8,
        enc_layers=6,
        dec_layers=6,
        d_ff=2048,
        dropout=0.0,
        norm_first=norm_first,
        tie_output=False,
        share_embeddings=False,
    )
    pe = PosEncodingConfig(kind=pos, max_len=512)  # type: ignore[arg-type]
    enc, dec = build_positional(pe, 512, 8, False, 6), build_positional(pe, 512, 8, True, 6)
    model = EncoderDecoder(cfg, VOCAB, VOCAB, enc, dec).eval()
    greedy = DecodeConfig(method=SearchKind.greedy, max_len_a=0.0, max_len_b=40)
    with torch.no_grad():
        model.out.weight.mul_(6.0)
        out = translate_ids(model, long_sentences(0, 2), greedy, 512)
        top = Counter(t for h in out for t in h[0].tokens).most_common(1)[0][0]
        model.out.weight[EOS_ID] = 0.75 * model.out.weight[top]
    return model


def long_sentences(seed: int, n: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(100, 251, (n,), generator=gen).tolist()
    return [torch.randint(4, VOCAB, (k,), generator=gen).tolist() for k in lengths]


def words() -> VocabTokenizer:
    return VocabTokenizer("word", [*SPECIAL_TOKENS, *[f"w{i}" for i in range(VOCAB - 4)]])


def max_difference(a: list[list[float]], b: list[list[float]]) -> float:
    assert [len(x) for x in a] == [len(y) for y in b]
    return max(abs(p - q) for x, y in zip(a, b, strict=True) for p, q in zip(x, y, strict=True))


@pytest.fixture(scope="module", params=["sinusoidal", "relative"])
def exported(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[EncoderDecoder, CTranslate2Model, Path]:
    model, tok = base_model(request.param), words()
    folder = tmp_path_factory.mktemp(f"ct2-{request.param}")
    save(build_spec(model, tok, tok, 512), folder, "float32")
    vocab = [tok.id_to_token(i) for i in range(VOCAB)]
    return model, CTranslate2Model(folder, vocab, vocab), folder


def test_teacher_forced_logprobs_agree_on_long_sentences(
    exported: tuple[EncoderDecoder, CTranslate2Model, Path],
) -> None:
    model, engine, _ = exported
    src, tgt = long_sentences(1, 4), long_sentences(2, 4)
    ours = our_logprobs(Translator(model, words(), words(), TrainConfig()), src, tgt)
    assert max_difference(ours, engine.logprobs(src, tgt)) < 1e-4


def test_beam_search_with_a_length_penalty_gives_ctranslate2s_tokens(
    exported: tuple[EncoderDecoder, CTranslate2Model, Path],
) -> None:
    """Beam 5, hypotheses ranked by score / length (CTranslate2's length_penalty=1.0, our
    `average` with alpha 1), outputs up to LIMIT tokens."""
    model, engine, _ = exported
    src = long_sentences(3, 4)
    cfg = DecodeConfig(
        method=SearchKind.beam,
        beam_size=5,
        length_penalty=LengthPenaltyKind.average,
        alpha=1.0,
        batch_size=4,
        max_len_a=0.0,
        max_len_b=LIMIT,
    )
    ours = [h[0].tokens for h in translate_ids(model, src, cfg, 512)]
    results = engine.translator.translate_batch(
        [[engine.src_vocab[i] for i in s] for s in src],
        beam_size=5,
        length_penalty=1.0,
        max_decoding_length=LIMIT - 1,  # CTranslate2's limit leaves out the EOS; ours counts it
        min_decoding_length=1,
        return_end_token=True,
        suppress_sequences=[[engine.tgt_vocab[PAD_ID]], [engine.tgt_vocab[BOS_ID]]],
    )
    theirs = [
        [engine.tgt_index[t] for t in r.hypotheses[0] if t != engine.tgt_vocab[EOS_ID]]
        for r in results
    ]
    assert theirs == ours
    assert len({len(t) for t in ours}) > 1  # the penalty decided between lengths


def test_marian_logprobs_agree_on_long_sentences(tmp_path: Path) -> None:
    """MarianMTModel is post-norm: the base model as Vaswani et al.'s."""
    model = base_model("sinusoidal", norm_first=False)
    to_marian(model, 512).save_pretrained(tmp_path)
    src, tgt = long_sentences(4, 3), long_sentences(5, 3)
    ours = our_logprobs(Translator(model, words(), words(), TrainConfig()), src, tgt)
    assert max_difference(ours, MarianModel(tmp_path).logprobs(src, tgt)) < 1e-4
