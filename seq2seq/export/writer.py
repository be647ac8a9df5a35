"""A checkpoint out as a CTranslate2 or Hugging Face model folder, written atomically and
self-checked (seq2seq/export/selfcheck.py).

The folder is written under a temporary name and renamed when complete. After writing, the
exported model is loaded back and checked against our own greedy search; a float32 export whose
log-probabilities differ by more than CHECK_TOLERANCE is an ExportError, and no folder is left.
The settings, the source checkpoint's sha256 and the check's result go to seq2seq_export.json.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from seq2seq.config.commands import ExportConfig, ExportFormat, Quantization
from seq2seq.data.tokenizer import SentencePieceTokenizer
from seq2seq.decode.translator import Translator
from seq2seq.export.ctranslate2 import ExportError
from seq2seq.export.selfcheck import (
    CheckResult,
    CTranslate2Model,
    Exported,
    MarianModel,
    report,
    self_check,
)

log = logging.getLogger(__name__)

MANIFEST = "seq2seq_export.json"


def write_folder(t: Translator, cfg: ExportConfig, out: Path) -> None:
    """The exported model and its tokenizers in `out` (an existing empty folder)."""
    model, rows = t.single("seq2seq-export"), t.cfg.pos_encoding.max_len
    if cfg.format == ExportFormat.huggingface:
        from seq2seq.export import huggingface as export_hf

        if cfg.quantization != Quantization.float32:
            raise ExportError("quantization applies to format=ctranslate2 only")
        export_hf.save(model, t.src_tok, t.tgt_tok, out, rows)
        return
    from seq2seq.export import ctranslate2 as export_ct2

    spec = export_ct2.build_spec(model, t.src_tok, t.tgt_tok, rows)
    export_ct2.save(spec, out, cfg.quantization.value)
    for name, tok in (("source.spm", t.src_tok), ("target.spm", t.tgt_tok)):
        if isinstance(tok, SentencePieceTokenizer):
            (out / name).write_bytes(tok.state()["model"])  # type: ignore[arg-type]


def load_exported(t: Translator, cfg: ExportConfig, out: Path) -> Exported:
    """The export in `out`, loaded back for the self-check."""
    if cfg.format == ExportFormat.huggingface:
        return MarianModel(out)
    from seq2seq.export.ctranslate2 import vocabulary

    return CTranslate2Model(out, vocabulary(t.src_tok), vocabulary(t.tgt_tok))


def manifest(cfg: ExportConfig, t: Translator, check: CheckResult | None) -> dict[str, Any]:
    """The export's record: source checkpoint, format, settings and the check."""
    from seq2seq.data.prepared import sha256_file

    return {
        "source_checkpoint": {"path": str(cfg.ckpt), "sha256": sha256_file(Path(cfg.ckpt))},
        "format": cfg.format.value,
        "quantization": cfg.quantization.value,
        "pos_encoding": t.cfg.pos_encoding.kind.value,
        "tokenizers": [getattr(t.src_tok, "kind", "?"), getattr(t.tgt_tok, "kind", "?")],
        # whether each folds case (a word/char vocabulary's users must lowercase the input)
        "lowercase": [t.src_tok.lowercase, t.tgt_tok.lowercase],
        "decode": {k: getattr(v, "value", v) for k, v in asdict(t.decode).items()},
        "check": None if check is None else asdict(check),
    }


def export_checkpoint(cfg: ExportConfig) -> CheckResult | None:
    """Export cfg.ckpt into cfg.out as cfg.format, then check it (cfg.check_lines > 0)."""
    out = Path(cfg.out)
    if out.exists() and not cfg.force:
        raise ExportError(f"{out} exists: choose another out= or pass force=true to replace it")
    t = Translator.from_checkpoint(cfg.ckpt, "cpu")
    if cfg.data_root is not None:
        t.cfg.data.root = cfg.data_root
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))  # private (0700)
    tmp = work / out.name  # made with the user's umask, like every other folder we write
    try:
        tmp.mkdir()
        write_folder(t, cfg, tmp)
        check = None
        if cfg.check_lines > 0:
            split = cfg.check_split or t.cfg.data.valid
            check = self_check(t, load_exported(t, cfg, tmp), split, cfg.check_lines)
            report(check, cfg)
        (tmp / MANIFEST).write_text(json.dumps(manifest(cfg, t, check), indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log.info("wrote %s (%s, %s)", out, cfg.format.value, cfg.quantization.value)
    return check
