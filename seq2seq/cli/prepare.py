"""seq2seq-prepare (`make prepare`): prepare a corpus once (seq2seq/data/prepare.py), then train
from it.

    seq2seq-prepare data.root=wmt14 data.train=[europarl,commoncrawl,news] data.prepared=wmt14.prep
    seq2seq-train data.prepared=wmt14.prep data.weights=[1,1,3] ...

The config tree is seq2seq-train's (seq2seq/config/prepare.yaml composes train.yaml), so the data
and tokenizer groups and overrides are the same. Without data.prepared the corpus goes to the cache
where seq2seq-train would prepare it on first use.
"""

from __future__ import annotations

from pathlib import Path

from seq2seq.cli.app import entry_point
from seq2seq.config.commands import register_configs
from seq2seq.config.schema import TrainConfig, resolve_path
from seq2seq.data.prepare import cached_prepare, describe_prepared, prepare


def run(cfg: TrainConfig) -> Path:
    """Prepare cfg's data into data.prepared (else the cache) and print what it holds."""
    if cfg.data.prepared:
        out = prepare(cfg.data, cfg.tokenizer, resolve_path(cfg.data.prepared))
    else:
        out = cached_prepare(cfg.data, cfg.tokenizer)
    print(describe_prepared(out))
    return out


register_configs()
main = entry_point("prepare", run)  # user errors exit 1 with one line


if __name__ == "__main__":
    main()
