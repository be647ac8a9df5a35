"""Inference: greedy, batched beam search and sampling, with a key/value cache.

Both decode a whole batch at once: sentences (and beams) live in one tensor, and finished
hypotheses are tracked with tensors, not with a Python loop over sentences. A sentence that is
done leaves the batch (its rows of the caches and the source mask are dropped), so later steps
only compute for sentences still being decoded. Each sentence produces at most a * |src| + b
tokens and at least `min_len` (EOS included in both; EOS is masked before `min_len`).

seq2seq/decode/schedule.py puts many sentences through them (`translate_ids`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from seq2seq import kernels
from seq2seq.config.schema import DecodeConfig, LengthPenaltyKind, SearchKind
from seq2seq.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from seq2seq.decode.ensemble import SearchModel
from seq2seq.decode.sampling import Sampler, uniform_table
from seq2seq.model.cache import LayerCache

NEG_INF = float("-inf")


@dataclass
class Hypothesis:
    """One output of a search: its token ids and its score."""

    tokens: list[int]  # output ids, without BOS and EOS
    score: float  # length-normalized log-probability (greedy: raw; NaN without scores)


def max_lengths(src: Tensor, a: float, b: int) -> Tensor:
    """Per-sentence output limit a * |src| + b for sources (B, S) (EOS counts, padding does not)."""
    return length_limits(src.ne(PAD_ID).sum(-1), a, b)  # (B,)


def length_limits(src_len: Tensor, a: float, b: int) -> Tensor:
    """The output limit a * |src| + b of sources of src_len (B,) tokens, EOS included."""
    return (a * src_len.float() + b).long().clamp(min=1)  # (B,)


def length_penalty(length: Tensor, kind: LengthPenaltyKind, alpha: float) -> Tensor:
    """Divisor for a hypothesis' summed log-probability (Wu et al. 2016 for gnmt)."""
    length = length.float()
    if kind == LengthPenaltyKind.gnmt:
        return ((5.0 + length) / 6.0) ** alpha
    if kind == LengthPenaltyKind.average:
        return length**alpha
    return torch.ones_like(length)


@dataclass
class Bounds:
    """Output length bounds (EOS included) of the sentences still being decoded."""

    max_len: Tensor  # (B,) only EOS may follow max_len - 1 tokens
    min_len: Tensor  # (B,) EOS is masked until min_len - 1 tokens are out (max_len wins)

    def __post_init__(self) -> None:
        self.min_len = torch.minimum(self.min_len, self.max_len)
        empty = self.max_len.numel() == 0  # Python ints: no mask work on most steps
        self.first_max = 1 << 62 if empty else int(self.max_len.min())
        self.last_min = 0 if empty else int(self.min_len.max())

    def select(self, sentences: Tensor) -> Bounds:
        """The bounds of the sentences `sentences` (B',) only."""
        return Bounds(self.max_len[sentences], self.min_len[sentences])


@functools.cache
def _never_output(device: torch.device) -> Tensor:
    """The ids no search outputs, PAD and BOS (2,), on `device`."""
    return torch.tensor([PAD_ID, BOS_ID], device=device)


def step_logprobs(
    logits: Tensor, step: int | Tensor, bounds: Bounds, group: int, normalize: bool = True
) -> Tensor:
    """Log-probabilities (B, G, V) of token `step` (one for all, or (B,) one per sentence) for
    logits (B*G, V), G hypotheses a sentence; with normalize=False the logits themselves (each
    row's largest is the same token, ties within float rounding aside), whose softmax over the
    vocabulary greedy search without scores skips.

    PAD and BOS are never output. EOS is masked before a sentence's min length; at its max length
    only EOS is left, with its own log-probability (the limit charges log p(EOS), like fairseq).
    """
    scores = logits.float()  # (B*G, V)
    if normalize:
        scores = scores.log_softmax(-1)
    logprobs = scores.view(-1, group, logits.size(-1))  # (B, G, V)
    logprobs.index_fill_(-1, _never_output(logprobs.device), NEG_INF)
    length = step + 1  # output length if this token is EOS
    per_row = isinstance(length, Tensor)
    if per_row or length < bounds.last_min:
        logprobs[..., EOS_ID].masked_fill_((length < bounds.min_len)[:, None], NEG_INF)
    if per_row or length >= bounds.first_max:
        at_limit = (length >= bounds.max_len)[:, None, None]  # (B, 1, 1)
        if per_row and not bool(at_limit.any()):
            return logprobs
        eos = logprobs[..., EOS_ID].clone()  # (B, G)
        logprobs.masked_fill_(at_limit, NEG_INF)
        logprobs[..., EOS_ID] = eos
    return logprobs


def _as_lengths(value: Tensor | int, like: Tensor) -> Tensor:
    return value if isinstance(value, Tensor) else torch.full_like(like, value)


def keep_rows(cache: list[LayerCache], rows: Tensor, sentences: Tensor | None) -> None:
    """Each layer cache keeps the rows `rows` and the sentences `sentences` (its reorder)."""
    for layer_cache in cache:
        layer_cache.reorder(rows, sentences)


def strip_eos(ids: list[int]) -> list[int]:
    """The ids before the first EOS (all of them if there is none)."""
    return ids[: ids.index(EOS_ID)] if EOS_ID in ids else ids


# Chooses each row's next token from its log-probabilities (N, V), given the input sentence of
# every row (N,) and the step: returns the tokens' log-probabilities (N,) and the tokens (N,).
Pick = Callable[[Tensor, Tensor, int], tuple[Tensor, Tensor]]


def most_probable(logprobs: Tensor, rows: Tensor, step: int) -> tuple[Tensor, Tensor]:
    """Greedy's `Pick`: each row's most probable token and its log-probability."""
    return kernels.row_max(logprobs)  # (N,) each


@torch.inference_mode()
def greedy_search(
    model: SearchModel,
    src: Tensor,
    max_len: Tensor,
    min_len: Tensor | int = 0,
    scores: bool = True,
) -> list[Hypothesis]:
    """Most probable next token at every step, for sources (B, S); a sentence leaves the batch
    when it emits EOS, and the search stops when none is left. scores=False: no softmax over
    the vocabulary a step, and NaN scores."""
    memory, src_mask = model.encode(src)  # (B, S, D), (B, S)
    return one_path_search(model, memory, src_mask, max_len, min_len, most_probable, scores)


def one_path_search(
    model: SearchModel,
    memory: Tensor,
    src_mask: Tensor,
    max_len: Tensor,
    min_len: Tensor | int,
    pick: Pick,
    normalize: bool = True,
) -> list[Hypothesis]:
    """One hypothesis per row of the encoder output memory (B, S, D), its token at every step
    chosen by `pick` (greedy: the most probable; sampling: a draw). A row leaves the batch when
    it emits EOS, and the search stops when none is left. A step writes the rows still decoding
    by slices (tokens (N, L), score (N,)); they go to their sentences' places when rows leave.
    normalize=False: `pick` sees the logits, not log-probabilities, and the scores are NaN."""
    batch, limit, device = memory.size(0), int(max_len.max()), memory.device
    bounds = Bounds(max_len, _as_lengths(min_len, max_len))
    cache = model.new_cache(limit)
    out = torch.full((batch, limit), PAD_ID, dtype=torch.long, device=device)  # (B, L)
    final = torch.zeros(batch, device=device)  # (B,)
    tokens, score = out.clone(), final.clone()  # (N, L), (N,): the rows still decoding
    alive = torch.arange(batch, device=device)  # (N,) sentence of each row still decoding
    token = torch.full((batch, 1), BOS_ID, dtype=torch.long, device=device)  # (N, 1)
    for step in range(limit):
        logits = model.decode(token, memory, src_mask, cache)[:, -1]  # (N, V)
        logprobs = step_logprobs(logits, step, bounds, 1, normalize)[:, 0]  # (N, V)
        best_logprob, best = pick(logprobs, alive, step)  # (N,) each
        tokens[:, step] = best
        score += best_logprob
        ended = best.eq(EOS_ID)  # (N,)
        if bool(ended.any()):
            out[alive], final[alive] = tokens, score
            rows = ended.logical_not().nonzero().squeeze(1)  # (N',)
            if rows.numel() == 0:
                break
            alive, best, bounds = alive[rows], best[rows], bounds.select(rows)
            tokens, score = tokens[rows], score[rows]
            memory, src_mask = memory[rows], src_mask[rows]
            keep_rows(cache, rows, rows)
        token = best[:, None]
    else:  # the length limit stopped the rows still decoding
        out[alive], final[alive] = tokens, score
    if not normalize:
        final.fill_(math.nan)
    return [
        Hypothesis(strip_eos(row), s) for row, s in zip(out.tolist(), final.tolist(), strict=True)
    ]


@torch.inference_mode()
def sample_search(
    model: SearchModel,
    src: Tensor,
    max_len: Tensor,
    cfg: DecodeConfig,
    sentences: list[int],
    min_len: Tensor | int = 0,
) -> list[list[Hypothesis]]:
    """cfg.nbest samples of each source of src (B, S), in the order drawn
    (seq2seq/decode/sampling.py); `sentences` (B): each source's index in the input, which with
    cfg.seed seeds its draws. A sample's score is its log-probability under the model."""
    n = cfg.nbest
    memory, src_mask = model.encode(src)  # (B, S, D), (B, S)
    table = uniform_table(cfg.seed, sentences, n, max_len.tolist()).to(src.device)  # (B*n, L)
    rows = torch.arange(src.size(0), device=src.device).repeat_interleave(n)  # (B*n,)
    min_len = _as_lengths(min_len, max_len)[rows]  # (B*n,)
    found = one_path_search(
        model, memory[rows], src_mask[rows], max_len[rows], min_len, Sampler(cfg, table)
    )
    return [found[i : i + n] for i in range(0, len(found), n)]


@dataclass
class _Finished:
    """The best `beam` finished hypotheses of each sentence, as tensors."""

    score: Tensor  # (B, K) normalized scores, -inf where empty
    tokens: Tensor  # (B, K, L) ids, padded with PAD

    def add(self, sentences: Tensor, score: Tensor, tokens: Tensor) -> None:
        """Merge candidates score (B', C), tokens (B', C, L) of `sentences` (B',) and keep the
        best K of each."""
        k, length = self.score.size(1), self.tokens.size(2)
        all_score = torch.cat((self.score[sentences], score), 1)  # (B', K + C)
        all_tokens = torch.cat((self.tokens[sentences], tokens), 1)  # (B', K + C, L)
        best, idx = all_score.topk(k, dim=1)  # (B', K)
        self.score[sentences] = best
        self.tokens[sentences] = all_tokens.gather(1, idx[:, :, None].expand(-1, -1, length))

    def nbest(self, n: int) -> list[list[Hypothesis]]:
        scores, tokens = self.score[:, :n].tolist(), self.tokens[:, :n].tolist()
        return [
            [Hypothesis(strip_eos([t for t in ids if t != PAD_ID]), s) for ids, s in zip(ts, ss)]
            for ts, ss in zip(tokens, scores, strict=True)
        ]


@dataclass
class _Beams:
    """The live hypotheses of the sentences still being decoded, sentence-major: W per sentence,
    1 at the first step (the K beams would all be the same), then K."""

    sentences: Tensor  # (B',) index in the batch of each sentence still being decoded
    score: Tensor  # (B', W) summed log-probabilities, -inf for an empty beam
    tokens: Tensor  # (B'*W, L) ids so far, PAD after them
    bounds: Bounds
    memory: Tensor  # (B', S, D) encoder output, one row per sentence
    src_mask: Tensor  # (B', S)

    def select(self, live: Tensor) -> None:
        """Keep only the sentences `live` (B'',)."""
        k, length = self.score.size(1), self.tokens.size(1)
        self.sentences, self.score = self.sentences[live], self.score[live]
        self.tokens = self.tokens.view(-1, k, length)[live].view(-1, length)
        self.bounds = self.bounds.select(live)
        self.memory, self.src_mask = self.memory[live], self.src_mask[live]


@torch.inference_mode()
def beam_search(
    model: SearchModel,
    src: Tensor,
    max_len: Tensor,
    cfg: DecodeConfig,
    min_len: Tensor | int = 0,
) -> list[list[Hypothesis]]:
    """Batched beam search (Graves 2012; Sutskever et al. 2014) for sources (B, S).

    Each step scores K x V continuations per sentence, keeps the top 2K, moves those ending in
    EOS (within the top K) to the finished set, and continues with the best K others. A sentence
    is done when it holds K finished hypotheses (or has no live one left) and leaves the batch;
    the search stops when all are done. The K beams of a sentence share one row of encoder
    output and cross-attention cache (see DecoderLayer).
    """
    k, device = cfg.beam_size, src.device
    batch, limit = src.size(0), int(max_len.max())
    memory, src_mask = model.encode(src)  # (B, S, D), (B, S)
    score = torch.zeros(batch, 1, device=device)  # (B, 1): one hypothesis per sentence at first
    tokens = torch.full((batch, limit), PAD_ID, dtype=torch.long, device=device)  # (B, L)
    bounds = Bounds(max_len, _as_lengths(min_len, max_len))
    beams = _Beams(torch.arange(batch, device=device), score, tokens, bounds, memory, src_mask)
    finished = _Finished(
        torch.full((batch, k), NEG_INF, device=device),
        torch.full((batch, k, limit), PAD_ID, dtype=torch.long, device=device),
    )
    cache = model.new_cache(limit)
    token = torch.full((batch, 1), BOS_ID, dtype=torch.long, device=device)  # (B, 1)
    for step in range(limit):
        logits = model.decode(token, beams.memory, beams.src_mask, cache)[:, -1]  # (B'*W, V)
        logprobs = step_logprobs(logits, step, beams.bounds, beams.score.size(1))  # (B', W, V)
        kept = _advance(beams, logprobs, step, finished, cfg)
        if kept is None:
            break
        keep_rows(cache, *kept)
        token = beams.tokens[:, step : step + 1]  # (B'*K, 1)
    return finished.nbest(cfg.nbest)


def _advance(
    beams: _Beams, logprobs: Tensor, step: int, finished: _Finished, cfg: DecodeConfig
) -> tuple[Tensor, Tensor | None] | None:
    """One beam-search step on logprobs (B', W, V) of W live hypotheses per sentence (1 at the
    first step, then K), updating `beams` and `finished` in place.

    Returns the cache rows to keep (the old hypothesis each new one continues) and the
    sentences kept (None: all of them), or None when every sentence is done.
    """
    nb, width, _ = logprobs.shape
    k = cfg.beam_size
    cand_score, parent, token_of = _best_continuations(logprobs, beams.score, 2 * k)  # (B', 2K)
    rows = parent + torch.arange(0, nb * width, width, device=parent.device)[:, None]
    is_eos = token_of.eq(EOS_ID)  # (B', 2K); rows (B', 2K) index beams.tokens
    alive_score, alive_pos = cand_score.masked_fill(is_eos, NEG_INF).topk(k)  # (B', K)
    done = alive_score[:, 0].isneginf()  # (B',) nothing left to continue
    ending = is_eos[:, :k] & cand_score[:, :k].isfinite()  # (B', K) only EOS in the top K ends
    if bool(ending.any()):
        penalty = length_penalty(torch.tensor(step + 1), cfg.length_penalty, cfg.alpha)
        norm = (cand_score[:, :k] / penalty).masked_fill(~ending, NEG_INF)  # (B', K)
        ended_tokens = beams.tokens[rows[:, :k].reshape(-1)].view(nb, k, -1)  # (B', K, L)
        finished.add(beams.sentences, norm, ended_tokens)
        done |= finished.score[beams.sentences, -1].isfinite()  # K finished hypotheses
    keep = rows.gather(1, alive_pos).view(-1)  # (B'*K,)
    beams.tokens = beams.tokens[keep]  # (B'*K, L)
    beams.tokens[:, step] = token_of.gather(1, alive_pos).view(-1)
    beams.score = alive_score
    if not bool(done.any()):
        return keep, None
    live = done.logical_not().nonzero().squeeze(1)  # (B'',)
    if live.numel() == 0:
        return None
    beams.select(live)
    return keep.view(nb, k)[live].view(-1), live


def _best_continuations(logprobs: Tensor, score: Tensor, n: int) -> tuple[Tensor, Tensor, Tensor]:
    """The n best continuations of each sentence among its W hypotheses' V tokens, logprobs
    (B', W, V) added to the hypotheses' scores (B', W): their summed scores (B', n), best first,
    the hypothesis (B', n) in [0, W) each continues and its token (B', n). The n best of the
    W x V sums are among each hypothesis' own n best tokens (the score adds the same to all of
    them), so only those W x n sums are made, never the (B', W x V) ones. A tiny vocabulary is
    padded with impossible candidates (-inf, token PAD, hypothesis 0)."""
    nb, width, vocab = logprobs.shape
    per_row = min(n, vocab)
    top, token = kernels.topk(logprobs.view(nb * width, vocab), per_row)  # (B'*W, n') each
    cand = (top.view(nb, width, per_row) + score[:, :, None]).view(nb, width * per_row)
    token = token.view(nb, width * per_row)  # (B', W*n')
    if cand.size(1) < n:
        cand = F.pad(cand, (0, n - cand.size(1)), value=NEG_INF)  # (B', n)
        token = F.pad(token, (0, n - token.size(1)), value=PAD_ID)  # (B', n)
    cand_score, pos = cand.topk(n, dim=1)  # (B', n)
    parent = (pos // per_row).clamp(max=width - 1)  # padding points at a real hypothesis
    return cand_score, parent, token.gather(1, pos)


def decode_batch(
    model: SearchModel,
    src: Tensor,
    cfg: DecodeConfig,
    min_len: int = 0,
    sentences: list[int] | None = None,
) -> list[list[Hypothesis]]:
    """Translate a batch of sources (B, S) with the method in cfg: cfg.nbest hypotheses each,
    at least min_len tokens long (EOS included) unless the max length a * |src| + b is lower.
    `sentences`: the index of each source in the whole input, which seeds its samples (default:
    its row)."""
    max_len = max_lengths(src, cfg.max_len_a, cfg.max_len_b)  # (B,)
    if cfg.method == SearchKind.greedy:
        return [[h] for h in greedy_search(model, src, max_len, min_len, cfg.scores)]
    if cfg.method == SearchKind.sample:
        index = sentences if sentences is not None else list(range(src.size(0)))
        return sample_search(model, src, max_len, cfg, index, min_len)
    return beam_search(model, src, max_len, cfg, min_len)


def pad_sources(seqs: list[list[int]], max_len: int, device: torch.device) -> Tensor:
    """Sources as a (B, S) tensor: each truncated to max_len tokens, then EOS, then padding."""
    rows = [torch.tensor([*s[:max_len], EOS_ID]) for s in seqs]
    return torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=PAD_ID).to(device)
