"""The seq2seq-translate entry point: a file (or stdin) in, detokenized translations out, in order.

    seq2seq-translate ckpt=outputs/numbers/.../checkpoints/best.pt input=src.txt output=hyp.txt
    echo "forty-two" | seq2seq-translate ckpt=... decode=greedy

A checkpoint decodes as its run was tested (the checkpoint's decode settings); decode=<group> or
decode.<key>=... on the command line replace them, and the log says which were used. With
decode.nbest > 1 each input line gives nbest output lines, best first.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from seq2seq.cli import command_line_overrides, entry_point
from seq2seq.config import (
    DecodeConfig,
    TranslateConfig,
    check_decode,
    merge_decode,
    register_configs,
)
from seq2seq.data import decode_text, read_lines, split_lines
from seq2seq.translator import Translator

log = logging.getLogger(__name__)


def read_input(path: str) -> list[str]:
    """Lines of `path`, or of stdin for "-" (UTF-8; bad bytes raise a DataError naming the line).
    An empty input is no error: it gives no lines."""
    if path != "-":
        return read_lines(Path(path), allow_empty=True)
    return split_lines(decode_text("<stdin>", sys.stdin.buffer.read()))


def load_model(cfg: TranslateConfig) -> Translator:
    """Check the decoding settings, then load the checkpoint (model, tokenizers, its config)."""
    check_decode(cfg.decode)
    return Translator.from_checkpoint(cfg.ckpt, cfg.device)


def translate_lines(
    cfg: TranslateConfig, lines: list[str], translator: Translator | None = None
) -> list[str]:
    """Translations of `lines` with cfg.decode (nbest per line, best first); blank lines stay
    blank (Translator.hypotheses). Loads cfg.ckpt unless `translator` is given."""
    translator = translator if translator is not None else load_model(cfg)
    out: list[str] = []
    for nbest in translator.hypotheses(lines, cfg.decode):
        out.extend(t.text for t in nbest[: cfg.decode.nbest])
    return out


def decode_settings(chosen: DecodeConfig, trained: DecodeConfig) -> DecodeConfig:
    """The checkpoint's decoding settings (as its run was tested) with the command line's
    changes (config.merge_decode), logged."""
    decode, changed = merge_decode(chosen, trained, command_line_overrides())
    check_decode(decode)
    source = f"the command line's {', '.join(changed)} over " if changed else ""
    log.info("decoding with %sthe checkpoint's settings: %s", source, describe_decode(decode))
    return decode


def describe_decode(d: DecodeConfig) -> str:
    return (
        f"{d.method.value}, beam {d.beam_size}, length penalty {d.length_penalty.value} "
        f"(alpha {d.alpha}), max length {d.max_len_a} * source + {d.max_len_b}"
    )


def run(cfg: TranslateConfig) -> None:
    """Translate cfg.input into cfg.output, one line (nbest lines) per input line."""
    # The checkpoint first: a bad one is reported at once, not after stdin reaches its end (the
    # user may be typing) nor only when the input is non-empty.
    translator = load_model(cfg)
    cfg.decode = decode_settings(cfg.decode, translator.decode)
    lines = read_input(cfg.input)
    if not lines:
        log.info("the input %s is empty: the output is empty too", cfg.input)
    out = translate_lines(cfg, lines, translator)
    text = "".join(t + "\n" for t in out)
    if cfg.output == "-":
        sys.stdout.write(text)
    else:
        Path(cfg.output).write_text(text, encoding="utf-8")
        log.info("wrote %d lines to %s", len(out), cfg.output)


register_configs()
main = entry_point("translate", run)  # seq2seq-translate; user errors exit 1 with one line


if __name__ == "__main__":
    main()
