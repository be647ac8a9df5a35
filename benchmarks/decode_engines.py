"""The engines benchmarks/decode.py compares, one per process: ours (seq2seq.decode.schedule
and search), Hugging Face transformers (MarianMTModel.generate, with its sdpa and its eager
attention) and CTranslate2 (float32, int8).

Each gets the same length-sorted batches of token ids and the same settings (no engine returns
scores: CTranslate2's return_scores=False, ours decode.scores=false, generate without
output_scores), decodes them all once after one warm-up batch, and returns the outputs and the
time; in the greedy forced mode it also
times one sentence decoded alone. Ours and CTranslate2 also run with one worker a thread
(`workers` > 1), their documented CPU throughput setting: CTranslate2 with inter_threads=workers
and intra_threads 1, handed every batch in one translate_batch call (max_batch_size: it sorts
the sentences by length and splits them, as the batches here are made, and runs the batches
side by side); ours in `workers` processes forked with one thread each, sentence i to worker
i mod workers and back in order (seq2seq.decode.workers' rule). Hugging Face's generate has no
such setting. This module imports neither torch nor ctranslate2 at the top: the
CTranslate2 process never loads torch (the two ship different OpenMP runtimes, and sharing one
process slows CTranslate2 down; tests/benchmarks/test_benchmarks.py checks it).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

if TYPE_CHECKING:
    from seq2seq.model.transformer import EncoderDecoder

BEAM = 5
FORCED = 32  # output tokens in the forced-length modes
LIMIT = 64  # natural modes: at most this many output tokens, for every engine
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2  # seq2seq.data.tokenizer's ids (not imported: it loads torch)
ALONE_REPEATS = 5  # one-sentence decodes timed (median)
INTER = "_inter"  # a run's suffix: one worker a thread (CTranslate2's inter_threads)


@dataclass
class Mode:
    """A decoding setting: greedy or beam 5, forced to FORCED tokens or natural length."""

    name: str
    beam: int
    forced: bool

    @property
    def limit(self) -> int:
        """Most output tokens (EOS included where there is one)."""
        return FORCED if self.forced else LIMIT


MODES = {
    m.name: m
    for m in [
        Mode("greedy_forced", 1, True),
        Mode("beam5_forced", BEAM, True),
        Mode("greedy_natural", 1, False),
        Mode("beam5_natural", BEAM, False),
    ]
}


def split_run(run: str) -> tuple[str, str | None, bool]:
    """A run's engine, CT2_USE_MKL and layout: 'ct2_int8_mkl1_inter' -> ('ct2_int8', '1',
    True); 'hf_sdpa' -> ('hf_sdpa', None, False)."""
    inter = run.endswith(INTER)
    engine, _, backend = run.removesuffix(INTER).partition("_mkl")
    return engine, backend or None, inter


@dataclass
class Inputs:
    """What every engine decodes: sources (ids without EOS), batches of indices, paths."""

    src_ids: list[list[int]]
    batches: list[list[int]]
    vocab: list[str]  # token string of each id (CTranslate2 works on strings)
    paths: dict[str, str]
    threads: int


class Result(TypedDict):
    outputs: list[list[int]]  # no EOS
    lengths: list[int]  # output tokens, EOS included where the engine produced one
    seconds: float  # all batches, after the warm-up
    alone_step_ms: float | None  # greedy forced only: one sentence alone, ms per decoder step


Runner = Callable[..., Result]  # (inputs, mode, workers=...)

_decode: Callable[[list[list[int]]], list[list[int]]] | None = None  # a forked worker's


def ours_decoder(inputs: Inputs, mode: Mode) -> Callable[[list[list[int]]], list[list[int]]]:
    """Our model and seq2seq.decode.schedule.translate_ids (length-sorted batches, as the others
    get)."""
    import torch

    from seq2seq import kernels
    from seq2seq.config.schema import DecodeConfig, LengthPenaltyKind, SearchKind
    from seq2seq.decode.load import choose_products
    from seq2seq.decode.schedule import translate_ids

    kernels.setup_process(torch.device("cpu"))  # as seq2seq.cli.translate runs it
    torch.set_num_threads(inputs.threads)
    model = _load_ours(inputs.paths["ours"], len(inputs.vocab))
    cfg = DecodeConfig(
        method=SearchKind.beam if mode.beam > 1 else SearchKind.greedy,
        beam_size=mode.beam,
        length_penalty=LengthPenaltyKind.average,
        alpha=1.0,
        batch_size=len(inputs.batches[0]),
        max_len_a=0.0,
        max_len_b=mode.limit,
        scores=False,  # the others return none either (CTranslate2's return_scores=False)
    )
    min_len = FORCED if mode.forced else 0
    choose_products(model, model.cfg, cfg, len(inputs.vocab))  # as Translator does

    def decode(src_ids: list[list[int]]) -> list[list[int]]:
        return [h[0].tokens for h in translate_ids(model, src_ids, cfg, min_len=min_len)]

    return decode


def run_ours(inputs: Inputs, mode: Mode, workers: int = 1) -> Result:
    if workers > 1:
        return _run_ours_workers(inputs, mode, workers)
    decode = ours_decoder(inputs, mode)
    decode([inputs.src_ids[i] for i in inputs.batches[0]])  # warm-up
    start = time.perf_counter()
    outputs = decode(inputs.src_ids)
    seconds = time.perf_counter() - start
    alone = _alone_step_ms(mode, lambda: decode(inputs.src_ids[:1]))
    return {
        "outputs": outputs,
        "lengths": [len(t) + 1 for t in outputs],  # all end with EOS
        "seconds": seconds,
        "alone_step_ms": alone,
    }


def _adopt(decode: Callable[[list[list[int]]], list[list[int]]]) -> None:
    """A forked worker's initializer: the parent's decoder (one thread, products chosen)."""
    global _decode
    _decode = decode


def _decode_share(src_ids: list[list[int]]) -> list[list[int]]:
    assert _decode is not None, "a worker decodes only after its initializer"
    return _decode(src_ids)


def _run_ours_workers(inputs: Inputs, mode: Mode, workers: int) -> Result:
    """Ours in `workers` one-thread processes forked from this one, which loads the model and
    chooses the products at one thread (load.choose_products) and warms up first; sentence i to
    worker i mod workers. The clock covers the shares' decoding, not the workers' start."""
    from concurrent.futures import ProcessPoolExecutor
    from dataclasses import replace
    from multiprocessing import get_context

    decode = ours_decoder(replace(inputs, threads=1), mode)
    first = [inputs.src_ids[i] for i in inputs.batches[0]]
    decode(first)  # warm-up, inherited by every worker
    context = get_context("fork")
    with ProcessPoolExecutor(workers, context, initializer=_adopt, initargs=(decode,)) as pool:
        list(pool.map(_decode_share, [first] * workers))  # every worker started (fork: all)
        shares = [inputs.src_ids[i::workers] for i in range(workers)]
        start = time.perf_counter()
        found = list(pool.map(_decode_share, shares))
        seconds = time.perf_counter() - start
    outputs: list[list[int]] = [[] for _ in inputs.src_ids]
    for i, share in enumerate(found):
        outputs[i::workers] = share
    return {
        "outputs": outputs,
        "lengths": [len(t) + 1 for t in outputs],  # all end with EOS
        "seconds": seconds,
        "alone_step_ms": None,  # one sentence alone: the one-process run's
    }


def _load_ours(path: str, vocab: int) -> EncoderDecoder:
    import torch
    from decode_setup import new_model

    model = new_model(vocab)
    model.load_state_dict(torch.load(path, weights_only=True))
    return model.eval()


def run_hf(inputs: Inputs, mode: Mode, attention: str, workers: int = 1) -> Result:
    """MarianMTModel.generate with attention implementation `attention` (sdpa or eager).
    early_stopping=True: a beam ends once it has K finished hypotheses, as ours and
    CTranslate2 do (HF's default keeps going while a longer one could still score higher).
    One process on all the threads: generate has no worker setting."""
    if workers != 1:
        raise ValueError("Hugging Face's generate runs in one process (workers=1)")
    import torch
    from transformers import MarianMTModel
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.set_num_threads(inputs.threads)
    path = inputs.paths["marian"]
    model = MarianMTModel.from_pretrained(path, attn_implementation=attention).eval()

    def decode(index: list[int]) -> list[list[int]]:
        rows = [inputs.src_ids[i] + [EOS_ID] for i in index]
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [PAD_ID] * (width - len(r)) for r in rows])  # (B, S)
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=ids.ne(PAD_ID),
                num_beams=mode.beam,
                do_sample=False,
                max_new_tokens=mode.limit,
                min_new_tokens=mode.limit if mode.forced else 0,
                length_penalty=1.0,
                early_stopping=True,
                suppress_tokens=[PAD_ID, BOS_ID],
                decoder_start_token_id=BOS_ID,
                eos_token_id=EOS_ID,
                pad_token_id=PAD_ID,
            )
        return [_until_eos(row[1:]) for row in out.tolist()]

    return _timed(inputs, mode, decode)


def _until_eos(row: list[int]) -> list[int]:
    """Generated ids up to and including the first EOS (HF pads finished rows after it)."""
    return row[: row.index(EOS_ID) + 1] if EOS_ID in row else row


def run_ct2(inputs: Inputs, mode: Mode, compute_type: str, workers: int = 1) -> Result:
    """CTranslate2 on all the threads batch by batch, or (workers > 1) with `workers` replicas
    of threads / workers threads, handed every batch at once (max_batch_size: the batch size)."""
    import ctranslate2

    translator = ctranslate2.Translator(
        inputs.paths[f"ct2_{compute_type}"],
        device="cpu",
        compute_type=compute_type,
        inter_threads=workers,
        intra_threads=max(1, inputs.threads // workers),
    )
    size = len(inputs.batches[0]) if workers > 1 else 0  # 0: as given
    index_of = {token: i for i, token in enumerate(inputs.vocab)}
    # the export adds the EOS our sources end with (its config's add_source_eos)
    pieces = [[inputs.vocab[t] for t in ids] for ids in inputs.src_ids]

    def decode(index: list[int]) -> list[list[int]]:
        results = translator.translate_batch(
            [pieces[i] for i in index],
            max_batch_size=size,
            beam_size=mode.beam,
            num_hypotheses=1,
            length_penalty=1.0,
            max_decoding_length=mode.limit,
            min_decoding_length=mode.limit if mode.forced else 1,
            return_end_token=True,
            suppress_sequences=[[inputs.vocab[PAD_ID]], [inputs.vocab[BOS_ID]]],
        )
        return [[index_of[t] for t in r.hypotheses[0]] for r in results]

    return _timed(inputs, mode, decode, workers)


def _timed(
    inputs: Inputs,
    mode: Mode,
    decode: Callable[[list[int]], list[list[int]]],
    workers: int = 1,
) -> Result:
    """Warm up on the first batch, then decode every batch; outputs back in input order. With
    workers > 1 the batches go in `workers` at a time for the warm-up and all at once after."""
    calls = inputs.batches
    if workers > 1:
        decode([i for index in calls[:workers] for i in index])
        calls = [[i for index in calls for i in index]]
    else:
        decode(calls[0])
    outputs: list[list[int]] = [[] for _ in inputs.src_ids]
    start = time.perf_counter()
    for index in calls:
        for i, row in zip(index, decode(index), strict=True):
            outputs[i] = row
    seconds = time.perf_counter() - start
    return {
        "outputs": [[t for t in row if t != EOS_ID] for row in outputs],
        "lengths": [len(row) for row in outputs],
        "seconds": seconds,
        "alone_step_ms": _alone_step_ms(mode, lambda: decode([0])) if workers == 1 else None,
    }


def _alone_step_ms(mode: Mode, decode_first: Callable[[], object]) -> float | None:
    """Greedy forced mode only: the first sentence decoded on its own (FORCED steps, its encoder
    pass included), median time over ALONE_REPEATS, per step in ms. A batch of one shows a
    step's fixed cost, which the last steps of natural-length batches (few rows left) pay."""
    if mode.beam > 1 or not mode.forced:
        return None
    times = []
    for _ in range(ALONE_REPEATS):
        start = time.perf_counter()
        decode_first()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times) / FORCED


ENGINES: dict[str, Runner] = {
    "ours": run_ours,
    # HF's two attention implementations: the default (sdpa) is not always the faster
    "hf_sdpa": functools.partial(run_hf, attention="sdpa"),
    "hf_eager": functools.partial(run_hf, attention="eager"),
    "ct2_float32": functools.partial(run_ct2, compute_type="float32"),
    "ct2_int8": functools.partial(run_ct2, compute_type="int8"),
}


def runner(engine: str) -> Runner:
    """The function that runs `engine` (loads nothing until called)."""
    return ENGINES[engine]
