"""seq2seq-export: a checkpoint out as a CTranslate2 or Hugging Face model folder, then a
self-check of the written folder against our own search (seq2seq/export/writer.py).

    seq2seq-export ckpt=run/checkpoints/average.pt out=deploy/ct2 quantization=int8
    seq2seq-export ckpt=run/checkpoints/average.pt out=deploy/hf format=huggingface
"""

from __future__ import annotations

from seq2seq.cli.app import entry_point
from seq2seq.config.commands import register_configs
from seq2seq.export.writer import export_checkpoint

register_configs()
main = entry_point("export", export_checkpoint)  # seq2seq-export; user errors exit 1 with one line


if __name__ == "__main__":
    main()
