"""The encoder-decoder Transformer: `encode`, `decode` and `forward`.

Token ids follow seq2seq.tokenizer: PAD_ID marks padding. Sources end in EOS; decoder inputs start
with BOS (teacher forcing: BOS + target, labels: target + EOS).
"""

from __future__ import annotations

import math

from torch import Tensor, nn

from seq2seq import kernels
from seq2seq.config import ModelConfig
from seq2seq.layers import DecoderLayer, EncoderLayer, LayerCache, LayerSpec, Linear
from seq2seq.positional import PositionalEncoding
from seq2seq.tokenizer import PAD_ID


class EncoderDecoder(nn.Module):
    """Encoder-decoder Transformer (Vaswani et al. 2017, "Attention Is All You Need").

    Embeddings are scaled by sqrt(D); the output head is a linear map, optionally tied to the
    target embeddings (Press & Wolf 2017), and the source and target may share one embedding
    matrix when their vocabulary is joint.
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
        self, ids: Tensor, table: nn.Embedding, pos: PositionalEncoding, offset: int
    ) -> Tensor:
        x = table(ids) * self.scale  # (B, T, D)
        return kernels.dropout(pos.embed(x, offset), self.cfg.dropout, self.training)

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) ids -> memory (B, S, D) and src_mask (B, S), True at real tokens."""
        src_mask = src.ne(PAD_ID)  # (B, S)
        x = self._embed(src, self.src_embed, self.enc_pos, 0)  # (B, S, D)
        for layer in self.encoder:
            x = layer(x, src_mask)
        return self.enc_norm(x), src_mask

    def decode(
        self,
        tgt_in: Tensor,
        memory: Tensor,
        src_mask: Tensor,
        cache: list[LayerCache] | None = None,
        hidden: bool = False,
    ) -> Tensor:
        """Decoder inputs (N, T) -> logits (N, T, V), or the final hidden states (N, T, D) before
        the output layer when `hidden`.

        memory (B, S, D) and src_mask (B, S) may have one row per sentence for N = B * G decoder
        rows, G hypotheses per sentence in sentence-major order (beam search).
        With a cache (one LayerCache per layer, see `new_cache`), tgt_in holds only the tokens
        not yet seen; positions continue from the cache's length.
        """
        offset = 0 if cache is None else cache[0].length
        x = self._embed(tgt_in, self.tgt_embed, self.dec_pos, offset)  # (N, T, D)
        for i, layer in enumerate(self.decoder):
            x = layer(x, memory, src_mask, None if cache is None else cache[i])
        x = self.dec_norm(x)  # (N, T, D)
        return x if hidden else self.out(x)  # (N, T, D) or (N, T, V)

    def new_cache(self, capacity: int = 0) -> list[LayerCache]:
        """Empty per-layer key/value caches for incremental decoding, with room for `capacity`
        positions before they grow."""
        return [LayerCache(capacity) for _ in self.decoder]

    def forward(self, src: Tensor, tgt_in: Tensor, keep: Tensor | None = None) -> Tensor:
        """Teacher-forced logits (B, T, V) for sources (B, S) and decoder inputs (B, T).

        Given `keep` (B, T), the decoder's final hidden states (K, D) at its K True positions
        come back instead, for a loss that applies the output layer `self.out` itself
        (kernels.output_loss, as training does).
        """
        memory, src_mask = self.encode(src)
        if keep is None:
            return self.decode(tgt_in, memory, src_mask)
        hidden = self.decode(tgt_in, memory, src_mask, hidden=True)  # (B, T, D)
        rows = keep.flatten().nonzero().squeeze(1)  # (K,)
        # index_select: its backward (index_add_) is faster on a CPU than a boolean mask's
        return hidden.flatten(0, 1).index_select(0, rows)  # (K, D)

    def num_params(self) -> int:
        """Trainable parameters, counting shared matrices once."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)
