"""export.py, export_ct2.py, export_hf.py: the exported folders load in CTranslate2 and
transformers and compute our model (every positional encoding CTranslate2 can express, pre- and
post-norm, shared and separate embeddings, tied and untied outputs); the rest is refused."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from seq2seq.config.commands import ExportConfig, ExportFormat, Quantization
from seq2seq.config.schema import TrainConfig
from seq2seq.data.tokenizer import SPECIAL_TOKENS, VocabTokenizer
from seq2seq.decode.schedule import translate_ids
from seq2seq.decode.search import max_lengths, pad_sources
from seq2seq.decode.translator import Translator
from seq2seq.export.ctranslate2 import ExportError, build_spec, save
from seq2seq.export.selfcheck import CTranslate2Model, MarianModel, greedy_by_limit, our_logprobs
from seq2seq.export.writer import export_checkpoint as export
from seq2seq.model.positional import PositionalEncoding
from seq2seq.model.relative import ALiBi
from seq2seq.model.transformer import EncoderDecoder
from seq2seq.train.run import train
from tests.conftest import VOCAB, MakeModel
from tests.tiny_run import REPO, compose_train, tiny_overrides, write_slice

ctranslate2 = pytest.importorskip("ctranslate2")
transformers = pytest.importorskip("transformers")

ENCODINGS = ["sinusoidal", "learned", "none", "relative", "t5_bias", "rope"]


def words(n: int) -> VocabTokenizer:
    return VocabTokenizer("word", [*SPECIAL_TOKENS, *[f"w{i}" for i in range(n - 4)]])


def sources(seed: int, n: int = 8) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 14, (n,), generator=gen)
    return [torch.randint(4, VOCAB, (int(k),), generator=gen).tolist() for k in lengths]


def agree(model: EncoderDecoder, engine: object, tok: VocabTokenizer) -> None:
    """Teacher-forced log-probabilities within float tolerance, greedy outputs identical."""
    cfg = TrainConfig()
    t = Translator(model, tok, tok, cfg)
    src, tgt = sources(1), sources(2)
    ours_lp = our_logprobs(t, src, tgt)
    theirs_lp = engine.logprobs(src, tgt)  # type: ignore[attr-defined]
    diff = max(abs(a - b) for x, y in zip(ours_lp, theirs_lp) for a, b in zip(x, y))
    assert diff < 1e-4
    decode = t.settings(method="greedy")
    ours = [h[0].tokens for h in translate_ids(model, src, decode, 1024)]
    limits = max_lengths(pad_sources(src, 1024, torch.device("cpu")), decode.max_len_a, 10)
    theirs = greedy_by_limit(engine, src, [int(x) - 1 for x in limits])  # type: ignore[arg-type]
    assert theirs == ours


def ct2(model: EncoderDecoder, tok: VocabTokenizer, path: Path) -> CTranslate2Model:
    save(build_spec(model, tok, tok, 64), path, "float32")
    vocab = [tok.id_to_token(i) for i in range(tok.vocab_size)]
    return CTranslate2Model(path, vocab, vocab)


@pytest.mark.parametrize("pos", ENCODINGS)
@pytest.mark.parametrize("norm_first", [True, False])
def test_ctranslate2_computes_our_model(
    make_model: MakeModel, tmp_path: Path, pos: str, norm_first: bool
) -> None:
    model = make_model(pos, layers=2, norm_first=norm_first)
    agree(model, ct2(model, words(VOCAB), tmp_path), words(VOCAB))


@pytest.mark.parametrize(("share", "tie"), [(False, True), (False, False)])
def test_ctranslate2_separate_embeddings(
    make_model: MakeModel, tmp_path: Path, share: bool, tie: bool
) -> None:
    model = make_model("sinusoidal", share_embeddings=share, tie_output=tie)
    with torch.no_grad():  # untied and unshared matrices start equal to nothing else
        model.tgt_embed.weight.normal_(0, 0.3)
        model.out.weight.normal_(0, 0.3)
    agree(model, ct2(model, words(VOCAB), tmp_path), words(VOCAB))


@pytest.mark.parametrize("quantization", ["int8", "int16", "float16"])
def test_quantized_export_leaves_the_model_alone(
    make_model: MakeModel, tmp_path: Path, quantization: str
) -> None:
    model = make_model("relative", layers=2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    save(build_spec(model, words(VOCAB), words(VOCAB), 64), tmp_path, quantization)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_ctranslate2_alibi_decoder_but_not_encoder(make_model: MakeModel, tmp_path: Path) -> None:
    model = make_model("none", layers=2)
    model.dec_pos = ALiBi(4)
    for layer in model.decoder:
        layer.self_attn.pos = model.dec_pos
    agree(model, ct2(model, words(VOCAB), tmp_path), words(VOCAB))
    model = make_model("alibi")
    with pytest.raises(ExportError, match="cannot express pos_encoding alibi in the encoder"):
        build_spec(model, words(VOCAB), words(VOCAB), 64)
    model.enc_pos = PositionalEncoding()  # the check reads each side's encoding
    build_spec(model, words(VOCAB), words(VOCAB), 64)


@pytest.mark.parametrize("pos", ["kerple", "fire"])
def test_ctranslate2_refuses_encodings_it_has_not(make_model: MakeModel, pos: str) -> None:
    with pytest.raises(ExportError, match=r"cannot express pos_encoding .* in the encoder"):
        build_spec(make_model(pos), words(VOCAB), words(VOCAB), 64)


@pytest.mark.parametrize(("share", "tie"), [(True, True), (False, True), (False, False)])
def test_marian_computes_our_model(
    make_model: MakeModel, tmp_path: Path, share: bool, tie: bool
) -> None:
    from seq2seq.export.huggingface import to_marian

    model = make_model(
        "sinusoidal", layers=2, norm_first=False, share_embeddings=share, tie_output=tie
    )
    with torch.no_grad():
        model.tgt_embed.weight.normal_(0, 0.3)
        model.out.weight.normal_(0, 0.3)
    to_marian(model, 64).save_pretrained(tmp_path)
    agree(model, MarianModel(tmp_path), words(VOCAB))


def test_marian_refuses_what_it_cannot_express(make_model: MakeModel) -> None:
    from seq2seq.export.huggingface import check_marian

    tok = words(VOCAB)
    with pytest.raises(ExportError, match="encoder's positional encoding Rotary"):
        check_marian(make_model("rope", norm_first=False), tok, tok)
    with pytest.raises(ExportError, match="norm_first=true"):
        check_marian(make_model("sinusoidal", norm_first=True), tok, tok)
    with pytest.raises(ExportError, match="needs SentencePiece tokenizers"):
        check_marian(make_model("sinusoidal", norm_first=False), tok, tok)


# --------------------------------------------------------------------------- a trained run


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny post-norm sinusoidal run (exportable both ways), trained for 150 steps."""
    root = tmp_path_factory.mktemp("export")
    data = write_slice(root / "data")
    extra = ("trainer.max_steps=150", "model.norm_first=false", "model.dropout=0", "optim.lr=0.01")
    train(compose_train(tiny_overrides(data, root / "cache", *extra)), root / "run")
    return root


def test_ctranslate2_export_of_a_run(run: Path) -> None:
    ckpt, out = run / "run" / "checkpoints" / "best.pt", run / "ct2"
    check = export(ExportConfig(ckpt=str(ckpt), out=str(out), check_lines=20))
    assert check is not None
    assert check.identical == check.sentences == 20
    assert check.max_logprob_diff < 1e-4
    manifest = json.loads((out / "seq2seq_export.json").read_text())
    assert manifest["check"]["identical"] == 20
    assert manifest["quantization"] == "float32"
    assert len(manifest["source_checkpoint"]["sha256"]) == 64
    # a user's path: SentencePiece pieces in, pieces out, detokenized by the exported model
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(out / "source.spm"))
    translator = ctranslate2.Translator(str(out))
    src = (run / "data" / "valid.en").read_text(encoding="utf-8").splitlines()[:5]
    found = translator.translate_batch(sp.encode(src, out_type=str), beam_size=1)
    tgt = spm.SentencePieceProcessor(model_file=str(out / "target.spm"))
    ours = Translator.from_checkpoint(ckpt, "cpu").translate(src, method="greedy")
    assert [tgt.decode(r.hypotheses[0]) for r in found] == ours
    with pytest.raises(ExportError, match="exists: choose another out= or pass force=true"):
        export(ExportConfig(ckpt=str(ckpt), out=str(out)))


def test_int8_export_reports_its_agreement(run: Path) -> None:
    ckpt, out = run / "run" / "checkpoints" / "best.pt", run / "ct2_int8"
    exact = export(ExportConfig(ckpt=str(ckpt), out=str(run / "ct2_fp32"), check_lines=20))
    cfg = ExportConfig(ckpt=str(ckpt), out=str(out), quantization=Quantization.int8)
    check = export(cfg)
    assert check is not None
    assert exact is not None
    assert 0 <= check.identical <= check.sentences == 20
    assert check.bleu_ours == exact.bleu_ours  # our side is the model as it was
    # int8 moves the log-probabilities, by far more than float32's export does; how far depends
    # on the CPU's int8 kernels (1.5 on an AVX2-only AMD EPYC, under 1 with VNNI), so no bound
    assert exact.max_logprob_diff < 1e-4 < check.max_logprob_diff < math.inf
    assert json.loads((out / "config.json").read_text())  # CTranslate2's own config
    manifest = json.loads((out / "seq2seq_export.json").read_text())
    assert manifest["quantization"] == "int8"


def test_huggingface_export_of_a_run(run: Path) -> None:
    from transformers import MarianMTModel, MarianTokenizer

    ckpt, out = run / "run" / "checkpoints" / "best.pt", run / "hf"
    check = export(ExportConfig(ckpt=str(ckpt), out=str(out), format=ExportFormat.huggingface))
    assert check is not None
    assert check.identical == check.sentences
    tokenizer = MarianTokenizer.from_pretrained(out)
    model = MarianMTModel.from_pretrained(out).eval()
    assert model.generation_config.max_length > 100  # not transformers' default of 20
    src = (run / "data" / "valid.en").read_text(encoding="utf-8").splitlines()[:5]
    batch = tokenizer(src, return_tensors="pt", padding=True)
    with torch.inference_mode():
        out_ids = model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=60)
    texts = tokenizer.batch_decode(out_ids, skip_special_tokens=True)
    assert texts == Translator.from_checkpoint(ckpt, "cpu").translate(src, method="greedy")


def test_export_cli(run: Path) -> None:
    ckpt, out = run / "run" / "checkpoints" / "best.pt", run / "cli"
    args = [
        sys.executable,
        "-m",
        "seq2seq.cli.export",
        f"ckpt={ckpt}",
        f"out={out}",
        "check_lines=5",
    ]
    done = subprocess.run(args, capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert "5/5 greedy outputs identical to ours" in done.stderr
    assert (out / "model.bin").exists()
    again = subprocess.run([*args, "format=huggingface"], capture_output=True, text=True, cwd=REPO)
    assert again.returncode == 1
    assert "exists: choose another out= or pass force=true" in again.stderr
    bad = subprocess.run(
        [*args[:-1], f"out={run / 'q'}", "format=huggingface", "quantization=int8"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert bad.returncode == 1
    assert "quantization applies to format=ctranslate2" in bad.stderr
    assert not (run / "q").exists()
    nodata = subprocess.run(
        [*args[:-1], f"out={run / 'n'}", f"data_root={run / 'nowhere'}"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert nodata.returncode == 1
    assert "or check_lines=0 to skip the check" in nodata.stderr
    assert not (run / "n").exists()
    assert not list(run.glob(".n.*"))  # no folder left behind
