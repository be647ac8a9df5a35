"""Inference: greedy and batched beam search with a key/value cache.

Both decode a whole batch at once: sentences (and beams) live in one tensor, and finished
hypotheses are tracked with tensors, not with a Python loop over sentences. Each sentence may
produce at most a * |src| + b tokens (EOS included).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from seq2seq.config import DecodeConfig, LengthPenaltyKind, SearchKind
from seq2seq.data import sentence_batches
from seq2seq.model import EncoderDecoder
from seq2seq.tokenizer import BOS_ID, EOS_ID, PAD_ID


@dataclass
class Hypothesis:
    tokens: list[int]  # output ids, without BOS and EOS
    score: float  # length-normalized log-probability (greedy: raw log-probability)


def max_lengths(src: Tensor, a: float, b: int) -> Tensor:
    """Per-sentence output limit a * |src| + b for sources (B, S) (EOS counts, padding does not)."""
    src_len = src.ne(PAD_ID).sum(-1)  # (B,)
    return (a * src_len.float() + b).long().clamp(min=1)  # (B,)


def length_penalty(length: Tensor, kind: LengthPenaltyKind, alpha: float) -> Tensor:
    """Divisor for a hypothesis' summed log-probability (Wu et al. 2016 for gnmt)."""
    length = length.float()
    if kind == LengthPenaltyKind.gnmt:
        return ((5.0 + length) / 6.0) ** alpha
    if kind == LengthPenaltyKind.average:
        return length**alpha
    return torch.ones_like(length)


def _next_token_logprobs(logits: Tensor) -> Tensor:
    """Log-probabilities (N, V) of the next token; PAD and BOS are never output."""
    logprobs = logits.float().log_softmax(-1)  # (N, V)
    logprobs[:, PAD_ID] = logprobs[:, BOS_ID] = float("-inf")
    return logprobs


def _strip(ids: list[int]) -> list[int]:
    return ids[: ids.index(EOS_ID)] if EOS_ID in ids else ids


@torch.no_grad()
def greedy_search(model: EncoderDecoder, src: Tensor, max_len: Tensor) -> list[Hypothesis]:
    """Most probable next token at every step, for sources (B, S); stops when all emit EOS."""
    memory, src_mask = model.encode(src)  # (B, S, D), (B, S)
    cache = model.new_cache()
    batch = src.size(0)
    token = torch.full((batch, 1), BOS_ID, dtype=torch.long, device=src.device)  # (B, 1)
    done = torch.zeros(batch, dtype=torch.bool, device=src.device)  # (B,)
    score = torch.zeros(batch, device=src.device)  # (B,)
    out = []
    for step in range(int(max_len.max())):
        logits = model.decode(token, memory, src_mask, cache)[:, -1]  # (B, V)
        logprobs = _next_token_logprobs(logits)  # (B, V)
        best = logprobs.argmax(-1)  # (B,)
        best = torch.where(step + 1 >= max_len, EOS_ID, best)  # length limit reached: stop
        best = best.masked_fill(done, PAD_ID)
        score += logprobs.gather(1, best[:, None]).squeeze(1).masked_fill(done, 0.0)
        out.append(best)
        done |= best.eq(EOS_ID)
        if bool(done.all()):
            break
        token = best[:, None]
    ids = torch.stack(out, 1).tolist()  # (B, T)
    return [Hypothesis(_strip(row), s) for row, s in zip(ids, score.tolist(), strict=True)]


@dataclass
class _Finished:
    """The best `beam` finished hypotheses of each sentence, as tensors."""

    score: Tensor  # (B, K) normalized scores, -inf where empty
    tokens: Tensor  # (B, K, L) ids, padded with PAD

    def add(self, score: Tensor, tokens: Tensor) -> None:
        """Merge candidates score (B, C), tokens (B, C, L) and keep the best K per sentence."""
        k = self.score.size(1)
        length = max(self.tokens.size(2), tokens.size(2))
        pad = torch.nn.functional.pad
        old = pad(self.tokens, (0, length - self.tokens.size(2)), value=PAD_ID)
        new = pad(tokens, (0, length - tokens.size(2)), value=PAD_ID)
        all_score = torch.cat((self.score, score), 1)  # (B, K + C)
        all_tokens = torch.cat((old, new), 1)  # (B, K + C, L)
        self.score, idx = all_score.topk(k, dim=1)  # (B, K)
        self.tokens = all_tokens.gather(1, idx[:, :, None].expand(-1, -1, length))


@torch.no_grad()
def beam_search(
    model: EncoderDecoder, src: Tensor, max_len: Tensor, cfg: DecodeConfig
) -> list[list[Hypothesis]]:
    """Batched beam search (Graves 2012; Sutskever et al. 2014) for sources (B, S).

    Each step scores K x V continuations per sentence, keeps the top 2K, moves those ending in
    EOS (within the top K) to the finished set, and continues with the best K others. A sentence
    is done when it holds K finished hypotheses; the search stops when all are done.
    """
    k, device = cfg.beam_size, src.device
    batch = src.size(0)
    memory, src_mask = model.encode(src)  # (B, S, D)
    memory = memory.repeat_interleave(k, 0)  # (B*K, S, D)
    src_mask = src_mask.repeat_interleave(k, 0)  # (B*K, S)
    cache = model.new_cache()
    scores = torch.full((batch, k), float("-inf"), device=device)  # (B, K) raw log-probs
    scores[:, 0] = 0.0  # all beams start identical: keep one alive
    tokens = torch.full((batch * k, 1), BOS_ID, dtype=torch.long, device=device)  # (B*K, 1)
    finished = _Finished(
        torch.full((batch, k), float("-inf"), device=device),
        torch.full((batch, k, 1), PAD_ID, dtype=torch.long, device=device),
    )
    offsets = (torch.arange(batch, device=device) * k)[:, None]  # (B, 1)
    for step in range(int(max_len.max())):
        logprobs = model.decode(tokens[:, -1:], memory, src_mask, cache)[:, -1]  # (B*K, V)
        logprobs = _next_token_logprobs(logprobs).view(batch, k, -1)  # (B, K, V)
        vocab = logprobs.size(-1)
        at_limit = (step + 1 >= max_len)[:, None, None]  # (B, 1, 1)
        not_eos = torch.arange(vocab, device=device).ne(EOS_ID)  # (V,)
        logprobs = logprobs.masked_fill(at_limit & not_eos, float("-inf"))  # only EOS at the limit
        cand = (scores[:, :, None] + logprobs).view(batch, -1)  # (B, K*V)
        cand_score, cand_idx = cand.topk(2 * k, dim=1)  # (B, 2K)
        beam_of, token_of = cand_idx // vocab, cand_idx % vocab  # (B, 2K)
        rows = (beam_of + offsets).view(-1)  # (B*2K,) rows of `tokens`
        cand_tokens = torch.cat((tokens[rows], token_of.view(-1, 1)), 1).view(batch, 2 * k, -1)
        is_eos = token_of.eq(EOS_ID) & cand_score.isfinite()  # (B, 2K)
        is_eos[:, k:] = False  # only EOS among the top K ends a hypothesis
        norm = cand_score / length_penalty(torch.tensor(step + 1), cfg.length_penalty, cfg.alpha)
        finished.add(norm.masked_fill(~is_eos, float("-inf")), cand_tokens[:, :, 1:])
        done = finished.score[:, -1].isfinite()  # (B,) K finished hypotheses each
        if bool(done.all()):
            break
        alive_score, alive_pos = cand_score.masked_fill(token_of.eq(EOS_ID), float("-inf")).topk(k)
        scores = alive_score.masked_fill(done[:, None], float("-inf"))  # (B, K)
        keep = (alive_pos + (torch.arange(batch, device=device) * 2 * k)[:, None]).view(-1)
        tokens = cand_tokens.view(batch * 2 * k, -1)[keep]  # (B*K, t+1)
        reorder = rows[keep]  # (B*K,) which old beam each new beam continues
        for layer_cache in cache:
            layer_cache.reorder(reorder)
    return _nbest(finished, cfg.nbest)


def _nbest(finished: _Finished, n: int) -> list[list[Hypothesis]]:
    scores, tokens = finished.score[:, :n].tolist(), finished.tokens[:, :n].tolist()
    return [
        [Hypothesis(_strip([t for t in ids if t != PAD_ID]), s) for ids, s in zip(row_t, row_s)]
        for row_t, row_s in zip(tokens, scores, strict=True)
    ]


def decode_batch(model: EncoderDecoder, src: Tensor, cfg: DecodeConfig) -> list[list[Hypothesis]]:
    """Translate a batch of sources (B, S) with the method in cfg: cfg.nbest hypotheses each."""
    max_len = max_lengths(src, cfg.max_len_a, cfg.max_len_b)  # (B,)
    if cfg.method == SearchKind.greedy:
        return [[h] for h in greedy_search(model, src, max_len)]
    return beam_search(model, src, max_len, cfg)


def pad_sources(seqs: list[list[int]], max_len: int, device: torch.device) -> Tensor:
    """Sources as a (B, S) tensor: each truncated to max_len tokens, then EOS, then padding."""
    rows = [torch.tensor(s[:max_len] + [EOS_ID]) for s in seqs]
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=PAD_ID).to(device)


def translate_ids(
    model: EncoderDecoder, src_ids: list[list[int]], cfg: DecodeConfig, max_src_len: int = 1024
) -> list[list[Hypothesis]]:
    """Decode many sources in length-sorted batches; results come back in input order."""
    device = next(model.parameters()).device
    results: list[list[Hypothesis]] = [[] for _ in src_ids]
    was_training = model.training
    model.eval()
    for index in sentence_batches([len(s) for s in src_ids], cfg.batch_size):
        src = pad_sources([src_ids[i] for i in index], max_src_len, device)  # (B, S)
        for i, hyps in zip(index, decode_batch(model, src, cfg), strict=True):
            results[i] = hyps
    model.train(was_training)
    return results
