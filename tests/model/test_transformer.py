"""Tests for seq2seq.model.transformer: causality, padding invariance, weight tying, the
teacher-forced loss, and that it trains."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from seq2seq import kernels
from seq2seq.config.schema import ModelConfig, PosKind
from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from seq2seq.model.absolute import sinusoid_table
from seq2seq.model.positional import PositionalEncoding
from seq2seq.model.transformer import EncoderDecoder
from tests.references import smoothed_loss

MakeModel = Callable[..., EncoderDecoder]
MakeSources = Callable[..., torch.Tensor]
ALL_KINDS = list(PosKind)
# Padding changes tensor shapes, so sums run in a different order: float32 rounding only.
TOL = {"atol": 1e-5, "rtol": 1e-4}


def with_bos(tgt: torch.Tensor) -> torch.Tensor:
    """Decoder input: BOS, then the target without its last column."""
    return torch.cat((torch.full((tgt.size(0), 1), BOS_ID), tgt[:, :-1]), dim=1)


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
def test_changing_a_future_target_token_leaves_earlier_outputs(
    kind: PosKind, make_model: MakeModel, make_sources: MakeSources
) -> None:
    model = make_model(kind, layers=2)
    src = make_sources([6, 4], seed=1)
    tgt_in = with_bos(make_sources([7, 7], seed=2))
    changed = tgt_in.clone()
    changed[:, 4] = torch.where(changed[:, 4] == 5, 6, 5)
    with torch.no_grad():
        before, after = model.logits(src, tgt_in), model.logits(src, changed)
    torch.testing.assert_close(after[:, :4], before[:, :4])
    for t in range(4, tgt_in.size(1)):  # every later position sees the change
        assert not torch.allclose(after[:, t], before[:, t], **TOL), f"position {t}"


@pytest.mark.parametrize("kind", ALL_KINDS, ids=lambda k: k.value)
def test_extra_right_padding_changes_nothing(
    kind: PosKind, make_model: MakeModel, make_sources: MakeSources
) -> None:
    model = make_model(kind, layers=2)
    src = make_sources([6, 3], seed=1)  # width 7
    padded = F.pad(src, (0, 5), value=PAD_ID)
    tgt_in = with_bos(make_sources([5, 5], seed=2))
    with torch.no_grad():
        mem, mask = model.encode(src)
        mem_p, mask_p = model.encode(padded)
        assert mask_p.sum().item() == mask.sum().item() == 7 + 4
        torch.testing.assert_close(mem_p[:, : src.size(1)][mask], mem[mask], **TOL)
        torch.testing.assert_close(model.logits(padded, tgt_in), model.logits(src, tgt_in), **TOL)


def test_padding_of_a_short_sentence_does_not_depend_on_its_batch(
    make_model: MakeModel, make_sources: MakeSources
) -> None:
    """A sentence decoded alone or next to a longer one (so padded) gives the same logits."""
    model = make_model(PosKind.relative, layers=2)
    batch = make_sources([9, 3], seed=5)
    alone = batch[1:, :4]
    tgt_in = with_bos(make_sources([4, 4], seed=6))
    with torch.no_grad():
        torch.testing.assert_close(
            model.logits(batch, tgt_in)[1:], model.logits(alone, tgt_in[1:]), **TOL
        )


def test_source_tokens_matter(make_model: MakeModel, make_sources: MakeSources) -> None:
    model = make_model(PosKind.sinusoidal)
    src = make_sources([5], seed=1)
    other = src.clone()
    other[0, 0] = 4 if src[0, 0] != 4 else 5
    tgt_in = with_bos(make_sources([3], seed=2))
    with torch.no_grad():
        assert not torch.allclose(model.logits(src, tgt_in), model.logits(other, tgt_in))


def test_none_encoding_is_order_blind_in_the_encoder(make_model: MakeModel) -> None:
    """With no positional information the encoder is permutation-equivariant."""
    model = make_model(PosKind.none, layers=2)
    src = torch.tensor([[5, 6, 7, 8, EOS_ID]])
    perm = torch.tensor([3, 0, 4, 1, 2])
    with torch.no_grad():
        mem, _ = model.encode(src)
        mem_perm, _ = model.encode(src[:, perm])
    torch.testing.assert_close(mem_perm, mem[:, perm], **TOL)
    sin = make_model(PosKind.sinusoidal, layers=2)
    with torch.no_grad():
        assert not torch.allclose(sin.encode(src[:, perm])[0], sin.encode(src)[0][:, perm])


# --------------------------------------------------------------------------- embeddings


def test_tied_and_shared_embeddings(make_model: MakeModel) -> None:
    model = make_model(tie_output=True, share_embeddings=True)
    assert model.out.weight is model.tgt_embed.weight
    assert model.src_embed.weight is model.tgt_embed.weight
    params = dict(model.named_parameters())
    assert "out.weight" not in params
    assert "tgt_embed.weight" not in params  # counted once
    assert model.num_params() == sum(p.numel() for p in params.values())


def test_tied_output_without_shared_embeddings(make_model: MakeModel) -> None:
    model = make_model(tie_output=True, share_embeddings=False, vocab=20, tgt_vocab=30)
    assert model.out.weight is model.tgt_embed.weight
    assert model.src_embed.weight is not model.tgt_embed.weight
    assert model.src_embed.num_embeddings == 20
    assert model.out.out_features == 30


def test_untied_output(make_model: MakeModel) -> None:
    model = make_model(tie_output=False, share_embeddings=False)
    assert model.out.weight is not model.tgt_embed.weight
    assert model.src_embed.weight is not model.tgt_embed.weight
    with torch.no_grad():
        model.out.weight.zero_()
    assert model.tgt_embed.weight.abs().sum() > 0


def test_share_embeddings_needs_one_vocabulary() -> None:
    cfg = ModelConfig(d_model=16, n_heads=2, enc_layers=1, dec_layers=1, d_ff=32)
    with pytest.raises(ValueError, match=r"share_embeddings.*20 source and 30 target"):
        EncoderDecoder(cfg, 20, 30, PositionalEncoding(), PositionalEncoding())


def test_pad_embedding_is_zero(make_model: MakeModel) -> None:
    model = make_model(tie_output=False, share_embeddings=False, d_model=16, n_heads=2)
    assert model.src_embed.weight[PAD_ID].abs().sum() == 0
    assert model.tgt_embed.weight[PAD_ID].abs().sum() == 0


def test_encoder_input_is_scaled_embedding_plus_sinusoids(make_model: MakeModel) -> None:
    """x = sqrt(D) * E[ids] + PE (Vaswani et al. 2017, section 3.4)."""
    model = make_model(PosKind.sinusoidal, d_model=16, n_heads=2)
    seen: list[torch.Tensor] = []
    model.encoder[0].register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    src = torch.tensor([[5, 6, 7, EOS_ID]])
    with torch.no_grad():
        model.encode(src)
    want = model.src_embed(src) * 4.0 + sinusoid_table(4, 16)
    torch.testing.assert_close(seen[0], want)


@pytest.mark.parametrize("side", ["src", "tgt"])
def test_word_dropout_zeroes_whole_token_embeddings_in_training_only(
    side: str, make_model: MakeModel, make_sources: MakeSources
) -> None:
    """Each token's scaled embedding is zeroed whole or kept (times 1 / (1 - p)) before the
    positions are added; outside training the input is exactly the plain one."""
    model = make_model(PosKind.sinusoidal, d_model=16, n_heads=2)
    setattr(model.cfg, f"{side}_word_dropout", 0.5)
    layer = model.encoder[0] if side == "src" else model.decoder[0]
    seen: list[torch.Tensor] = []
    layer.register_forward_pre_hook(lambda _m, args: seen.append(args[0]))
    src = make_sources([30, 30], seed=3)  # (2, 31)
    tgt_in = with_bos(make_sources([30, 30], seed=4))  # (2, 31)
    ids = src if side == "src" else tgt_in
    table = model.src_embed if side == "src" else model.tgt_embed
    plain = table(ids).detach() * 4.0  # (2, 31, 16): sqrt(D) E[ids]
    with torch.no_grad():
        torch.manual_seed(0)
        model.train()
        model.logits(src, tgt_in)
        model.eval()
        model.logits(src, tgt_in)
    words = seen[0] - sinusoid_table(31, 16)  # (2, 31, 16): the embeddings, positions removed
    dropped = words.abs().amax(-1) < 1e-6  # (2, 31)
    assert 10 < dropped.sum().item() < 52  # p = 0.5 of 62 tokens
    torch.testing.assert_close(words[~dropped], 2.0 * plain[~dropped], **TOL)
    torch.testing.assert_close(seen[1], plain + sinusoid_table(31, 16))


def test_word_dropout_off_by_default_leaves_training_unchanged(
    make_model: MakeModel, make_sources: MakeSources
) -> None:
    """p = 0 draws nothing: the same seed gives the same training loss as before the option."""
    src, tgt = make_sources([6, 4], seed=1), make_sources([5, 7], seed=2)
    losses = []
    for p in (0.0, 0.0, 0.3):
        model = make_model(PosKind.sinusoidal, dropout=0.1).train()
        model.cfg.src_word_dropout = p
        torch.manual_seed(5)
        losses.append(model(src, with_bos(tgt), tgt, 0.1)[0].item())
    assert losses[0] == losses[1] != losses[2]


# --------------------------------------------------------------------------- training


def copy_batch(gen: torch.Generator, batch: int = 16, length: int = 5) -> torch.Tensor:
    return torch.randint(4, 12, (batch, length), generator=gen)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_a_few_adam_steps_lower_the_loss_on_a_copy_task(
    norm_first: bool, make_model: MakeModel
) -> None:
    model = make_model(PosKind.sinusoidal, norm_first=norm_first, layers=2, vocab=12).train()
    assert isinstance(model.enc_norm, torch.nn.LayerNorm) == norm_first
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    eval_src = copy_batch(gen, batch=64)

    def loss_on(src: torch.Tensor) -> torch.Tensor:
        labels = torch.cat((src, torch.full((src.size(0), 1), EOS_ID)), dim=1)
        logits = model.logits(src, with_bos(labels))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())

    with torch.no_grad():
        start = loss_on(eval_src).item()
    for _ in range(40):
        optimizer.zero_grad()
        loss_on(copy_batch(gen)).backward()
        optimizer.step()
    with torch.no_grad():
        end = loss_on(eval_src).item()
    assert end < 0.7 * start, (start, end)


@pytest.mark.parametrize("mode", ["auto", "reference"])
def test_forward_is_the_label_smoothed_loss_of_the_teacher_forced_logits(
    mode: str, make_model: MakeModel, make_sources: MakeSources
) -> None:
    """forward(src, tgt_in, tgt_out, eps) = the written-out label-smoothed loss of `logits`
    over the non-pad labels, on either kernel path; padding adds nothing."""
    model = make_model(PosKind.sinusoidal, layers=2).eval()
    src = make_sources([6, 4], seed=3)
    tgt_out = make_sources([7, 3], seed=4)  # (B, T) padded labels
    tgt_in = with_bos(tgt_out)
    with torch.no_grad(), kernels.use(mode):
        logits = model.logits(src, tgt_in)  # (B, T, V)
        loss, nll = model(src, tgt_in, tgt_out, 0.1)
    want_loss, want_nll = smoothed_loss(logits.flatten(0, 1), tgt_out.flatten(), 0.1)
    torch.testing.assert_close(loss, want_loss, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(nll, want_nll, rtol=1e-5, atol=1e-4)
