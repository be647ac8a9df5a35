"""scripts/run_curves.py: runs' validation curves side by side, a run continued in a second folder
read as one curve (the later folder's record of a step wins), unvalidated steps as dashes, each
run's end from its last folder's results.json, and a bad argument refused with its fix."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("run_curves", REPO / "scripts" / "run_curves.py")
rc = importlib.util.module_from_spec(_spec)
sys.modules["run_curves"] = rc
_spec.loader.exec_module(rc)


def write_run(folder: Path, valid: dict[int, tuple[float, float]], results: dict | None) -> Path:
    folder.mkdir(parents=True)
    records = [{"type": "train", "step": 1, "loss": 9.0}]
    records += [{"type": "valid", "step": s, "bleu": b, "loss": x} for s, (b, x) in valid.items()]
    text = "".join(json.dumps(r) + "\n" for r in records) + '{"type": "valid", "st'  # a cut line
    (folder / "train_log.jsonl").write_text(text)
    if results is not None:
        (folder / "results.json").write_text(json.dumps(results))
    return folder


def test_curves_of_continued_and_short_runs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    first = write_run(tmp_path / "a", {200: (10.0, 3.0), 400: (20.0, 2.5)}, {"steps": 400})
    again = write_run(
        tmp_path / "a2",
        {400: (21.0, 2.4), 600: (25.5, 2.2)},
        {"steps": 600, "train_minutes": 12.34, "precision": "bf16"},
    )
    short = write_run(tmp_path / "b", {200: (5.0, 4.0)}, None)
    rc.main([f"long={first},{again}", f"short={short}", "--every", "200", "--loss"])
    out = capsys.readouterr().out
    assert "| long | 10.00 (3.000) | 21.00 (2.400) | 25.50 (2.200) |" in out
    assert "| short | 5.00 (4.000) | – | – |" in out
    assert "| long | 600 | 600 | 12.3 | bf16 | 25.50 (step 600) |" in out
    assert "| short | 200 | – | – | – | 5.00 (step 200) |" in out


def test_chosen_steps_without_loss(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = write_run(tmp_path / "a", {200: (10.0, 3.0), 400: (20.0, 2.5)}, None)
    rc.main([f"a={run}", "--steps", "400"])
    assert "| a | 20.00 |" in capsys.readouterr().out


@pytest.mark.parametrize("spec", ["nolabel", "a=", "=dir"])
def test_a_malformed_argument_is_refused(spec: str) -> None:
    with pytest.raises(SystemExit, match="LABEL=RUN_DIR"):
        rc.main([spec])


def test_a_folder_without_a_log_is_named(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"no train_log\.jsonl in .*missing"):
        rc.main([f"a={tmp_path / 'missing'}"])
