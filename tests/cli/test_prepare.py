"""seq2seq-prepare end to end: the console script prepares a corpus into data.prepared=DIR and
says what it holds; a run trained from DIR reads exactly the batches (token ids, batch
boundaries, order) of a run trained from the same raw files, which prepares them itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, tokenizer_bytes
from seq2seq.train.build import build_trainer
from seq2seq.train.trainer import Trainer
from tests.tiny_run import REPO, compose_train, tiny_overrides, write_slice

SIZES = {"train": 150, "valid": 10, "test": 10}
EPOCHS = 2  # the order of epoch 1 is drawn anew: it must agree too


def env() -> dict[str, str]:
    # as tests/cli/test_translate.py: the script must not rely on HYDRA_FULL_ERROR
    return {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"} | {
        "OMP_NUM_THREADS": "1"
    }


def batches(trainer: Trainer) -> list[tuple[tuple[int, int], dict[str, torch.Tensor]]]:
    """Every batch of the first EPOCHS epochs, in training order, as the trainer collates them."""
    found = []
    for epoch in range(EPOCHS):
        for ref in trainer.epoch_batches(epoch):
            batch = trainer.train_data.collate(ref)
            fields = ("src", "tgt_in", "tgt_out", "index")
            found.append((ref, {name: getattr(batch, name) for name in fields}))
    return found


def unpadded(row: torch.Tensor) -> list[int]:
    return row[row.ne(PAD_ID)].tolist()


def test_prepare_cli_then_training_reads_the_batches_of_the_raw_files(tmp_path: Path) -> None:
    data = write_slice(tmp_path / "data", SIZES)
    out = tmp_path / "prepared"
    # the script's own tokenizer cache: its tokenizer is trained apart from the raw run's
    cli_args = [*tiny_overrides(data, tmp_path / "cli-cache"), f"data.prepared={out}"]
    done = subprocess.run(
        [sys.executable, "-m", "seq2seq.cli.prepare", *cli_args],
        cwd=REPO,  # `-m` imports this checkout's package
        env=env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (out / "manifest.json").is_file()
    assert not list(tmp_path.glob(".prepared.*"))

    raw_cfg = compose_train(tiny_overrides(data, tmp_path / "raw-cache"))
    for run in ("raw-run", "prep-run"):
        (tmp_path / run).mkdir()
    raw = build_trainer(raw_cfg, tmp_path / "raw-run")  # prepares into raw-cache/prepared
    assert [p.parent.name for p in (tmp_path / "raw-cache" / "prepared").glob("*/manifest.json")]
    prep_cfg = compose_train(tiny_overrides(data, tmp_path / "prep-cache", f"data.prepared={out}"))
    prep_cfg.data.root = str(tmp_path / "nowhere")  # everything must come from DIR
    prep = build_trainer(prep_cfg, tmp_path / "prep-run")
    try:
        want, got = batches(raw), batches(prep)
    finally:
        raw.close()
        prep.close()
    assert not (tmp_path / "prep-cache").exists()  # nothing prepared or trained again

    # the same batches, boundaries and order, token for token
    assert [ref for ref, _ in got] == [ref for ref, _ in want]
    for (ref, a), (_, b) in zip(got, want, strict=True):
        for name in a:
            assert torch.equal(a[name], b[name]), (ref, name)
    assert len(got) > 2 * EPOCHS  # several batches an epoch: boundaries and order were compared
    epoch0 = [b["index"][0].item() for ref, b in got if ref[0] == 0]
    epoch1 = [b["index"][0].item() for ref, b in got if ref[0] == 1]
    assert epoch0 != epoch1  # epochs are drawn in another order: the seed's order was compared

    # and both are the raw lines as the tokenizers encode them (independently of prepare):
    # every pair once an epoch, each batch within the token budget
    # (the raw run's tokenizers, trained apart from the script's: they must be the same)
    src_tok, tgt_tok = raw.src_tok, raw.tgt_tok
    assert tokenizer_bytes(prep.src_tok) == tokenizer_bytes(src_tok)
    assert tokenizer_bytes(prep.tgt_tok) == tokenizer_bytes(tgt_tok)
    src_lines = (data / "train.en").read_text(encoding="utf-8").splitlines()
    tgt_lines = (data / "train.de").read_text(encoding="utf-8").splitlines()
    for epoch in range(EPOCHS):
        seen: list[int] = []
        for ref, b in got:
            if ref[0] != epoch:
                continue
            assert b["src"].numel() <= raw_cfg.trainer.max_tokens
            for row, i in enumerate(b["index"].tolist()):
                seen.append(i)
                assert unpadded(b["src"][row]) == [*src_tok.encode(src_lines[i]), EOS_ID]
                assert unpadded(b["tgt_in"][row]) == [BOS_ID, *tgt_tok.encode(tgt_lines[i])]
                assert unpadded(b["tgt_out"][row]) == [*tgt_tok.encode(tgt_lines[i]), EOS_ID]
        assert sorted(seen) == list(range(SIZES["train"]))

    # what the script printed: the folder, the pairs kept and their tokens, the eval splits
    src_tokens = sum(len(src_tok.encode(line)) for line in src_lines)
    tgt_tokens = sum(len(tgt_tok.encode(line)) for line in tgt_lines)
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"prepared corpus: {out} (")
    assert lines[0].endswith(" MB on disk)")
    assert lines[1] == (
        f"  train train: 150/150 pairs kept (0 empty, 0 over 64 tokens); tokens {src_tokens} "
        f"src, {tgt_tokens} tgt"
    )
    assert sorted(lines[2:4]) == ["  eval test: 10 pairs", "  eval valid: 10 pairs"]
    assert lines[4:] == [
        f"train with: seq2seq-train data.prepared={out} (and the same data settings)"
    ]
