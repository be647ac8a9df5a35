"""Tests for seq2seq.train.checkpoint: atomic writes, refusing unsafe or broken files, rotation,
averaging."""

from __future__ import annotations

import errno
import pickle
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import torch

from seq2seq.train.checkpoint import (
    CheckpointError,
    TrainState,
    average_checkpoints,
    average_state_dicts,
    load_checkpoint,
    rotate_checkpoints,
    save_checkpoint,
    step_checkpoints,
)


def sample_state(value: float = 1.0) -> dict[str, Any]:
    return {
        "model": {"w": torch.full((2, 3), value), "b": torch.tensor([value]), "n": torch.tensor(7)},
        "train_state": {"step": 3, "best_bleu": 1.5},
        "config": {"name": "x", "betas": [0.9, 0.98]},
        "tokenizers": {"src": {"kind": "bpe", "model": b"\x00\x01"}},
    }


def test_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "run" / "checkpoints" / "last.pt"  # folders are created
    state = sample_state(2.5)
    save_checkpoint(state, path)
    loaded = load_checkpoint(path)
    assert loaded.keys() == state.keys()
    for name, tensor in state["model"].items():
        assert torch.equal(loaded["model"][name], tensor)
    assert loaded["train_state"] == state["train_state"]
    assert loaded["config"] == state["config"]
    assert loaded["tokenizers"]["src"]["model"] == b"\x00\x01"
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"]  # no temporary file left


def test_overwrite_replaces_contents(tmp_path: Path) -> None:
    path = tmp_path / "last.pt"
    save_checkpoint(sample_state(1.0), path)
    save_checkpoint(sample_state(4.0), path)
    assert load_checkpoint(path)["model"]["w"][0, 0].item() == 4.0


def crash_mid_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.save writes a few bytes, then the process 'dies'."""

    def partial_save(obj: object, f: Any, *args: object, **kwargs: object) -> None:
        f.write(b"PK\x03\x04 half a checkpoint")
        raise KeyboardInterrupt("simulated crash")

    monkeypatch.setattr(torch, "save", partial_save)


def test_crash_while_writing_keeps_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "last.pt"
    save_checkpoint(sample_state(1.0), path)
    before = path.read_bytes()
    crash_mid_write(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(sample_state(9.0), path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert load_checkpoint(path)["model"]["w"][0, 0].item() == 1.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def test_crash_while_writing_a_new_file_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    crash_mid_write(monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(sample_state(), tmp_path / "best.pt")
    assert list(tmp_path.iterdir()) == []


def test_failed_write_names_the_file_and_keeps_the_old_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "last.pt"
    save_checkpoint(sample_state(1.0), path)

    def full_disk(obj: object, f: Any, *args: object, **kwargs: object) -> None:
        f.write(b"PK\x03\x04 part of a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(CheckpointError) as err:
        save_checkpoint(sample_state(9.0), path)
    assert str(err.value).startswith(f"{path}: cannot write the checkpoint (No space left")
    assert "the previous last.pt is intact" in str(err.value)
    assert str(tmp_path) in str(err.value)
    with pytest.raises(CheckpointError, match=r"no best\.pt was written"):
        save_checkpoint(sample_state(9.0), tmp_path / "best.pt")
    monkeypatch.undo()
    assert load_checkpoint(path)["model"]["w"][0, 0].item() == 1.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]  # no temporary files


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.pt"
    with pytest.raises(CheckpointError, match=r"nope\.pt"):
        load_checkpoint(path)


def test_truncated_file(tmp_path: Path) -> None:
    path = tmp_path / "last.pt"
    save_checkpoint(sample_state(), path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"last\.pt.*truncated"):
        load_checkpoint(path)


def test_random_bytes(tmp_path: Path) -> None:
    path = tmp_path / "garbage.pt"
    path.write_bytes(torch.randint(0, 256, (4096,), dtype=torch.uint8).numpy().tobytes())
    with pytest.raises(CheckpointError, match=r"garbage\.pt"):
        load_checkpoint(path)


def test_not_a_checkpoint_dict(tmp_path: Path) -> None:
    path = tmp_path / "weights.pt"
    torch.save({"w": torch.zeros(2)}, path)
    with pytest.raises(CheckpointError, match=r"weights\.pt.*'model'"):
        load_checkpoint(path)
    torch.save([torch.zeros(2)], path)
    with pytest.raises(CheckpointError, match=r"weights\.pt"):
        load_checkpoint(path)


class Payload:
    """Unpickling this creates (opens for writing) the file `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.marker, "w"))


@pytest.mark.parametrize("writer", ["torch.save", "pickle"])
def test_malicious_pickle_is_refused(tmp_path: Path, writer: str) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    state = {"model": {"w": torch.zeros(1)}, "extra": Payload(marker)}
    if writer == "torch.save":
        torch.save(state, path)
    else:
        path.write_bytes(pickle.dumps(state, protocol=2))
    with pytest.raises(CheckpointError, match=r"evil\.pt") as err:
        load_checkpoint(path)
    assert "weights_only=False" not in str(err.value)  # torch's unsafe advice is not passed on
    assert not marker.exists()
    # the payload is live: an unsafe load does run it (so the refusal above is what saved us)
    if writer == "torch.save":
        torch.load(path, weights_only=False)
    else:
        pickle.loads(path.read_bytes())
    assert marker.exists()


# --------------------------------------------------------------------------- rotation


def touch_all(folder: Path, names: list[str]) -> None:
    for name in names:
        (folder / name).write_bytes(b"x")


def test_rotate_keeps_newest_by_step_number(tmp_path: Path) -> None:
    steps = [5, 10, 20, 100, 1000, 200]
    touch_all(tmp_path, [f"step_{s}.pt" for s in steps] + ["best.pt", "last.pt", "step_x.pt"])
    assert [p.name for p in step_checkpoints(tmp_path)] == [f"step_{s}.pt" for s in sorted(steps)]
    rotate_checkpoints(tmp_path, keep_last=3)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(
        ["best.pt", "last.pt", "step_x.pt", "step_100.pt", "step_200.pt", "step_1000.pt"]
    )
    rotate_checkpoints(tmp_path, keep_last=3)  # idempotent
    assert sorted(p.name for p in tmp_path.iterdir()) == names


def test_rotate_zero_and_more_than_present(tmp_path: Path) -> None:
    touch_all(tmp_path, ["step_1.pt", "step_2.pt", "last.pt"])
    rotate_checkpoints(tmp_path, keep_last=5)
    assert len(list(tmp_path.iterdir())) == 3
    rotate_checkpoints(tmp_path, keep_last=0)
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


# --------------------------------------------------------------------------- averaging


def test_average_is_elementwise_mean(tmp_path: Path) -> None:
    paths = []
    gen = torch.Generator().manual_seed(0)
    models = []
    for i in range(3):
        model = {
            "w": torch.randn(4, 5, generator=gen),
            "h": torch.randn(3, generator=gen).half(),
            "count": torch.tensor(i),  # integer buffers are copied from the first checkpoint
        }
        models.append(model)
        paths.append(tmp_path / f"step_{i}.pt")
        save_checkpoint({"model": model}, paths[-1])
    avg = average_state_dicts(paths)
    torch.testing.assert_close(avg["w"], (models[0]["w"] + models[1]["w"] + models[2]["w"]) / 3)
    assert avg["h"].dtype == torch.float16
    want_h = (sum(m["h"].double() for m in models) / 3).half()
    torch.testing.assert_close(avg["h"], want_h)
    assert avg["count"].item() == 0
    assert avg["count"].dtype == torch.int64


def test_average_refuses_mismatched_keys(tmp_path: Path) -> None:
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    save_checkpoint({"model": {"w": torch.zeros(2)}}, a)
    save_checkpoint({"model": {"w": torch.zeros(2), "extra": torch.zeros(1)}}, b)
    with pytest.raises(CheckpointError, match=r"b\.pt.*differ"):
        average_state_dicts([a, b])


def test_average_of_nothing() -> None:
    with pytest.raises(CheckpointError):
        average_state_dicts([])


def test_average_refuses_mismatched_shapes_and_vocabularies(tmp_path: Path) -> None:
    a, b, c = tmp_path / "a.pt", tmp_path / "b.pt", tmp_path / "c.pt"
    save_checkpoint({"model": {"w": torch.zeros(2)}, "tokenizers": {"src": 1}}, a)
    save_checkpoint({"model": {"w": torch.zeros(3)}, "tokenizers": {"src": 1}}, b)
    save_checkpoint({"model": {"w": torch.zeros(2)}, "tokenizers": {"src": 2}}, c)
    with pytest.raises(CheckpointError, match=r"b\.pt: w has shape \(3,\), but \(2,\)"):
        average_state_dicts([a, b])
    with pytest.raises(CheckpointError, match=r"c\.pt: its vocabulary differs"):
        average_checkpoints([a, c])


def test_average_checkpoints_is_a_checkpoint_for_inference(tmp_path: Path) -> None:
    paths = []
    for i, value in enumerate([1.0, 2.0, 6.0]):
        state = {**sample_state(value), "optimizer": {"state": {}}, "rng": {}}
        state["train_state"] = {"step": i}
        paths.append(tmp_path / f"step_{i}.pt")
        save_checkpoint(state, paths[-1])
    avg = average_checkpoints(paths)
    assert avg["model"]["w"][0, 0].item() == 3.0
    assert avg["model"]["n"].item() == 7
    assert avg["train_state"] == {"step": 2}  # the last one's
    assert avg["config"] == sample_state()["config"]
    assert "tokenizers" in avg
    assert "optimizer" not in avg
    assert "rng" not in avg
    assert avg["averaged_from"] == [str(p) for p in paths]


def test_train_state_of_an_older_checkpoint_keeps_its_best_bleu() -> None:
    old = {"step": 8, "best_bleu": 12.5, "best_step": 4, "stale_validations": 1, "gone": 0}
    state = TrainState.from_dict(old)
    assert (state.step, state.best_step, state.stale_validations) == (8, 4, 1)
    assert (state.best_metric, state.best_score, state.best_valid) == ("bleu", 12.5, {"bleu": 12.5})
    fresh = TrainState.from_dict({"step": 0, "best_bleu": -1.0})  # no validation yet
    assert fresh.best_score is None
    assert fresh.best_valid == {}
    assert TrainState.from_dict(asdict(state)) == state
