"""Tests for seq2seq.decode.alignment: the written-out weights are the ones attention uses, each
hypothesis gets its own (cropped, batch-independent) attention, and alignments follow the
i-j convention without EOS."""

from __future__ import annotations

import pytest
import torch

from seq2seq.config.schema import DecodeConfig, PosKind, SearchKind
from seq2seq.decode.alignment import (
    check_layer,
    format_alignment,
    hard_alignment,
    model_attention,
    search_model_attention,
    translation_attention,
)
from seq2seq.decode.ensemble import Ensemble
from seq2seq.decode.schedule import translate_ids
from seq2seq.decode.search import greedy_search
from seq2seq.errors import ConfigError
from seq2seq.model.transformer import EncoderDecoder
from tests.conftest import MakeModel, MakeSources


@pytest.mark.parametrize("pos", [PosKind.sinusoidal, PosKind.alibi])
def test_weights_are_those_the_attention_applies(
    make_model: MakeModel, make_sources: MakeSources, pos: PosKind
) -> None:
    """softmax weights @ values through the output projection give forward's output, with a
    padded source (masked keys get no weight)."""
    model = make_model(pos, layers=1)
    src = make_sources([5, 2])  # (2, 6): the second row is padded
    memory, src_mask = model.encode(src)
    attn = model.decoder[0].cross_attn
    x = torch.randn(2, 3, 32)
    kv = attn.project_kv(memory)
    weights = attn.weights(x, kv, src_mask)  # (B, H, T, S)
    assert weights.shape == (2, 4, 3, 6)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, 3))
    assert torch.all(weights[1, :, :, 3:] == 0)
    heads = (weights @ kv[1]).transpose(1, 2).reshape(2, 3, 32)  # (B, T, D)
    torch.testing.assert_close(attn.out_proj(heads), attn(x, kv, src_mask), atol=1e-5, rtol=0)


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_each_hypothesis_gets_its_attention(trained: EncoderDecoder, method: str) -> None:
    ids = [[5, 6, 7], [8], [9, 10, 11, 12, 13], [4, 4]]
    cfg = DecodeConfig(method=SearchKind(method), beam_size=3, nbest=2 if method == "beam" else 1)
    found = translate_ids(trained, ids, cfg)
    together = translation_attention(trained, ids, found, 64, batch_size=8)
    one_by_one = translation_attention(trained, ids, found, 64, batch_size=1)
    for src, hyps, weights, alone in zip(ids, found, together, one_by_one, strict=True):
        assert len(weights) == len(hyps)
        for h, w, a in zip(hyps, weights, alone, strict=True):
            assert w.shape == (2, len(h.tokens) + 1, len(src) + 1)  # layers, tokens + EOS each
            torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:2]))
            torch.testing.assert_close(w, a, atol=1e-5, rtol=0)  # padding changes nothing
    # the 2nd of a beam's n-best is another output, attended differently
    if method == "beam":
        assert found[2][0].tokens != found[2][1].tokens


def test_an_ensembles_attention_is_its_models_mean(
    trained: EncoderDecoder, make_model: MakeModel
) -> None:
    other = make_model(PosKind.rope, vocab=16, layers=2, seed=2)
    src, outputs = torch.tensor([[5, 6, 7, 2]]), [[9, 8]]
    want = (model_attention(trained, src, outputs) + model_attention(other, src, outputs)) / 2
    torch.testing.assert_close(
        search_model_attention(Ensemble([trained, other]), src, outputs), want
    )
    shallow = make_model(PosKind.rope, vocab=16, layers=1)
    with pytest.raises(ConfigError, match=r"equally many decoder layers, these have \[2, 1\]"):
        search_model_attention(Ensemble([trained, shallow]), src, outputs)


def test_hard_alignment_takes_each_target_tokens_argmax_without_eos() -> None:
    weights = torch.tensor(
        [
            [0.1, 0.7, 0.0, 0.2],  # target 0 -> source 1
            [0.2, 0.1, 0.3, 0.4],  # target 1 -> source 2 (the source EOS column does not count)
            [0.6, 0.2, 0.1, 0.1],  # target 2 -> source 0
            [0.0, 0.0, 0.0, 1.0],  # EOS row: left out
        ]
    )
    pairs = hard_alignment(weights)
    assert pairs == [(1, 0), (2, 1), (0, 2)]
    assert format_alignment(pairs) == "1-0 2-1 0-2"
    assert hard_alignment(weights[-1:]) == [] == hard_alignment(weights[:, -1:])  # empty side


def test_check_layer_counts_from_both_ends() -> None:
    assert [check_layer(i, 3) for i in (0, 2, -1, -3)] == [0, 2, 2, 0]
    for bad in (3, -4):
        with pytest.raises(ConfigError, match=rf"align_layer={bad} is invalid.*\[-3, 2\]"):
            check_layer(bad, 3)


def test_the_rerun_gives_the_attention_of_the_search(trained: EncoderDecoder) -> None:
    """The weights the cached, step-by-step greedy search computed (recorded by a hook, one
    sentence) are those of the teacher-forced re-run, row for row."""
    src = torch.tensor([[5, 9, 7, 12, 2]])
    steps: list[list[torch.Tensor]] = [[] for _ in trained.decoder]
    hooks = [
        layer.cross_attn.register_forward_hook(
            lambda attn, args, _, i=i: steps[i].append(attn.weights(*args).mean(1))
        )
        for i, layer in enumerate(trained.decoder)
    ]
    try:
        (hyp,) = greedy_search(trained, src, torch.tensor([12]))
    finally:
        for hook in hooks:
            hook.remove()
    during = torch.stack([torch.cat(layer, 1)[0] for layer in steps])  # (L, T + 1, S)
    assert len(hyp.tokens) >= 3
    assert during.shape == (2, len(hyp.tokens) + 1, 5)
    rerun = model_attention(trained, src, [hyp.tokens])[0]  # (L, T + 1, S)
    torch.testing.assert_close(rerun, during, atol=1e-5, rtol=0)
