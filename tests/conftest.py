"""Shared fixtures: tiny models built straight from the package's classes (no Hydra, no data)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from seq2seq.config.schema import ModelConfig, PosEncodingConfig, PosKind
from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from seq2seq.kernels import onednn
from seq2seq.model.transformer import EncoderDecoder, build_positional

# The test models are tiny: one intra-op thread is fastest, and on a busy machine the default
# (one per core) waits on the other threads at every op, which made a 9-step decode take seconds.
torch.set_num_threads(1)

VOCAB = 24  # ids 0-3 are the specials, 4.. are "words"

MakeModel = Callable[..., EncoderDecoder]


def tiny_pos_config(kind: PosKind | str) -> PosEncodingConfig:
    """Small settings so that every regime of every encoding shows up in sequences of ~10 tokens:
    the sinusoid table must grow, Shaw distances get clipped, T5 uses its logarithmic buckets."""
    return PosEncodingConfig(
        kind=PosKind(kind), max_len=64, clip=3, num_buckets=8, max_distance=12, rope_base=100.0
    )


def _make_model(
    pos: PosKind | str | tuple[PosEncodingConfig, PosEncodingConfig] = PosKind.sinusoidal,
    *,
    d_model: int = 32,
    n_heads: int = 4,
    layers: int = 1,
    d_ff: int = 64,
    vocab: int = VOCAB,
    tgt_vocab: int | None = None,
    norm_first: bool = True,
    tie_output: bool = True,
    share_embeddings: bool = True,
    dropout: float = 0.0,
    seed: int = 0,
    randomize_pos: bool = True,
) -> EncoderDecoder:
    """A tiny EncoderDecoder in eval mode, with one encoding kind on both sides or an (encoder,
    decoder) pair of settings; positional parameters are randomized so that a wrong position or
    bucket changes the output."""
    torch.manual_seed(seed)
    cfg = ModelConfig(
        d_model=d_model,
        n_heads=n_heads,
        enc_layers=layers,
        dec_layers=layers,
        d_ff=d_ff,
        dropout=dropout,
        norm_first=norm_first,
        tie_output=tie_output,
        share_embeddings=share_embeddings,
    )
    if isinstance(pos, tuple):
        enc_cfg, dec_cfg = (dataclasses.replace(side) for side in pos)
    else:
        enc_cfg, dec_cfg = tiny_pos_config(pos), tiny_pos_config(pos)
    if PosKind(dec_cfg.kind) == PosKind.sinusoidal:
        dec_cfg.max_len = 4  # shorter than the test sequences: the table grows on demand
    model = EncoderDecoder(
        cfg,
        vocab,
        tgt_vocab if tgt_vocab is not None else vocab,
        build_positional(enc_cfg, d_model, n_heads, causal=False, n_layers=layers),
        build_positional(dec_cfg, d_model, n_heads, causal=True, n_layers=layers),
    )
    if randomize_pos:
        with torch.no_grad():
            for p in [*model.enc_pos.parameters(), *model.dec_pos.parameters()]:
                nn.init.normal_(p, std=0.5)
    return model.eval()


@pytest.fixture(scope="session")
def make_model() -> MakeModel:
    """Factory for tiny models: make_model("rope", layers=2, norm_first=False, ...)."""
    return _make_model


def _random_sources(
    lengths: list[int], vocab: int = VOCAB, seed: int = 0, pad_to: int | None = None
) -> torch.Tensor:
    """(B, S) sources: random word ids, then EOS, right-padded with PAD."""
    gen = torch.Generator().manual_seed(seed)
    width = max(lengths) + 1 if pad_to is None else pad_to
    src = torch.full((len(lengths), width), PAD_ID, dtype=torch.long)
    for row, n in enumerate(lengths):
        src[row, :n] = torch.randint(4, vocab, (n,), generator=gen)
        src[row, n] = EOS_ID
    return src


MakeSources = Callable[..., torch.Tensor]


REV_VOCAB = 16


def reverse_batch(gen: torch.Generator, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sources of 1-6 random words + EOS, targets: the words reversed + EOS (both padded)."""
    src = torch.full((n, 8), PAD_ID)
    tgt = torch.full((n, 8), PAD_ID)
    for i, length in enumerate(torch.randint(1, 7, (n,), generator=gen).tolist()):
        words = torch.randint(4, REV_VOCAB, (length,), generator=gen)
        src[i, :length], src[i, length] = words, EOS_ID
        tgt[i, :length], tgt[i, length] = words.flip(0), EOS_ID
    return src, tgt


@pytest.fixture(scope="session")
def trained(make_model: MakeModel) -> EncoderDecoder:
    """A tiny model trained ~1 s on reversal, so that it stops with EOS at varied lengths."""
    model = make_model(PosKind.sinusoidal, vocab=REV_VOCAB, layers=2, randomize_pos=False)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(80):
        src, tgt = reverse_batch(gen, 32)
        tgt_in = torch.cat((torch.full((32, 1), BOS_ID), tgt[:, :-1]), dim=1)
        logits = model.logits(src, tgt_in)
        loss = F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=PAD_ID)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


@pytest.fixture(scope="session")
def make_sources() -> MakeSources:
    """Factory for (B, S) source batches: make_sources([5, 3], seed=1, pad_to=9)."""
    return _random_sources


@pytest.fixture(scope="session", autouse=True)
def session_choices_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Product choices timed outside a test (module fixtures) go to the session's folder, never
    to the user's cache (seq2seq.decode.load.choices_file)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SEQ2SEQ_CACHE_DIR", str(tmp_path_factory.mktemp("seq2seq-cache")))
        yield


@pytest.fixture(autouse=True)
def own_choices_file(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Product choices a test times (seq2seq.decode.load.choose_products) are kept in its own
    folder (not in its tmp_path, which some tests list), never read from or written to the
    user's cache, nor from another test's."""
    monkeypatch.setenv("SEQ2SEQ_CACHE_DIR", str(tmp_path_factory.mktemp("seq2seq-cache")))


@pytest.fixture(autouse=True)
def products_on_onednn() -> Iterator[None]:
    """A training run sets where float32 products run, process-wide, from a timing (oneDNN or
    ATen: seq2seq.train.precision.resolve_products): every test starts and ends with oneDNN's,
    the default, whatever the test before it or this machine's timing chose."""
    onednn.set_products("onednn")
    yield
    onednn.set_products("onednn")
