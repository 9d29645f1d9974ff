"""TRICE: transfer from single-source to multi-source sequence generation.

Huang, Li, Xu, Sun, Liu. "Transfer Learning for Sequence Generation: from Single-source to
Multi-source". ACL 2021 (arXiv:2105.14809).

Notation (the paper's, with K sources):
    x_1 .. x_K   the source sentences;  X = [x_1; ...; x_K] their concatenation
    H^c          coarse encoder output: the (pre)trained encoder run over X         §2.3, Eq. (8-9)
    H^f_k        fine encoder output for source k                                     §2.4, Eq. (10-14)
    N_f          number of fine-encoder layers
What this file changes with respect to msgcore.model.Transformer:
    * `encode`: concatenated (coarse) encoding with segment embeddings, split back per source,
      then the fine encoder, where each source attends to all the other sources;
    * the decoder layer's `cross_attend`: separated cross-attention, one shared attention module
      applied to each source with its own mask, averaged (§2.5, Eq. 15-16).
The training stages (§2.2) are recipes: `sample_single_source` builds the stage-1 data and
`from_single_source` starts stage 2 from the stage-1 model with a new, randomly initialised fine
encoder whose parameters get a larger learning rate (`parameter_groups`). Table 5's "FFN adapter"
variant (`AdapterEncoderLayer`) adds new FFNs inside the coarse encoder instead.

As in mBART and the authors' code, a LayerNorm follows the embedding sum (token + position + segment),
in the encoder and in the decoder (`msgcore.embeddings.NormedEmbeddings`); the stand-in pre-training uses the same model.
The new parameters learn at the peak rate `fine_lr`, ten times the base rate in the recipes (authors: 5e-4
against 5e-5).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from msgcore.attention import KV, MultiHeadAttention
from msgcore.batching import concatenate_sources, split_sources
from msgcore.data import Corpus
from msgcore.embeddings import Embeddings, NormedEmbeddings
from msgcore.layers import DecoderLayer, EncoderLayer, EncoderOut, FeedForward, ResidualLayer
from msgcore.model import Decoder, Encoder, Transformer, TransformerConfig, build_embeddings


@dataclass
class TriceConfig(TransformerConfig):
    fine_layers: int = 1  # N_f fine-encoder layers; 0 = no fine encoder (Table 5)
    fine_cross_attention: bool = True  # False = fine layers without cross-source attention (Table 5 "w/o CA")
    separated_cross_attention: bool = True  # False = one cross-attention over all sources joined (Table 6)
    concatenated_encoding: bool = True  # False = the coarse encoder reads each source alone (Table 6)
    segment_embedding: bool = True  # add E_seg[k] to the tokens of source k (Table 6)
    restart_positions: bool = True  # positions count from 0 in each source (authors' code); False = the packed
    #                                 sources are one long sequence with continuous positions (DualBART)
    encoder_adapters: bool = False  # Table 5 "FFN adapter": an extra FFN sub-layer in every coarse encoder layer
    embedding_norm: bool = True  # LayerNorm after token + position + segment embeddings (mBART, authors' code)
    base_lr: float = 5e-5  # the peak learning rate the trainer uses for this run (authors: 5e-5)
    fine_lr: float = 5e-4  # absolute peak learning rate of the new (stage-2) parameters (authors: 5e-4)


# DualBART (Table 3) and APE's concatenation baseline: the pre-trained model reading the K sources as one long
# sequence: no fine encoder, one cross-attention over it, no segment embedding, continuous positions.
ONE_LONG_SEQUENCE = dict(fine_layers=0, separated_cross_attention=False, segment_embedding=False,
                         restart_positions=False)


def join_sources(outs: list[EncoderOut]) -> EncoderOut:
    """Concatenate encoded sources along the length axis (padding kept, masked)."""
    return EncoderOut(torch.cat([o.hidden for o in outs], 1), torch.cat([o.mask for o in outs], 1))


def trice_embeddings(cfg: TriceConfig, token_embedding: nn.Embedding) -> Embeddings:
    """The embedding block of a TRICE stack: with the embedding LayerNorm unless `cfg.embedding_norm` is off."""
    plain = build_embeddings(cfg, token_embedding)
    if not cfg.embedding_norm:
        return plain
    return NormedEmbeddings(token_embedding, plain.positions, cfg.dropout, cfg.segment_stride)


class FineEncoderLayer(ResidualLayer):
    """One fine-encoder layer (§2.4), run over all K sources at once: self-attention (Eq. 11), then each
    source's cross-attention to the other sources' self-attention outputs B (Eq. 12-13), then the FFN (Eq. 14).

    # Deviation: the paper states K = 2 (source 1 attends to source 2 and vice versa). For any K,
    # source k attends to the concatenation of all other sources, with their padding masks.
    In pre-norm the cross-attention normalises its keys and values with the same LayerNorm as its queries
    (they are all the sub-layer's input B); in post-norm B is already normalised, as in the authors' code.
    """

    def __init__(self, cfg: TriceConfig):
        super().__init__(cfg.d_model, cfg.dropout, cfg.pre_norm)
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.self_attn_norm, self.ffn_norm = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)
        if cfg.fine_cross_attention:  # Table 5 "w/o CA" builds no cross-attention (its parameters are not counted)
            self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
            self.cross_attn_norm = nn.LayerNorm(cfg.d_model)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation_dropout)
        self.use_cross_attention = cfg.fine_cross_attention

    def forward(self, states: list[Tensor], masks: list[Tensor],
                need_weights: bool = False) -> tuple[list[Tensor], list[Tensor | None]]:
        """states[k] (B, S_k, D) with masks[k] (B, S_k), True = real token. Returns A^(i) per source and, per
        source, its weights over the other sources joined (None without cross-attention or when K = 1)."""
        selfs = [self.self_attend(x, mask) for x, mask in zip(states, masks)]  # B_k^(i), Eq. (11)
        crossed, weights = [], []
        for k, (b, mask) in enumerate(zip(selfs, masks)):
            others = [EncoderOut(o, m) for j, (o, m) in enumerate(zip(selfs, masks)) if j != k]
            c, w = self.cross_attend(b, join_sources(others) if others else None, need_weights)  # Eq. (12-13)
            crossed.append(self.after(c, self.ffn(self.before(c, self.ffn_norm)), self.ffn_norm))  # Eq. (14)
            weights.append(w)
        return crossed, weights

    def self_attend(self, x: Tensor, mask: Tensor) -> Tensor:
        h, _, _ = self.self_attn(self.before(x, self.self_attn_norm), mask=mask[:, None, None, :])
        return self.after(x, h, self.self_attn_norm)  # Eq. (11)

    def cross_attend(self, b: Tensor, others: EncoderOut | None, need_weights: bool) -> tuple[Tensor, Tensor | None]:
        """C_k = CrossAtt(B_k, O_\\k, O_\\k): `others` holds the other sources' B, joined (Eq. 12)."""
        if not self.use_cross_attention or others is None:
            return b, None
        keys = self.before(others.hidden, self.cross_attn_norm)
        h, _, weights = self.cross_attn(self.before(b, self.cross_attn_norm), keys, others.mask[:, None, None, :],
                                        need_weights=need_weights)
        return self.after(b, h, self.cross_attn_norm), weights  # Eq. (13)


class FineEncoder(nn.Module):
    """N_f fine layers over the coarse outputs of the K sources; the same weights serve every source."""

    def __init__(self, cfg: TriceConfig):
        super().__init__()
        self.layers = nn.ModuleList(FineEncoderLayer(cfg) for _ in range(cfg.fine_layers))
        self.final_norm = nn.LayerNorm(cfg.d_model) if cfg.pre_norm else nn.Identity()

    def forward(self, coarse: list[EncoderOut], need_weights: bool = False):
        """Returns one EncoderOut per source and, per layer, each source's cross-source weights."""
        states, masks, attention = [o.hidden for o in coarse], [o.mask for o in coarse], []
        for layer in self.layers:
            states, layer_weights = layer(states, masks, need_weights)  # A^(i) from A^(i-1), Eq. (11-14)
            attention.append(layer_weights)
        outs = [EncoderOut(self.final_norm(h), mask) for h, mask in zip(states, masks)]
        return outs, attention


class AdapterEncoderLayer(EncoderLayer):
    """Table 5's "FFN adapter" alternative to the fine encoder: a new FFN sub-layer (with its own
    residual and norm) after the pre-trained FFN of each coarse encoder layer. No cross-source
    attention: the sources only meet in the coarse encoder's self-attention.

    # Deviation: each adapter is the model's own FFN size (d_ff), so the adapters add about as many parameters as
    # the fine encoder; the paper's add 6 times as many (Table 5: 100.7M against 16.8M for N_f = 1)."""

    def __init__(self, cfg: TriceConfig):
        super().__init__(cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.dropout, cfg.attention_dropout,
                         cfg.activation_dropout, cfg.pre_norm)
        self.adapter = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation_dropout)
        self.adapter_norm = nn.LayerNorm(cfg.d_model)

    def forward(self, x: Tensor, mask: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        x, weights = super().forward(x, mask, need_weights)
        return self.after(x, self.adapter(self.before(x, self.adapter_norm)), self.adapter_norm), weights


class TriceEncoder(Encoder):
    def __init__(self, cfg: TriceConfig, token_embedding: nn.Embedding):
        super().__init__(cfg, token_embedding)
        self.embed = trice_embeddings(cfg, token_embedding)

    def build_layer(self, cfg: TriceConfig, index: int) -> nn.Module:
        return AdapterEncoderLayer(cfg) if cfg.encoder_adapters else super().build_layer(cfg, index)


class SeparatedCrossAttentionLayer(DecoderLayer):
    """Decoder layer whose cross-attention reads each source separately (§2.5).

    z_k = CrossAttn(s, H^f_k) with source k's mask (Eq. 15); z = (1/K) sum_k z_k (Eq. 16).
    One module, shared by all sources; its K/V cache holds one (k, v) per source.
    """

    def cross_attend(self, x: Tensor, memory: list[EncoderOut], cross_kv: list[KV] | None,
                     need_weights: bool) -> tuple[Tensor, list[KV], Tensor | None]:
        outputs, caches, weights = [], [], []
        for k, source in enumerate(memory):
            h, kv, w = self.cross_attn(x, source.hidden, source.mask[:, None, None, :],
                                       cross_kv[k] if cross_kv else None, need_weights=need_weights)  # Eq. (15)
            outputs.append(h)
            caches.append(kv)
            weights.append(w)
        mean = torch.stack(outputs).mean(0)  # Eq. (16)
        return mean, caches, torch.cat(weights, -1) if need_weights else None


class TriceDecoder(Decoder):
    def __init__(self, cfg: TriceConfig, token_embedding: nn.Embedding):
        super().__init__(cfg, token_embedding)
        self.embed = trice_embeddings(cfg, token_embedding)

    def build_layer(self, cfg: TriceConfig, index: int) -> nn.Module:
        layer_class = SeparatedCrossAttentionLayer if cfg.separated_cross_attention else DecoderLayer
        return layer_class(cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.dropout, cfg.attention_dropout,
                           cfg.activation_dropout, cfg.pre_norm)


class TriceTransformer(Transformer):
    """Coarse encoder + fine encoder + decoder with separated cross-attention."""

    config_class = TriceConfig

    def __init__(self, cfg: TriceConfig):
        super().__init__(cfg)
        self.fine_encoder = FineEncoder(cfg) if cfg.fine_layers > 0 else None
        self.reset_linear_parameters()  # again, now that the fine encoder exists

    def build_encoder(self, cfg: TriceConfig) -> nn.Module:
        return TriceEncoder(cfg, self.token_embedding if cfg.tie_embeddings else self.new_embedding(cfg))

    def build_decoder(self, cfg: TriceConfig) -> nn.Module:
        return TriceDecoder(cfg, self.token_embedding)

    def coarse_encode(self, sources: list[Tensor], source_masks: list[Tensor]) -> list[EncoderOut]:
        """H^c: the concatenated sources through the (pre)trained encoder, split back per source."""
        if not self.cfg.concatenated_encoding:
            return [self.encoder(tokens, mask) for tokens, mask in zip(sources, source_masks)]
        tokens, segments, positions, mask = concatenate_sources(sources, source_masks, self.cfg.pad_id)
        # Positions restart at 0 for each source (authors' code); Eq. (8) adds E_seg[k]. DualBART reads the
        # sources as one long sequence instead: continuous positions, the only cue without a segment embedding.
        if not self.cfg.restart_positions:
            positions = (mask.cumsum(1) - 1).clamp(min=0) * mask  # (B, S) 0 .. len-1 across the sources
        # With one source there is nothing to tell apart: no segment embedding, a plain seq2seq model.
        segments = segments if self.cfg.segment_embedding and len(sources) > 1 else None
        packed = self.encoder(tokens, mask, positions=positions, segment_ids=segments)  # Eq. (9)
        hidden = split_sources(packed.hidden, source_masks)  # Eq. (10)
        return [EncoderOut(h, m) for h, m in zip(hidden, source_masks)]

    def encode(self, sources: list[Tensor], source_masks: list[Tensor]) -> list[EncoderOut]:
        outs = self.coarse_encode(sources, source_masks)
        if self.fine_encoder is not None:
            outs, _ = self.fine_encoder(outs)
        return outs if self.cfg.separated_cross_attention else [join_sources(outs)]

    def cross_source_attention(self, sources: list[Tensor], source_masks: list[Tensor]) -> list[list[Tensor]]:
        """The fine encoder's cross-source attention weights, per layer and source: each
        (B, H, S_k, sum of the other sources' lengths). For the chapter's heatmap."""
        if self.fine_encoder is None:
            raise ValueError("this model has no fine encoder (fine_layers=0)")
        _, weights = self.fine_encoder(self.coarse_encode(sources, source_masks), need_weights=True)
        return weights

    def new_parameter_names(self) -> list[str]:
        """Parameters that stage 2 adds to the stage-1 model: the fine encoder, or the adapters."""
        return [name for name, _ in self.named_parameters() if is_new_parameter(name)]

    def parameter_groups(self) -> list[dict]:
        """The stage-2 parameters are new: they learn at the peak rate `fine_lr` (authors' code: 5e-4 against
        5e-5). The trainer multiplies its peak lr (`base_lr`) by `lr_scale`, hence the ratio."""
        new = set(self.new_parameter_names())
        named = list(self.named_parameters())
        groups = [{"params": [p for n, p in named if n not in new], "lr_scale": 1.0}]
        if new:
            groups.append({"params": [p for n, p in named if n in new],
                           "lr_scale": self.cfg.fine_lr / self.cfg.base_lr})
        return groups


def is_new_parameter(name: str) -> bool:
    return name.startswith("fine_encoder.") or ".adapter" in name


def from_single_source(single: Transformer, cfg: TriceConfig) -> TriceTransformer:
    """Stage 2 (§2.2): copy the stage-1 model into a TRICE model; the fine encoder starts random."""
    model = TriceTransformer(cfg)
    missing, unexpected = model.load_state_dict(single.state_dict(), strict=False)
    if unexpected or any(not is_new_parameter(name) for name in missing):
        raise ValueError(f"stage-1 model does not match: missing {missing[:3]}, unexpected {unexpected[:3]}")
    return model


def sample_single_source(corpus: Corpus, seed: int = 0) -> Corpus:
    """Stage-1 data (§2.2): each K-source example keeps one source, drawn with probability 1/K."""
    rng = random.Random(f"trice-ssg:{seed}")
    picks = [rng.randrange(corpus.num_sources) for _ in range(len(corpus))]
    column = [corpus.sources[k][i] for i, k in enumerate(picks)]
    return Corpus(corpus.name, corpus.split, ("any",), corpus.target_lang, [column], corpus.target)
