"""What the entry points share: Hydra composition and one-line user errors.

A user error (seq2seq.errors.UserError: a bad override, a missing or corrupt file, a bad value)
ends the process with one line,
`error: <Type>: <message>`, on stderr and exit status 1, as seq2seq-train does; anything else is
a bug and keeps its full traceback.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import hydra
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    MissingMandatoryValue,
    OmegaConfBaseException,
)

from seq2seq.config.checks import merge_decode
from seq2seq.config.schema import CONFIG_DIR, DecodeConfig, SearchKind
from seq2seq.errors import ConfigError, UserError

log = logging.getLogger(__name__)


def config_error(err: Exception) -> ConfigError:
    """A Hydra composition or OmegaConf error as one line naming the key; Hydra's own hint for
    an unknown key (`use +key=...`) is wrong here: the schemas have no free-form keys."""
    cause = err.__cause__ if isinstance(err.__cause__, OmegaConfBaseException) else err
    key = getattr(cause, "full_key", None)
    if not isinstance(cause, OmegaConfBaseException) or not key:
        # e.g. "Could not find 'decode/nope'", then the options, then the search path: drop it
        return ConfigError("config: " + one_line(str(err).split("Config search path:")[0]))
    if isinstance(cause, MissingMandatoryValue):
        return ConfigError(f"config: {key} is required; pass {key}=... on the command line")
    if isinstance(cause, ConfigAttributeError | ConfigKeyError):
        kind, parent = getattr(cause, "object_type", None), key.rpartition(".")[0]
        names = [f.name for f in dataclasses.fields(kind)] if dataclasses.is_dataclass(kind) else []
        valid = f"; the keys of {parent or 'the config'} are: {', '.join(names)}" if names else ""
        return ConfigError(f"config: unknown key {key}{valid}")
    # the first line of msg, e.g. "Invalid value 'nope', expected one of [greedy, beam]"; the
    # next ones repeat the key and name the schema classes
    return ConfigError(f"config: {key}: {(cause.msg or str(cause)).splitlines()[0]}")


def to_dataclass(cfg: DictConfig) -> Any:
    """The composed config as its schema's dataclass; a value left unset is a ConfigError."""
    try:
        return OmegaConf.to_object(cfg)
    except OmegaConfBaseException as err:  # e.g. ckpt (required) not given
        raise config_error(err) from err


def command_line_overrides() -> list[str] | None:
    """The overrides of the running Hydra app's command line, or None outside one (a call from
    Python)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    return list(HydraConfig.get().overrides.task)


def one_line(text: str) -> str:
    """`text`'s non-blank lines, stripped and joined by single spaces."""
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def fail(err: Exception) -> NoReturn:
    """Print `err` as one `error: Type: message` line on stderr and exit with status 1."""
    print(f"error: {type(err).__name__}: {one_line(str(err))}", file=sys.stderr)
    sys.exit(1)


def entry_point(config_name: str, run: Callable[[Any], object]) -> Callable[[], None]:
    """A console-script main: compose seq2seq/config/<config_name>.yaml with the command line's
    overrides, convert it to its dataclass and call `run` with it."""

    def task(cfg: DictConfig) -> None:
        logging.basicConfig(level=logging.INFO, format="[%(levelname)s] %(message)s")
        try:
            run(to_dataclass(cfg))
        except Exception as err:  # caught here, or Hydra prints "Error executing job ..." first
            # OSError: an output path that cannot be written (the message names it)
            if isinstance(err, UserError | OSError):
                fail(err)
            raise

    # Hydra names the job (`--help`: "<name> is powered by Hydra") after the task's module
    task.__module__ = f"seq2seq.{config_name}"
    hydra_main = hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name=config_name)
    composed = hydra_main(task)

    def main() -> None:
        run_hydra(composed)

    return main


def run_hydra(composed: Callable[[], object]) -> None:
    """Call a hydra.main-decorated function; a composition error (unknown key, bad value, bad
    override syntax) becomes one `error: ConfigError: ...` line and exit status 1."""
    # With this set, Hydra re-raises a composition error as it is instead of printing its own
    # trimmed traceback and banner (and bugs keep their full traceback).
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        composed()
    except HydraException as err:
        fail(config_error(err))


def decode_settings(chosen: DecodeConfig, trained: DecodeConfig) -> DecodeConfig:
    """The checkpoint's decoding settings (as its run was tested) with the command line's
    changes (config.merge_decode), logged."""
    decode, changed = merge_decode(chosen, trained, command_line_overrides())
    source = f"the command line's {', '.join(changed)} over " if changed else ""
    log.info("decoding with %sthe checkpoint's settings: %s", source, describe_decode(decode))
    return decode


def describe_decode(d: DecodeConfig) -> str:
    """The decoding settings `d` in words, for the log."""
    if d.method == SearchKind.sample:
        return (
            f"sample, {d.nbest} a sentence, temperature {d.temperature}, top_k {d.top_k}, "
            f"top_p {d.top_p}, seed {d.seed}, max length {d.max_len_a} * source + {d.max_len_b}"
        )
    return (
        f"{d.method.value}, beam {d.beam_size}, length penalty {d.length_penalty.value} "
        f"(alpha {d.alpha}), max length {d.max_len_a} * source + {d.max_len_b}"
    )
