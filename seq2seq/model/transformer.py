"""The encoder-decoder Transformer (Vaswani et al. 2017): `encode`, `decode` (logits, for the
searches), `forward` (the teacher-forced training loss) and `logits` (teacher-forced logits).

Token ids follow seq2seq.data.tokenizer: PAD_ID marks padding. Sources end in EOS; decoder
inputs start with BOS (teacher forcing: BOS + target, labels: target + EOS).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from torch import Tensor, nn

from seq2seq import kernels
from seq2seq.config.schema import ModelConfig, PosEncodingConfig, TrainConfig
from seq2seq.data.tokenizer import PAD_ID
from seq2seq.model.absolute import Learned, Rotary, Sinusoidal
from seq2seq.model.cache import LayerCache
from seq2seq.model.layers import DecoderLayer, EncoderLayer, LayerSpec, Linear
from seq2seq.model.positional import Offset, PerLayer, PositionalEncoding
from seq2seq.model.relative import ALiBi, Fire, Kerple, ShawRelative, T5Bias


class EncoderDecoder(nn.Module):
    """Encoder-decoder Transformer (Vaswani et al. 2017, "Attention Is All You Need").

    Embeddings are scaled by sqrt(D); the output head is a linear map, optionally tied to the
    target embeddings (Press & Wolf 2017), and the source and target may share one embedding
    matrix when their vocabulary is joint. Word dropout (Gal & Ghahramani 2016, "A Theoretically
    Grounded Application of Dropout in Recurrent Neural Networks"; Sennrich et al. 2016, "Edinburgh
    Neural Machine Translation Systems for WMT 16"), in training only, zeroes whole token
    embeddings before the positions are added.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        src_vocab: int,
        tgt_vocab: int,
        enc_pos: PositionalEncoding,
        dec_pos: PositionalEncoding,
    ) -> None:
        super().__init__()
        spec = LayerSpec(
            cfg.d_model,
            cfg.n_heads,
            cfg.d_ff,
            cfg.dropout,
            cfg.attn_dropout,
            cfg.ffn_dropout,
            cfg.norm_first,
        )
        self.cfg, self.scale = cfg, math.sqrt(cfg.d_model)
        self.src_embed = nn.Embedding(src_vocab, cfg.d_model, padding_idx=PAD_ID)
        if cfg.share_embeddings:
            if src_vocab != tgt_vocab:
                raise ValueError(
                    f"model.share_embeddings needs one vocabulary, got {src_vocab} source and "
                    f"{tgt_vocab} target tokens: set tokenizer.joint=true or share_embeddings=false"
                )
            self.tgt_embed = self.src_embed
        else:
            self.tgt_embed = nn.Embedding(tgt_vocab, cfg.d_model, padding_idx=PAD_ID)
        self.enc_pos, self.dec_pos = enc_pos, dec_pos
        # layer i's self-attention uses pos.layer(i): the stack's encoding or its own tables
        self.encoder = nn.ModuleList(
            EncoderLayer(spec, enc_pos.layer(i)) for i in range(cfg.enc_layers)
        )
        self.decoder = nn.ModuleList(
            DecoderLayer(spec, dec_pos.layer(i)) for i in range(cfg.dec_layers)
        )
        # pre-norm stacks end in a LayerNorm; post-norm layers already end in one
        self.enc_norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()
        self.dec_norm = nn.LayerNorm(cfg.d_model) if cfg.norm_first else nn.Identity()
        self.out = Linear(cfg.d_model, tgt_vocab, bias=False)
        self._init_weights()
        if cfg.tie_output:
            self.out.weight = self.tgt_embed.weight

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for emb in (self.src_embed, self.tgt_embed):
            nn.init.normal_(emb.weight, std=self.cfg.d_model**-0.5)
            nn.init.zeros_(emb.weight[PAD_ID])

    def _embed(
        self,
        ids: Tensor,
        table: nn.Embedding,
        pos: PositionalEncoding,
        offset: Offset,
        word_dropout: float,
    ) -> Tensor:
        x = table(ids) * self.scale  # (B, T, D)
        if word_dropout > 0 and self.training:  # whole tokens' embeddings, positions kept
            keep = kernels.dropout(x.new_ones(x.shape[:-1]).unsqueeze(-1), word_dropout, True)
            x = x * keep  # (B, T, D) times (B, T, 1)
        return kernels.dropout(pos.embed(x, offset), self.cfg.dropout, self.training)

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) ids -> memory (B, S, D) and src_mask (B, S), True at real tokens."""
        src_mask = src.ne(PAD_ID)  # (B, S)
        word_dropout = self.cfg.src_word_dropout
        x = self._embed(src, self.src_embed, self.enc_pos, 0, word_dropout)  # (B, S, D)
        for layer in self.encoder:
            x = layer(x, src_mask)
        return self.enc_norm(x), src_mask

    def decode_states(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        cache: list[LayerCache] | None = None,
    ) -> Tensor:
        """Decoder inputs (N, T) -> the final hidden states (N, T, D), before the output layer.

        memory (B, S, D) and src_mask (B, S) may have one row per sentence for N = B * G decoder
        rows, G hypotheses per sentence in sentence-major order (beam search).
        With a cache (one LayerCache per layer, see `new_cache`), tgt_in holds only the tokens
        not yet seen; positions continue from the cache's length.
        """
        offset = 0 if cache is None else cache[0].offset  # (N,) once rows differ
        word_dropout = self.cfg.tgt_word_dropout
        x = self._embed(tgt_in, self.tgt_embed, self.dec_pos, offset, word_dropout)  # (N, T, D)
        for i, layer in enumerate(self.decoder):
            x = layer(x, memory, src_mask, None if cache is None else cache[i])
        states: Tensor = self.dec_norm(x)  # (N, T, D)
        return states

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        cache: list[LayerCache] | None = None,
    ) -> Tensor:
        """Decoder inputs (N, T) -> logits (N, T, V): `decode_states` through the output layer."""
        logits: Tensor = self.out(self.decode_states(tgt_in, memory, src_mask, cache))  # (N, T, V)
        return logits

    def add_sentences(
        self,
        cache: list[LayerCache],
        memory: Tensor,
        src_mask: Tensor,
        slots: Tensor | None = None,
    ) -> None:
        """Put new sentences, encoder output memory (B', S, D) and src_mask (B', S), in the rows
        `slots` (B',) of `cache` or after its rows (continuous batching: see
        seq2seq/decode/schedule.py); from then on each row decodes from its own position."""
        for layer, layer_cache in zip(self.decoder, cache, strict=True):
            assert isinstance(layer, DecoderLayer)
            layer.add_sentences(memory, src_mask, layer_cache, slots)

    def new_cache(self, capacity: int = 0) -> list[LayerCache]:
        """Empty per-layer key/value caches for incremental decoding, with room for `capacity`
        positions before they grow."""
        return [LayerCache(capacity) for _ in self.decoder]

    def forward(
        self,
        src: Tensor,
        tgt_in: Tensor,
        tgt_out: Tensor,
        label_smoothing: float,
        rdrop_alpha: float = 0.0,
        all_positions: bool = False,
    ) -> tuple[Tensor, Tensor]:
        """Teacher forcing: the summed label-smoothed loss and the summed NLL of the labels
        tgt_out (B, T) for sources (B, S) and decoder inputs (B, T) (BOS + target), over the
        non-pad labels. The output layer and the loss are one kernel (kernels.output_loss), so
        no logits are formed for padding (nor at all on the fused CPU path). Only the loss
        carries a gradient.

        rdrop_alpha > 0: R-Drop (Liang et al. 2021): a second pass of the batch, with its own
        dropout masks, and kernels.rdrop_loss of the two: half the authors' loss, (loss1 + loss2
        + alpha x their symmetric KL) / 2, so that alpha is the authors' and the loss keeps the
        scale of one pass (the NLL is their mean). 0: one pass, exactly as without it.

        all_positions: the same sums, with every (B x T) position passed to the loss kernel and
        the padded labels skipped there, so that no shape depends on the data (torch.compile
        with static shapes reuses one graph per batch shape; see seq2seq/data/buckets.py).
        """
        rows: Tensor | None
        ignore: int | None
        if all_positions:  # every position; the loss kernel skips the padded labels
            rows, target, ignore = None, tgt_out.flatten(), PAD_ID  # target (B T,)
        else:  # the real labels' positions only
            real = tgt_out.ne(PAD_ID)  # (B, T)
            rows, target, ignore = real.flatten().nonzero().squeeze(1), tgt_out[real], None  # (K,)
        kept = self.label_states(src, tgt_in, rows)  # (K, D) or (B T, D)
        weight = self.out.weight  # (V, D)
        if rdrop_alpha == 0:
            return kernels.output_loss(kept, weight, target, label_smoothing, ignore)
        again = self.label_states(src, tgt_in, rows)  # (K, D): the second pass's dropout
        kl_weight = rdrop_alpha / 2  # the mean of the two losses + alpha / 2 x KL
        return kernels.rdrop_loss(kept, again, weight, target, label_smoothing, kl_weight, ignore)

    def label_states(self, src: Tensor, tgt_in: Tensor, rows: Tensor | None) -> Tensor:
        """The final decoder states (K, D) of the flattened (B x T) positions `rows` (K,) of a
        teacher-forced pass over sources (B, S) and decoder inputs (B, T); all of them
        (B x T, D) when `rows` is None."""
        memory, src_mask = self.encode(src)
        hidden = self.decode_states(tgt_in, memory, src_mask).flatten(0, 1)  # (B T, D)
        if rows is None:
            return hidden
        # index_select: its backward (index_add_) is faster on a CPU than a boolean mask's
        return hidden.index_select(0, rows)  # (K, D)

    def logits(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V) for sources (B, S) and decoder inputs (B, T)."""
        memory, src_mask = self.encode(src)
        return self.decode(tgt_in, memory, src_mask)  # (B, T, V)

    def num_params(self) -> int:
        """Trainable parameters, counting shared matrices once."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)


def build_model(cfg: TrainConfig, src_vocab: int, tgt_vocab: int) -> EncoderDecoder:
    """The Transformer, with the encoder and decoder positional encodings from cfg."""
    m = cfg.model
    enc_cfg: PosEncodingConfig = cfg.encoder_pos or cfg.pos_encoding
    dec_cfg: PosEncodingConfig = cfg.decoder_pos or cfg.pos_encoding
    enc_pos = build_positional(enc_cfg, m.d_model, m.n_heads, False, m.enc_layers)
    dec_pos = build_positional(dec_cfg, m.d_model, m.n_heads, True, m.dec_layers)
    return EncoderDecoder(m, src_vocab, tgt_vocab, enc_pos, dec_pos)


Builder = Callable[[PosEncodingConfig, int, int, bool], PositionalEncoding]


# kind -> builder(cfg, d_model, n_heads, causal)
BUILDERS: dict[str, Builder] = {
    "none": lambda c, d, h, causal: PositionalEncoding(),
    "sinusoidal": lambda c, d, h, causal: Sinusoidal(d, c.max_len),
    "learned": lambda c, d, h, causal: Learned(d, c.max_len),
    "rope": lambda c, d, h, causal: Rotary(d // h, c.rope_base),
    "alibi": lambda c, d, h, causal: ALiBi(h, directional=c.alibi_directional and not causal),
    "t5_bias": lambda c, d, h, causal: T5Bias(
        h, causal, c.num_buckets, c.max_distance, 0.0 if c.t5_zero_init else d**-0.5
    ),
    "relative": lambda c, d, h, causal: ShawRelative(d // h, c.clip),
    "kerple": lambda c, d, h, causal: Kerple(h, causal),
    "fire": lambda c, d, h, causal: Fire(h, c.fire_threshold),
}


# kinds with parameters in attention: one set per layer unless pos_encoding.share_layers says
# otherwise (the value here is each paper's choice: True = shared by the stack)
SHARED_BY_DEFAULT = {"relative": False, "t5_bias": True, "kerple": False, "fire": False}


def build_positional(
    cfg: PosEncodingConfig, d_model: int, n_heads: int, causal: bool, n_layers: int = 1
) -> PositionalEncoding:
    """The encoding named by `cfg.kind`, for a stack of n_layers layers of width d_model with
    n_heads heads: one instance for the stack, or `PerLayer` ones (see SHARED_BY_DEFAULT)."""
    kind = getattr(cfg.kind, "value", cfg.kind)
    if kind not in BUILDERS:
        raise ValueError(f"unknown pos_encoding.kind {kind!r}; choose one of {sorted(BUILDERS)}")
    shared = SHARED_BY_DEFAULT.get(kind, True) if cfg.share_layers is None else cfg.share_layers
    if shared or kind not in SHARED_BY_DEFAULT or n_layers == 1:
        return BUILDERS[kind](cfg, d_model, n_heads, causal)
    return PerLayer([BUILDERS[kind](cfg, d_model, n_heads, causal) for _ in range(n_layers)])
