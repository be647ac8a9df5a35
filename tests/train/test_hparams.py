"""Every run writes its settings and final scores to TensorBoard's HParams plugin in its tb/
folder (seq2seq/train/hparams.py): read back from the event files with TensorBoard's own
EventAccumulator and the plugin's protobufs, they are the run's config and results.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import metadata
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

from seq2seq.train.hparams import encoding_label, run_metrics
from seq2seq.train.run import train
from tests.tiny_run import compose_train, tiny_overrides, write_slice

CAP = 6  # data.train_max_src_len: the run is trained short and has a "long" split


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hparams")
    write_slice(root / "data", {"train": 200, "valid": 20, "test": 20})
    extra = [
        f"data.train_max_src_len={CAP}",
        "data.test=[test,valid]",
        "pos_encoding=sin_enc_nope_dec",
        "trainer.seed=7",
        "trainer.max_steps=4",
        "trainer.valid_every=2",
    ]
    cfg = compose_train(tiny_overrides(root / "data", root / "cache", *extra))
    train(cfg, root / "run")
    return root / "run"


def read_board(tb: Path) -> EventAccumulator:
    board = EventAccumulator(str(tb), size_guidance={"tensors": 0, "scalars": 0})
    board.Reload()
    return board


def plugin_data(board: EventAccumulator) -> dict[str, HParamsPluginData]:
    """The hparams plugin's summaries by tag (experiment, session start, session end)."""
    content = board.PluginTagToContent(metadata.PLUGIN_NAME)
    return {tag: HParamsPluginData.FromString(raw) for tag, raw in content.items()}


def test_the_settings_are_the_runs(run: Path) -> None:
    data = plugin_data(read_board(run / "tb"))
    assert set(data) == {
        metadata.EXPERIMENT_TAG,
        metadata.SESSION_START_INFO_TAG,
        metadata.SESSION_END_INFO_TAG,
    }
    start = data[metadata.SESSION_START_INFO_TAG].session_start_info.hparams
    results = json.loads((run / "results.json").read_text())
    assert start["encoding"].string_value == "enc=sinusoidal/dec=none"
    assert start["seed"].number_value == 7
    assert start["train_max_src_len"].number_value == CAP
    assert start["precision"].string_value == results["precision"] == "fp32"
    assert start["params"].number_value == results["params"] > 0
    assert start["d_model"].number_value == 32
    assert start["layers"].string_value == "1+1"


def test_the_metrics_are_the_final_scores(run: Path) -> None:
    board = read_board(run / "tb")
    data = plugin_data(board)
    declared = {m.name.tag for m in data[metadata.EXPERIMENT_TAG].experiment.metric_infos}
    results = json.loads((run / "results.json").read_text())
    want = {
        "hparams/test/test/bleu": results["test"]["test"]["bleu"],
        "hparams/test/test/chrf": results["test"]["test"]["chrf"],
        "hparams/test/valid/bleu": results["test"]["valid"]["bleu"],
        "hparams/test/valid/chrf": results["test"]["valid"]["chrf"],
        "hparams/best_valid/bleu": results["best_valid"]["bleu"],
        "hparams/best_valid/chrf": results["best_valid"]["chrf"],
        "hparams/best_valid/loss": results["best_valid"]["loss"],
        "hparams/long/bleu": results["length"]["long"]["bleu"],
        "hparams/long/chrf": results["length"]["long"]["chrf"],
        "hparams/steps": 4,
    }
    assert set(want) <= declared
    for tag, value in want.items():
        (event,) = board.Scalars(tag)  # the dashboard finds each metric as a scalar
        assert event.value == pytest.approx(value), tag
        assert event.step == 4
    assert results["test"]["test"]["chrf"] > 0  # scores, not zeros everywhere


def test_the_averaged_checkpoints_validation_is_a_metric_beside_best_pts() -> None:
    summary = {
        "test": {},
        "best_valid": {"metric": "bleu", "step": 1348, "bleu": 32.96, "loss": 2.08},
        "valid_average": {"bleu": 22.34, "loss": 2.82, "ppl": 16.7},
        "steps": 1348,
    }
    metrics = run_metrics(summary)
    assert metrics["hparams/valid_average/bleu"] == 22.34
    assert metrics["hparams/valid_average/loss"] == 2.82
    assert metrics["hparams/valid_average/ppl"] == 16.7
    assert metrics["hparams/best_valid/bleu"] == 32.96
    assert "hparams/best_valid/step" not in metrics


def test_encoding_labels() -> None:
    label = lambda *o: encoding_label(compose_train(list(o)))  # noqa: E731
    assert label("pos_encoding=rope") == "rope"
    assert label("pos_encoding=alibi_directional") == "alibi[alibi_directional]"
    assert label("pos_encoding=rope", "+pos_encoding@decoder_pos=alibi") == "enc=rope/dec=alibi"
