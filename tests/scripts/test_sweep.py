"""Trained short, tested long (make sweep-multi30k) on a slice of the numbers data: the training
cap data.train_max_src_len, the test splits scored together by source-token bucket and on the
long split, and scripts/sweep.py (runs, skips finished runs, resumes unfinished ones, reports a
failed one). compare_runs.py --length-by tokens reads the result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from seq2seq.evaluation.scoring import token_bucket, token_buckets
from seq2seq.train.corpus import load_corpus
from tests.tiny_run import REPO, compose_train, tiny_overrides, write_slice

CAP = 6  # training sources of at most 6 BPE tokens: about half of the slice
SIZES = {"train": 300, "valid": 30, "test": 30}


def overrides(root: Path) -> list[str]:
    data, cache = root / "data", root / "cache"
    return tiny_overrides(
        data,
        cache,
        f"data.train_max_src_len={CAP}",
        "data.test=[test,valid]",
        "trainer.max_steps=8",
        "trainer.valid_every=4",
    )


def sweep(root: Path, encodings: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(REPO / "scripts" / "sweep.py"), "--dir", str(root / "sweep")]
    cmd += ["--encodings", encodings, "--seeds", "1", "--jobs", "1", "--", *overrides(root)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two encodings, one seed, 8 steps each."""
    root = tmp_path_factory.mktemp("short")
    write_slice(root / "data", SIZES)
    proc = sweep(root, "sinusoidal,rope")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 runs" in proc.stdout
    assert "0 finished, 2 to run" in proc.stdout
    return root


def results(root: Path, run: str) -> dict:
    return json.loads((root / "sweep" / run / "results.json").read_text())


def test_training_keeps_short_sources_only(swept: Path) -> None:
    corpus = load_corpus(compose_train(overrides(swept)))
    src_tok = corpus.tokenizers[0]
    lines = (swept / "data" / "train.en").read_text(encoding="utf-8").splitlines()
    short = [line for line in lines if len(src_tok.encode(line)) <= CAP]
    assert 0 < len(short) < len(lines)  # the cap removes some, not all
    assert len(corpus.train) == len(short)
    assert corpus.evals["test"].src_text == (swept / "data" / "test.en").read_text().splitlines()


def test_results_hold_the_long_split_and_the_buckets(swept: Path) -> None:
    corpus = load_corpus(compose_train(overrides(swept)))
    lens = [len(ids) for name in ("test", "valid") for ids in corpus.evals[name].src_ids]
    length = results(swept, "sinusoidal_seed1")["length"]
    assert length["splits"] == ["test", "valid"]
    assert length["max_src_len"] == CAP
    assert length["all"]["n"] == SIZES["test"] + SIZES["valid"]
    assert length["long"]["n"] == sum(n > CAP for n in lens) > 0
    buckets = token_buckets(CAP)
    want: dict[str, int] = {}
    for n in lens:
        want[token_bucket(n, buckets)] = want.get(token_bucket(n, buckets), 0) + 1
    assert {b: c["n"] for b, c in length["buckets"].items()} == want
    for cell in [length["all"], length["long"], *length["buckets"].values()]:
        assert 0 <= cell["bleu"] <= 100
        assert 0 <= cell["chrf"] <= 100


def test_rerun_skips_finished_resumes_unfinished_and_reports_failures(swept: Path) -> None:
    done = swept / "sweep" / "sinusoidal_seed1" / "results.json"
    stamp = done.stat().st_mtime_ns
    (swept / "sweep" / "rope_seed1" / "results.json").unlink()  # as if killed before the end
    proc = sweep(swept, "sinusoidal,rope,no_such_encoding")
    assert proc.returncode == 1
    assert "1 finished, 2 to run" in proc.stdout
    assert "rope_seed1: ran" in proc.stdout
    assert "no_such_encoding_seed1: failed" in proc.stdout
    assert f"FAILED {swept / 'sweep' / 'no_such_encoding_seed1'}" in proc.stdout
    assert done.stat().st_mtime_ns == stamp  # the finished run was not touched
    rope = results(swept, "rope_seed1")
    assert rope["resumed_from"]
    assert rope["steps"] == 8  # continued from its own checkpoint
    record = json.loads((swept / "sweep" / "sweep.json").read_text())
    states = {Path(r["folder"]).name: r["state"] for r in record["runs"]}
    assert states == {
        "sinusoidal_seed1": "finished",
        "rope_seed1": "ran",
        "no_such_encoding_seed1": "failed",
    }


def test_compare_runs_reads_the_length_results(swept: Path, tmp_path: Path) -> None:
    script = REPO / "scripts" / "compare_runs.py"
    cmd = [sys.executable, str(script), str(swept / "sweep"), "--length-by", "tokens"]
    cmd += ["--baseline", "sinusoidal", "--curves", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    md = (tmp_path / "comparison.md").read_text()
    long = results(swept, "rope_seed1")["length"]["long"]
    row = next(ln for ln in md.splitlines() if ln.startswith("| rope |"))
    assert f"| {long['bleu']:.2f} |" in row  # BLEU on the long split, first column
    assert f"**long (> {CAP} tokens)**" in md
    assert "Δ vs sinusoidal" in md
    assert "## Learning curves" in md
    assert "## Runs" in md
    assert (tmp_path / "valid_bleu_by_step.png").stat().st_size > 0


def test_attention_pictures_of_the_best_and_the_worst(swept: Path, tmp_path: Path) -> None:
    report = tmp_path / "report"
    script = REPO / "scripts" / "compare_runs.py"
    cmd = [sys.executable, str(script), str(swept / "sweep"), "--length-by", "tokens"]
    assert subprocess.run([*cmd, "--out", str(report)], capture_output=True).returncode == 0
    png = tmp_path / "attention.png"
    cmd = [sys.executable, str(REPO / "scripts" / "attention_long.py"), "--sweep"]
    cmd += [str(swept / "sweep"), "--report", str(report / "comparison.csv"), "--png", str(png)]
    proc = subprocess.run([*cmd, "--min-tokens", "3"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    ranked = [line.split(":")[1].split("(")[0].strip() for line in proc.stdout.splitlines()[:2]]
    assert proc.stdout.startswith("best: ")
    assert sorted(ranked) == ["rope", "sinusoidal"]
    assert png.stat().st_size > 0
    assert list((swept / "sweep" / "attention_tb").glob("events.out.tfevents.*"))
