"""Translation in several processes at once: the CPU's throughput setting (seq2seq-translate
workers=N), as CTranslate2's inter_threads and Marian's --cpu-threads.

A decoder step is many small products and elementwise ops. Split over a CPU's threads, each op
pays a fork-join and the Python between the ops runs on one core; N processes, each with its
share of the cores and of the sentences, run their steps side by side instead. The sentences
are dealt out in turn (line i to worker i mod N), so that every worker gets lengths like the
whole file's, and put back in order. Outputs are the same as in one process: a sentence's
search does not depend on the others (continuous batching, seq2seq/decode/schedule.py), and its
samples are seeded by its line.

Starting a worker: with one thread each, a worker is forked from the process that loaded the
model (no import, no loading: the weights are shared until written, which decoding never
does); with more, it is spawned and loads the checkpoint itself, since a forked child cannot
run the parallel regions of GNU OpenMP, whose thread pool it inherits without the threads.
Either way the parent times where the float32 products run (load.choose_products) once, at a
worker's threads, and hands the choice to every worker. What it costs and gains:
docs/BENCHMARKS.md, "Decoding against CTranslate2".
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from multiprocessing import get_all_start_methods, get_context
from pathlib import Path
from types import TracebackType

import torch

from seq2seq.config.checks import check_workers
from seq2seq.config.schema import DecodeConfig
from seq2seq.decode.load import Backends
from seq2seq.decode.translator import Translation, Translator

_translator: Translator | None = None  # a worker's own (_adopt, _load)


def _quiet(threads: int) -> None:
    """A worker's threads; its warnings stay quiet: the parent warns once about the whole
    input, with its line numbers (Translator.encode)."""
    torch.set_num_threads(threads)
    logging.getLogger("seq2seq").setLevel(logging.ERROR)


def _adopt(translator: Translator) -> None:
    """A forked worker's initializer: the parent's translator, on one thread."""
    global _translator
    _quiet(1)
    _translator = translator


def _load(paths: list[str], quantize: str, threads: int) -> None:
    """A spawned worker's initializer: its threads, then the checkpoint(s), on the CPU."""
    global _translator
    _quiet(threads)
    _translator = Translator.from_checkpoint(paths, "cpu", quantize)


def _hypotheses(
    texts: list[str],
    decode: DecodeConfig,
    attention: bool,
    numbers: range,
    products: Backends | None,
) -> list[list[Translation]]:
    """A worker's share: Translator.hypotheses on its own model, with the products its parent
    chose, each text's samples seeded by its index in the whole input (`numbers`)."""
    assert _translator is not None, "a worker translates only after its initializer"
    if products is not None:
        _translator.use_products(decode, products, len(texts))
    return _translator.hypotheses(texts, decode, attention, numbers)


def worker_threads(workers: int, threads: int | None = None) -> int:
    """Threads each of `workers` processes takes: this process's torch threads (by default one
    a physical core) shared out, at least one each."""
    total = threads if threads is not None else torch.get_num_threads()
    return max(1, total // workers)


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """This process's torch threads set to `n` for the block, then put back."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class WorkerPool:
    """`workers` processes that translate with `translator`'s checkpoint(s) `paths`, each on its
    share of the threads (worker_threads): forked from this process at one thread each, spawned
    otherwise (a script that spawns them runs under `if __name__ == "__main__":`, as any
    multiprocessing script). Use as a context manager, or close() it. Not a paper's idea: the
    inter-batch parallelism of CPU decoders (CTranslate2's inter_threads, Marian's CPU
    workers)."""

    def __init__(
        self,
        translator: Translator,
        paths: str | Path | Sequence[str | Path],
        workers: int,
        threads: int | None = None,
    ) -> None:
        """`translator`: loaded from `paths` on the CPU (its weights: float32 or int8, as the
        workers'). `threads`: in all (default: this process's torch threads)."""
        check_workers(workers)
        self.translator, self.workers = translator, workers
        self.threads = worker_threads(workers, threads)
        if self.threads == 1 and "fork" in get_all_start_methods():  # not on Windows
            self.start_method = "fork"
            self.pool = ProcessPoolExecutor(
                workers, get_context("fork"), initializer=_adopt, initargs=(translator,)
            )
        else:
            one = [paths] if isinstance(paths, (str, Path)) else list(paths)
            args = ([str(p) for p in one], translator.weights.value, self.threads)
            self.start_method = "spawn"
            self.pool = ProcessPoolExecutor(
                workers, get_context("spawn"), initializer=_load, initargs=args
            )

    def hypotheses(
        self, texts: Sequence[str], decode: DecodeConfig, attention: bool = False
    ) -> list[list[Translation]]:
        """Translator.hypotheses of `texts`, line i translated by worker i mod `workers`, in
        order. A worker's failure is raised here; a worker that died is a RuntimeError."""
        if not texts:
            return []
        self.translator.encode(texts)  # the warnings the workers keep quiet, numbered as here
        n, step = len(texts), self.workers
        with torch_threads(self.threads):  # timed as a worker runs them, on its share
            products = self.translator.products(decode, -(-n // step))
        shares = [(list(texts[i::step]), range(i, n, step)) for i in range(min(step, n))]
        jobs = [self.pool.submit(_hypotheses, s, decode, attention, i, products) for s, i in shares]
        try:
            found = [job.result() for job in jobs]
        except BrokenProcessPool as err:
            raise RuntimeError(
                "a translation worker died (out of memory?): translate with workers=1, or fewer "
                "workers"
            ) from err
        out: list[list[Translation]] = [[] for _ in texts]
        for i, share in enumerate(found):
            out[i::step] = share
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
