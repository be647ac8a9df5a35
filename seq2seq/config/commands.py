"""Typed configs of the commands that use a trained model: seq2seq-translate, seq2seq-evaluate,
seq2seq-export and seq2seq-average; and the one place every schema is stored in Hydra's
ConfigStore (`register_configs`, called by each entry point).

The training run's own schema (what a checkpoint stores) is seq2seq/config/schema.py; the commands
here take its `DecodeConfig`. As there, every field is read somewhere and carries a comment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from seq2seq.config.schema import DecodeConfig, TrainConfig


class AttentionLayers(str, Enum):
    """attention_layers (seq2seq-translate): the decoder layers a heatmap shows."""

    mean = "mean"  # one heatmap: the decoder layers' cross-attention averaged
    all = "all"  # one heatmap per decoder layer


class LengthUnit(str, Enum):
    """length_by (seq2seq-evaluate): what the source-length buckets count."""

    words = "words"  # whitespace words of the source: 1-10, 11-20, 21-30, 31-40, 41+
    items = "items"  # comma-separated items of the source (the numbers data)


class PairedTest(str, Enum):
    """paired (seq2seq-evaluate): the paired test(s) of compared systems (sacreBLEU's own)."""

    bs = "bs"  # paired bootstrap resampling (Koehn, 2004)
    ar = "ar"  # approximate randomization (Riezler & Maxwell, 2005)
    both = "both"  # both; a difference is called only where both find it


class WeightType(str, Enum):
    """quantize (seq2seq-translate, seq2seq-evaluate): the linear layers' weights in decoding."""

    float32 = "float32"  # as trained
    int8 = "int8"  # int8 weights, inputs quantized per call (seq2seq/decode/quantize.py); CPU


@dataclass
class TranslateConfig:
    """The config of seq2seq-translate (seq2seq/config/translate.yaml)."""

    # checkpoint to load (best.pt or last.pt of a run), or a list of them: an ensemble that
    # averages their log-probabilities at every step (ckpt=[a.pt,b.pt]; same tokenizers)
    ckpt: Any = MISSING
    input: str = "-"  # file to translate, one sentence a line ("-" = stdin)
    output: str = "-"  # where to write translations ("-" = stdout)
    device: str = "auto"  # auto | cpu | cuda
    # int8: decode with int8 linear layers (CPU only; its speed and BLEU cost: docs/BENCHMARKS.md,
    # "Decoding against CTranslate2")
    quantize: WeightType = WeightType.float32
    # CPU: translate in this many processes at once, each with its share of the cores and of the
    # lines (seq2seq/decode/workers.py); the same outputs, more sentences/s on large inputs
    workers: int = 1
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    # append " ||| " and source-target alignment pairs i-j (0-based subword tokens, EOS left
    # out) to each output line: each target token's most attended source token
    align: bool = False
    # decoder layer whose cross-attention (averaged over heads) aligns; 0-based, -1 = the last
    align_layer: int = -1
    attention_dir: str | None = None  # write one cross-attention heatmap (PNG) per sentence here
    attention_layers: AttentionLayers = AttentionLayers.mean  # heatmaps: layers averaged or all


@dataclass
class EvaluateConfig:
    """The config of seq2seq-evaluate (seq2seq/config/evaluate.yaml)."""

    # score this checkpoint's translations of `split` (one checkpoint: to compare checkpoints give
    # systems=; for an ensemble, translate with seq2seq-translate ckpt=[a.pt,b.pt], then hyp=) ...
    ckpt: Any = None
    split: str = "test"  # ... read from the checkpoint's data config (root overridable below)
    data_root: str | None = None  # replaces the checkpoint's data.root when set
    # ... or score this hypothesis file against `ref`; a list of files compares them with the
    # first (hyp=[base.txt,new.txt]); a list of lists, each system's training seeds
    # (hyp=[[base1.txt,base2.txt],[new1.txt,new2.txt]]): seed-level tests as well
    hyp: Any = None
    ref: str | None = None  # reference file (plain or .gz), required with hyp
    src: str | None = None  # source file of `ref` (plain or .gz), for by_length with hyp
    # ... or compare checkpoints: each translates `split` on its own, and is tested against the
    # first (systems=[base.pt,new.pt]); a list of lists, each system's training seeds
    systems: Any = None
    names: list[str] = field(default_factory=list)  # the compared systems' names; default: paths
    paired: PairedTest = PairedTest.bs  # comparisons: the paired test(s) against the first system
    paired_bs_n: int = 1000  # comparisons: bootstrap resamples (the test's and every interval's)
    paired_ar_n: int = 10000  # comparisons: approximate randomization trials
    paired_seed: int | None = 12345  # comparisons: the resamples' seed (null: unseeded)
    alpha: float = 0.05  # comparisons: the family-wise level of the verdicts, after Holm
    blocked_seeds: bool = False  # seed comparisons: the i-th run of every system shares a seed
    # also report case-insensitive BLEU; comparisons: BLEU and chrF tested lowercased (the
    # Multi30k anchor's metric is lowercased BLEU)
    lowercase: bool = False
    by_length: bool = False  # also report BLEU, chrF and count per source-length bucket
    length_by: LengthUnit = LengthUnit.words  # the buckets of by_length (as the sweep report's)
    # ckpt: also score the split's references with the model (teacher forcing): per-sentence
    # NLL and per-token log-probs to `ref_logprobs`, corpus perplexity, perplexity by position
    score_refs: bool = False
    ref_logprobs: str | None = None  # score_refs' JSON lines; unset: <split>.ref_logprobs.jsonl
    json: str | None = None  # write the scores as JSON to this path ("-" = stdout)
    device: str = "auto"  # auto | cpu | cuda
    quantize: WeightType = WeightType.float32  # ckpt / systems: as seq2seq-translate's
    decode: DecodeConfig = field(default_factory=DecodeConfig)


class ExportFormat(str, Enum):
    """format (seq2seq-export): the kind of model folder written."""

    ctranslate2 = "ctranslate2"  # a CTranslate2 model folder (ctranslate2.Translator)
    huggingface = "huggingface"  # a MarianMTModel folder (from_pretrained)


class Quantization(str, Enum):
    """CTranslate2's weight types (its `--quantization`)."""

    float32 = "float32"
    int8 = "int8"
    int8_float32 = "int8_float32"
    int8_float16 = "int8_float16"
    int8_bfloat16 = "int8_bfloat16"
    int16 = "int16"
    float16 = "float16"
    bfloat16 = "bfloat16"


@dataclass
class ExportConfig:
    """The config of seq2seq-export (seq2seq/config/export.yaml)."""

    ckpt: str = MISSING  # checkpoint to export (best.pt, last.pt, average.pt)
    out: str = MISSING  # folder to write; it must not exist unless force=true
    format: ExportFormat = ExportFormat.ctranslate2  # ctranslate2 | huggingface
    quantization: Quantization = Quantization.float32  # ctranslate2: the weights' type
    force: bool = False  # replace an existing `out`
    check_lines: int = 100  # validation sentences the self-check translates (0: no check)
    check_split: str | None = None  # the split it reads; default: the checkpoint's data.valid
    data_root: str | None = None  # replaces the checkpoint's data.root for the check


@dataclass
class AverageConfig:
    """The config of seq2seq-average (seq2seq/config/average.yaml): `last` checkpoints of a
    `run`, or the checkpoints `ckpts`, averaged into `out`."""

    out: str = MISSING  # the checkpoint to write; never one of its inputs
    run: str | None = None  # a run folder (or its checkpoints/): its newest step checkpoints
    last: int = 10  # with run: how many of them
    ckpts: list[str] = field(default_factory=list)  # instead of run: these checkpoints


def register_configs() -> None:
    """Store the schemas so that YAML files under seq2seq/config/ are validated against them."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="translate_schema", node=TranslateConfig)
    cs.store(name="evaluate_schema", node=EvaluateConfig)
    cs.store(name="export_schema", node=ExportConfig)
    cs.store(name="average_schema", node=AverageConfig)
