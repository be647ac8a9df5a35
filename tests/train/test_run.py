"""Tests for seq2seq.train.run and seq2seq-train: one short end-to-end run shared by the tests that
follow it (train -> checkpoints -> results.json -> translate -> evaluate, in-process and via the
CLIs)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

import seq2seq.cli.evaluate
import seq2seq.cli.translate
from seq2seq.config.checks import merge_decode
from seq2seq.config.commands import EvaluateConfig, TranslateConfig, register_configs
from seq2seq.config.schema import (
    DecodeConfig,
    SearchKind,
    TrainConfig,
    config_from_dict,
    resolve_path,
)
from seq2seq.data.text import DataError
from seq2seq.train.checkpoint import load_checkpoint
from seq2seq.train.corpus import read_split
from seq2seq.train.run import train
from tests.tiny_run import compose_train, write_slice

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "seq2seq" / "config"
BIN = Path(sys.executable).parent


# --------------------------------------------------------------------------- end to end


@dataclass
class Run:
    cfg: TrainConfig
    run_dir: Path
    data: Path
    results: dict[str, dict[str, object]]

    @property
    def best(self) -> Path:
        return self.run_dir / "checkpoints" / "best.pt"


SLICE = {"train": 2000, "valid": 50, "test": 50}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Train a tiny model for 60 steps on 2000 pairs (a few seconds on one CPU thread)."""
    root = tmp_path_factory.mktemp("e2e")
    data = root / "data"
    write_slice(data, SLICE)
    cfg = compose_train(
        [
            f"data.root={data}",
            "data.test=[test]",
            "data.max_len=64",
            "tokenizer=bpe",
            "tokenizer.vocab_size=200",
            f"tokenizer.cache_dir={root / 'tokenizers'}",
            f"data.cache_dir={root / 'prepared'}",
            "model.d_model=32",
            "model.n_heads=2",
            "model.enc_layers=1",
            "model.dec_layers=1",
            "model.d_ff=64",
            "model.dropout=0.0",
            "optim.lr=0.003",
            "optim.warmup_steps=10",
            "trainer.max_steps=60",
            "trainer.valid_every=30",
            "trainer.valid_bleu_sentences=20",
            "trainer.log_every=10",
            "trainer.max_tokens=1024",
            "trainer.progress=false",
            "trainer.device=cpu",
            "trainer.threads=1",
            "trainer.precision=fp32",  # auto's choice depends on the CPU (test_precision.py)
        ]
    )
    run_dir = root / "run"
    results = train(cfg, run_dir)
    return Run(cfg, run_dir, data, results)


def scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def test_training_loss_falls(run: Run) -> None:
    loss = scalars(run.run_dir, "train/loss")
    assert [step for step, _ in loss] == [10, 20, 30, 40, 50, 60]
    assert loss[-1][1] < 0.85 * loss[0][1], loss
    assert [step for step, _ in scalars(run.run_dir, "valid/bleu")] == [30, 60]
    assert len(scalars(run.run_dir, "test/test_bleu")) == 1


def score_checkpoints_written_and_loadable(run: Run) -> None:
    folder = run.run_dir / "checkpoints"
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["best.pt", "last.pt", "step_30.pt", "step_60.pt"]
    last = load_checkpoint(folder / "last.pt")
    assert last["train_state"]["step"] == 60
    best = load_checkpoint(run.best)
    assert best["train_state"]["step"] in (30, 60)
    assert config_from_dict(last["config"]) == run.cfg  # the config survives the round trip
    assert set(last["tokenizers"]) == {"src", "tgt"}


def test_results_json(run: Run) -> None:
    results = json.loads((run.run_dir / "results.json").read_text())
    assert results["steps"] == 60
    test = results["test"]["test"]
    for key in ("bleu", "chrf", "bleu_signature", "chrf_signature", "bleu_lc"):
        assert key in test
    assert test["n"] == SLICE["test"]
    assert test == run.results["test"]
    hyp = (run.run_dir / "test.hyp").read_text(encoding="utf-8").splitlines()
    assert len(hyp) == SLICE["test"]
    assert results["machine"]["cores"] >= 1
    assert results["machine"]["cpu_model"]  # times' CPU
    assert results["precision"] == "fp32"
    assert results["precision_s_per_step"] == {}  # nothing timed: the precision was given


def input_lines(run: Run) -> list[str]:
    """Seven test sentences and a blank line, in an order unlike their length order."""
    src = (run.data / "test.en").read_text(encoding="utf-8").splitlines()
    return [src[3], src[0], "", src[5], src[1], src[6], src[2], src[4]]


def translate_config(run: Run, overrides: list[str]) -> TranslateConfig:
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = OmegaConf.to_object(compose("translate", overrides=[f"ckpt={run.best}", *overrides]))
    assert isinstance(cfg, TranslateConfig)
    return cfg


def test_translate_and_evaluate_in_process(run: Run, tmp_path: Path) -> None:
    lines = input_lines(run)
    (tmp_path / "in.txt").write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    cfg = translate_config(
        run,
        [
            f"input={tmp_path / 'in.txt'}",
            f"output={tmp_path / 'out.txt'}",
            "device=cpu",
            "decode.batch_size=3",
        ],
    )
    assert cfg.decode.method == SearchKind.beam
    seq2seq.cli.translate.run(cfg)
    out = (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()
    assert len(out) == len(lines)
    assert out[2] == ""  # a blank line stays blank
    one_by_one = [seq2seq.cli.translate.translate_lines(cfg, [line])[0] for line in lines]
    assert out == one_by_one

    cfg.decode.nbest = 2  # two lines per input, best first; distinct, except for the blank line
    nbest = seq2seq.cli.translate.translate_lines(cfg, lines)
    assert len(nbest) == 2 * len(lines)
    assert nbest[0::2] == out
    assert nbest[4:6] == ["", ""]
    assert sum(a != b for a, b in zip(nbest[0::2], nbest[1::2])) >= len(lines) // 2

    refs = (run.data / "test.de").read_text(encoding="utf-8").splitlines()
    ref_lines = [refs[3], refs[0], "", refs[5], refs[1], refs[6], refs[2], refs[4]]
    (tmp_path / "ref.txt").write_text("".join(x + "\n" for x in ref_lines), encoding="utf-8")
    scores = seq2seq.cli.evaluate.run(
        EvaluateConfig(
            hyp=str(tmp_path / "out.txt"),
            ref=str(tmp_path / "ref.txt"),
            json=str(tmp_path / "s.json"),
        )
    )
    assert scores["n"] == len(lines)
    assert json.loads((tmp_path / "s.json").read_text()) == scores
    assert 0.0 <= float(scores["bleu"]) <= 100.0  # type: ignore[arg-type]


def test_evaluate_checkpoint_on_a_split(run: Run) -> None:
    cfg = EvaluateConfig(ckpt=str(run.best), split="valid", device="cpu")
    cfg.decode.method = SearchKind.greedy
    scores = seq2seq.cli.evaluate.run(cfg)
    assert scores["n"] == SLICE["valid"]
    assert "bleu_signature" in scores
    assert "chrf" in scores


def cli(name: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1"}
    return subprocess.run(
        [str(BIN / name), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_console_scripts(run: Run, tmp_path: Path) -> None:
    lines = input_lines(run)
    (tmp_path / "in.txt").write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    done = cli(
        "seq2seq-translate",
        [f"ckpt={run.best}", "input=in.txt", "output=out.txt", "device=cpu", "decode.beam_size=3"],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    out = (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()
    assert len(out) == len(lines)
    assert out[2] == ""
    same = translate_config(run, ["device=cpu", "decode.beam_size=3"])
    # the checkpoint's decoding settings (greedy) with the command line's beam_size
    same.decode = merge_decode(same.decode, run.cfg.decode, ["decode.beam_size=3"])[0]
    assert out == seq2seq.cli.translate.translate_lines(same, lines)  # in order, as in-process

    refs = (run.data / "test.de").read_text(encoding="utf-8").splitlines()
    (tmp_path / "ref.txt").write_text("".join(r + "\n" for r in refs[:8]), encoding="utf-8")
    done = cli("seq2seq-evaluate", ["hyp=out.txt", "ref=ref.txt", "json=-"], tmp_path)
    assert done.returncode == 0, done.stderr
    scores = json.loads(done.stdout)  # stdout holds the JSON alone (logs go to stderr)
    assert scores["n"] == len(lines)
    for key in ("bleu", "chrf"):
        assert isinstance(scores[key], float | int)
        assert scores[f"{key}_signature"].startswith("nrefs:1|")


def test_translate_decodes_as_the_run_tested(run: Run, tmp_path: Path) -> None:
    """Without decode overrides seq2seq-translate takes the checkpoint's decoding settings, so
    it reproduces the hypotheses the training run wrote for its test split; an override wins."""
    assert run.cfg.decode.method.value == "greedy"  # translate.yaml's default is beam
    src = (run.data / "test.en").read_text(encoding="utf-8")
    (tmp_path / "in.txt").write_text(src, encoding="utf-8")
    args = [f"ckpt={run.best}", "input=in.txt", "output=out.txt", "device=cpu"]
    done = cli("seq2seq-translate", args, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "decoding with the checkpoint's settings: greedy" in done.stderr
    want = (run.run_dir / "test.hyp").read_text(encoding="utf-8")
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == want
    done = cli("seq2seq-translate", [*args, "decode=beam", "decode.beam_size=2"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "the command line's decode over the checkpoint's settings: beam, beam 2" in done.stderr


def test_merge_decode_takes_the_command_lines_keys_only() -> None:
    trained = DecodeConfig(method=SearchKind.beam, beam_size=4, alpha=1.0)
    chosen = DecodeConfig(method=SearchKind.greedy, beam_size=7, alpha=0.6)
    assert merge_decode(chosen, trained, None) == (chosen, [])  # from Python: as given
    assert merge_decode(chosen, trained, ["device=cpu"]) == (trained, [])
    merged, keys = merge_decode(chosen, trained, ["decode.beam_size=7", "input=x"])
    assert merged == DecodeConfig(method=SearchKind.beam, beam_size=7, alpha=1.0)
    assert keys == ["decode.beam_size"]
    assert merge_decode(chosen, trained, ["decode=greedy"]) == (chosen, ["decode"])


def test_console_script_reports_a_bad_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "bad.pt").write_bytes(b"not a checkpoint")
    (tmp_path / "in.txt").write_text("one\n", encoding="utf-8")
    done = cli("seq2seq-translate", ["ckpt=bad.pt", "input=in.txt", "output=out.txt"], tmp_path)
    assert done.returncode != 0
    assert "bad.pt" in done.stderr
    assert "CheckpointError" in done.stderr
    assert not (tmp_path / "out.txt").exists()


def test_console_scripts_leave_no_files_behind(run: Run, tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("one\n", encoding="utf-8")
    done = cli(
        "seq2seq-translate", [f"ckpt={run.best}", "input=in.txt", "output=out.txt"], tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.txt"]


def stdin_with(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def test_translate_reads_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    stdin_with(monkeypatch, b"one\r\n\ntwo words\n")
    assert seq2seq.cli.translate.read_input("-") == ["one", "", "two words"]
    stdin_with(monkeypatch, b"ok\n\xff\n")
    with pytest.raises(DataError, match="<stdin>:2"):
        seq2seq.cli.translate.read_input("-")


def test_translate_stdin_splits_lines_like_files(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    data = "one\u2028two\nthree\x0cfour\nfive\x85six\n".encode()
    (tmp_path / "in.txt").write_bytes(data)
    from_file = seq2seq.cli.translate.read_input(str(tmp_path / "in.txt"))
    assert len(from_file) == 3
    stdin_with(monkeypatch, data)
    assert seq2seq.cli.translate.read_input("-") == from_file


# --------------------------------------------------------------------------- multi30k


MULTI30K = Path(os.environ.get("MULTI30K_ROOT", REPO / ".." / "shared" / "data" / "multi30k"))


@pytest.mark.skipif(
    not MULTI30K.is_dir(), reason=f"Multi30k not found at {MULTI30K} (fetch it with `make data`)"
)
def test_multi30k_splits() -> None:
    cfg = compose_train(["data=multi30k"])
    assert resolve_path(cfg.data.root).resolve() == MULTI30K.resolve()
    counts = {
        split: len(read_split(cfg.data, split))
        for split in (*cfg.data.train, cfg.data.valid, "test_2016_flickr")
    }
    assert counts == {"train": 29000, "val": 1014, "test_2016_flickr": 1000}
    assert "test_2016_flickr" in cfg.data.test
