"""seq2seq-translate, seq2seq-evaluate, seq2seq-train and `make resume` fail alike: a user error
prints one line, `error: <Type>: <message>`, on stderr and exits 1, with no traceback and no Hydra
banner. Run through the installed console scripts (and `python -m`), as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from seq2seq.train.run import train
from tests.tiny_run import compose_train, tiny_overrides, write_slice

BIN = Path(sys.executable).parent  # the console scripts of this virtualenv
CKPT = "run/checkpoints/best.pt"  # relative to the `root` fixture, the commands' cwd
LATIN1 = b"sieben\nzw\xf6lf\n"  # invalid UTF-8 on line 2


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with a checkpoint trained for one step (char tokenizer: ~3 s), a corrupt one,
    and input, hypothesis and reference files, good and bad."""
    root = tmp_path_factory.mktemp("cli")
    write_slice(root / "data", {"train": 40, "valid": 4, "test": 4})
    extra = ["tokenizer=char", "trainer.max_steps=1", "trainer.valid_every=1"]
    train(compose_train(tiny_overrides(root / "data", root / "tokenizers", *extra)), root / "run")
    (root / "bad.pt").write_bytes(b"\x80\x02garbage, not a checkpoint" * 10)
    (root / "latin1.txt").write_bytes(LATIN1)
    for name in ("in.txt", "hyp.txt", "ref.txt"):
        (root / name).write_text("sieben\nzwölf\n", encoding="utf-8")
    return root


def env() -> dict[str, str]:
    # without HYDRA_FULL_ERROR: the scripts must not rely on the user setting it
    return {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"} | {
        "OMP_NUM_THREADS": "1"
    }


def cli(
    name: str, args: list[str], cwd: Path, stdin: bytes | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a console script; stdin is empty unless given (it never waits on a terminal)."""
    done = subprocess.run(
        [str(BIN / name), *args],
        cwd=cwd,
        env=env(),
        input=stdin if stdin is not None else b"",
        capture_output=True,
        timeout=120,
        check=False,
    )
    return subprocess.CompletedProcess(
        done.args,
        done.returncode,
        done.stdout.decode(errors="replace"),
        done.stderr.decode(errors="replace"),
    )


def python(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """This interpreter with `args` (no standard input), as a user's shell would run it."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def assert_user_error(done: subprocess.CompletedProcess[str], kind: str, *words: str) -> None:
    """Exit 1; the last stderr line is `error: <kind>: ...` naming `words`; nothing else of
    an error: no traceback, no Hydra banner or "Error executing job" line."""
    err = done.stderr
    assert done.returncode == 1, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines, err
    assert lines[-1].startswith(f"error: {kind}: "), err
    assert sum(line.startswith("error:") for line in lines) == 1, err
    for word in words:
        assert word in lines[-1], err
    for banner in ("Traceback", "HYDRA_FULL_ERROR", "Error executing job"):
        assert banner not in err + done.stdout, err


TRANSLATE_ERRORS = [
    pytest.param(
        ["ckpt=bad.pt", "input=in.txt"],
        None,
        "CheckpointError",
        ["bad.pt"],
        id="corrupt-checkpoint",
    ),
    pytest.param(
        [f"ckpt={CKPT}", "input=nope.txt"], None, "DataError", ["nope.txt"], id="missing-input"
    ),
    pytest.param(
        [f"ckpt={CKPT}", "input=latin1.txt"],
        None,
        "DataError",
        ["latin1.txt:2", "UTF-8"],
        id="invalid-utf8-file",
    ),
    pytest.param(
        [f"ckpt={CKPT}"], LATIN1, "DataError", ["<stdin>:2", "UTF-8"], id="invalid-utf8-stdin"
    ),
    pytest.param(
        [f"ckpt={CKPT}", "decode.beam_size=0"],
        None,
        "ConfigError",
        ["decode.beam_size=0", "at least 1"],
        id="bad-value",
    ),
    pytest.param(
        [f"ckpt={CKPT}", "decode.foo=1"],
        None,
        "ConfigError",
        ["decode.foo", "beam_size"],
        id="unknown-key",
    ),
    pytest.param(
        [f"ckpt={CKPT}", "decode.method=nope"],
        None,
        "ConfigError",
        ["decode.method", "greedy, beam"],
        id="bad-enum",
    ),
    pytest.param(["input=in.txt"], None, "ConfigError", ["ckpt is required"], id="no-ckpt"),
]


@pytest.mark.parametrize(("args", "stdin", "kind", "words"), TRANSLATE_ERRORS)
def test_translate_user_errors(
    root: Path, args: list[str], stdin: bytes | None, kind: str, words: list[str]
) -> None:
    done = cli("seq2seq-translate", [*args, "device=cpu"], root, stdin)
    assert_user_error(done, kind, *words)
    assert done.stdout == ""


def test_translate_missing_checkpoint_does_not_wait_on_stdin(root: Path) -> None:
    """input=- (the default) and a stdin that stays open: the checkpoint is checked first."""
    with (root / "err.txt").open("wb") as err:
        proc = subprocess.Popen(
            [str(BIN / "seq2seq-translate"), "ckpt=missing.pt"],
            cwd=root,
            env=env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
        try:
            code = proc.wait(timeout=60)  # stdin is never written to nor closed
        finally:
            proc.kill()
            proc.stdin.close()  # type: ignore[union-attr]
    stderr = (root / "err.txt").read_text(encoding="utf-8")
    assert_user_error(
        subprocess.CompletedProcess([], code, "", stderr),
        "CheckpointError",
        "missing.pt: no such checkpoint",
    )


def test_translate_succeeds(root: Path) -> None:
    """The happy path, so that the error tests cannot pass on a CLI that always fails."""
    done = cli("seq2seq-translate", [f"ckpt={CKPT}", "device=cpu"], root, b"sieben\n\nzwei\n")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 3
    assert done.stdout.splitlines()[1] == ""
    assert "error:" not in done.stderr


EVALUATE_ERRORS = [
    pytest.param(["ckpt=missing.pt"], "CheckpointError", ["missing.pt"], id="missing-checkpoint"),
    pytest.param(["ckpt=bad.pt"], "CheckpointError", ["bad.pt"], id="corrupt-checkpoint"),
    pytest.param(["hyp=nope.txt", "ref=ref.txt"], "DataError", ["nope.txt"], id="missing-hyp"),
    pytest.param(["hyp=hyp.txt", "ref=nope.txt"], "DataError", ["nope.txt"], id="missing-ref"),
    pytest.param(
        ["hyp=latin1.txt", "ref=ref.txt"],
        "DataError",
        ["latin1.txt:2", "UTF-8"],
        id="invalid-utf8-hyp",
    ),
    pytest.param(["hyp=hyp.txt"], "ConfigError", ["hyp= needs ref="], id="hyp-without-ref"),
    pytest.param([], "ConfigError", ["ckpt=", "hyp="], id="neither-ckpt-nor-hyp"),
    pytest.param(
        [f"ckpt={CKPT}", "decode.beam_size=0"],
        "ConfigError",
        ["decode.beam_size=0"],
        id="bad-value",
    ),
    pytest.param(
        ["hyp=hyp.txt", "ref=ref.txt", "decode.foo=1"],
        "ConfigError",
        ["unknown key decode.foo"],
        id="unknown-key",
    ),
    pytest.param(
        ["hyp=hyp.txt", "ref=ref.txt", "decode.method=nope"],
        "ConfigError",
        ["decode.method", "greedy, beam"],
        id="bad-enum",
    ),
    pytest.param(["decode=nope"], "ConfigError", ["decode/nope", "greedy"], id="unknown-group"),
    pytest.param(["decode.beam_size=["], "ConfigError", ["'['"], id="override-syntax"),
]


@pytest.mark.parametrize(("args", "kind", "words"), EVALUATE_ERRORS)
def test_evaluate_user_errors(root: Path, args: list[str], kind: str, words: list[str]) -> None:
    done = cli("seq2seq-evaluate", [*args, "device=cpu"], root)
    assert_user_error(done, kind, *words)
    assert done.stdout == ""


def test_evaluate_succeeds(root: Path) -> None:
    done = cli("seq2seq-evaluate", ["hyp=hyp.txt", "ref=ref.txt", "json=-"], root)
    assert done.returncode == 0, done.stderr
    scores = json.loads(done.stdout)
    assert scores["n"] == 2
    assert scores["chrf"] == 100.0  # one-word lines: BLEU has no 4-grams


BUG = """
import sys
import seq2seq.cli.translate as t
def load_model(cfg):
    raise RuntimeError("a bug, not a user error")
t.load_model = load_model
sys.argv = ["seq2seq-translate", "ckpt=any.pt"]
t.main()
"""


def test_a_bug_keeps_its_traceback(tmp_path: Path) -> None:
    done = python(["-c", BUG], tmp_path)
    assert done.returncode == 1
    assert "Traceback" in done.stderr
    assert "RuntimeError: a bug, not a user error" in done.stderr
    assert not any(line.startswith("error:") for line in done.stderr.splitlines())


def test_translate_bad_device_and_unwritable_output(root: Path) -> None:
    done = cli("seq2seq-translate", [f"ckpt={CKPT}", "input=in.txt", "device=nope"], root)
    assert_user_error(done, "ConfigError", "device='nope'", "auto, cpu")
    args = [f"ckpt={CKPT}", "input=in.txt", "device=cpu", "output=no/such/dir/out.txt"]
    assert_user_error(cli("seq2seq-translate", args, root), "FileNotFoundError", "no/such/dir")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["decode.foo=1"], ["decode.foo", "beam_size"]),
        (["trainer.precision=fp8"], ["trainer.precision", "auto"]),
        (["trainer.device=nope"], ["device='nope'"]),
    ],
    ids=["unknown-key", "bad-enum", "bad-device"],
)
def test_train_config_errors(root: Path, tmp_path: Path, args: list[str], words: list[str]) -> None:
    """seq2seq-train itself: a composition error is one line too, not Hydra's banner."""
    done = cli("seq2seq-train", [*args, f"hydra.run.dir={tmp_path / 'run'}"], root)
    assert_user_error(done, "ConfigError", *words)


def test_make_resume_of_a_folder_that_holds_no_run(tmp_path: Path) -> None:
    """`make resume RUN=<dir>` (seq2seq/cli/resume.py) fails like seq2seq-train when <dir> is no
    run's folder: one ResumeError line naming it, exit 1, no traceback."""
    folder = tmp_path / "nope"
    done = python(["-m", "seq2seq.cli.resume", str(folder)], tmp_path)
    assert_user_error(done, "ResumeError", str(folder), "not the folder of a seq2seq-train run")
