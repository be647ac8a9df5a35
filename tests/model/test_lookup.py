"""Tests for seq2seq.model.lookup: parameters and submodules read from the instance __dict__
inside `direct_attributes`, the same objects, and nothing left behind after it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
import torch
from torch import nn

from seq2seq.config.schema import DecodeConfig, PosKind, SearchKind
from seq2seq.decode import schedule
from seq2seq.decode.schedule import translate_ids
from seq2seq.model.absolute import Sinusoidal
from seq2seq.model.lookup import direct_attributes
from seq2seq.model.transformer import EncoderDecoder

MakeModel = Callable[..., EncoderDecoder]


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.scale = nn.Parameter(torch.ones(2))
        self.register_buffer("table", torch.zeros(3))
        self.register_parameter("nothing", None)


def dict_keys(model: nn.Module) -> list[set[str]]:
    return [set(m.__dict__) for m in model.modules()]


def test_inside_every_parameter_and_submodule_is_an_instance_entry_and_the_same_object() -> None:
    block = Block()
    before = dict_keys(block)
    with direct_attributes(block):
        assert block.__dict__["lin"] is block._modules["lin"]
        assert block.__dict__["scale"] is block._parameters["scale"]
        assert block.__dict__["nothing"] is None
        assert block.lin.__dict__["weight"] is block.lin._parameters["weight"]
        assert "table" not in block.__dict__  # buffers stay where they are
    assert dict_keys(block) == before
    assert block.lin is block._modules["lin"]


def test_entries_go_after_an_error_and_nested_blocks_keep_the_outer_ones() -> None:
    block = Block()
    before = dict_keys(block)
    with pytest.raises(RuntimeError), direct_attributes(block):
        raise RuntimeError("inside")
    assert dict_keys(block) == before
    with direct_attributes(block):
        inside = dict_keys(block)
        with direct_attributes(block):
            pass
        assert dict_keys(block) == inside  # the inner block added nothing, so removes nothing
    assert dict_keys(block) == before


def test_assignments_inside_are_read_and_kept() -> None:
    block = Block()
    new_lin, new_scale, new_table = nn.Linear(2, 3), nn.Parameter(torch.zeros(2)), torch.ones(5)
    with direct_attributes(block):
        block.lin = new_lin
        block.scale = new_scale
        block.table = new_table  # a buffer grown while decoding (Sinusoidal.embed)
        assert block.lin is new_lin
        assert block.scale is new_scale
        assert block.table is new_table
    assert block.lin is new_lin
    assert block.scale is new_scale
    assert block.table is new_table
    assert "lin" not in block.__dict__
    assert "scale" not in block.__dict__
    assert dict(block.named_parameters())["lin.weight"] is new_lin.weight


def test_decoding_gives_the_same_translations_and_restores_the_model(
    make_model: MakeModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """translate_ids reads attributes directly: same hypotheses as through nn.Module's
    __getattr__, for a beam and a greedy search whose sinusoid table grows while decoding; the
    model's mode and instance dicts are as they were, also after a failing search."""
    model = make_model(PosKind.sinusoidal.value, layers=2).train()
    assert isinstance(model.dec_pos, Sinusoidal)
    model.dec_pos.table = model.dec_pos.table[:4]  # positions past 3 grow it
    before = dict_keys(model)
    src = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15]]
    for method in (SearchKind.beam, SearchKind.greedy):
        cfg = DecodeConfig(method=method, beam_size=3, max_len_a=0.0, max_len_b=12)
        got = translate_ids(model, src, cfg, min_len=12)
        assert model.training
        assert dict_keys(model) == before
        with monkeypatch.context() as m:
            m.setattr(schedule, "direct_attributes", lambda _: contextlib.nullcontext())
            want = translate_ids(model, src, cfg, min_len=12)
        assert [h.tokens for hs in got for h in hs] == [h.tokens for hs in want for h in hs]
        assert [h.score for hs in got for h in hs] == pytest.approx(
            [h.score for hs in want for h in hs], abs=1e-5
        )
    assert model.dec_pos.table.size(0) > 4
    monkeypatch.setattr(schedule, "decode_batch", _fail)
    with pytest.raises(RuntimeError, match="search failed"):
        translate_ids(model, src, DecodeConfig(method=SearchKind.beam))
    assert model.training
    assert dict_keys(model) == before


def _fail(*_: object, **__: object) -> None:
    raise RuntimeError("search failed")


def test_decoding_leaves_a_model_in_eval_mode_alone(
    make_model: MakeModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Setting every module's mode costs ~1 ms a call: an eval model's is not set at all; a
    model with one module in training mode decodes in eval mode, and gets its root's mode
    after."""
    model = make_model(PosKind.sinusoidal.value, layers=1).eval()
    with monkeypatch.context() as m:
        m.setattr(nn.Module, "train", _no_mode_change)
        with schedule.decoding(model):
            pass
    model.decoder[0].train()
    with schedule.decoding(model):
        assert not any(module.training for module in model.modules())
    assert not any(module.training for module in model.modules())  # the root's mode, as before


def _no_mode_change(*_: object) -> None:
    raise AssertionError("the mode was set")
