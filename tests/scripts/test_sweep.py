"""Trained short, tested long (make sweep-multi30k) on a slice of the numbers data: the training
cap data.train_max_src_len, the test splits scored together by source-token bucket and on the
long split, and the sweep as the make target runs it: a Hydra multirun of experiment=pos_multi30k
(its fixed folder, one run folder per encoding and seed, trainer.skip_finished) on the joblib
launcher, two runs at a time. Run again, it skips the finished runs without touching them,
resumes an unfinished one from its checkpoint, and a run that fails is reported (exit status 1,
one line naming it) while the others finish. compare_runs.py --length-by tokens reads the result."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from seq2seq.evaluation.scoring import token_bucket, token_buckets
from seq2seq.train.corpus import load_corpus
from tests.tiny_run import REPO, assert_same_weights, compose_train, tiny_overrides, write_slice

CAP = 6  # training sources of at most 6 BPE tokens: about half of the slice
SIZES = {"train": 300, "valid": 30, "test": 30}


def overrides(root: Path) -> list[str]:
    """The experiment's settings with the tiny model on the slice (data.valid: the slice's)."""
    data, cache = root / "data", root / "cache"
    return tiny_overrides(
        data,
        cache,
        f"data.train_max_src_len={CAP}",
        "data.valid=valid",
        "data.test=[test,valid]",
        "trainer.max_steps=8",
        "trainer.valid_every=4",
        "trainer.keep_last=2",  # step_4.pt stays, for the run resumed below
    )


def sweep(root: Path, encodings: str) -> subprocess.CompletedProcess[str]:
    """What `make sweep-multi30k` runs (one seed), into root/sweep."""
    cmd = [sys.executable, "-m", "seq2seq.cli.train", "-m", "experiment=pos_multi30k"]
    cmd += ["trainer.seed=1", f"pos_encoding={encodings}", f"hydra.sweep.dir={root / 'sweep'}"]
    cmd += ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", *overrides(root)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two encodings, one seed, 8 steps each."""
    root = tmp_path_factory.mktemp("short")
    write_slice(root / "data", SIZES)
    proc = sweep(root, "sinusoidal,rope")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Joblib.Parallel(n_jobs=2" in proc.stdout + proc.stderr
    assert sorted(p.name for p in (root / "sweep").iterdir() if not p.name.startswith(".")) == [
        "multirun.yaml",
        "rope_seed1",
        "sinusoidal_seed1",
    ]
    return root


def results(root: Path, run: str) -> dict:
    return json.loads((root / "sweep" / run / "results.json").read_text())


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under folder but the log, by path: (size, mtime in ns)."""
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "train.log"
    }


def test_training_keeps_short_sources_only(swept: Path) -> None:
    corpus = load_corpus(compose_train(["experiment=pos_multi30k", *overrides(swept)]))
    src_tok = corpus.tokenizers[0]
    lines = (swept / "data" / "train.en").read_text(encoding="utf-8").splitlines()
    short = [line for line in lines if len(src_tok.encode(line)) <= CAP]
    assert 0 < len(short) < len(lines)  # the cap removes some, not all
    assert len(corpus.train) == len(short)
    assert corpus.evals["test"].src_text == (swept / "data" / "test.en").read_text().splitlines()


def test_results_hold_the_long_split_and_the_buckets(swept: Path) -> None:
    corpus = load_corpus(compose_train(["experiment=pos_multi30k", *overrides(swept)]))
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
    runs = swept / "sweep"
    finished = snapshot(runs / "sinusoidal_seed1")
    assert ".hydra/config.yaml" in finished
    assert "results.json" in finished
    # rope as if killed after step 4: its later checkpoints and results gone
    rope = runs / "rope_seed1" / "checkpoints"
    shutil.copy(rope / "last.pt", swept / "rope_step8.pt")
    for name in ("last.pt", "step_8.pt", "../results.json"):
        (rope / name).unlink()
    # alibi's run folder holds a corrupt checkpoint: that run fails, the others go on
    (runs / "alibi_seed1" / "checkpoints").mkdir(parents=True)
    (runs / "alibi_seed1" / "checkpoints" / "last.pt").write_bytes(b"not a checkpoint")
    proc = sweep(swept, "sinusoidal,rope,alibi")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith(
        f"error: a run of the sweep failed: {runs / 'alibi_seed1'}: ResumeError"
    )
    # the finished run: its log says so, and nothing else in its folder changed (.hydra/ too)
    assert snapshot(runs / "sinusoidal_seed1") == finished
    log = (runs / "sinusoidal_seed1" / "train.log").read_text().splitlines()
    assert "already finished" in log[-1]
    assert "skipped" in log[-1]
    # the unfinished one continued from its own checkpoint, to the same weights
    resumed = results(swept, "rope_seed1")
    assert resumed["resumed_from"] == str(rope / "step_4.pt")
    assert resumed["steps"] == 8
    assert_same_weights(swept / "rope_step8.pt", rope / "last.pt")
    assert not (runs / "alibi_seed1" / "results.json").exists()


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
    assert f"| BLEU long (> {CAP} tokens) |" in md
    assert "Every encoding against **sinusoidal**" in md
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


def test_make_resume_trains_a_finished_sweep_run_further(swept: Path) -> None:
    """The sweep experiment's trainer.skip_finished does not stop `make resume`."""
    run = swept / "sweep" / "sinusoidal_seed1"
    cmd = [sys.executable, "-m", "seq2seq.cli.resume", str(run), "trainer.max_steps=10"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    resumed = results(swept, "sinusoidal_seed1")
    assert resumed["resumed_from"] == str(run / "checkpoints" / "last.pt")
    assert resumed["steps"] == 10


def test_report_rebuilds_the_runs_source_tokenizer(swept: Path) -> None:
    """The significance tests split the sentences by source tokens with the tokenizer rebuilt
    from the run's .hydra/config.yaml: the lengths are those training counted."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "compare_runs", REPO / "scripts" / "compare_runs.py"
    )
    assert spec is not None
    assert spec.loader is not None
    cr = importlib.util.module_from_spec(spec)
    sys.modules["compare_runs"] = cr
    spec.loader.exec_module(cr)
    import sweep_significance

    job = cr.load_job(swept / "sweep" / "rope_seed1", swept / "sweep")
    corpus = load_corpus(compose_train(["experiment=pos_multi30k", *overrides(swept)]))
    srcs = [s for name in ("test", "valid") for s in corpus.evals[name].src_text]
    lens = [len(ids) for name in ("test", "valid") for ids in corpus.evals[name].src_ids]
    assert sweep_significance.source_lengths(job, srcs) == lens
