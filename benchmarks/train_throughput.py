"""Training throughput: our Trainer's step against Hugging Face's MarianMTModel, same batches.

    python benchmarks/train_throughput.py [--data DIR] [--repeats 5] [--steps 10] [--threads 2]
        [--precision fp32|bf16] [--dropout 0.1] [--max-tokens 4096] [--rdrop-alpha 0]
        [--device cpu|cuda] [--no-doc]

Both engines: d=256, 3+3 layers, 4 heads, FFN 1024, post-norm, ReLU, scaled embeddings, tied joint
sentencepiece BPE vocabulary of 8000 (trained on Multi30k train, cached), dropout 0.1 (no dropout on
the FFN's hidden units: our model.ffn_dropout, Marian's activation_dropout), label-smoothed (0.1)
cross-entropy per target token (ours: the Trainer's fused output layer and loss; Marian: logits,
then PyTorch's F.cross_entropy with label_smoothing, the same function; Marian runs with sdpa
attention, HF's default, and with eager; the speed-up is over the faster), AdamW with the same
warmup + inverse-sqrt schedule, clipping 1.0, on the CPU (fp32, or bf16 autocast for both; --device
cuda: on the GPU). The batches are the first of epoch 0 as the Trainer draws them (length-bucketed,
--max-tokens padded tokens), collated before timing. Each engine runs in its own child process (for
its peak RSS); the repeats alternate the order of the engines. Marian starts from our model's
initial weights (seq2seq/export/huggingface.py, the converter decode_setup.py exports with). The
premise is checked before any timing is reported: a failed copy aborts the run, and so does an
eval-mode loss of the first batch at step 0 that differs between ours and either Marian by more than
LOSS_TOLERANCE. Medians go to benchmarks/results/train_throughput.json and docs/BENCHMARKS.md
(train_throughput).

--compile-vs-eager times trainer.compile against eager on the same fixed-shape batches instead
(ours only; benchmarks/compile_vs_eager.py says how), as train_compile[_bf16][_max_autotune].

--rdrop-alpha A (> 0) times the step with R-Drop (Liang et al. 2021) on both sides: ours with
trainer.rdrop_alpha=A (two passes, kernels.rdrop_loss: chunked on the CPU), Marian with two
forward passes and the same loss written out on its full logits (the mean of the two
label-smoothed losses + A x the symmetric KL, F.kl_div both ways over the non-pad tokens, / 2).
Its results are train_throughput_rdrop[_bf16] (JSON and docs/BENCHMARKS.md), beside the plain
step's.

--device cuda runs both engines on the GPU (each step synchronized before its clock is read; bf16
is CUDA autocast; SDPA's cuDNN backend is off for every engine, as kernels.setup_process sets it
for ours: it builds a graph for each new shape, benchmarks/sdpa_backends.py) and adds the model
FLOPs utilisation: each step's FLOPs (seq2seq.train.flops, the same batches for every engine)
over its seconds, against the GPU's peak for the precision (flops.peak_tflops: dense bf16 tensor
cores, or plain fp32 without TF32, PyTorch's default).
Its results are train_throughput_cuda[_bf16].
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common  # noqa: F401  before torch: MKL's Intel path on AMD (common.py)
import torch
import torch.nn.functional as F
from common import (
    ONEDNN_DEFAULT_CACHES,
    child_pythonpath,
    multi30k_root,
    peak_rss_mb,
    update_doc,
    write_json,
)
from hydra import compose, initialize_config_dir
from train_throughput_report import (
    ENGINES,
    LOSS_TOLERANCE,
    doc_name,
    report,
    summarise,
)

from seq2seq.config.commands import register_configs
from seq2seq.config.schema import CONFIG_DIR, TrainConfig
from seq2seq.data.batching import Batch
from seq2seq.data.tokenizer import PAD_ID
from seq2seq.train.flops import gpu_peak_tflops

HF_ATTENTION = {"hf": "sdpa", "hf_eager": "eager"}  # Marian's attention per engine


def train_config(args: argparse.Namespace, extra: list[str] | None = None) -> TrainConfig:
    """The benchmark's TrainConfig (data=multi30k, model=small as post-norm, on the CPU), with
    the overrides `extra` last (a later override of a key wins)."""
    register_configs()
    overrides = [
        "data=multi30k",
        f"data.root={args.data}",
        "tokenizer=bpe",
        "tokenizer.vocab_size=8000",
        "model=small",
        "model.norm_first=false",
        f"model.dropout={args.dropout}",
        "optim.clip_norm=1.0",
        f"trainer.max_tokens={args.max_tokens}",
        f"trainer.threads={args.threads}",
        f"trainer.device={args.device}",
        "trainer.label_smoothing=0.1",
        "trainer.progress=false",
        f"trainer.precision={args.precision}",
        f"trainer.compile={str(args.compile).lower()}",
        f"trainer.rdrop_alpha={args.rdrop_alpha}",
        *(extra or []),
    ]
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        from omegaconf import OmegaConf

        cfg = OmegaConf.to_object(compose("train", overrides=overrides))
    assert isinstance(cfg, TrainConfig)
    return cfg


def marian(cfg: TrainConfig, vocab: int, attention: str) -> torch.nn.Module:
    """A MarianMTModel of the same size and architecture as our model, with its dropout rates
    and attention implementation `attention` (sdpa, HF's default, or eager)."""
    from transformers import MarianMTModel

    from seq2seq.export.huggingface import marian_config

    config = marian_config(
        cfg.model, (vocab, vocab), max_positions=cfg.data.max_len + 2, dropout=True
    )
    config._attn_implementation = attention
    return MarianMTModel(config)


def hf_logits(model: Any, batch: Batch) -> torch.Tensor:
    """Marian's (B, T, V) logits for our batch layout (EOS-terminated source, BOS + target)."""
    return model(
        input_ids=batch.src,
        attention_mask=batch.src != PAD_ID,
        decoder_input_ids=batch.tgt_in,
        decoder_attention_mask=batch.tgt_in != PAD_ID,
    ).logits


def hf_loss(model: Any, batch: Batch, smoothing: float, bf16: bool) -> tuple[Any, Any]:
    """Marian's summed label-smoothed loss of `batch` and its (N, V) float32 logits."""
    with torch.autocast(batch.src.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = hf_logits(model, batch).flatten(0, 1).float()  # (B T, V)
    loss = F.cross_entropy(  # the label-smoothed loss as PyTorch ships it (equal to ours)
        logits,
        batch.tgt_out.flatten(),
        ignore_index=PAD_ID,
        reduction="sum",
        label_smoothing=smoothing,
    )
    return loss, logits


def hf_rdrop_loss(model: Any, batch: Batch, smoothing: float, bf16: bool, alpha: float) -> Any:
    """R-Drop's loss as ours (the authors' halved: (loss1 + loss2 + alpha x symmetric KL) / 2),
    on two passes of Marian's full logits."""
    loss1, x1 = hf_loss(model, batch, smoothing, bf16)
    loss2, x2 = hf_loss(model, batch, smoothing, bf16)  # other dropout masks
    keep = batch.tgt_out.flatten().ne(PAD_ID)  # (B T,)
    lp, lq = x1[keep].log_softmax(-1), x2[keep].log_softmax(-1)  # (N, V) each
    kl = F.kl_div(lp, lq, reduction="sum", log_target=True)
    kl = kl + F.kl_div(lq, lp, reduction="sum", log_target=True)
    return (loss1 + loss2 + alpha * kl / 2) / 2  # kl / 2: the symmetric KL, as the authors'


def hf_step(
    model: Any,
    optimizer: Any,
    scheduler: Any,
    batch: Batch,
    smoothing: float,
    bf16: bool,
    rdrop_alpha: float = 0.0,
) -> float:
    """One HF training step with the same loss (R-Drop's when rdrop_alpha > 0), clipping,
    optimizer and autocast as ours; returns the loss per target token."""
    if rdrop_alpha > 0:
        loss = hf_rdrop_loss(model, batch, smoothing, bf16, rdrop_alpha)
    else:
        loss = hf_loss(model, batch, smoothing, bf16)[0]
    tokens = batch.tgt_tokens
    (loss / tokens).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    scheduler.step()
    return loss.item() / tokens


def first_batches(cfg: TrainConfig, steps: int) -> tuple[list[Batch], int]:
    """The first `steps` batches of epoch 0 as the Trainer draws them, and the vocabulary size."""
    from seq2seq.train.corpus import load_corpus

    corpus = load_corpus(cfg)
    refs = corpus.train.epoch_batches(0)[:steps]
    return [corpus.train.collate(r) for r in refs], corpus.tokenizers[1].vocab_size


def eval_loss(logits_of: Any, model: torch.nn.Module, batch: Batch, smoothing: float) -> float:
    """Loss per target token of `batch` in eval mode (no dropout), without gradients."""
    model.eval()
    with torch.no_grad():
        logits = logits_of(batch)  # (B, T, V)
        loss = F.cross_entropy(  # the label-smoothed loss, as kernels.reference computes it
            logits.flatten(0, 1).float(),
            batch.tgt_out.flatten(),
            ignore_index=PAD_ID,
            reduction="sum",
            label_smoothing=smoothing,
        )
    model.train()
    return float(loss) / batch.tgt_tokens


def engine_step(engine: str, cfg: TrainConfig, vocab: int, run_dir: Path) -> tuple[Any, Any]:
    """Functions batch -> loss: one optimizer step of `engine`, and its eval-mode loss. Marian
    starts from our model's initial weights (the Trainer's seed) when the names map."""
    from seq2seq.model.transformer import build_model
    from seq2seq.train.build import build_optimizer, build_trainer

    smoothing = cfg.trainer.label_smoothing
    if engine == "ours":
        trainer = build_trainer(cfg, run_dir)
        ours = lambda b: trainer.model.logits(b.src, b.tgt_in)  # noqa: E731
        return (
            lambda b: trainer.train_step([b])["loss"],  # type: ignore[index]
            lambda b: eval_loss(ours, trainer.model, b, smoothing),
        )
    from seq2seq.export.huggingface import load_into

    model = marian(cfg, vocab, HF_ATTENTION[engine]).train()
    torch.manual_seed(cfg.trainer.seed)  # as build_trainer does before building our model
    try:
        load_into(model, build_model(cfg, vocab, vocab))
    except (KeyError, AttributeError, RuntimeError) as err:  # no comparison without the premise
        raise SystemExit(f"cannot copy our initial weights into Marian: {err!r}") from err
    device = torch.device(cfg.trainer.device)
    model.to(device)
    optimizer, scheduler = build_optimizer(model, cfg.optim, device, cfg.trainer.max_steps)
    bf16, alpha = cfg.trainer.precision.value == "bf16", cfg.trainer.rdrop_alpha
    return (
        lambda b: hf_step(model, optimizer, scheduler, b, smoothing, bf16, alpha),
        lambda b: eval_loss(lambda x: hf_logits(model, x), model, b, smoothing),
    )


def run_engine(engine: str, cfg: TrainConfig, steps: int) -> dict[str, Any]:
    """Child process: the eval-mode loss of the first batch at the initial weights, then `steps`
    optimizer steps of `engine` on the first batches of epoch 0; returns per-step seconds,
    losses, token counts and the peak RSS."""
    batches, vocab = first_batches(cfg, steps)
    device = torch.device(cfg.trainer.device)
    batches = [b.to(device) for b in batches]  # before timing (ours would move them itself)
    if engine != "ours":  # the SDPA backends ours runs with (kernels.setup_process), for Marian
        torch.backends.cuda.enable_cudnn_sdp(False)  # too: no engine pays cuDNN's graph per shape
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    with tempfile.TemporaryDirectory() as run_dir:
        step, evaluate = engine_step(engine, cfg, vocab, Path(run_dir))
        initial = evaluate(batches[0])
        seconds, losses = [], []
        for batch in batches:
            sync()
            start = time.perf_counter()
            losses.append(float(step(batch)))
            sync()  # the optimizer's kernels may still be queued after the loss's .item()
            seconds.append(time.perf_counter() - start)
    gpu_mb = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else 0.0
    flops = step_flops(cfg, vocab, batches)  # after training: building a model draws numbers
    return {
        "engine": engine,
        "seconds": seconds,
        "losses": losses,
        "rss_mb": peak_rss_mb(),
        "gpu_mb": gpu_mb,
        "flops": flops,
        "initial_eval_loss": initial,
        "src_tokens": [b.src_tokens for b in batches],
        "tgt_tokens": [b.tgt_tokens for b in batches],
    }


def step_flops(cfg: TrainConfig, vocab: int, batches: list[Batch]) -> list[float]:
    """Each batch's training FLOPs (seq2seq.train.flops) for the benchmark's model, the same for
    every engine: the engines compute the same function (check_premise)."""
    from seq2seq.model.transformer import build_model
    from seq2seq.train.flops import FlopCounter

    m = cfg.model
    counter = FlopCounter(
        build_model(cfg, vocab, vocab),
        m.d_model,
        (m.enc_layers, m.dec_layers),
        vocab,
        passes=2 if cfg.trainer.rdrop_alpha > 0 else 1,
    )
    return [
        counter.batch(b.src_tokens, b.tgt_tokens, b.src.shape[1], b.tgt_out.shape[1])
        for b in batches
    ]


def engine_env(engine: str, threads: int) -> dict[str, str]:
    """An engine's child process environment: its threads, this checkout on the path, and for
    Marian oneDNN's default caches, as users run it (ours caps them: kernels/onednn.py)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": child_pythonpath()}
    if engine != "ours":
        env.update(ONEDNN_DEFAULT_CACHES)
    return env


def child(engine: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run one engine in a fresh Python process (its own peak RSS); returns its result."""
    cmd = [
        sys.executable,
        __file__,
        "--engine",
        engine,
        "--data",
        args.data,
        "--steps",
        str(args.warmup + args.steps),
        "--threads",
        str(args.threads),
        "--max-tokens",
        str(args.max_tokens),
        "--precision",
        args.precision,
        "--dropout",
        str(args.dropout),
        "--rdrop-alpha",
        str(args.rdrop_alpha),
        "--device",
        args.device,
    ] + (["--compile"] if args.compile else [])
    env = engine_env(engine, args.threads)
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{engine} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


Runs = dict[str, list[dict[str, Any]]]  # each engine's repeats, in the order they ran


def check_premise(runs: Runs) -> float:
    """The engines start from the same function: the eval-mode loss of the first batch at the
    initial weights agrees to LOSS_TOLERANCE between ours and each Marian. Returns the largest
    difference; aborts the benchmark (before any timing is reported) when it does not hold."""
    losses = {e: runs[e][0]["initial_eval_loss"] for e in ENGINES}
    gaps = {e: abs(losses[e] - losses["ours"]) for e in ENGINES[1:]}
    if max(gaps.values()) > LOSS_TOLERANCE:
        shown = ", ".join(f"{e} {loss:.8f}" for e, loss in losses.items())
        raise SystemExit(
            f"the engines do not compute the same function: first-batch eval loss {shown} "
            f"(tolerance {LOSS_TOLERANCE}); no timing is reported"
        )
    return max(gaps.values())


def arguments() -> argparse.Namespace:
    """The command line's options (see the module docstring)."""
    default_data = str(multi30k_root())
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=default_data, help="Multi30k folder")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="timed steps per repeat")
    parser.add_argument("--warmup", type=int, default=2, help="untimed first steps")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument(
        "--precision",
        choices=("fp32", "bf16"),
        default="fp32",
        help="both engines (bf16: autocast)",
    )
    parser.add_argument("--dropout", type=float, default=0.1, help="0: loss curves must agree")
    parser.add_argument("--compile", action="store_true", help="ours: trainer.compile=true")
    parser.add_argument(
        "--rdrop-alpha",
        type=float,
        default=0.0,
        help="> 0: the step with R-Drop on both sides (ours: trainer.rdrop_alpha)",
    )
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="both engines (cuda: + MFU)"
    )
    parser.add_argument("--engine", choices=ENGINES, help="(internal) run one engine, print JSON")
    parser.add_argument(
        "--compile-vs-eager",
        action="store_true",
        help="ours compiled against eager on the same fixed-shape batches (no Marian)",
    )
    parser.add_argument("--shape-buckets", type=int, default=8, help="--compile-vs-eager's")
    parser.add_argument(
        "--compile-mode", choices=("default", "max_autotune"), default="default", help="trainer's"
    )
    parser.add_argument("--compile-engine", help="(internal) --compile-vs-eager's engine")
    parser.add_argument("--no-doc", action="store_true", help="skip docs and results/")
    args = parser.parse_args()
    if args.rdrop_alpha > 0 and args.dropout == 0:
        parser.error("--rdrop-alpha needs --dropout above 0 (the two passes would agree)")
    return args


def main() -> None:
    args = arguments()
    sys.argv[0] = str(Path(__file__).resolve())  # common.command() names it from the root
    args.data = str(Path(args.data).resolve())
    if args.compile_vs_eager or args.compile_engine:
        import compile_vs_eager

        compile_vs_eager.main(args, train_config)
        return
    if args.engine:
        torch.set_num_threads(args.threads)
        cfg = train_config(args)
        print(json.dumps(run_engine(args.engine, cfg, args.steps)))
        return
    runs, gap = measure(args)
    result = results(args, runs, gap)
    print(json.dumps(result, indent=2))
    if not args.no_doc:
        name, title = doc_name(args)
        write_json(name, result)
        update_doc(name, title, report(result))


def measure(args: argparse.Namespace) -> tuple[Runs, float]:
    """Every engine's repeats, each in its own process, the order alternating; the premise is
    checked after the first repeat. Returns the runs and the premise's largest loss gap."""
    runs: Runs = {e: [] for e in ENGINES}
    gap = 0.0
    for repeat in range(args.repeats):
        for engine in ENGINES if repeat % 2 == 0 else ENGINES[::-1]:
            runs[engine].append(child(engine, args))
        if repeat == 0:
            gap = check_premise(runs)
        for engine in ENGINES:
            print(f"repeat {repeat + 1} {engine}: {runs[engine][-1]['seconds']}", flush=True)
    return runs, gap


def results(args: argparse.Namespace, runs: Runs, gap: float) -> dict[str, Any]:
    """The engines' summaries, the speed-up over the faster Marian and the run's settings."""
    peak = 0.0
    if args.device == "cuda":
        dtype = torch.float32 if args.precision == "fp32" else torch.bfloat16
        peak = gpu_peak_tflops(torch.cuda.get_device_name(), dtype)
    result: dict[str, Any] = {e: summarise(runs[e], args.warmup, peak) for e in ENGINES}
    hf_best = max(ENGINES[1:], key=lambda e: result[e]["src_tgt_tokens_per_s"])
    speedup = result["ours"]["src_tgt_tokens_per_s"] / result[hf_best]["src_tgt_tokens_per_s"]
    result.update(
        speedup=speedup,
        hf_best=hf_best,
        initial_loss_gap=gap,
        loss_curves={e: runs[e][0]["losses"] for e in ENGINES},
        repeats=args.repeats,
        steps=args.steps,
        warmup=args.warmup,
        steps_total=args.steps + args.warmup,
        threads=args.threads,
        max_tokens=args.max_tokens,
        precision=args.precision,
        dropout=args.dropout,
        compile=args.compile,
        rdrop_alpha=args.rdrop_alpha,
        device=args.device,
        peak_tflops=peak,
    )
    return result


if __name__ == "__main__":
    main()
