"""The package as a user installs it: `pip wheel .` builds a wheel with every subpackage, the
config tree and the embedded data; installed without -e into a fresh virtual environment (reusing
this environment's dependencies, not its editable seq2seq), seq2seq-train, seq2seq-translate and
seq2seq-evaluate run from a folder outside the repository."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.tiny_run import REPO, tiny_overrides, write_slice

SCRIPTS = ("seq2seq-train", "seq2seq-prepare", "seq2seq-translate", "seq2seq-evaluate")


def run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, f"{args[0]} failed:\n{done.stdout}\n{done.stderr}"
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of the sources (setuptools writes build/ beside them)."""
    out, src = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "seq2seq", src / "seq2seq", ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    # no build isolation: this environment's setuptools builds it (no download)
    args = [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(src)]
    run(args, out, {**os.environ, "PIP_NO_INDEX": "1"})
    (found,) = out.glob("seq2seq-*.whl")
    return found


def test_the_wheel_holds_every_subpackage_the_configs_and_the_data(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    package = {p.relative_to(REPO).as_posix() for p in (REPO / "seq2seq").rglob("*.py")}
    assert package <= names, f"missing from the wheel: {sorted(package - names)}"
    configs = {p.relative_to(REPO).as_posix() for p in (REPO / "seq2seq/config").rglob("*.yaml")}
    assert configs <= names, f"missing from the wheel: {sorted(configs - names)}"
    assert {"seq2seq/py.typed", "seq2seq/data/numbers/train.en.gz"} <= names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not any(n.startswith(("tests/", "scripts/", "benchmarks/")) for n in names)


def dependency_paths() -> list[str]:
    """Where this environment's dependencies import from: PYTHONPATH's folders that hold no
    seq2seq (a machine may carry its dependencies there; the checkout itself stays out), then
    site-packages."""
    carried = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    folders = [Path(p).resolve() for p in carried if p]
    return [str(f) for f in folders if not (f / "seq2seq").exists()] + [
        sysconfig.get_paths()["purelib"]
    ]


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel installed; this environment's dependency folders as plain paths
    (so its dependencies import, while its .pth files, the editable seq2seq among them, do
    not run)."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "deps.pth").write_text("".join(f"{p}\n" for p in dependency_paths()))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--python", str(python)]
    # --force-reinstall: a checkout on PYTHONPATH (its seq2seq.egg-info) must not pass for the wheel
    run(
        [*pip, "install", "--no-deps", "--no-index", "--force-reinstall", str(wheel)],
        root,
        dict(os.environ),
    )
    return root


def test_the_installed_wheel_trains_translates_and_evaluates(venv: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    where = run(
        [str(venv / "bin" / "python"), "-c", "import seq2seq; print(seq2seq.__file__)"],
        tmp_path,
        env,
    ).stdout
    assert Path(where.strip()).is_relative_to(venv), where  # the wheel's copy, not the checkout
    for script in SCRIPTS:
        assert (venv / "bin" / script).exists()
    data = write_slice(tmp_path / "data", {"train": 60, "valid": 8, "test": 8})
    overrides = tiny_overrides(data, tmp_path / "cache", "trainer.max_steps=8")
    run([str(venv / "bin" / "seq2seq-train"), *overrides, "hydra.run.dir=run"], tmp_path, env)
    ckpt = tmp_path / "run" / "checkpoints" / "best.pt"
    assert ckpt.exists()
    assert (tmp_path / "run" / "results.json").exists()
    done = run(
        [str(venv / "bin" / "seq2seq-translate"), f"ckpt={ckpt}", f"input={data / 'test.en'}"],
        tmp_path,
        env,
    )
    assert len(done.stdout.splitlines()) == 8
    done = run(
        [str(venv / "bin" / "seq2seq-evaluate"), f"ckpt={ckpt}", "split=test"], tmp_path, env
    )
    assert "BLEU" in done.stdout
