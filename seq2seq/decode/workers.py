"""Translation in several processes at once: the CPU's throughput setting (seq2seq-translate
workers=N), as CTranslate2's inter_threads and Marian's --cpu-threads.

A decoder step is many small products and elementwise ops. Split over a CPU's threads, each op
pays a fork-join and the Python between the ops runs on one core; N processes, each with its
share of the cores and of the sentences, run their steps side by side instead. Each worker is a
spawned process (a forked one would inherit the parent's OpenMP thread pool, which GNU OpenMP
does not survive) with the checkpoint loaded once; the sentences are dealt out in turn (line i to
worker i mod N), so that every worker gets lengths like the whole file's, and put back in order.
Outputs are the same as in one process: a sentence's search does not depend on the others
(continuous batching, seq2seq/decode/schedule.py), and its samples are seeded by its line. What
it costs and gains: docs/BENCHMARKS.md, "Decoding against CTranslate2".
"""

from __future__ import annotations

import logging
import multiprocessing
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from types import TracebackType

import torch

from seq2seq.config.schema import DecodeConfig, WeightType
from seq2seq.decode.translator import Translation, Translator
from seq2seq.errors import ConfigError

_translator: Translator | None = None  # a worker's own, loaded by _start


def _start(paths: list[str], quantize: str, threads: int) -> None:
    """A worker's initializer: its threads, then the checkpoint(s), on the CPU. Its warnings
    stay quiet: the parent warns once about the whole input, with its line numbers."""
    global _translator
    torch.set_num_threads(threads)
    logging.getLogger("seq2seq").setLevel(logging.ERROR)
    _translator = Translator.from_checkpoint(paths, "cpu", quantize)


def _hypotheses(
    texts: list[str], decode: DecodeConfig, attention: bool, numbers: range
) -> list[list[Translation]]:
    """A worker's share: Translator.hypotheses on its own model, each text's samples seeded
    by its index in the whole input (`numbers`)."""
    assert _translator is not None, "a worker translates only after _start"
    return _translator.hypotheses(texts, decode, attention, numbers)


def worker_threads(workers: int, threads: int | None = None) -> int:
    """Threads each of `workers` processes takes: this process's torch threads (by default one
    a physical core) shared out, at least one each."""
    total = threads if threads is not None else torch.get_num_threads()
    return max(1, total // workers)


class WorkerPool:
    """`workers` spawned processes with the checkpoint(s) `paths` loaded, each on its share of
    the threads (worker_threads). Use as a context manager, or close() it. Not a paper's idea:
    the inter-batch parallelism of CPU decoders (CTranslate2's inter_threads, Marian's CPU
    workers)."""

    def __init__(
        self,
        paths: str | Path | Sequence[str | Path],
        workers: int,
        quantize: WeightType | str = WeightType.float32,
        threads: int | None = None,
    ) -> None:
        """Start the workers; each loads the checkpoint(s) once. `threads`: in all (default:
        this process's torch threads)."""
        if workers < 1:
            raise ConfigError(f"config: workers={workers} is invalid; it must be at least 1")
        one = [paths] if isinstance(paths, (str, Path)) else list(paths)
        self.workers = workers
        self.threads = worker_threads(workers, threads)
        self.pool = ProcessPoolExecutor(
            workers,
            mp_context=multiprocessing.get_context("spawn"),
            initializer=_start,
            initargs=([str(p) for p in one], WeightType(quantize).value, self.threads),
        )

    def hypotheses(
        self, texts: Sequence[str], decode: DecodeConfig, attention: bool = False
    ) -> list[list[Translation]]:
        """Translator.hypotheses of `texts`, line i translated by worker i mod `workers`, in
        order. A worker's failure is raised here; a worker that died is a RuntimeError."""
        n, step = len(texts), self.workers
        shares = [(list(texts[i::step]), range(i, n, step)) for i in range(min(step, n))]
        jobs = [self.pool.submit(_hypotheses, s, decode, attention, i) for s, i in shares]
        try:
            found = [job.result() for job in jobs]
        except BrokenProcessPool as err:
            raise RuntimeError(
                "a translation worker died (out of memory?): translate with workers=1, or fewer "
                "workers"
            ) from err
        out: list[list[Translation]] = [[] for _ in texts]
        for i, share in enumerate(found):
            out[i :: self.workers] = share
        return out

    def close(self) -> None:
        """Stop the workers."""
        self.pool.shutdown()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        err: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
