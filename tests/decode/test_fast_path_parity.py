"""The decoding fast path (kernels auto on a CPU) against the reference path (plain PyTorch, what
CUDA runs): greedy, beam and sampling search return the same tokens, and scores within float
tolerance, for every positional encoding, pre- and post-norm.

Which fast kernels run depends on sizes (seq2seq/kernels/cpu.py): one sentence alone takes
F.linear and SDPA, a batch oneDNN's packed weights and matmuls, long rows the blocked top-k
and row maximum. The thresholds are set here so that each regime runs on a small model: "alone"
sends every product and attention to the few-rows kernels, "batch" to the batched ones, and
both take the blocked top-k (blocks of 8 over a vocabulary of 603, a partial block included).
The sentences end at different steps, so rows leave the batch with their caches.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from seq2seq import kernels
from seq2seq.config.schema import DecodeConfig, PosKind, SearchKind
from seq2seq.decode.schedule import translate_ids
from seq2seq.decode.search import Hypothesis
from seq2seq.kernels import cpu
from seq2seq.model.transformer import EncoderDecoder
from tests.conftest import MakeModel
from tests.search_cases import SEARCHES, eos_biased_model, random_sources

VOCAB = 603  # 75 blocks of 8 and a partial one of 3
SCORE_TOL = 1e-4
REGIMES = {  # cpu thresholds: every call few-rows (alone) or batched (batch)
    "alone": {"SMALL_ROWS": 10**6, "FEW_QUERY_ROWS": 10**6},
    "batch": {"SMALL_ROWS": 0, "FEW_QUERY_ROWS": 0},
}


@pytest.fixture(autouse=True)
def auto_afterwards() -> Iterator[None]:
    yield
    kernels.set_mode("auto")


def sources(n: int = 7) -> list[list[int]]:
    return random_sources(VOCAB, n)


def model_of(make_model: MakeModel, kind: PosKind, norm_first: bool) -> EncoderDecoder:
    return eos_biased_model(make_model, kind, VOCAB, norm_first)


def decode(model: EncoderDecoder, search: str, mode: str) -> list[list[Hypothesis]]:
    with kernels.use(mode):
        return translate_ids(model, sources(), SEARCHES[search])


@pytest.mark.parametrize("regime", sorted(REGIMES))
@pytest.mark.parametrize("search", sorted(SEARCHES))
@pytest.mark.parametrize("kind", list(PosKind), ids=lambda k: k.value)
def test_fast_path_decodes_as_the_reference(
    kind: PosKind, search: str, regime: str, make_model: MakeModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in {**REGIMES[regime], "BLOCKED_MIN_ELEMENTS": 0, "BLOCK": 8}.items():
        monkeypatch.setattr(cpu, name, value)
    model = model_of(make_model, kind, norm_first=kind != PosKind.rope)
    fast, reference = decode(model, search, "auto"), decode(model, search, "reference")
    assert [[h.tokens for h in hyps] for hyps in fast] == [
        [h.tokens for h in hyps] for hyps in reference
    ]
    for got, want in zip(fast, reference, strict=True):
        for g, w in zip(got, want, strict=True):
            assert g.score == pytest.approx(w.score, abs=SCORE_TOL)
    lengths = {len(h.tokens) for hyps in fast for h in hyps}
    assert len(lengths) > 1  # sentences ended at different steps: rows left the batch


def test_the_default_thresholds_decode_as_the_reference(make_model: MakeModel) -> None:
    """Without forcing any regime: one sentence alone, and a batch of them, beam search."""
    model = model_of(make_model, PosKind.sinusoidal, norm_first=True)
    for size in (1, 16):
        cfg = DecodeConfig(method=SearchKind.beam, beam_size=4, batch_size=size, max_len_a=1.0)
        found = {}
        for mode in kernels.MODES:
            with kernels.use(mode):
                found[mode] = translate_ids(model, sources(), cfg)
        assert [h[0].tokens for h in found["auto"]] == [h[0].tokens for h in found["reference"]]
