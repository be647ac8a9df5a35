"""scripts/compare_runs.py on a fake sweep whose scores are known in advance.

The fake sweep has three encodings x two seeds over a tiny data folder:
- rope: both seeds copy the references, so every bucket of every split scores BLEU 100;
- sinusoidal: seed 1 gets the last item of each line wrong, seed 2 the first and the last
  (one-item lines are entirely wrong, so bucket "1" scores 0): far below rope, beyond seed noise;
- enc=alibi/dec=rope (pos_encoding rope, encoder_pos alibi): seed 1 copies, seed 2 is all
  wrong, so its std over seeds is huge and the gap to rope is within seed noise;
plus a sinusoidal seed-3 job that never wrote results.json.
"""

from __future__ import annotations

import csv
import importlib.util
import itertools
import json
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "compare_runs.py"
_spec = importlib.util.spec_from_file_location("compare_runs", SCRIPT)
cr = importlib.util.module_from_spec(_spec)
sys.modules["compare_runs"] = cr  # dataclasses look their module up while being defined
_spec.loader.exec_module(cr)
import sweep_report as sr  # noqa: E402 - importable once compare_runs set the path

EN = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven"]
DE = ["eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun", "zehn", "elf"]
SPLITS = {"test": (20, 1, 6), "test_long": (8, 5, 8)}  # lines, min items, max items
WRONG = "falsch"
OVERRIDE = "enc=alibi/dec=rope"


def phrases(split: str, words: list[str]) -> list[str]:
    """Line i has lo + i % (hi - lo + 1) comma-separated one-word numbers."""
    n, lo, hi = SPLITS[split]
    rows = []
    for i in range(n):
        items = lo + i % (hi - lo + 1)
        rows.append(", ".join(words[(3 * i + k) % len(words)] for k in range(items)))
    return rows


def _replace_item(ref: str, index: int) -> str:
    items = ref.split(", ")
    items[index] = WRONG
    return ", ".join(items)


HYPS: dict[str, Callable[[str], str]] = {
    "copy": lambda ref: ref,
    "last_wrong": lambda ref: _replace_item(ref, -1),
    "ends_wrong": lambda ref: _replace_item(_replace_item(ref, 0), -1),
    "garbage": lambda ref: WRONG,
}
# (pos_encoding, encoder_pos, seed, hyp mode or None for an unfinished job, params, minutes)
JOBS = [
    ("sinusoidal", None, 1, "last_wrong", 1000, 1.0),
    ("sinusoidal", None, 2, "ends_wrong", 1000, 2.0),
    ("rope", None, 1, "copy", 1000, 1.0),
    ("rope", None, 2, "copy", 3000, 2.0),
    ("rope", "alibi", 1, "copy", 1000, 4.0),
    ("rope", "alibi", 2, "garbage", 1000, 4.0),
    ("sinusoidal", None, 3, None, 1000, 1.0),
]


def make_data(root: Path) -> Path:
    """{split}.en / {split}.de plain-text files."""
    root.mkdir(parents=True)
    for split in SPLITS:
        (root / f"{split}.en").write_text("\n".join(phrases(split, EN)) + "\n")
        (root / f"{split}.de").write_text("\n".join(phrases(split, DE)) + "\n")
    return root


def make_job(sweep: Path, num: int, job: tuple, data_root: Path) -> Path:
    """One Hydra job folder: .hydra/config.yaml, and results.json + hyps when finished."""
    pos, enc, seed, mode, params, minutes = job
    path = sweep / f"{num}_pos_encoding={pos},trainer.seed={seed}"
    (path / ".hydra").mkdir(parents=True)
    cfg = {
        "data": {"root": str(data_root), "src_lang": "en", "tgt_lang": "de", "test": [*SPLITS]},
        "pos_encoding": {"kind": pos, "max_len": 64},
        "encoder_pos": None if enc is None else {"kind": enc},
        "decoder_pos": None,
        "trainer": {"seed": seed},
        "name": "fake",
    }
    (path / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)))
    if mode is None:
        return path
    tests = {}
    for split in SPLITS:
        hyps = [HYPS[mode](ref) for ref in phrases(split, DE)]
        (path / f"{split}.hyp").write_text("".join(h + "\n" for h in hyps))
        tests[split] = {"n": len(hyps), "bleu": 12.5, "chrf": 34.5, "bleu_signature": "sig"}
    results = {"test": tests, "best_valid_bleu": 1.0, "steps": 10, "minutes": minutes + 0.5}
    results |= {"train_minutes": minutes, "params": params, "train_tokens_per_s": 500.0}
    (path / "results.json").write_text(json.dumps(results))
    return path


def make_sweep(root: Path, jobs: list[tuple]) -> Path:
    """multirun-style sweep folder with a data folder beside it."""
    data = make_data(root / "data")
    sweep = root / "multirun" / "fake" / "2025-01-01_00-00-00"
    for num, job in enumerate(jobs):
        make_job(sweep, num, job, data)
    return sweep


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The fake sweep compared in-process with --length-by items."""
    root = tmp_path_factory.mktemp("sweep")
    sweep = make_sweep(root, JOBS)
    out = root / "out"
    assert cr.main([str(sweep), "--out", str(out), "--length-by", "items"]) == 0
    with (out / "comparison.csv").open() as f:
        rows = list(csv.DictReader(f))
    return {"out": out, "rows": rows, "md": (out / "comparison.md").read_text(), "sweep": sweep}


def select(rows: list[dict], **where: str) -> list[dict]:
    return [r for r in rows if all(r[k] == v for k, v in where.items())]


def md_row(md: str, label: str, section: str = "## Test scores") -> list[str]:
    """The cells of `label`'s row in the first table after `section`."""
    part = md[md.index(section) :]
    line = next(ln for ln in part.splitlines() if ln.startswith(f"| {label} |"))
    return [c.strip() for c in line.strip("|").split("|")]


# ----------------------------------------------------------------------------- units


def test_mean_std() -> None:
    mean, std = sr.mean_std([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5
    assert std == pytest.approx(1.290994, abs=1e-6)  # sample std (n - 1)
    assert sr.mean_std([7.0]) == (7.0, None)
    assert sr.fmt_mean_std([1.0, 2.0, 3.0, 4.0]) == "2.50 ± 1.29"
    assert sr.fmt_mean_std([7.0]) == "7.00"


def test_encoding_label() -> None:
    base = {"pos_encoding": {"kind": "rope"}, "encoder_pos": None, "decoder_pos": None}
    assert cr.encoding_label(OmegaConf.create(base)) == "rope"
    enc = base | {"encoder_pos": {"kind": "alibi"}}
    assert cr.encoding_label(OmegaConf.create(enc)) == "enc=alibi/dec=rope"
    dec = base | {"decoder_pos": {"kind": "none"}}
    assert cr.encoding_label(OmegaConf.create(dec)) == "enc=rope/dec=none"
    directional = base | {"pos_encoding": {"kind": "alibi", "alibi_directional": True}}
    assert cr.encoding_label(OmegaConf.create(directional)) == "alibi[alibi_directional=True]"
    shared = {"kind": "relative", "share_layers": True, "alibi_directional": False}
    assert cr.encoding_label(OmegaConf.create(base | {"pos_encoding": shared})) == (
        "relative[share_layers=True]"
    )


def test_latest_sweep_is_the_newest(tmp_path: Path) -> None:
    for name in ["a/2025-03-01_10-00-00", "b/2025-05-01_09-00-00", "a/2025-04-01_23-59-59"]:
        (tmp_path / name).mkdir(parents=True)
    assert cr.latest_sweep(tmp_path) == tmp_path / "b" / "2025-05-01_09-00-00"
    with pytest.raises(SystemExit, match="no sweep folder"):
        cr.latest_sweep(tmp_path / "missing")


# ----------------------------------------------------------------------------- the report


def test_csv_exact_copies_score_100_in_every_bucket(report: dict) -> None:
    rows = report["rows"]
    rope = select(rows, encoding="rope")
    assert {r["seed"] for r in rope} == {"1", "2"}
    assert {(r["split"], r["bucket"]) for r in rope} == {
        *(("test", b) for b in ["all", "1", "2", "3", "4", "5", "6"]),
        *(("test_long", b) for b in ["all", "5", "6", "7", "8"]),
    }
    assert all(float(r["bleu"]) == 100.0 and float(r["chrf"]) == 100.0 for r in rope)
    # every one-item line of a sinusoidal run is entirely wrong; longer lines are partly right
    for seed in ["1", "2"]:
        sin = {r["bucket"]: r for r in select(rows, encoding="sinusoidal", seed=seed, split="test")}
        assert float(sin["1"]["bleu"]) == 0.0
        assert 0.0 < float(sin["6"]["bleu"]) < 100.0
        assert float(sin["all"]["bleu"]) < 100.0


def test_csv_bucket_sizes_and_job_columns(report: dict) -> None:
    rows = report["rows"]
    # 6 finished jobs x (7 test rows + 5 test_long rows); the unfinished job has none
    assert len(rows) == 6 * 12
    assert not select(rows, seed="3")
    one = select(rows, encoding="rope", seed="2", split="test")
    sizes = {r["bucket"]: int(r["n_sentences"]) for r in one}
    assert sizes["all"] == 20
    assert sum(n for b, n in sizes.items() if b != "all") == 20
    assert sizes["1"] == 4  # lines 0, 6, 12, 18 have one item
    assert {(r["params"], r["train_minutes"], r["train_tokens_per_s"]) for r in one} == {
        ("3000", "2.0", "500.0")
    }


def test_markdown_main_table(report: dict) -> None:
    md, rows = report["md"], report["rows"]
    rope = md_row(md, "rope")
    # encoding, BLEU test, BLEU test_long, chrF test, chrF test_long, params, min, tok/s, seeds
    assert rope == ["rope", *["100.00 ± 0.00"] * 4, "2,000", "1.50", "500", "2"]
    override = md_row(md, OVERRIDE)
    values = [float(r["bleu"]) for r in select(rows, encoding=OVERRIDE, split="test", bucket="all")]
    assert sorted(values)[1] == 100.0
    assert sorted(values)[0] < 5.0
    expected = f"{statistics.fmean(values):.2f} ± {statistics.stdev(values):.2f}"
    assert override[1] == expected
    assert override[-1] == "2"
    assert "sinusoidal" in md_row(md, "sinusoidal")[0]
    # ranked by BLEU on the first split: rope first
    table = md[md.index("## Test scores") : md.index("## BLEU by source length")]
    assert table.index("| rope |") < table.index(f"| {OVERRIDE} |")


def test_markdown_bucket_tables(report: dict) -> None:
    md = report["md"]
    section = md[md.index("### test_long") :]
    assert "| Encoding | 5 (n=2) | 6 (n=2) | 7 (n=2) | 8 (n=2) |" in section
    assert md_row(md, "rope", "### test_long") == ["rope", *["100.00 ± 0.00"] * 4]
    assert md_row(md, "sinusoidal", "### test (BLEU)")[1] == "0.00 ± 0.00"  # bucket "1"


def test_significance_against_the_best(report: dict) -> None:
    """Without --baseline the best (rope) is the baseline. Sinusoidal is worse on every
    sentence of every seed (sentence-level p tiny), but the override's two seeds (BLEU 100 and
    ~0) make the pooled seed noise huge: no difference is called, and the text says why."""
    md = report["md"]
    part = md[md.index("## Significance") : md.index("## Failed")]
    assert "Every encoding against **rope**" in part
    sin = md_row(part, "sinusoidal", "| System | Metric |")
    assert sin[1] == "BLEU on test"
    assert sin[3].startswith("no difference shown (sentence level: paired bootstrap p=")
    assert "seed level: pooled-variance t-test, df=3" in sin[3]
    assert "seed level: Holm-adjusted p > 0.05" in sin[3]
    assert "sentence level: Holm-adjusted" not in sin[3].split("; ", 3)[-1]
    tested = json.loads((report["out"] / "significance.json").read_text())
    assert tested["baseline"] == "rope"
    assert len(tested["verdicts"]) == 2 * 2 * 2  # systems x metrics x splits


def test_failed_jobs_and_signature_reported(report: dict) -> None:
    md = report["md"]
    failed = md[md.index("## Failed or unfinished jobs") :]
    assert "6_pos_encoding=sinusoidal,trainer.seed=3" in failed
    assert "no results.json" in failed
    assert "Jobs: 6 finished, 1 failed or unfinished" in md
    assert "tok:13a" in md[md.index("## sacreBLEU") :]


def test_png_is_written(report: dict) -> None:
    png = (report["out"] / "bleu_by_length.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(png) > 1000


def test_single_seed_is_not_tested(tmp_path: Path) -> None:
    sweep = make_sweep(tmp_path, [j for j in JOBS if j[2] == 1])
    assert cr.main([str(sweep), "--length-by", "items"]) == 0
    md = (sweep / "comparison.md").read_text()  # --out defaults to the sweep folder
    assert "Not tested: the tests need two encodings with two or more seeds" in md
    assert json.loads((sweep / "significance.json").read_text()) is None


def test_missing_hyp_falls_back_to_results_json(tmp_path: Path) -> None:
    sweep = make_sweep(tmp_path, JOBS[2:4])
    (next(sweep.glob("0_*")) / "test.hyp").unlink()
    assert cr.main([str(sweep), "--out", str(tmp_path / "o")]) == 0
    with (tmp_path / "o" / "comparison.csv").open() as f:
        rows = select(list(csv.DictReader(f)), seed="1", split="test")
    assert [(r["bucket"], r["bleu"], r["chrf"]) for r in rows] == [("all", "12.5", "34.5")]
    assert "not re-scored by length" in (tmp_path / "o" / "comparison.md").read_text()


def test_only_unfinished_jobs_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    sweep = make_sweep(tmp_path, [JOBS[-1]])
    assert cr.main([str(sweep)]) == 1
    err = capsys.readouterr().err
    assert "no finished job" in err
    assert "0_pos_encoding=sinusoidal,trainer.seed=3" in err


def test_latest_picks_the_newest_multirun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sweep = make_sweep(tmp_path, JOBS[2:4])
    (sweep.parent / "2024-12-31_00-00-00").mkdir()  # older and empty
    monkeypatch.chdir(tmp_path)
    assert cr.main(["--latest", "--out", "out"]) == 0
    assert "Jobs: 2 finished, 0 failed" in (tmp_path / "out" / "comparison.md").read_text()


# ----------------------------------------------------------------------------- the CLI


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120
    )


def test_cli_writes_the_three_files(report: dict, tmp_path: Path) -> None:
    out = tmp_path / "cli"
    proc = run_cli(str(report["sweep"]), "--out", str(out), "--length-by", "items")
    assert proc.returncode == 0, proc.stderr
    names = ["comparison.csv", "comparison.md", "bleu_by_length.png", "significance.json"]
    assert all((out / n).is_file() for n in names)
    assert (out / "comparison.md").read_text() in proc.stdout
    assert all(f"wrote {out / n}" in proc.stdout for n in names)


def test_cli_fails_on_an_empty_folder(tmp_path: Path) -> None:
    proc = run_cli(str(tmp_path))
    assert proc.returncode != 0
    assert "no finished job" in proc.stderr
    assert not (tmp_path / "comparison.md").exists()


# ----------------------------------------------------------------------------- trained short


def make_short_job(sweep: Path, pos: str, seed: int, long_bleu: float, curve: list) -> None:
    """A finished run of make sweep-multi30k: results.json with a "length" block, a curve."""
    path = sweep / f"{pos}_seed{seed}"
    (path / ".hydra").mkdir(parents=True)
    data = {"test": ["a"], "train_max_src_len": 16}
    cfg = {"pos_encoding": {"kind": pos}, "trainer": {"seed": seed}, "data": data}
    (path / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)))
    cell = lambda bleu: {"n": 5, "bleu": bleu, "chrf": 2 * bleu}  # noqa: E731
    length = {
        "splits": ["a", "b"],
        "max_src_len": 16,
        "all": cell(30.0),
        "long": cell(long_bleu),
        "buckets": {"1-8": cell(40.0), "17-24": cell(long_bleu)},
    }
    res = {"test": {"a": cell(31.0), "b": cell(29.0)}, "length": length, "steps": 100}
    res |= {"minutes": 2.0, "train_minutes": 1.5, "precision": "bf16", "resumed_from": None}
    (path / "results.json").write_text(json.dumps(res))
    logs = [{"type": "valid", "step": s, "bleu": b} for s, b in curve]
    (path / "train_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in logs))


def test_tokens_mode_tables_and_curves(tmp_path: Path) -> None:
    """Long-split BLEU sinusoidal 10, 12 and rope 20, 22 (results.json only): the tables and
    curves read results.json; without translations the significance section says it tested
    nothing, and why."""
    sweep = tmp_path / "sweep"
    make_short_job(sweep, "sinusoidal", 1, 10.0, [(50, 5.0), (100, 9.0)])
    make_short_job(sweep, "sinusoidal", 2, 12.0, [(50, 7.0), (100, 11.0)])
    make_short_job(sweep, "rope", 1, 20.0, [(50, 6.0), (100, 12.0)])
    make_short_job(sweep, "rope", 2, 22.0, [(50, 6.0), (100, 14.0)])
    out = tmp_path / "out"
    args = [str(sweep), "--out", str(out), "--length-by", "tokens"]
    assert cr.main([*args, "--baseline", "sinusoidal", "--curves"]) == 0
    md = (out / "comparison.md").read_text()
    assert md_row(md, "rope")[:4] == ["rope", "21.00 ± 1.41", "30.00 ± 0.00", "31.00 ± 0.00"]
    assert md_row(md, "sinusoidal", "### a + b (BLEU)")[1:] == ["40.00 ± 0.00", "11.00 ± 1.41"]
    assert md_row(md, "sinusoidal", "### a + b (chrF)")[1:] == ["80.00 ± 0.00", "22.00 ± 2.83"]
    assert md_row(md, "rope", "## Learning curves")[1:] == ["6.0 ± 0.0", "13.0 ± 1.4"]
    assert md_row(md, "sinusoidal", "## Learning curves")[1:] == ["6.0 ± 1.4", "10.0 ± 1.4"]
    assert "(greedy, the validation pairs whose source has at most L = 16 tokens)" in md
    assert "summed: 8.0 min" in md
    assert md_row(md, "rope", "## Runs") == ["rope", "1", "100", "bf16", "1.5", "2.0", "no"]
    significance = md[md.index("## Significance") : md.index("## Failed")]
    assert "Every encoding against **sinusoidal**" in significance
    assert "Not tested: a run's translations cannot be read" in significance
    assert cr.main(args) == 0  # without a baseline the best (rope) is the baseline
    assert "Every encoding against **rope**" in (out / "comparison.md").read_text()


def test_doc_gets_the_reports_tables_between_its_markers(tmp_path: Path) -> None:
    """--doc: the document's marked section becomes the report's tables and tests (one heading
    level down, linked to comparison.md); the text around it is kept; a second run replaces
    the section instead of adding one; a document without markers gets them appended."""
    sweep = tmp_path / "sweep"
    for seed, bleu in ((1, 10.0), (2, 12.0)):
        make_short_job(sweep, "sinusoidal", seed, bleu, [(50, 5.0)])
        make_short_job(sweep, "rope", seed, bleu + 10, [(50, 6.0)])
    out, doc = tmp_path / "docs" / "positional" / "m", tmp_path / "docs" / "P.md"
    doc.parent.mkdir(parents=True)
    marks = "<!-- report:positional/m start -->\nold table\n<!-- report:positional/m end -->"
    doc.write_text(f"# P\n\nbefore\n\n{marks}\n\nafter\n")
    args = [str(sweep), "--out", str(out), "--length-by", "tokens", "--curves", "--doc", str(doc)]
    for _ in range(2):
        assert cr.main([*args, "--baseline", "sinusoidal"]) == 0
    text = doc.read_text()
    assert text.startswith("# P\n\nbefore\n\n<!-- report:positional/m start -->\n")
    assert text.endswith("<!-- report:positional/m end -->\n\nafter\n")
    assert "old table" not in text
    assert text.count("report:positional/m start") == 1
    assert "from [positional/m/comparison.md](positional/m/comparison.md)" in text
    assert md_row(text, "rope", "### Test scores")[:2] == ["rope", "21.00 ± 1.41"]
    assert "#### a + b (BLEU)" in text
    assert "### Significance" in text
    assert "Learning curves" not in text
    assert "## Runs" not in text
    bare = tmp_path / "bare.md"
    bare.write_text("# Bare\n")
    assert cr.main([*args[:-1], str(bare)]) == 0
    assert bare.read_text().startswith("# Bare\n\n<!-- report:positional/m start -->\n")
    elsewhere = [str(sweep), "--out", str(tmp_path / "o"), "--length-by", "tokens"]
    assert cr.main([*elsewhere, "--doc", str(doc), "--doc-name", "positional/m"]) == 0
    assert doc.read_text().count("report:positional/m start") == 1  # the name, not the folder


# a tokens-mode sweep with translations: sources of 2-9 words (the word tokenizer: one token a
# word), cap 5; refs of random words; every system replaces words of the references at a rate
# (within the cap, over it): rope is truly better on the long sentences only
CAP, N_TEST = 5, 80
RATES = {"sinusoidal": (0.3, 0.3), "rope": (0.3, 0.05), "learned": (0.3, 0.3)}


def make_translated_sweep(root: Path, rates: dict, seeds: tuple[int, ...] = (1, 2, 3)) -> Path:
    """Jobs with .hydra/config.yaml (word tokenizer over root/data), test.hyp and results.json
    whose "length" block is the run's own scoring (length_generalization)."""
    from seq2seq.evaluation.scoring import length_generalization
    from tests.evaluation.synthetic import corrupt, make_references

    rng = np.random.default_rng(7)
    data = root / "data"
    data.mkdir(parents=True)
    srcs = [" ".join(EN[: 2 + i % 8]) for i in range(N_TEST)]
    refs = make_references(rng, N_TEST)
    for split, n in (("train", 20), ("test", N_TEST)):
        (data / f"{split}.en").write_text("".join(x + "\n" for x in srcs[:n]))
        (data / f"{split}.de").write_text("".join(x + "\n" for x in refs[:n]))
    lens = [len(x.split()) for x in srcs]
    sweep = root / "sweep"
    for (pos, (short, long)), seed in itertools.product(rates.items(), seeds):
        path = sweep / f"{pos}_seed{seed}"
        (path / ".hydra").mkdir(parents=True)
        cfg = {
            "pos_encoding": {"kind": pos},
            "trainer": {"seed": seed},
            "data": {"root": str(data), "src_lang": "en", "tgt_lang": "de", "test": ["test"]},
            "tokenizer": {"kind": "word", "cache_dir": str(root / "tok")},
        }
        (path / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)))
        hyps = [
            corrupt(rng, [ref], long if n > CAP else short)[0]
            for ref, n in zip(refs, lens, strict=True)
        ]
        (path / "test.hyp").write_text("".join(h + "\n" for h in hyps))
        length = {"splits": ["test"], **length_generalization(lens, hyps, refs, CAP)}
        res = {"test": {"test": {"n": N_TEST, "bleu": 1.0, "chrf": 1.0}}, "length": length}
        (path / "results.json").write_text(json.dumps(res))
    return sweep


def test_tokens_mode_tests_long_and_within_the_cap(tmp_path: Path) -> None:
    """Rope, truly better on long sentences only, is called better there (BLEU and chrF) and
    not within the cap; learned (the baseline's rates) is called nothing; one report, Holm over
    its 8 comparisons."""
    sweep = make_translated_sweep(tmp_path, RATES)
    out = tmp_path / "out"
    args = ["--length-by", "tokens", "--baseline", "sinusoidal", "--ar-trials", "1000"]
    assert cr.main([str(sweep), "--out", str(out), *args]) == 0
    tested = json.loads((out / "significance.json").read_text())
    calls = {(v["system"], v["metric"]): v for v in tested["verdicts"]}
    long, within = f"long (> {CAP} tokens)", f"short (<= {CAP} tokens)"
    assert set(calls) == {
        (s, f"{m} on {t}")
        for s in ("rope", "learned")
        for m in ("BLEU", "chrF2")
        for t in (long, within)
    }
    for metric in ("BLEU", "chrF2"):
        assert calls["rope", f"{metric} on {long}"]["verdict"] == "better"
        assert calls["rope", f"{metric} on {within}"]["verdict"] == "no difference shown"
        for where in (long, within):
            assert calls["learned", f"{metric} on {where}"]["verdict"] == "no difference shown"
    md = (out / "comparison.md").read_text()
    assert "alpha = 0.05 after Holm over 8 comparisons" in md
    assert md_row(md, "rope", "| System | Metric |")[3].startswith("better (sentence level: ")


def test_tokens_mode_checks_the_rebuilt_tokenizer(tmp_path: Path) -> None:
    """A run whose results.json counts other long sentences than the rebuilt tokenizer finds:
    the report stops and names the run; a run short of a seed is left out and named."""
    sweep = make_translated_sweep(tmp_path, RATES)
    shutil.rmtree(sweep / "learned_seed3")
    out = tmp_path / "out"
    args = ["--length-by", "tokens", "--baseline", "sinusoidal", "--method", "bs"]
    assert cr.main([str(sweep), "--out", str(out), *args]) == 0
    md = (out / "comparison.md").read_text()
    assert "learned is not tested: it has no finished run for seed(s) [3]" in md
    res_file = sweep / "rope_seed2" / "results.json"
    res = json.loads(res_file.read_text())
    res["length"]["long"]["n"] -= 1
    res_file.write_text(json.dumps(res))
    with pytest.raises(SystemExit, match="rope_seed2: the tokenizer rebuilt"):
        cr.main([str(sweep), "--out", str(out), *args])


def test_tokens_mode_buckets_are_scored_again_from_the_translations(tmp_path: Path) -> None:
    """Runs whose results.json holds other buckets (an older version's) share today's bucket
    table: each bucket's BLEU is scored again from the run's translations; a run without its
    translations keeps results.json's buckets, with a note."""
    from seq2seq.evaluation.scoring import bucket_cell

    sweep = make_translated_sweep(tmp_path, {"sinusoidal": (0.3, 0.3), "rope": (0.3, 0.05)}, (1,))
    for job in sweep.iterdir():
        res = json.loads((job / "results.json").read_text())
        res["length"]["buckets"] = {"1-5": {"n": 1, "bleu": 1.0, "chrf": 1.0}}  # not today's
        (job / "results.json").write_text(json.dumps(res))
    out = tmp_path / "out"
    assert cr.main([str(sweep), "--out", str(out), "--length-by", "tokens", "--method", "bs"]) == 0
    md = (out / "comparison.md").read_text()
    srcs = (tmp_path / "data" / "test.en").read_text().splitlines()
    refs = (tmp_path / "data" / "test.de").read_text().splitlines()
    hyps = (sweep / "rope_seed1" / "test.hyp").read_text().splitlines()
    idx = [i for i, src in enumerate(srcs) if len(src.split()) in (7, 8)]
    want = bucket_cell([hyps[i] for i in idx], [refs[i] for i in idx])
    header = next(ln for ln in md[md.index("### test (BLEU)") :].splitlines() if "Encoding" in ln)
    cells = [c.strip() for c in header.strip("|").split("|")]
    assert cells[1:] == ["1-2 (n=10)", "3-4 (n=20)", "5-6 (n=20)", "7-8 (n=20)", "9-10 (n=10)"]
    assert md_row(md, "rope", "### test (BLEU)")[4] == f"{want['bleu']:.2f}"  # one seed
    assert "not re-scored" not in md
    (sweep / "rope_seed1" / "test.hyp").unlink()
    assert cr.main([str(sweep), "--out", str(out), "--length-by", "tokens", "--method", "bs"]) == 0
    md = (out / "comparison.md").read_text()
    assert "`sweep/rope_seed1`: buckets as its results.json has them (not re-scored: " in md


def test_tokens_mode_notes_a_run_without_length_results(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    make_short_job(sweep, "sinusoidal", 1, 10.0, [])
    make_short_job(sweep, "rope", 1, 20.0, [])
    res = json.loads((sweep / "rope_seed1" / "results.json").read_text())
    del res["length"]
    (sweep / "rope_seed1" / "results.json").write_text(json.dumps(res))
    assert cr.main([str(sweep), "--out", str(tmp_path / "o"), "--length-by", "tokens"]) == 0
    md = (tmp_path / "o" / "comparison.md").read_text()
    assert "not trained with data.train_max_src_len" in md
