"""Tests for seq2seq.config.schema and .commands, and the YAML tree beside them: every option
composes through Hydra into a valid TrainConfig (and a model), and bad keys or values fail early
with the key in the message."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import DictConfig, OmegaConf

from seq2seq.config.checks import check_config, check_decode
from seq2seq.config.commands import EvaluateConfig, TranslateConfig, register_configs
from seq2seq.config.schema import (
    DataConfig,
    DecodeConfig,
    ModelConfig,
    OptimConfig,
    PosEncodingConfig,
    PosKind,
    SamplingPlan,
    TokenizerConfig,
    TrainConfig,
    TrainerConfig,
    config_from_dict,
)
from seq2seq.model.absolute import Rotary, Sinusoidal
from seq2seq.model.positional import PositionalEncoding
from seq2seq.model.relative import ALiBi
from seq2seq.model.transformer import build_model
from seq2seq.train.resume import config_changes, flatten
from tests.config_snapshot import SNAPSHOT, resolve_all

CONFIGS = Path(__file__).resolve().parents[2] / "seq2seq" / "config"
GROUPS = ["data", "tokenizer", "model", "pos_encoding", "optim", "trainer", "decode", "experiment"]
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((CONFIGS / g).glob("*.yaml"))]
SMALL_VOCAB = 50
POS_SIDES = ("encoder_pos", "decoder_pos")  # per-side overrides of pos_encoding


def compose_config(name: str, overrides: list[str] | None = None) -> DictConfig:
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(name, overrides=overrides or [])


def train_config(overrides: list[str] | None = None) -> TrainConfig:
    cfg = OmegaConf.to_object(compose_config("train", overrides))
    assert isinstance(cfg, TrainConfig)
    return cfg


def test_every_group_has_options() -> None:
    for group in GROUPS:
        assert any(o[0] == group for o in OPTIONS), f"seq2seq/config/{group}/ has no YAML file"
    assert len(OPTIONS) >= 20


def plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True, enum_to_str=True)


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_config_option_composes(group: str, option: str) -> None:
    composed = compose_config("train", [f"{group}={option}"])
    cfg = OmegaConf.to_object(composed)
    assert isinstance(cfg, TrainConfig)
    check_config(cfg)
    if group == "experiment":
        assert cfg.name == option
    else:  # every value of the YAML file reached the config (the root's for a _global_ file)
        path = CONFIGS / group / f"{option}.yaml"
        written = flatten(plain(OmegaConf.load(path)))
        is_global = "# @package _global_" in path.read_text(encoding="utf-8")
        got = flatten(plain(composed if is_global else composed[group]))
        for key, value in written.items():
            assert got[key] == value, f"{group}/{option}.yaml: {key}"

    if group == "model":  # full-size models: build on the meta device (no memory, no init time)
        with torch.device("meta"):
            model = build_model(cfg, SMALL_VOCAB, SMALL_VOCAB)
        assert len(model.encoder) == cfg.model.enc_layers
        assert len(model.decoder) == cfg.model.dec_layers
        assert model.out.weight.shape == (SMALL_VOCAB, cfg.model.d_model)
        assert model.encoder[0].ffn.up.out_features == cfg.model.d_ff
        assert model.encoder[0].self_attn.n_heads == cfg.model.n_heads
    if group == "pos_encoding":
        model = build_model(cfg, SMALL_VOCAB, SMALL_VOCAB).eval()
        sides = [(model.enc_pos, cfg.encoder_pos), (model.dec_pos, cfg.decoder_pos)]
        for pos, side in sides:  # a per-side mix (encoder_pos, decoder_pos) or one for both
            has_encoding = (side or cfg.pos_encoding).kind != PosKind.none
            assert (type(pos) is not PositionalEncoding) == has_encoding
        src = torch.tensor([[5, 6, 7, 2], [5, 2, 0, 0]])
        with torch.no_grad():
            logits = model.logits(src, torch.tensor([[1, 8, 9], [1, 8, 0]]))
        assert logits.shape == (2, 3, SMALL_VOCAB)
        assert torch.isfinite(logits).all()


SWEEPS = ["pos_sweep", "pos_multi30k", "pos_multi30k_ref"]
ENCODINGS = [o for g, o in OPTIONS if g == "pos_encoding"]


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("experiment", SWEEPS)
def test_every_sweep_run_passes_the_checks_and_runs_long(experiment: str, encoding: str) -> None:
    """Every run a sweep makes (its experiment with each encoding) passes check_config and its
    model scores sources and targets five times the length experiment's cap: a setting that
    breaks only on long test sentences (T5's max_distance at or below its exact buckets) fails
    here, not after a run's training."""
    composed = compose_config("train", [f"experiment={experiment}", f"pos_encoding={encoding}"])
    cfg = OmegaConf.to_object(composed)
    assert isinstance(cfg, TrainConfig)
    check_config(cfg)
    model = build_model(cfg, SMALL_VOCAB, SMALL_VOCAB).eval()
    src = torch.randint(3, SMALL_VOCAB, (1, 50))  # (B, S): 5L for L = 10
    tgt = torch.randint(3, SMALL_VOCAB, (1, 70))  # (B, T)
    with torch.no_grad():
        logits = model.logits(src, tgt)  # (B, T, V)
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("decode", [p.stem for p in sorted((CONFIGS / "decode").glob("*.yaml"))])
def test_translate_and_evaluate_configs_compose(decode: str) -> None:
    translate = OmegaConf.to_object(
        compose_config("translate", ["ckpt=run/best.pt", "input=in.txt", f"decode={decode}"])
    )
    assert isinstance(translate, TranslateConfig)
    assert translate.ckpt == "run/best.pt"
    assert translate.input == "in.txt"
    assert translate.decode.method.value == decode
    check_decode(translate.decode)
    evaluate = OmegaConf.to_object(
        compose_config("evaluate", ["hyp=h.txt", "ref=r.txt", "json=-", f"decode={decode}"])
    )
    assert isinstance(evaluate, EvaluateConfig)
    assert (evaluate.hyp, evaluate.ref, evaluate.json) == ("h.txt", "r.txt", "-")
    check_decode(evaluate.decode)


def test_translate_and_evaluate_defaults() -> None:
    evaluate = OmegaConf.to_object(compose_config("evaluate"))
    assert isinstance(evaluate, EvaluateConfig)
    assert evaluate.ckpt is None
    assert evaluate.split == "test"
    assert evaluate.decode.method.value == "beam"
    with pytest.raises(Exception, match="ckpt"):  # the checkpoint is mandatory
        OmegaConf.to_object(compose_config("translate"))


def test_default_train_config() -> None:
    cfg = train_config()
    check_config(cfg)
    assert cfg.encoder_pos is None
    assert cfg.decoder_pos is None
    assert cfg.pos_encoding.kind == PosKind.sinusoidal
    t = cfg.trainer  # reliability settings: resume when possible, early stopping off
    assert (t.resume, t.max_bad_steps, t.patience, t.average_last) == ("auto", 5, 0, 0)


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_pos_encoding_for_one_side_only(side: str) -> None:
    other = "decoder" if side == "encoder" else "encoder"
    cfg = train_config([f"+pos_encoding@{side}_pos=alibi", "model.d_model=32", "model.n_heads=4"])
    check_config(cfg)
    chosen = getattr(cfg, f"{side}_pos")
    assert chosen is not None
    assert chosen.kind == PosKind.alibi
    assert getattr(cfg, f"{other}_pos") is None
    model = build_model(cfg, SMALL_VOCAB, SMALL_VOCAB)
    assert isinstance(getattr(model, f"{side[:3]}_pos"), ALiBi)
    assert isinstance(getattr(model, f"{other[:3]}_pos"), Sinusoidal)  # the default
    # every layer of a stack shares its stack's encoding
    layers = model.encoder if side == "encoder" else model.decoder
    assert all(isinstance(layer.self_attn.pos, ALiBi) for layer in layers)


def test_both_sides_overridden() -> None:
    cfg = train_config(
        ["+pos_encoding@encoder_pos=alibi", "+pos_encoding@decoder_pos=rope", "model.d_model=32"]
    )
    model = build_model(cfg, SMALL_VOCAB, SMALL_VOCAB)
    assert isinstance(model.enc_pos, ALiBi)
    assert isinstance(model.dec_pos, Rotary)


@pytest.mark.parametrize(
    ("override", "key", "detail"),
    [
        ("model.dmodel=3", "model.dmodel", "dmodel"),
        ("pos_encoding.kind=foo", "pos_encoding.kind", "sinusoidal"),
        ("trainer.precision=fp8", "trainer.precision", "fp32"),
        ("decode.beam_size=five", "decode.beam_size", "five"),
        ("trainer.resum=never", "trainer.resum", "resum"),
        ("trainer.patience=soon", "trainer.patience", "soon"),
    ],
)
def test_bad_keys_and_values_fail_at_compose_time(override: str, key: str, detail: str) -> None:
    with pytest.raises(ConfigCompositionException) as err:
        compose_config("train", [override])
    message = f"{err.value} {err.value.__cause__}"
    assert key in message
    assert detail in message  # the bad key, or the allowed values


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["decode.beam_size=0"], "decode.beam_size"),
        (["decode.max_len_b=-1"], "decode.max_len_b"),
        (["decode.max_len_a=-0.5"], "decode.max_len_a"),
        (["decode=beam", "decode.nbest=6"], "decode.nbest"),
        (["model.d_model=30", "model.n_heads=4"], "model.d_model"),
        (["model.enc_layers=0"], "model.enc_layers"),
        (["model.dropout=1.0"], "model.dropout"),
        (["trainer.label_smoothing=-0.1"], "trainer.label_smoothing"),
        (["optim.lr=0"], "optim.lr"),
        (["optim.betas=[0.9]"], "optim.betas"),
        (["tokenizer.joint=false"], "model.share_embeddings"),
        (["data.max_len=-5"], "data.max_len"),
        (["trainer.max_tokens=-1"], "trainer.max_tokens"),
        (["trainer.max_steps=0"], "trainer.max_steps"),
        (["trainer.max_bad_steps=0"], "trainer.max_bad_steps"),
        (["trainer.patience=-1"], "trainer.patience"),
        (["trainer.keep_last=-1"], "trainer.keep_last"),
        (["trainer.average_last=4"], "trainer.keep_last"),  # keep_last=3 cannot keep them
        (["trainer.resume=''"], "trainer.resume"),
        (["optim.warmup_steps=-1"], "optim.warmup_steps"),
        (["tokenizer.sampling.bpe_dropout=1.0"], "tokenizer.sampling.bpe_dropout"),
        (["tokenizer.sampling.bpe_dropout=-0.1"], "tokenizer.sampling.bpe_dropout"),
        (
            ["tokenizer=unigram", "tokenizer.sampling.bpe_dropout=0.1"],
            "tokenizer.sampling.bpe_dropout",
        ),
        (["tokenizer.sampling.unigram_alpha=0.1"], "tokenizer.sampling.unigram_alpha"),  # bpe
        (
            ["tokenizer=unigram", "tokenizer.sampling.unigram_alpha=1.5"],
            "tokenizer.sampling.unigram_alpha",
        ),
        (
            ["tokenizer=unigram", "tokenizer.sampling.unigram_alpha=-0.2"],
            "tokenizer.sampling.unigram_alpha",
        ),
        (
            [
                "tokenizer=unigram",
                "tokenizer.sampling.unigram_alpha=0.1",
                "tokenizer.sampling.unigram_nbest=1",
            ],
            "tokenizer.sampling.unigram_nbest",
        ),
        (["tokenizer.sampling.unigram_nbest=8"], "tokenizer.sampling.unigram_nbest"),  # bpe
        (
            ["tokenizer=word", "tokenizer.sampling.bpe_dropout=0.1"],
            "tokenizer.sampling.bpe_dropout",
        ),
        (
            ["tokenizer=char", "tokenizer.sampling.unigram_alpha=0.1"],
            "tokenizer.sampling.unigram_alpha",
        ),
        (["pos_encoding=t5_bias", "pos_encoding.max_distance=10"], "pos_encoding.max_distance"),
        (["pos_encoding=t5_bias", "pos_encoding.num_buckets=2"], "pos_encoding.num_buckets"),
        (
            ["+pos_encoding@decoder_pos=t5_bias", "decoder_pos.max_distance=16"],
            "decoder_pos.max_distance",
        ),
        (
            ["+pos_encoding@encoder_pos=t5_bias", "encoder_pos.max_distance=8"],
            "encoder_pos.max_distance",
        ),
        (["trainer.rdrop_alpha=-1"], "trainer.rdrop_alpha"),
        (["trainer.rdrop_alpha=inf"], "trainer.rdrop_alpha"),
        (["trainer.rdrop_alpha=1", "model.dropout=0"], "trainer.rdrop_alpha"),
        (["model.src_word_dropout=1"], "model.src_word_dropout"),
        (["model.tgt_word_dropout=-0.1"], "model.tgt_word_dropout"),
    ],
)
def test_check_config_rejects(overrides: list[str], key: str) -> None:
    cfg = train_config(overrides)  # composes: the types are fine, the values are not
    with pytest.raises(ValueError, match=key.replace(".", r"\.") + "="):
        check_config(cfg)


@pytest.mark.parametrize(
    "overrides",
    [
        ["tokenizer=bpe", "tokenizer.sampling.bpe_dropout=0.1"],
        ["tokenizer=unigram", "tokenizer.sampling.unigram_alpha=0.1"],
        [
            "tokenizer=unigram",
            "tokenizer.sampling.unigram_alpha=1",
            "tokenizer.sampling.unigram_nbest=64",
        ],
        ["trainer.rdrop_alpha=5"],
        ["trainer.rdrop_alpha=0.5", "model.dropout=0", "model.attn_dropout=0.1"],
        ["trainer.rdrop_alpha=0.5", "model.dropout=0", "model.src_word_dropout=0.1"],
        ["model.src_word_dropout=0.1", "model.tgt_word_dropout=0.1"],
    ],
)
def test_check_config_accepts_regularization(overrides: list[str]) -> None:
    """Subword sampling, word dropout and R-Drop compose from the command line's keys and pass
    the checks."""
    check_config(train_config(overrides))


def test_sampling_a_word_tokenizer_is_refused_with_the_fix() -> None:
    cfg = train_config(["tokenizer=word", "tokenizer.sampling.bpe_dropout=0.1"])
    with pytest.raises(ValueError, match="word or char tokenizer has a single segmentation"):
        check_config(cfg)


def test_check_decode_names_its_prefix() -> None:
    with pytest.raises(ValueError, match=r"decode\.batch_size=0"):
        check_decode(DecodeConfig(batch_size=0))
    check_decode(DecodeConfig(method="greedy", nbest=1, beam_size=1))  # type: ignore[arg-type]


def test_every_config_resolves_as_the_snapshot_says() -> None:
    """Defaults live once, in seq2seq/config/schema.py: the YAMLs hold only what differs, and every
    option still composes to the values of tests/fixtures/resolved_configs.json (rewrite it with
    `python -m tests.config_snapshot` after an intended change)."""
    want = json.loads(SNAPSHOT.read_text())
    got = resolve_all()
    assert sorted(got) == sorted(want)  # a new or removed option: rewrite the snapshot
    for case, values in want.items():
        assert got[case] == values, case


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_group_files_restate_no_default(group: str, option: str) -> None:
    """A group file sets only values that differ from its schema's defaults (besides `kind`,
    `method` and `name`, which say what the option is)."""
    if group == "experiment":
        return  # recipes override other groups' choices, not the schema's defaults
    schema = {
        "pos_encoding": PosEncodingConfig,
        "decode": DecodeConfig,
        "data": DataConfig,
        "tokenizer": TokenizerConfig,
        "model": ModelConfig,
        "optim": OptimConfig,
        "trainer": TrainerConfig,
    }[group]
    defaults = OmegaConf.to_container(OmegaConf.structured(schema), enum_to_str=True)
    path = CONFIGS / group / f"{option}.yaml"
    values = OmegaConf.to_container(OmegaConf.load(path))
    assert isinstance(values, dict)
    assert isinstance(defaults, dict)
    if "# @package _global_" in path.read_text(encoding="utf-8"):  # a per-side mix: sections
        assert group == "pos_encoding"
        assert set(values) <= {"pos_encoding", *POS_SIDES}
        values = {f"{side}.{k}": v for side, section in values.items() for k, v in section.items()}
    for key, value in values.items():
        if key.rsplit(".", 1)[-1] not in ("kind", "method", "name"):
            default = defaults[key.rsplit(".", 1)[-1]]
            assert value != default, f"seq2seq/config/{group}/{option}.yaml restates {key}"


def test_a_sampling_run_saved_before_the_plan_option_keeps_its_plan() -> None:
    """Its epochs were planned on the prepared lengths: a resume must not change that, and
    config_changes names the key when today's default (sampled) is asked for."""
    old = {"tokenizer": {"kind": "bpe", "sampling": {"bpe_dropout": 0.1}}}
    assert config_from_dict(old).tokenizer.sampling.plan == SamplingPlan.prepared
    plain = {"tokenizer": {"kind": "bpe", "sampling": {"bpe_dropout": 0.0}}}
    assert config_from_dict(plain).tokenizer.sampling.plan == SamplingPlan.sampled
    new = {"tokenizer": {"kind": "bpe", "sampling": {"bpe_dropout": 0.1, "plan": "sampled"}}}
    assert config_from_dict(new).tokenizer.sampling.plan == SamplingPlan.sampled
    now = train_config(["tokenizer.sampling.bpe_dropout=0.1"])
    saved = OmegaConf.to_container(OmegaConf.structured(now), enum_to_str=True)
    assert isinstance(saved, dict)
    del saved["tokenizer"]["sampling"]["plan"]  # as written before the option
    assert config_changes(saved, now) == [("tokenizer.sampling.plan", "prepared", "sampled")]
