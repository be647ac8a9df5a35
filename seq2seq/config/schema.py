"""The training run's typed config schema (TrainConfig: what `seq2seq-train` composes and a
checkpoint stores), registered in Hydra's ConfigStore with the other commands' configs
(seq2seq/config/commands.py).

Every field here is read somewhere; each carries a comment saying what it does. YAML files under
`seq2seq/config/` only choose values. An unknown key or a bad value fails when Hydra composes the
config, and the error names the full key (e.g. `pos_encoding.kind`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

# the installed package (its embedded data: data/numbers) and its Hydra config tree (this folder)
PACKAGE_ROOT = Path(__file__).resolve().parent.parent
CONFIG_DIR = str(Path(__file__).resolve().parent)


class TokenizerKind(str, Enum):
    """tokenizer.kind: a SentencePiece model (bpe, unigram), or words or characters."""

    bpe = "bpe"
    unigram = "unigram"
    word = "word"
    char = "char"


class PosKind(str, Enum):
    """pos_encoding.kind: the positional encodings of seq2seq/model/positional.py."""

    sinusoidal = "sinusoidal"
    learned = "learned"
    relative = "relative"
    t5_bias = "t5_bias"
    alibi = "alibi"
    rope = "rope"
    kerple = "kerple"
    fire = "fire"
    none = "none"


class SearchKind(str, Enum):
    """decode.method: how translations are searched for."""

    greedy = "greedy"
    beam = "beam"
    sample = "sample"  # random sampling (temperature, top-k, top-p), seeded


class LengthPenaltyKind(str, Enum):
    """decode.length_penalty: how beam search normalizes scores by length."""

    none = "none"  # raw sum of log-probabilities
    gnmt = "gnmt"  # Wu et al. 2016: score / ((5 + |y|) / 6) ** alpha
    average = "average"  # score / |y| ** alpha


class Schedule(str, Enum):
    """optim.schedule: the learning rate after the linear warmup."""

    inverse_sqrt = "inverse_sqrt"  # Vaswani et al. 2017, eq. 3: lr * sqrt(warmup / step)
    cosine = "cosine"  # half a cosine from lr down to min_lr (Loshchilov & Hutter 2017, SGDR)
    linear = "linear"  # a straight line from lr down to min_lr


class Precision(str, Enum):
    """trainer.precision: the floating-point type training computes in."""

    auto = "auto"  # the faster of fp32 and bf16, timed on a CPU; bf16 on a GPU that supports it
    fp32 = "fp32"
    bf16 = "bf16"  # autocast to bfloat16 (CUDA or CPU)
    fp16 = "fp16"  # autocast to float16 with a gradient scaler (CUDA)


class SamplingPlan(str, Enum):
    """tokenizer.sampling.plan: the lengths an epoch's batches are cut on when sampling."""

    sampled = "sampled"  # the epoch's sampled segmentations, drawn before its first batch
    prepared = "prepared"  # the prepared (deterministic) ones; sampled at batch time, then cut


class BestMetric(str, Enum):
    """trainer.best_metric: the validation score that picks best.pt."""

    bleu = "bleu"  # validation BLEU of greedy translations, higher is better
    chrf = "chrf"  # validation chrF of the same translations, higher is better
    loss = "loss"  # validation loss (teacher-forced NLL per token, no smoothing), lower is better


class Kernels(str, Enum):
    """trainer.kernels: which implementations the model's operations run on."""

    auto = "auto"  # the fast CPU kernels on a CPU, plain PyTorch elsewhere (CUDA)
    reference = "reference"  # plain PyTorch everywhere


class BatchShapes(str, Enum):
    """trainer.batch_shapes: the shapes of the training batches (seq2seq/data/buckets.py)."""

    auto = "auto"  # fixed with trainer.compile, exact without
    exact = "exact"  # each batch as long as its longest pair, its rows as the token budget cut
    fixed = "fixed"  # padded to one of trainer.shape_buckets shapes (rows, L, L)


class CompileMode(str, Enum):
    """trainer.compile_mode: torch.compile's mode for trainer.compile."""

    default = "default"  # Inductor's defaults
    # "max-autotune": GEMMs timed against Inductor's templates; on a CPU these are offered only for
    # frozen (inference) weights, so a training step's GEMMs keep ATen's kernels
    max_autotune = "max_autotune"


@dataclass
class DataConfig:
    """data: the parallel corpus, its splits, and which pairs training keeps."""

    name: str = "numbers"  # label used in logs and run folders
    # relative: to the working directory, else to the package (its embedded data/numbers)
    root: str = "data/numbers"  # folder of {split}.{lang} or {split}.{lang}.gz files
    src_lang: str = "en"  # source language suffix
    tgt_lang: str = "de"  # target language suffix
    # training split(s); several are mixed in every epoch (data.weights)
    train: list[str] = field(default_factory=lambda: ["train"])
    # per training split: the share of its pairs drawn each epoch (1 = each once, 0.5 = a random
    # half, 3 = each three times); empty = 1 for every split
    weights: list[float] = field(default_factory=list)
    valid: str = "valid"  # validation split (loss, perplexity, greedy BLEU)
    test: list[str] = field(default_factory=lambda: ["test"])  # splits scored after training
    max_len: int = 256  # pairs with a side longer than this (in tokens) are dropped and counted
    # length generalization: train only on the pairs whose source has at most this many tokens
    # (0 = all). It is then also the experiment's cap L (unless length_cap sets one): validation
    # keeps only sources of at most L tokens (best.pt is chosen within the cap), and the whole
    # test splits are also scored together by source-token bucket around L, with a "long" split
    # of every sentence over L and the hypothesis/reference length ratio of each bucket
    train_max_src_len: int = 0
    # the cap L of a reference run trained on every length (train_max_src_len=0): validated and
    # scored as a capped run would be, so that the two compare on the same sentences (0 = none)
    length_cap: int = 0
    # bidirectional training (BiT; Ding et al. 2021, "Improving Neural Machine Translation by
    # Bidirectional Training"): the first N epochs also train on every pair reversed, target ->
    # source, with no tag (an epoch then has about twice the batches), the later ones source ->
    # target only, as without it. The authors train 1/3 of the steps so. Needs tokenizer.joint;
    # not with tokenizer.sampling or train_max_src_len. 0 = off
    bidirectional_epochs: int = 0
    # a seq2seq-prepare output to train from; unset: prepared on first use into cache_dir
    prepared: str | None = None
    # data prepared on first use, keyed by files and settings (relative: to the working directory)
    cache_dir: str = ".cache/prepared"
    workers: int = 0  # processes that tokenize while preparing (0 = one per core)


def length_cap(d: DataConfig) -> int:
    """The cap L of a length experiment (data.length_cap, else data.train_max_src_len; 0: none)."""
    return d.length_cap or d.train_max_src_len


@dataclass
class SubwordSamplingConfig:
    """tokenizer.sampling: subword regularization, training only (seq2seq/data/subword_sampling.py).

    Each epoch, every training pair is segmented anew by the SentencePiece model's sampler:
    BPE-dropout (Provilkov et al. 2020, "BPE-Dropout: Simple and Effective Subword
    Regularization") for tokenizer=bpe, subword sampling (Kudo 2018, "Subword Regularization:
    Improving Neural Network Translation Models with Multiple Subword Candidates") for
    tokenizer=unigram. Validation, test and translation always use the deterministic
    segmentation. All 0 (the default): off, the prepared ids exactly."""

    # bpe: the probability that each merge is skipped (BPE-dropout's p; the paper uses 0.1).
    # 0 = off. Must be 0 for the other tokenizer kinds
    bpe_dropout: float = 0.0
    # unigram: the smoothing exponent: a segmentation x is drawn with probability proportional
    # to P(x)^alpha (Kudo 2018 tries 0.1-0.5; small = closer to uniform). 0 = off, at most 1
    unigram_alpha: float = 0.0
    # unigram: draw among the unigram_nbest most probable segmentations (Kudo's l; at least 2),
    # or -1 = among all of them (forward-filtering backward-sampling on the lattice)
    unigram_nbest: int = -1
    # the lengths the epoch's batches are cut on: sampled = every pair's segmentation of the
    # epoch, drawn before its first batch (each batch then holds at most trainer.max_tokens of
    # them, as without sampling; one epoch's ids in memory); prepared = the deterministic ones,
    # sampled as each batch is read (no memory; a batch made too wide is cut into passes)
    plan: SamplingPlan = SamplingPlan.sampled


@dataclass
class TokenizerConfig:
    """tokenizer: how the source and target vocabularies are built."""

    kind: TokenizerKind = TokenizerKind.bpe  # bpe | unigram (sentencepiece), word | char
    vocab_size: int = 8000  # target vocabulary size (sentencepiece; cap for word)
    joint: bool = True  # one vocabulary for both languages
    min_freq: int = 1  # word/char: drop tokens seen fewer times
    character_coverage: float = 1.0  # sentencepiece: share of characters covered
    # fold case: the tokenizer is trained on lowercased text and lowercases every text it encodes
    # (sentencepiece: its nmt_nfkc_cf rule, kept in the model file), so the model reads and writes
    # lowercase only, as the Multi30k papers' preprocessing; validation then scores lowercased
    lowercase: bool = False
    cache_dir: str = ".cache/tokenizers"  # trained models, keyed by a hash of data + settings
    sample_lines: int = 1_000_000  # trained on at most this many random training pairs (or all)
    sample_seed: int = 1  # seed of that sample
    # subword regularization of the training pairs (off by default); not a vocabulary setting:
    # a fine-tuning run (trainer.init_from) chooses its own
    sampling: SubwordSamplingConfig = field(default_factory=SubwordSamplingConfig)


@dataclass
class PosEncodingConfig:
    """pos_encoding, encoder_pos, decoder_pos: an encoding and its settings."""

    kind: PosKind = PosKind.sinusoidal  # which encoding (see seq2seq/model/positional.py)
    max_len: int = 1024  # learned: table size; sinusoidal: precomputed length
    clip: int = 16  # relative (Shaw): distances beyond +-clip share one embedding
    num_buckets: int = 32  # t5_bias: number of relative-position buckets
    max_distance: int = 128  # t5_bias: distance at which buckets stop growing
    rope_base: float = 10000.0  # rope: base of the rotation frequencies
    # relative, t5_bias, kerple, fire: one set of position parameters for all the layers of a
    # stack (true) or one per layer (false); unset: as each paper does (per layer: relative,
    # kerple, fire; shared: t5_bias). Checkpoints from before this key keep theirs (shared)
    share_layers: bool | None = None
    # alibi, encoder only: false = the symmetric -slope * |i - j|, blind to left vs right;
    # true = keys on the left and on the right get different slopes (docs/POSITIONAL_ENCODINGS.md)
    alibi_directional: bool = False
    t5_zero_init: bool = False  # t5_bias: start the table at zero, not N(0, d_model^-0.5) as T5
    # fire: the threshold L's starting value (tokens); below the longest training position, or
    # the progressive interpolation never acts in training (the run reports it)
    fire_threshold: float = 32.0


@dataclass
class ModelConfig:
    """model: the Transformer's sizes, dropouts and shared weights."""

    d_model: int = 128  # embedding and hidden size
    n_heads: int = 4  # attention heads
    enc_layers: int = 4  # encoder layers
    dec_layers: int = 4  # decoder layers
    d_ff: int = 256  # feed-forward inner size
    dropout: float = 0.1  # residual and embedding dropout
    attn_dropout: float = 0.0  # dropout on attention weights
    ffn_dropout: float = 0.0  # dropout on the feed-forward hidden activations (after the ReLU)
    # word dropout (Gal & Ghahramani 2016; Sennrich et al. 2016): in training, each source
    # (target: decoder input) token's embedding is zeroed whole with this probability, the kept
    # ones scaled by 1 / (1 - p), before the positions are added; 0 = off
    src_word_dropout: float = 0.0
    tgt_word_dropout: float = 0.0
    norm_first: bool = True  # pre-norm (True) or post-norm (False, Vaswani et al.)
    tie_output: bool = True  # output projection shares the target embedding matrix
    share_embeddings: bool = True  # source and target share embeddings (needs a joint vocab)


@dataclass
class OptimConfig:
    """optim: AdamW, gradient clipping and the learning-rate schedule."""

    lr: float = 1e-3  # peak learning rate, reached after warmup
    warmup_steps: int = 1000  # linear warmup from lr / warmup_steps, then `schedule`
    schedule: Schedule = Schedule.inverse_sqrt  # inverse_sqrt | cosine | linear
    # cosine and linear: the step at which the decay reaches min_lr and stays (0 =
    # trainer.max_steps: a run stopped earlier, by max_minutes or patience, never gets there)
    decay_steps: int = 0
    min_lr: float = 0.0  # cosine and linear: the learning rate at decay_steps and after
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])  # Adam betas
    eps: float = 1e-9  # Adam epsilon
    weight_decay: float = 0.0  # decoupled weight decay (AdamW)
    clip_norm: float = 1.0  # gradient-norm clipping (0 = off)


@dataclass
class TrainerConfig:
    """trainer: the training loop's batches, stopping rules, validation and saving."""

    seed: int = 1  # seeds python, torch and the batch order
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    threads: int = 0  # torch intra-op threads (0 = torch default)
    max_tokens: int = 4096  # token budget per batch (padded source or target tokens)
    accum_steps: int = 1  # batches accumulated per optimizer step
    max_steps: int = 10000  # stop after this many optimizer steps
    max_epochs: int = 100  # stop after this many epochs
    max_minutes: float = 0.0  # stop after this much wall time (0 = no limit)
    label_smoothing: float = 0.1  # label-smoothed cross-entropy
    log_every: int = 50  # steps between TensorBoard/console scalars
    valid_every: int = 500  # steps between validations (and checkpoints)
    valid_bleu_sentences: int = 0  # validation sentences decoded for BLEU (0 = all)
    keep_last: int = 3  # periodic checkpoints kept, besides best.pt
    # auto | fp32 | bf16 | fp16. auto times a few real steps in fp32 and bf16 before a run on a
    # CPU or a CUDA GPU with bf16 and keeps the faster (fp32 elsewhere); a resumed run keeps it
    precision: Precision = Precision.auto
    # auto: the fast CPU kernels on a CPU (oneDNN linears, fused output layer + loss, cheap
    # dropout masks, attention on matmuls where SDPA is slow) and plain PyTorch elsewhere (CUDA);
    # reference: plain PyTorch everywhere (F.linear, F.scaled_dot_product_attention, F.dropout,
    # F.cross_entropy on full logits). Same model and results to float rounding (seq2seq/kernels)
    kernels: Kernels = Kernels.auto
    # torch.compile the model for training; it runs on the plain-PyTorch kernels (trainer.kernels
    # is then taken as reference). With batch_shapes fixed (auto's choice with compile) it compiles
    # one graph per shape, each on its first step (the log gives those steps' seconds), and reuses
    # them. On the CPUs measured it is slower than eager (AMD EPYC: 0.47x fp32, 0.45x bf16: its
    # kernels are the reference ones; docs/BENCHMARKS.md), faster on a GPU (H200: 1.65x bf16):
    # check with `benchmarks/train_throughput.py --compile-vs-eager` first
    compile: bool = False
    compile_mode: CompileMode = CompileMode.default  # default | max_autotune (longer warm-up)
    # auto | exact | fixed. fixed pads every training batch to one of shape_buckets shapes: the
    # source and target both to one of shape_buckets lengths chosen from the training pairs'
    # lengths (least padding), the rows to that length's share of max_tokens (filler rows add
    # nothing to the loss or the gradients), so that a compiled model reuses its graphs. It
    # costs padding: the log gives the share of real tokens per epoch (padding_efficiency).
    # auto: fixed with compile, exact without
    batch_shapes: BatchShapes = BatchShapes.auto
    shape_buckets: int = 8  # batch_shapes fixed: how many lengths (and shapes)
    # device peak in TFLOPS for train/mfu in TensorBoard; 0 = a table of GPUs by name
    # (seq2seq/train/flops.py: bf16 dense peaks), or on the CPU a matmul's, measured at start
    peak_tflops: float = 0.0
    progress: bool = True  # a progress bar on a terminal, a log line every log_every steps else
    # auto: resume from <run dir>/checkpoints when it holds one (last.pt, else the newest
    # loadable step_N.pt); never: always start afresh (refused if the run dir has checkpoints);
    # or the path of a checkpoint to resume from. See docs/RELIABILITY.md.
    resume: str = "auto"
    # true: a run whose directory already holds results.json (it finished: tested and scored)
    # returns those scores at once, training and writing nothing, and Hydra leaves its .hydra/
    # as it was (cli/train.py). The sweep experiments (pos_sweep, pos_multi30k) set it, so that a
    # sweep started again skips its finished runs and resumes the others (resume=auto)
    skip_finished: bool = False
    # fine-tune: a new run (step 0) from this checkpoint's weights and tokenizers, with its model
    # settings (seq2seq/train/finetune.py); a resumed run continues from its own checkpoints instead
    init_from: str | None = None
    init_reset: bool = True  # with init_from: a fresh optimizer (false: keep its AdamW moments)
    max_bad_steps: int = 5  # stop after this many consecutive non-finite losses/gradients
    # the validation metric that chooses best.pt and that early stopping watches
    best_metric: BestMetric = BestMetric.bleu
    patience: int = 0  # stop after this many validations without a best_metric gain (0 = off)
    average_last: int = 0  # average the last N step checkpoints at the end and test it too
    # R-Drop (Liang et al. 2021): > 0 runs every batch through the model twice (independent
    # dropout masks) and trains on half the authors' loss, (loss1 + loss2 + rdrop_alpha x their
    # symmetric KL divergence) / 2 (kernels.rdrop_loss): rdrop_alpha is the authors' alpha
    # (their IWSLT'14 De-En setting is 5). 0 = off: one pass, as without it. It needs dropout;
    # a step costs about twice as much
    rdrop_alpha: float = 0.0


def fixed_shapes(t: TrainerConfig) -> int:
    """How many fixed batch shapes training pads to (trainer.batch_shapes, trainer.shape_buckets);
    0: exact shapes."""
    fixed = t.batch_shapes == BatchShapes.fixed
    fixed = fixed or (t.batch_shapes == BatchShapes.auto and t.compile)
    return t.shape_buckets if fixed else 0


@dataclass
class DecodeConfig:
    """decode: the search that translates, and how long its outputs may be."""

    method: SearchKind = SearchKind.greedy  # greedy | beam | sample
    beam_size: int = 5  # beam width (beam search)
    length_penalty: LengthPenaltyKind = LengthPenaltyKind.gnmt  # how beam scores are normalized
    alpha: float = 0.6  # length penalty exponent
    max_len_a: float = 1.5  # output length limit is a * |src| + b
    max_len_b: int = 10  # see max_len_a
    nbest: int = 1  # hypotheses returned per sentence (beam search), samples drawn (sample)
    batch_size: int = 64  # sentences per decoding batch (rows decoded side by side)
    continuous: bool = True  # greedy: finished rows take the next sentences (continuous batching)
    temperature: float = 1.0  # sample: the logits are divided by it (below 1: closer to greedy)
    top_k: int = 0  # sample: draw from the k most probable tokens only (0 = all)
    top_p: float = 1.0  # sample: from the fewest most probable tokens holding p of the mass
    seed: int = 1  # sample: with the sentence's index, seeds its draws (batch-size independent)
    # greedy: each output's log-probability (Translation.score). Off, a step takes the argmax of
    # the logits and skips the softmax over the vocabulary (CTranslate2's return_scores=False)
    # and scores are NaN; text-only callers (translate, evaluate, validation) turn it off
    scores: bool = True


@dataclass
class TrainConfig:
    """The config of seq2seq-train (seq2seq/config/train.yaml)."""

    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    pos_encoding: PosEncodingConfig = field(default_factory=PosEncodingConfig)
    encoder_pos: PosEncodingConfig | None = None  # overrides pos_encoding in the encoder
    decoder_pos: PosEncodingConfig | None = None  # overrides pos_encoding in the decoder
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    name: str = "default"  # run name: names the output folder (experiment/*.yaml set it)


def resolve_path(path: str | Path) -> Path:
    """A path from a config (data.root, trainer.resume): relative to the working directory,
    else to the package (the embedded data/numbers)."""
    p = Path(path).expanduser()
    if p.is_absolute() or p.exists():
        return p
    return PACKAGE_ROOT / p if (PACKAGE_ROOT / p).exists() else p


def config_from_dict(values: dict[str, Any]) -> TrainConfig:
    """A TrainConfig from the plain dict stored in a checkpoint (validated like the CLI's).

    A checkpoint saved before a setting existed gets the value it was trained with, where that
    differs from today's default (`upgrade_pos_encoding`, `upgrade_sampling`)."""
    values = {k: upgrade_pos_encoding(v) if k in POS_SECTIONS else v for k, v in values.items()}
    if "tokenizer" in values:
        values["tokenizer"] = upgrade_sampling(values["tokenizer"])
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), values))  # type: ignore[return-value]


POS_SECTIONS = ("pos_encoding", "encoder_pos", "decoder_pos")


def upgrade_pos_encoding(values: dict[str, Any] | None) -> dict[str, Any] | None:
    """A stored positional-encoding section from before `share_layers`: Shaw's tables were then
    shared by the layers of a stack, which the checkpoint's weights hold."""
    if not isinstance(values, dict) or "share_layers" in values:
        return values
    if values.get("kind") == PosKind.relative:  # a str enum: equal to "relative" too
        return {**values, "share_layers": True}
    return values


def upgrade_sampling(values: dict[str, Any] | None) -> dict[str, Any] | None:
    """A stored tokenizer section from before tokenizer.sampling.plan, sampling on: its epochs
    were planned on the prepared lengths (plan=prepared), which a resume must keep."""
    if not isinstance(values, dict):
        return values
    sampling = values.get("sampling")
    if not isinstance(sampling, dict) or "plan" in sampling:
        return values
    if sampling.get("bpe_dropout") or sampling.get("unigram_alpha"):
        return {**values, "sampling": {**sampling, "plan": SamplingPlan.prepared.value}}
    return values
