"""The seq2seq-translate entry point: a file (or stdin) in, detokenized translations out, in order.

    seq2seq-translate ckpt=outputs/numbers/.../checkpoints/best.pt input=src.txt output=hyp.txt
    echo "forty-two" | seq2seq-translate ckpt=... decode=greedy
    seq2seq-translate ckpt=[a.pt,b.pt] decode=sample decode.nbest=3 align=true attention_dir=att
    seq2seq-translate ckpt=... input=big.txt output=hyp.txt workers=2

A checkpoint decodes as its run was tested (the checkpoint's decode settings); decode=<group> or
decode.<key>=... on the command line replace them, and the log says which were used. With
decode.nbest > 1 each input line gives nbest output lines, best first (samples: as drawn).
Several checkpoints decode as an ensemble; align=true appends " ||| " and alignment pairs to each
line, attention_dir=DIR writes a heatmap of each sentence's best translation; workers=N (CPU)
translates in N processes at once, each on 1/N of the cores and of the lines.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from pathlib import Path

from seq2seq.cli.app import decode_settings, entry_point
from seq2seq.config.checks import check_decode, check_workers
from seq2seq.config.commands import TranslateConfig, register_configs
from seq2seq.data.text import decode_text, read_lines, split_lines
from seq2seq.decode.alignment import check_layer, format_alignment
from seq2seq.decode.attention_plot import require_matplotlib, save_heatmap
from seq2seq.decode.translator import Translation, Translator
from seq2seq.decode.workers import WorkerPool
from seq2seq.errors import ConfigError
from seq2seq.kernels import resolve_device

log = logging.getLogger(__name__)


def read_input(path: str) -> list[str]:
    """Lines of `path`, or of stdin for "-" (UTF-8; bad bytes raise a DataError naming the line).
    An empty input is no error: it gives no lines."""
    if path != "-":
        return read_lines(Path(path), allow_empty=True)
    return split_lines(decode_text("<stdin>", sys.stdin.buffer.read()))


def checkpoints(ckpt: object) -> str | list[str]:
    """cfg.ckpt as one path, or a list of them (an ensemble); anything else is a ConfigError."""
    if isinstance(ckpt, str):
        return ckpt
    if isinstance(ckpt, (list, tuple)) and ckpt and all(isinstance(p, str) for p in ckpt):
        return list(ckpt)
    raise ConfigError(
        f"config: ckpt={ckpt!r} is invalid; it must be a checkpoint's path or a list of them "
        "(ckpt=[a.pt,b.pt])"
    )


def load_model(cfg: TranslateConfig) -> Translator:
    """Check the settings, then load the checkpoint(s) (model, tokenizers, config)."""
    check_decode(cfg.decode)
    paths = checkpoints(cfg.ckpt)
    if cfg.attention_dir is not None:
        require_matplotlib()  # before the work, not after it
    check_workers(cfg.workers)
    if cfg.workers > 1 and resolve_device(cfg.device).type != "cpu":
        raise ConfigError(
            f"config: workers={cfg.workers} runs several CPU processes, but device={cfg.device} "
            "is a GPU here: give workers=1, or device=cpu"
        )
    translator = Translator.from_checkpoint(paths, cfg.device, cfg.quantize)
    if cfg.align:
        check_layer(cfg.align_layer, translator.decoder_layers())
    return translator


def translate_lines(
    cfg: TranslateConfig, lines: list[str], translator: Translator | None = None
) -> list[str]:
    """Translations of `lines` with cfg.decode (nbest per line, best first), with alignments
    (cfg.align) and heatmaps (cfg.attention_dir) when asked; blank lines stay blank
    (Translator.hypotheses). Loads cfg.ckpt unless `translator` is given."""
    translator = translator if translator is not None else load_model(cfg)
    attention = cfg.align or cfg.attention_dir is not None
    decode = dataclasses.replace(cfg.decode, scores=False)  # text out: greedy skips its scores
    if cfg.workers > 1 and lines:
        with WorkerPool(translator, checkpoints(cfg.ckpt), cfg.workers) as pool:
            log.info(
                "translating in %d processes of %d threads (%s)",
                pool.workers,
                pool.threads,
                pool.start_method,
            )
            found = pool.hypotheses(lines, decode, attention)
    else:
        found = translator.hypotheses(lines, decode, attention)
    out: list[str] = []
    for nbest in found:
        for t in nbest[: cfg.decode.nbest]:
            out.append(
                f"{t.text} ||| {format_alignment(t.alignment(cfg.align_layer))}"
                if cfg.align
                else t.text
            )
    if cfg.attention_dir is not None:
        write_heatmaps(cfg, translator, lines, found)
    return out


def write_heatmaps(
    cfg: TranslateConfig, translator: Translator, lines: list[str], found: list[list[Translation]]
) -> None:
    """One PNG per non-blank line, line-<number>.png (1-based), of its best translation."""
    folder = Path(str(cfg.attention_dir))
    folder.mkdir(parents=True, exist_ok=True)
    src_tok, tgt_tok, max_len = translator.src_tok, translator.tgt_tok, translator.cfg.data.max_len
    for number, (line, nbest) in enumerate(zip(lines, found, strict=True), 1):
        if not line.strip() or nbest[0].attention is None:
            continue
        src = [src_tok.id_to_token(i) for i in src_tok.encode(line)[:max_len]] + ["</s>"]
        tgt = [tgt_tok.id_to_token(i) for i in nbest[0].tokens] + ["</s>"]
        title = f"line {number}: {nbest[0].text}"
        save_heatmap(
            nbest[0].attention, src, tgt, folder / f"line-{number}.png", cfg.attention_layers, title
        )
    log.info("wrote the cross-attention heatmaps to %s", folder)


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
