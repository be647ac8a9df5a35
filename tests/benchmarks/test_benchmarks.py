"""benchmarks/: the CTranslate2 worker of decode.py never loads torch (two OpenMP runtimes in
one process slow CTranslate2 down), the length-cap rule of the natural modes, the machine
fields every result file records, CTranslate2 run with each of its CPU backends (CT2_USE_MKL)
and its figure the faster, export_speed.py giving ours CTranslate2's stopping rule, the per-step
counts of benchmarks/decode_ops.py, and the floor engine of benchmarks/decode_floor.py computing
the model's own decoder step.

The worker test runs the real worker path (decode.main with --worker) in a fresh interpreter,
with a stand-in ctranslate2 module: CI installs only the dev extra, and a real CTranslate2 would
need a converted model. Where ctranslate2 is installed, a second test imports it for real."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
HEAVY = ("torch", "seq2seq", "transformers")  # what the CTranslate2 worker must not import,
# but for the torch-free seq2seq.mkl (benchmarks/common.py loads it; CTranslate2's own MKL does not
# call the function it answers) and the package that holds it
LIGHT = ("seq2seq", "seq2seq.mkl")

FAKE_CT2 = """
import sys, types

class Translator:  # returns "a </s>" for every sentence; calls kept in fake.calls
    def __init__(self, path, **kwargs):
        fake.calls.append(["init", kwargs])

    def translate_batch(self, batch, **kwargs):
        fake.calls.append(["batch", len(batch), kwargs.get("max_batch_size", 0)])
        return [types.SimpleNamespace(hypotheses=[["a", "</s>"]]) for _ in batch]

fake = types.ModuleType("ctranslate2")
fake.Translator = Translator
fake.calls = []
sys.modules["ctranslate2"] = fake
"""

CHECK = """
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r} and m not in {light!r})
assert not heavy, f"loaded: {{heavy[:10]}}"
"""


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter with benchmarks/ on sys.path."""
    prelude = f"import sys\nsys.path.insert(0, {str(BENCH)!r})\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + code],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def ct2_worker(
    tmp_path: Path, name: str, mode: str, src_ids: list[list[int]], batches: list[list[int]]
) -> tuple[dict[str, Any], list[Any]]:
    """decode.py --worker NAME MODE on the stand-in ctranslate2 in a fresh interpreter, which
    must not import torch: its result and the stand-in's calls."""
    inputs = {
        "src_ids": src_ids,
        "batches": batches,
        "threads": 1 if name == "ct2_float32" else 2,
        "vocab": ["<pad>", "<s>", "</s>", "<unk>", "a", "b"],
        "paths": {"ct2_float32": str(tmp_path)},
    }
    path = tmp_path / "inputs.json"
    path.write_text(json.dumps(inputs))
    argv = ["decode.py", "--worker", name, mode, str(path)]
    code = FAKE_CT2 + f"sys.argv = {argv!r}\nimport decode\ndecode.main()\n"
    code += "import json\nprint('CALLS' + json.dumps(fake.calls), file=sys.stderr)\n"
    done = run_python(code + CHECK.format(heavy=HEAVY, light=LIGHT))
    assert done.returncode == 0, done.stderr
    calls = json.loads(done.stderr.split("CALLS", 1)[1].splitlines()[0])
    return json.loads(done.stdout.strip().splitlines()[-1]), calls


def test_ct2_worker_never_imports_torch(tmp_path: Path) -> None:
    """decode.py --worker ct2_float32 greedy_forced, end to end up to CTranslate2's calls."""
    result, _ = ct2_worker(tmp_path, "ct2_float32", "greedy_forced", [[4, 5], [5]], [[0, 1]])
    assert result["outputs"] == [[4], [4]]  # EOS stripped, input order kept
    assert result["lengths"] == [2, 2]
    assert result["alone_step_ms"] is not None


def test_ct2_worker_with_a_replica_a_thread(tmp_path: Path) -> None:
    """decode.py --worker ct2_float32_inter: inter_threads = threads, intra_threads 1, every
    batch in one translate_batch call split at the batch size (after a warm-up of one batch a
    replica), outputs back in input order, no one-sentence timing."""
    src_ids, batches = [[4, 5], [5], [4], [5, 5]], [[0, 3], [1, 2]]
    result, calls = ct2_worker(tmp_path, "ct2_float32_inter", "greedy_natural", src_ids, batches)
    assert result["outputs"] == [[4]] * 4
    assert result["alone_step_ms"] is None
    assert calls[0][0] == "init"
    assert (calls[0][1]["inter_threads"], calls[0][1]["intra_threads"]) == (2, 1)
    assert calls[1:] == [["batch", 4, 2], ["batch", 4, 2]]  # warm-up (2 batches), then all


def test_ours_with_a_worker_a_thread_gives_one_process_outputs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """decode_engines.run_ours with workers=2 (forked one-thread workers, sentence i to worker
    i mod 2) decodes what one process does, in input order, in a greedy and a beam mode."""
    monkeypatch.syspath_prepend(str(BENCH))
    import decode_engines
    import torch
    from decode_setup import new_model

    vocab = 12
    torch.save(new_model(vocab, seed=3).state_dict(), tmp_path / "model.pt")
    gen = torch.Generator().manual_seed(0)
    src = [torch.randint(4, vocab, (n,), generator=gen).tolist() for n in (3, 7, 2, 5, 4)]
    inputs = decode_engines.Inputs(
        src_ids=src,
        batches=[[1, 3, 4], [0, 2]],
        vocab=[f"t{i}" for i in range(vocab)],
        paths={"ours": str(tmp_path / "model.pt")},
        threads=2,
    )
    threads = torch.get_num_threads()
    try:
        for mode in ("greedy_natural", "beam5_natural"):
            one = decode_engines.run_ours(inputs, decode_engines.MODES[mode], workers=1)
            two = decode_engines.run_ours(inputs, decode_engines.MODES[mode], workers=2)
            assert two["outputs"] == one["outputs"], mode
            assert two["lengths"] == one["lengths"]
            assert two["alone_step_ms"] is None
    finally:
        torch.set_num_threads(threads)


@pytest.mark.skipif(importlib.util.find_spec("ctranslate2") is None, reason="no ctranslate2")
def test_real_ctranslate2_import_brings_no_torch() -> None:
    """With the real ctranslate2: it, and every module the worker imports, leave torch out."""
    code = (
        "import ctranslate2, common, decode, decode_engines\n"
        "run = decode_engines.runner('ct2_int8')\n"
    )
    done = run_python(code + CHECK.format(heavy=HEAVY, light=LIGHT))
    assert done.returncode == 0, done.stderr


@pytest.fixture
def decode(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))
    import decode as module

    return module


def test_at_cap_is_the_same_rule_for_every_engine(decode: ModuleType) -> None:
    # limit 4: ours ends with a forced EOS after 3 tokens, the others stop at 4 without one
    outputs = [[5, 6, 7], [5, 6, 7, 8], [5, 6], []]
    assert decode.at_cap(outputs, 4) == 0.5


def test_natural_mode_over_the_cap_share_fails_loudly(decode: ModuleType) -> None:
    table = {
        "greedy_forced": {"ours": {"at_cap": 1.0}},  # forced: at the cap by design
        "beam5_natural": {"ours": {"at_cap": 0.05}, "hf_sdpa": {"at_cap": 0.5}},
    }
    decode.check_natural_lengths(table)
    table["greedy_natural"] = {"ours": {"at_cap": 0.25}}
    with pytest.raises(SystemExit, match=r"greedy_natural: 25\.0%"):
        decode.check_natural_lengths(table)


def test_versus_faster_hf_takes_the_faster_attention(decode: ModuleType) -> None:
    table = {
        "greedy_forced": {
            "ours": {"ours_speedup": 1.0},
            "hf_sdpa": {"sent_per_s": 10.0, "ours_speedup": 3.0},
            "hf_eager": {"sent_per_s": 15.0, "ours_speedup": 2.0},
        }
    }
    faster = decode.versus_faster_hf(table)
    assert faster == {"greedy_forced": {"engine": "hf_eager", "ours_speedup": 2.0}}


def test_machine_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import common

    fields = common.machine_fields()
    for key in ("cpu_model", "cpu_vendor", "cores", "torch", "threads", "machine"):
        assert key in fields
    assert fields["cpu_model"] in fields["machine"]
    assert fields["torch"] in fields["machine"]


# --------------------------------------------------------------------------- CTranslate2's backends


def test_every_ctranslate2_engine_runs_with_both_backends(decode: ModuleType) -> None:
    """...and, with several threads, ours and CTranslate2 also with one worker a thread."""
    runs = decode.expand_runs(["ours", "ct2_float32", "hf_sdpa", "ct2_int8"], 1)
    assert runs == [
        "ours",
        "ct2_float32_mkl0",
        "ct2_float32_mkl1",
        "hf_sdpa",
        "ct2_int8_mkl0",
        "ct2_int8_mkl1",
    ]
    runs = decode.expand_runs(["ours", "ct2_float32", "hf_eager"], 2)
    assert runs == [
        "ours",
        "ours_inter",
        "ct2_float32_mkl0",
        "ct2_float32_mkl0_inter",
        "ct2_float32_mkl1",
        "ct2_float32_mkl1_inter",
        "hf_eager",
    ]
    assert decode.split_run("ct2_int8_mkl1") == ("ct2_int8", "1", False)
    assert decode.split_run("ct2_int8_mkl0_inter") == ("ct2_int8", "0", True)
    assert decode.split_run("ours_inter") == ("ours", None, True)
    assert decode.split_run("hf_eager") == ("hf_eager", None, False)


def test_spawn_sets_ct2_use_mkl_per_run(
    decode: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each CTranslate2 run gets its own CT2_USE_MKL in its worker's environment, and the
    worker the engine's name; the other engines never see one (not even a user's export)."""
    seen: list[tuple[list[str], dict[str, str]]] = []
    monkeypatch.setattr(decode, "run_json", lambda cmd, env, what: seen.append((cmd, env)))
    monkeypatch.setenv("CT2_USE_MKL", "1")
    runs = ("ct2_float32_mkl0", "ct2_float32_mkl1_inter", "ours", "ours_inter", "hf_sdpa")
    for run in runs:
        decode.spawn(run, "greedy_natural", tmp_path / "inputs.json", 2)
    assert [env.get("CT2_USE_MKL") for _, env in seen] == ["0", "1", None, None, None]
    assert [cmd[cmd.index("--worker") + 1] for cmd, _ in seen] == [
        "ct2_float32",
        "ct2_float32_inter",
        "ours",
        "ours_inter",
        "hf_sdpa",
    ]


def test_ctranslate2s_figure_is_its_faster_backend(decode: ModuleType) -> None:
    table = {
        "beam5_natural": {
            "ours": {"sent_per_s": 100.0, "ours_speedup": 1.0},
            "ct2_float32_mkl0": {"sent_per_s": 371.0, "ours_speedup": 100 / 371},
            "ct2_float32_mkl1": {"sent_per_s": 162.0, "ours_speedup": 100 / 162},
        }
    }
    figure = decode.ct2_figures(table)["beam5_natural"]["ct2_float32"]
    assert figure["ct2_use_mkl"] == "0"
    assert figure["sent_per_s"] == 371.0
    assert figure["inter_threads"] is False
    table["beam5_natural"]["ct2_float32_mkl1"]["sent_per_s"] = 500.0
    assert decode.ct2_figures(table)["beam5_natural"]["ct2_float32"]["ct2_use_mkl"] == "1"


def test_each_engines_figure_is_its_fastest_layout(decode: ModuleType) -> None:
    """With a run a thread layout, CTranslate2's figure and ours are each one's fastest run, and
    every ratio is ours' fastest over the row's; agreement stays against ours' first run."""

    def result(seconds: float, outputs: list[list[int]]) -> dict[str, Any]:
        return {
            "seconds": seconds,
            "outputs": outputs,
            "lengths": [len(o) + 1 for o in outputs],
            "alone_step_ms": None,
            "peak_rss_mb": 100.0,
        }

    same, other = [[4, 5], [6]], [[4, 5], [7]]
    runs = {
        "greedy_natural": {
            "ours": [result(2.0, same)],
            "ours_inter": [result(1.0, same)],
            "ct2_float32_mkl0": [result(0.8, same)],
            "ct2_float32_mkl0_inter": [result(0.5, other)],
            "ct2_float32_mkl1": [result(4.0, same)],
        }
    }
    table = decode.summarize(runs)["greedy_natural"]
    assert table["ours"]["ours_speedup"] == pytest.approx(2.0)  # ours_inter over ours
    assert table["ct2_float32_mkl0_inter"]["ours_speedup"] == pytest.approx(0.5)
    assert table["ct2_float32_mkl0_inter"]["same_output_as_ours"] == 0.5
    figure = decode.ct2_figures({"greedy_natural": table})["greedy_natural"]["ct2_float32"]
    assert (figure["ct2_use_mkl"], figure["inter_threads"]) == ("0", True)
    assert figure["ours"] == "ours_inter"
    assert figure["ours_speedup"] == pytest.approx(0.5)


@pytest.fixture
def export_speed(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))
    import export_speed as module

    return module


def test_export_speed_runs_ctranslate2_with_both_backends(
    export_speed: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both CT2_USE_MKL values per compute type and both thread layouts per engine, each its own
    run; ours without a backend; the fastest run is each engine's figure, and a backend that
    fails (a build without MKL) leaves the others."""
    assert export_speed.RUNS == (
        "ours",
        "ours_inter",
        "ours_int8",
        "ct2_float32_mkl0",
        "ct2_float32_mkl0_inter",
        "ct2_float32_mkl1",
        "ct2_float32_mkl1_inter",
        "ct2_int8_mkl0",
        "ct2_int8_mkl0_inter",
        "ct2_int8_mkl1",
        "ct2_int8_mkl1_inter",
    )
    assert export_speed.split_run("ct2_int8_mkl1_inter") == ("ct2_int8", "1", True)
    assert export_speed.split_run("ours_inter") == ("ours", None, True)
    assert export_speed.split_run("ours_int8") == ("ours_int8", None, False)
    monkeypatch.setenv("CT2_USE_MKL", "1")
    assert "CT2_USE_MKL" not in export_speed.run_env("ours", 2)
    assert "CT2_USE_MKL" not in export_speed.run_env("ours_int8", 2)
    assert export_speed.run_env("ct2_int8_mkl0", 2)["CT2_USE_MKL"] == "0"
    assert export_speed.run_env("ct2_int8_mkl0_inter", 2)["CT2_USE_MKL"] == "0"
    summary = {
        "ours": {"mean": 200.0},
        "ours_inter": {"mean": 220.0},
        "ours_int8": {"mean": 300.0},  # another engine: not ours' figure
        "ct2_float32_mkl0": {"mean": 371.0},
        "ct2_float32_mkl0_inter": {"mean": 400.0},
        "ct2_float32_mkl1": {"mean": 162.0},
        "ct2_float32_mkl1_inter": {"mean": 170.0},
        "ct2_int8_mkl0": {"error": "no MKL in this build"},
        "ct2_int8_mkl0_inter": {"error": "no MKL in this build"},
        "ct2_int8_mkl1": {"mean": 250.0},
        "ct2_int8_mkl1_inter": {"mean": 240.0},
    }
    figures = export_speed.ct2_figures(summary)
    assert figures["ct2_float32"] == {
        "ct2_use_mkl": "0",
        "inter_threads": True,
        "mean": 400.0,
        "ours": "ours_inter",
        "ours_over_ct2": 220.0 / 400.0,
    }
    assert figures["ct2_int8"]["ct2_use_mkl"] == "1"
    assert figures["ct2_int8"]["inter_threads"] is False
    rows = export_speed.table(
        {
            k: {
                **v,
                "std": 0.0,
                "bleu": 1.0,
                "identical_to_ours": 1,
                "at_limit": 0,
                "peak_rss_mb": 1,
            }
            if "error" not in v
            else v
            for k, v in summary.items()
        },
        1,
        2,
    )
    assert "| ours | - | 2 x 1 | 220.0 ± 0.0 | 1.00 |" in "\n".join(rows)
    assert "| ct2_float32 | 0 | 2 x 1 | 400.0 ± 0.0 | 0.55 |" in "\n".join(rows)


def test_export_speed_gives_ours_ctranslate2s_stopping_rule(
    export_speed: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ours stops where CTranslate2 does (one length limit, not our a * |src| + b): a sentence
    that never emits EOS once ran to 256 tokens in CTranslate2 and ~1.5x its source in ours."""
    import seq2seq.decode.translator
    from seq2seq.decode.translator import Translation

    calls: list[dict[str, Any]] = []

    class Recorder:
        @classmethod
        def from_checkpoint(cls, *args: Any, **kwargs: Any) -> Recorder:
            return cls()

        def translate_nbest(self, texts: list[str], **changes: Any) -> list[list[Translation]]:
            calls.append(changes)
            return [[Translation(t.upper(), 0.0, list(range(len(t))))] for t in texts]

    monkeypatch.setattr(seq2seq.decode.translator, "Translator", Recorder)
    inputs = {"ckpt": "x.pt", "threads": 1, "max_decoding_length": 77}
    assert export_speed.ours_decoder(inputs, 5, "float32")(["a b", "c"]) == (["A B", "C"], [3, 1])
    assert calls == [
        {
            "method": "beam",
            "beam_size": 5,
            "batch_size": 64,
            "max_len_a": 0.0,
            "max_len_b": 77,
            "scores": False,
        }
    ]
    refs = ["x"] * 3
    runs = {
        run: [
            {
                "outputs": ["a", "b", "c"],
                "lengths": [3, 255, 256],
                "seconds": 1.0,
                "peak_rss_mb": 1.0,
            }
        ]
        for run in ("ours", "ct2_float32_mkl0")
    }
    summary = export_speed.summarize(runs, refs, 3)
    assert summary["ours"]["at_limit"] == summary["ct2_float32_mkl0"]["at_limit"] == 2


def test_decode_setups_export_check_compares_logits_with_marian(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Catches the export check calling the model as it no longer is (forward returns the loss
    since the fused output layer; benchmarks/decode.py failed on it) and an export that drifts:
    a post-norm sinusoidal model exported to Marian gives the same teacher-forced logits."""
    monkeypatch.syspath_prepend(str(BENCH))
    import decode_setup

    from seq2seq.export.huggingface import to_marian
    from tests.conftest import _make_model

    model = _make_model("sinusoidal", layers=2, norm_first=False, randomize_pos=False)
    to_marian(model, max_positions=64).save_pretrained(tmp_path / "marian")
    src, tgt = [[5, 6, 7], [8, 9]], [[10, 11], [12, 13, 14, 15]]
    check = decode_setup.export_check(model, str(tmp_path / "marian"), src, tgt)
    assert check["positions"] == 2 + 1 + 4 + 1  # BOS + target, each sentence
    assert check["max_abs_logit"] > 0
    assert max(check["max_abs_logit_diff"].values()) < 1e-4


# --------------------------------------------------------------------------- decode_ops


def test_decode_ops_counts_a_step_whatever_the_lengths(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step's counts come out the same from two pairs of forced lengths (the encoder, the
    set-up and the last step cancel out), and hold what they say: nested ops include the
    top-level ones, and the breakdowns add up to the totals."""
    monkeypatch.syspath_prepend(str(BENCH))
    import decode_ops

    from tests.conftest import _make_model

    model = _make_model("sinusoidal", layers=2)
    found = []
    for short, long in ((3, 6), (4, 10)):
        monkeypatch.setattr(decode_ops, "SHORT", short)
        monkeypatch.setattr(decode_ops, "LONG", long)
        found.append(decode_ops.per_step(model, 1, "auto"))
    first, second = found
    for key in decode_ops.COUNTS:
        assert first[key] == second[key], key
    assert first["dispatcher_ops"] >= first["top_level_ops"] > 0
    assert sum(first["ops"].values()) == pytest.approx(first["dispatcher_ops"])
    assert sum(first["top"].values()) == pytest.approx(first["top_level_ops"])
    assert sum(first["calls"].values()) == pytest.approx(first["python_calls"])


def test_decode_report_shows_both_backends_and_ctranslate2s_figure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import decode_report

    def row(rate: float, same: float | None) -> dict[str, object]:
        return {
            "sent_per_s": rate,
            "tokens_per_s": 10 * rate,
            "tokens_per_sentence": 10.0,
            "at_cap": 0.0,
            "peak_rss_mb": 100.0,
            "same_output_as_ours": same,
            "same_first_half_as_ours": same,
            "alone_step_ms": None,
            "ours_speedup": 100.0 / rate,
        }

    result = {
        "setup": {
            "logits": {
                "max_abs_logit_diff": {"sdpa": 1e-6},
                "sentences": 2,
                "positions": 9,
                "max_abs_logit": 5.0,
            }
        },
        "results": {
            "beam5_natural": {
                "ours": row(100.0, None),
                "ct2_float32_mkl0": row(371.0, 0.98),
                "ct2_float32_mkl1": row(162.0, 0.98),
            }
        },
        "faster_hf": {},
        "ct2": {
            "beam5_natural": {
                "ct2_float32": {"ct2_use_mkl": "0", "sent_per_s": 371.0, "ours_speedup": 100 / 371}
            }
        },
        "profile": {"mode": "beam5_forced", "profiled_seconds": 1.0, "share": {"attention": 1.0}},
    }
    text = decode_report.markdown(result)
    assert "| CTranslate2 float32 (CT2_USE_MKL=0) | 371.0 |" in text
    assert "| CTranslate2 float32 (CT2_USE_MKL=1) | 162.0 |" in text
    figure = "CTranslate2 float32 371.0 sent/s with CT2_USE_MKL=0 (ours 0.27x, ours (PyTorch))"
    assert figure in text
    assert "beam5_natural 98%" in text  # both backends count among the float32 engines

    engines = result["results"]["beam5_natural"]  # type: ignore[index]
    engines["ours_inter"] = row(120.0, 1.0)
    engines["ct2_float32_mkl0_inter"] = row(400.0, 0.97)
    result["ct2"]["beam5_natural"]["ct2_float32"].update(  # type: ignore[index]
        sent_per_s=400.0, inter_threads=True, ours="ours_inter", ours_speedup=0.3
    )
    text = decode_report.markdown(result)
    assert "| ours (PyTorch, a worker a thread) | 120.0 |" in text
    assert "| CTranslate2 float32 (CT2_USE_MKL=0, a replica a thread) | 400.0 |" in text
    assert (
        "CTranslate2 float32 400.0 sent/s with CT2_USE_MKL=0, a replica a thread (ours 0.30x, "
        "ours (PyTorch, a worker a thread))" in text
    )
    assert "beam5_natural 97%-98%" in text  # the replica run counts among the float32 engines


def test_matmul_bound_builds_train_throughputs_plain_config(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """matmul_bound.py gives train_throughput.train_config every setting it reads (a new one
    there once broke it): the plain step, in each precision."""
    monkeypatch.syspath_prepend(str(BENCH))
    import argparse

    import matmul_bound

    args = argparse.Namespace(data=str(tmp_path), steps=1, warmup=0, threads=2, no_doc=True)
    for precision in matmul_bound.PRECISIONS:
        cfg = matmul_bound.bench_config(args, precision)
        assert cfg.trainer.precision.value == precision
        assert cfg.trainer.rdrop_alpha == 0
        assert not cfg.trainer.compile


def test_products_summary_names_the_faster_step_and_how_often_the_timing_picked_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Catches a ratio upside down, the warm-up steps timed, or the start-up timing's agreement
    counted against the wrong backend."""
    monkeypatch.syspath_prepend(str(BENCH))
    import products

    def run(steps: list[float], pick: str) -> dict:
        probe = {"onednn": 0.08, "aten": 0.07} if pick == "aten" else {"onednn": 0.07, "aten": 0.08}
        return {"seconds": steps, "probe_s": probe, "probe_pick": pick, "initial_eval_loss": 9.5}

    runs = {
        "onednn": [run([9.0, 1.0, 1.0, 1.2], "aten"), run([9.0, 1.1, 1.0, 1.0], "onednn")],
        "aten": [run([9.0, 0.8, 0.8, 0.9], "aten"), run([0.1, 0.8, 0.9, 0.9], "aten")],
    }
    result = products.summarise(runs, warmup=1)
    assert result["onednn"]["s_per_step_repeats"] == [1.0, 1.0]
    assert result["aten"]["s_per_step_repeats"] == [0.8, 0.9]
    assert result["faster"] == "aten"
    assert result["aten_over_onednn"] == pytest.approx(1.0 / 0.85)
    assert result["probe_agrees"] == 0.75  # 3 of the 4 processes' timings picked ATen
    result.update(repeats=2, steps=3, warmup=1, threads=2)
    text = products.report(result)
    assert "faster on **aten**" in text
    assert "80 / 70" in text  # each process's start-up timing, in ms


def test_products_trains_train_throughputs_plain_fp32_config(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.syspath_prepend(str(BENCH))
    import argparse

    import products
    import train_throughput

    args = argparse.Namespace(data=str(tmp_path), threads=2)
    cfg = train_throughput.train_config(products.tt_args(args))
    assert cfg.trainer.precision.value == "fp32"
    assert cfg.trainer.rdrop_alpha == 0
    assert not cfg.trainer.compile
    assert cfg.data.root == str(tmp_path)


# --------------------------------------------------------------------------- decode_floor


def test_decode_floor_computes_model_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    """The floor engine of benchmarks/decode_floor.py is the model's own decoder step written
    otherwise: the same logits as model.decode with its cache, step after step, for one row and
    for several; and it refuses a model it does not know (post-norm)."""
    monkeypatch.syspath_prepend(str(BENCH))
    import decode_floor
    import torch

    from seq2seq.data.tokenizer import BOS_ID
    from tests.conftest import VOCAB, _make_model

    model = _make_model("sinusoidal", layers=2)
    for rows in (1, 3):
        src = torch.randint(4, VOCAB, (rows, 7), generator=torch.Generator().manual_seed(rows))
        with torch.inference_mode():
            memory, mask = model.encode(src)  # (N, S, D), (N, S)
            floor, cache = decode_floor.Floor(model, memory, 6), model.new_cache(6)
            tokens = torch.full((rows,), BOS_ID)  # (N,)
            for t in range(6):
                ours = model.decode(tokens[:, None], memory, mask, cache)[:, -1]  # (N, V)
                theirs = floor.logits(tokens, t)  # (N, V)
                torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)
                tokens = ours.argmax(-1)
    with pytest.raises(SystemExit, match="pre-norm sinusoidal"):
        decode_floor.Floor(_make_model("sinusoidal", norm_first=False), memory, 6)


def test_a_benchmark_measures_the_checkout_it_is_in(tmp_path: Path) -> None:
    """common.py puts its own checkout first, for a benchmark script and its child processes:
    run from a git worktree of a fixed commit, a benchmark imports that commit's seq2seq, never
    the checkout an editable install points at. Here a stand-in checkout (tmp) has its own
    seq2seq package and a benchmark script, whose seq2seq must be the stand-in, in its process
    and in a child; a program that is not a benchmark (pytest here) keeps its own path."""
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "common.py").write_text((BENCH / "common.py").read_text())
    (tmp_path / "seq2seq").mkdir()
    (tmp_path / "seq2seq" / "__init__.py").write_text("STAND_IN = True\n")
    probe = tmp_path / "benchmarks" / "probe.py"
    probe.write_text(
        "import subprocess, sys\n"
        "import common, seq2seq\n"
        "child = subprocess.run([sys.executable, '-c', 'import seq2seq; print(seq2seq.__file__)'],"
        " capture_output=True, text=True, check=True, cwd='/')\n"
        "print(seq2seq.__file__, child.stdout.strip(), common.code_version())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, str(probe)], capture_output=True, text=True, check=True, cwd="/", env=env
    )
    here, child, code = done.stdout.split()
    assert Path(here).parent == tmp_path / "seq2seq"
    assert Path(child).parent == tmp_path / "seq2seq"
    assert code == "unknown"  # no git checkout there
    assert str(tmp_path) not in os.environ.get("PYTHONPATH", "")  # pytest's own is untouched


def test_the_recorded_code_is_the_commit_the_benchmark_started_on(tmp_path: Path) -> None:
    """code_version is read as a benchmark script starts: the results it then writes into the
    tree (tracked files) do not mark the code as changed, nor do an earlier benchmark's (the
    documents and results a benchmark writes); a tree whose code changed before it starts is."""
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    (tmp_path / "benchmarks" / "common.py").write_text((BENCH / "common.py").read_text())
    (tmp_path / "benchmarks" / "results" / "probe.json").write_text("{}\n")
    (tmp_path / "docs" / "BENCHMARKS.md").write_text("# Benchmarks\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    probe = tmp_path / "benchmarks" / "probe.py"
    probe.write_text(
        "import pathlib, common\n"
        "pathlib.Path(common.ROOT, 'benchmarks/results/probe.json').write_text('{\"n\": 1}\\n')\n"
        "with open(pathlib.Path(common.ROOT, 'docs/BENCHMARKS.md'), 'a') as doc:\n"
        "    doc.write('a section\\n')\n"
        "print(common.code_version())\n"
    )
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "c"], check=True)
    commit = subprocess.run(
        [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()

    def recorded() -> str:
        run = [sys.executable, str(probe)]
        return subprocess.run(run, capture_output=True, text=True, check=True).stdout.strip()

    assert recorded() == commit  # the run's own results do not count
    assert recorded() == commit  # nor the earlier run's, left in the tree
    (tmp_path / "code.py").write_text("x = 2\n")
    assert recorded() == f"{commit}+changes"  # the code it started on had changed
