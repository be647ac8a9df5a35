"""The resolved value of every config option, as composed today: tests/config/test_schema.py checks
that each still composes to the same values (seq2seq/config/*.yaml hold only what differs from the
schemas' defaults, so a default changed in seq2seq/config/schema.py shows here).

    python -m tests.config_snapshot   # rewrite tests/fixtures/resolved_configs.json after a change

"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from seq2seq.config.commands import register_configs

CONFIGS = Path(__file__).resolve().parents[1] / "seq2seq" / "config"
SNAPSHOT = Path(__file__).resolve().parent / "fixtures" / "resolved_configs.json"
GROUPS = ["data", "tokenizer", "model", "pos_encoding", "optim", "trainer", "decode", "experiment"]
# the app configs besides train (mandatory values given)
APPS = {"translate": ["ckpt=run/best.pt"], "evaluate": []}


def cases() -> dict[str, tuple[str, list[str]]]:
    """name -> (config name, overrides): every option of every group, and each app per decode."""
    out: dict[str, tuple[str, list[str]]] = {"train": ("train", [])}
    for group in GROUPS:
        for path in sorted((CONFIGS / group).glob("*.yaml")):
            out[f"train {group}={path.stem}"] = ("train", [f"{group}={path.stem}"])
    for app, required in APPS.items():
        for path in sorted((CONFIGS / "decode").glob("*.yaml")):
            out[f"{app} decode={path.stem}"] = (app, [*required, f"decode={path.stem}"])
    out["export"] = ("export", ["ckpt=run/best.pt", "out=deploy"])  # no decode group
    out["prepare"] = ("prepare", [])
    out["average"] = ("average", ["out=avg.pt", "run=run"])
    return out


def resolve(name: str, overrides: list[str]) -> dict[str, Any]:
    """The composed config as plain values (MULTI30K_ROOT unset, so its default shows)."""
    register_configs()
    saved = os.environ.pop("MULTI30K_ROOT", None)
    try:
        with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
            cfg = compose(name, overrides=overrides)
        return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)  # type: ignore[return-value]
    finally:
        if saved is not None:
            os.environ["MULTI30K_ROOT"] = saved


def resolve_all() -> dict[str, dict[str, Any]]:
    return {key: resolve(name, overrides) for key, (name, overrides) in cases().items()}


if __name__ == "__main__":
    SNAPSHOT.parent.mkdir(exist_ok=True)
    SNAPSHOT.write_text(json.dumps(resolve_all(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT}")
