"""workers.py: translation in several processes gives what one process gives, in input order,
samples included; seq2seq-translate workers=N writes the same file as workers=1."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from seq2seq.config.schema import DecodeConfig, SearchKind
from seq2seq.decode.translator import Translator
from seq2seq.decode.workers import WorkerPool, worker_threads
from seq2seq.errors import ConfigError
from seq2seq.train.run import train
from tests.tiny_run import compose_train, tiny_overrides, write_slice

BIN = Path(sys.executable).parent  # the console scripts of this virtualenv


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("workers")
    data = write_slice(root / "data")
    train(compose_train(tiny_overrides(data, root / "cache", "trainer.max_steps=12")), root / "run")
    return root / "run" / "checkpoints" / "best.pt"


@pytest.fixture(scope="module")
def texts(ckpt: Path) -> list[str]:
    """23 lines (not a multiple of 2 or 3), one blank, longer than a decode batch of 4."""
    lines = (ckpt.parents[2] / "data" / "test.en").read_text(encoding="utf-8").splitlines()
    return [*lines[:10], "", *lines[10:], "seven hundred and one"][:23]


@pytest.fixture(scope="module", params=[2, 4], ids=["forked", "spawned"])
def pool(ckpt: Path, request: pytest.FixtureRequest) -> Iterator[WorkerPool]:
    """Two workers: of one thread each (forked from a process with the model loaded), or of
    two (spawned; they load the checkpoint)."""
    translator = Translator.from_checkpoint(ckpt, "cpu")
    with WorkerPool(translator, ckpt, workers=2, threads=request.param) as pool:
        assert pool.start_method == ("fork" if request.param == 2 else "spawn")
        yield pool


def settings(translator: Translator, **changes: object) -> DecodeConfig:
    return dataclasses.replace(translator.settings(**changes), batch_size=4)


@pytest.mark.parametrize(
    "changes",
    [
        {"method": "greedy"},  # continuous batching: 23 sentences, rows refilled
        {"method": "beam", "beam_size": 3, "nbest": 2},
        {"method": "sample", "nbest": 2, "seed": 5, "top_k": 0},
    ],
    ids=["greedy", "beam", "sample"],
)
def test_workers_give_what_one_process_gives(
    ckpt: Path, texts: list[str], pool: WorkerPool, changes: dict[str, object]
) -> None:
    """Catches lines put back out of order, a share lost, or a share's samples drawn with its
    own line numbers instead of the whole input's."""
    translator = Translator.from_checkpoint(ckpt, "cpu")
    decode = settings(translator, **changes)
    want = translator.hypotheses(texts, decode)
    got = pool.hypotheses(texts, decode)
    assert [[(t.text, t.tokens) for t in n] for n in got] == [
        [(t.text, t.tokens) for t in n] for n in want
    ]
    scores = [t.score for n in got for t in n]
    assert scores == pytest.approx([t.score for n in want for t in n], abs=1e-4)
    assert got[10][0].text == ""  # the blank line stays blank, in its place


def test_a_share_samples_as_in_the_whole_input(ckpt: Path, texts: list[str]) -> None:
    """Translator.hypotheses(numbers=...): the draws follow each line's index in the whole
    input; without it a share's lines would be seeded by their index in the share."""
    translator = Translator.from_checkpoint(ckpt, "cpu")
    decode = settings(translator, method=SearchKind.sample, seed=3, top_k=0, nbest=3)
    whole = [[t.tokens for t in n] for n in translator.hypotheses(texts, decode)]
    share = texts[1::2]
    numbered = translator.hypotheses(share, decode, numbers=range(1, len(texts), 2))
    assert [[t.tokens for t in n] for n in numbered] == whole[1::2]
    plain = translator.hypotheses(share, decode)
    assert [[t.tokens for t in n] for n in plain] != whole[1::2]


def test_more_workers_than_lines(ckpt: Path, texts: list[str]) -> None:
    translator = Translator.from_checkpoint(ckpt, "cpu")
    decode = settings(translator, method="greedy")
    with WorkerPool(translator, ckpt, workers=3, threads=3) as pool:
        assert pool.threads == 1
        got = pool.hypotheses(texts[:2], decode)
        assert [n[0].text for n in got] == [
            n[0].text for n in translator.hypotheses(texts[:2], decode)
        ]
        assert pool.hypotheses([], decode) == []


def test_worker_threads_share_the_cores(ckpt: Path) -> None:
    assert worker_threads(2, 8) == 4
    assert worker_threads(3, 8) == 2
    assert worker_threads(4, 2) == 1  # never none
    with pytest.raises(ConfigError, match="workers=0 is invalid"):
        WorkerPool(Translator.from_checkpoint(ckpt, "cpu"), ckpt, workers=0)


def test_the_cli_writes_the_same_file_with_workers(
    ckpt: Path, texts: list[str], tmp_path: Path
) -> None:
    """seq2seq-translate workers=2: the same lines as workers=1, and the log says so."""
    (tmp_path / "in.txt").write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    outputs = []
    for workers in (1, 2):
        out = tmp_path / f"out{workers}.txt"
        # device=cpu: worker processes are a CPU setting (device=auto on a GPU machine refuses them)
        args = [f"ckpt={ckpt}", f"input={tmp_path / 'in.txt'}", f"output={out}", "device=cpu"]
        done = subprocess.run(
            [str(BIN / "seq2seq-translate"), *args, f"workers={workers}", "decode.batch_size=4"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        outputs.append(out.read_text(encoding="utf-8"))
    assert "translating in 2 processes of 1 threads (fork)" in done.stderr
    assert outputs[0] == outputs[1]
    assert len(outputs[0].splitlines()) == len(texts)


def test_the_cli_refuses_bad_workers(ckpt: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [str(BIN / "seq2seq-translate"), f"ckpt={ckpt}", "workers=0"],
        input="seven\n",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert "workers=0 is invalid; it must be at least 1" in done.stderr


def test_a_worker_takes_its_parents_products_untimed_for_any_share(
    ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent times the products once, at a worker's share of the lines; each worker, given
    that choice, keys it by its own share (1 to 3 lines here, batches of 4 and a full one) and
    never times. Catches a worker keyed differently from its products' lookup (it would time
    again, a batch's probe per process)."""
    import seq2seq.decode.load
    import seq2seq.decode.workers as workers

    translator = Translator.from_checkpoint(ckpt, "cpu")
    monkeypatch.setattr(seq2seq.decode.load, "_PRODUCTS", {})

    def never(*args: object) -> None:
        raise AssertionError("a worker timed the products")

    monkeypatch.setattr(seq2seq.decode.load, "time_decoding", never)
    monkeypatch.setattr(workers, "_translator", translator)
    decode = settings(translator, method="beam", beam_size=2)
    for lines in (["a b"], ["a b", "c"], ["a b", "c", "a"], ["a b"] * 5):
        share = range(len(lines))
        found = workers._hypotheses(lines, decode, False, share, ("aten", "onednn"))
        assert len(found) == len(lines)
