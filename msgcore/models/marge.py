"""MARGE: a multilingual autoencoder that retrieves and reconstructs (pre-training via paraphrasing).

Lewis, Ghazvininejad, Ghosh, Aghajanyan, Wang, Zettlemoyer. "Pre-training via Paraphrasing".
NeurIPS 2020 (arXiv:2006.15020). §2.1 overview, §2.2 relevance scores, §2.3 reconstruction model,
§3 architecture. Batch construction (§2.4) lives in msgcore/retrieval.py.

Notation (the paper's):
    x_1 .. x_N   target documents;  z_1 .. z_M evidence documents (a batch holds both; a document
                 can be a target and evidence at once, Eq. 1 keeps it from reading itself)
    g(x)         document embedding from the first L_r encoder layers (the relevance model)
    f(x, z)      relevance: the cosine of g(x) and g(z), -inf when x = z                  Eq. (1)
    beta         a trainable scalar that scales f inside the cross-attention logits       Eq. (4)
What this file changes with respect to msgcore.model.Transformer:
    * the encoder also returns g (`MargeEncoder.forward_with_relevance`), from the same pass;
    * the decoder starts with self-attention-only layers, then layers whose cross-attention
      reads ALL evidence documents concatenated, with beta * f(x_i, z_j) added to the logits
      of every token of z_j (Eq. 4). The bias goes through the core attention module as a
      generic float mask (msgcore.attention.additive_mask); it is the only path by which the
      reconstruction loss reaches g (no contrastive loss, §2.2);
    * `MargeBatch`: a set of documents, some of which are targets; `loss` reconstructs each
      target from the others. A plain `Batch` (ordinary seq2seq, fine-tuning, zero-shot
      translation) goes through the core paths with no bias.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from msgcore.attention import KV, MultiHeadAttention, additive_mask
from msgcore.batching import map_tensors
from msgcore.layers import DecoderLayer, EncoderOut, FeedForward, LayerCache, ResidualLayer
from msgcore.model import Decoder, Encoder, Transformer, TransformerConfig
from msgcore.utils import MsgcoreError


@dataclass
class MargeConfig(TransformerConfig):
    relevance_layers: int = 2  # L_r: g comes from the first L_r encoder layers (paper: 4 of 12, §3)
    relevance_pooling: str = "bos"  # "bos": the state at position 0 (§3); "mean": mean over real tokens
    decoder_self_only_layers: int = 1  # the first decoder layers have no cross-attention (paper: 4, §3)
    decoder_d_ff: int = 0  # FFN width of the decoder layers with cross-attention; 0 = d_ff (paper: 4x, §3)
    beta_init: float = 1.0  # initial beta of every cross-attention layer (lucidrains/marge-pytorch)
    # Measured on the toy corpus (tests/test_marge.py): at d=64 the cosines of a random encoder lie within
    # ~0.04 of each other (BOS: mean 0.93), so beta = 1 barely moves the attention and g learns slowly;
    # beta_init = 10 learns retrieval within 800 updates. Log `betas()` and the spread of f.


# ---- the relevance model (§2.2) ----------------------------------------------------------------------

def relevance(g_x: Tensor, g_z: Tensor, same: Tensor) -> Tensor:
    """f(x_i, z_j) for unit vectors g_x (N, D) and g_z (M, D); same (N, M) bool marks x_i = z_j.

    Returns (N, M): the cosine in [-1, 1], -inf where the evidence is the target itself.
    """
    return (g_x @ g_z.T).masked_fill(same, float("-inf"))  # Eq. (1)


def pool(x: Tensor, mask: Tensor, how: str) -> Tensor:
    """(B, S, D) states -> (B, D) unit document embeddings g."""
    if how == "bos":
        g = x[:, 0]  # (B, D): the beginning-of-sentence token (§3)
    elif how == "mean":
        # Deviation: the paper uses BOS for f; mean pooling is its choice for sentence retrieval (§4.1).
        g = (x * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)  # (B, D)
    else:
        raise MsgcoreError(f"unknown relevance_pooling {how!r}; use 'bos' or 'mean'")
    # Deviation: L2-normalised so that a dot product is the cosine (lucidrains); no extra LayerNorm.
    return F.normalize(g.float(), dim=-1).to(x.dtype)


class MargeEncoder(Encoder):
    """The encoder; its first L_r layers are also the relevance model g (shared parameters, §3)."""

    def forward_with_relevance(self, tokens: Tensor, mask: Tensor) -> tuple[EncoderOut, Tensor]:
        """tokens (B, S), mask (B, S) -> (EncoderOut, g (B, D)) in one pass; g keeps its gradient."""
        x = self.embed(tokens)  # (B, S, D)
        attn_mask = mask[:, None, None, :]  # (B, 1, 1, S)
        g = None
        for depth, layer in enumerate(self.layers, start=1):
            x, _ = layer(x, attn_mask)
            if depth == self.relevance_layers:
                g = pool(x, mask, self.relevance_pooling)  # (B, D)
        return EncoderOut(self.final_norm(x), mask), g

    @torch.no_grad()
    def embed_documents(self, tokens: Tensor, mask: Tensor) -> Tensor:
        """g (B, D) alone, running only the first L_r layers (for indexing, §2.4)."""
        x = self.embed(tokens)
        for layer in self.layers[:self.relevance_layers]:
            x, _ = layer(x, mask[:, None, None, :])
        return pool(x, mask, self.relevance_pooling)


# ---- the reconstruction model (§2.3) -----------------------------------------------------------------

@dataclass
class BiasedEncoderOut(EncoderOut):
    """Evidence for a batch of targets: all documents concatenated, with each key's relevance.

    hidden (B, S, D) and mask (B, S) as in EncoderOut; S = sum of the evidence lengths. The mask is
    False on padding and on the target's own document. relevance (B, S) is f(x_b, z_j) repeated
    over the tokens of z_j (0 where masked, so that beta * relevance stays finite).
    """

    relevance: Tensor  # (B, S) float

    def index_select(self, index: Tensor) -> "BiasedEncoderOut":
        """Rows `index` (beam search repeats each target once per beam); the bias follows."""
        return BiasedEncoderOut(self.hidden.index_select(0, index), self.mask.index_select(0, index),
                                self.relevance.index_select(0, index))


def shared_keys_values(attn: MultiHeadAttention, hidden: Tensor) -> KV | None:
    """K/V of a memory whose rows are one expanded tensor (stride 0): computed once, then expanded.

    In a MARGE batch every target reads the same concatenated evidence, so projecting it N times
    would be wasted work. Returns None for an ordinary memory (the attention computes K/V itself).
    """
    if hidden.size(0) == 1 or hidden.stride(0) != 0:
        return None
    k, v = attn.keys_values(hidden[:1], hidden[:1], None)  # (1, H, S, Dh) each
    return k.expand(hidden.size(0), -1, -1, -1), v.expand(hidden.size(0), -1, -1, -1)  # (B, H, S, Dh)


class RelevanceCrossLayer(DecoderLayer):
    """A decoder layer whose cross-attention logits to the tokens of z_j get + beta * f(x_i, z_j)."""

    def __init__(self, cfg: MargeConfig):
        super().__init__(cfg.d_model, cfg.n_heads, cfg.decoder_d_ff or cfg.d_ff, cfg.dropout,
                         cfg.attention_dropout, cfg.activation_dropout, cfg.pre_norm)
        # Deviation: one beta per cross-attention layer, shared by its heads, starting at `cfg.beta_init` (the
        # config's default 1.0 is lucidrains'; the book's scales start at 10); the paper says "a trainable scalar
        # parameter".
        self.beta = nn.Parameter(torch.tensor(float(cfg.beta_init)))

    def cross_attend(self, x: Tensor, memory: list[EncoderOut], cross_kv: list[KV] | None,
                     need_weights: bool) -> tuple[Tensor, list[KV], Tensor | None]:
        """x (B, T, D); memory = [one EncoderOut over all evidence]. Returns (B, T, D), [kv], weights."""
        if len(memory) != 1:
            raise MsgcoreError(f"MARGE's decoder reads 1 concatenated memory, got {len(memory)}")
        source = memory[0]
        mask = source.mask[:, None, None, :]  # (B, 1, 1, S) bool
        if isinstance(source, BiasedEncoderOut):
            bias = self.beta * source.relevance[:, None, None, :]  # (B, 1, 1, S), constant over heads and queries
            mask = additive_mask(mask, bias.to(x.dtype))  # Eq. (4): Q K^T / sqrt(d) + beta f(x_i, z_j)
        kv = cross_kv[0] if cross_kv else shared_keys_values(self.cross_attn, source.hidden)
        h, kv, weights = self.cross_attn(x, source.hidden, mask, kv, need_weights=need_weights)  # Eq. (4): softmax
        return h, [kv], weights


class SelfOnlyDecoderLayer(ResidualLayer):
    """The decoder's base layers: causal self-attention and FFN, no cross-attention (§3)."""

    def __init__(self, cfg: MargeConfig):
        super().__init__(cfg.d_model, cfg.dropout, cfg.pre_norm)
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation_dropout)  # paper: the encoder's width
        self.self_attn_norm, self.ffn_norm = nn.LayerNorm(cfg.d_model), nn.LayerNorm(cfg.d_model)

    def forward(self, x: Tensor, memory: list[EncoderOut], cache: LayerCache | None = None,
                need_weights: bool = False) -> tuple[Tensor, LayerCache, None]:
        """x (B, T, D); `memory` is ignored. Returns x, the cache (self K/V only) and no weights."""
        cache = cache or LayerCache()
        h, self_kv, _ = self.self_attn(self.before(x, self.self_attn_norm), cache=cache.self_kv, causal=True)
        x = self.after(x, h, self.self_attn_norm)
        x = self.after(x, self.ffn(self.before(x, self.ffn_norm)), self.ffn_norm)
        return x, LayerCache(self_kv, None), None


class MargeDecoder(Decoder):
    """cfg.decoder_layers layers in all: the first `decoder_self_only_layers` without cross-attention."""

    def build_layer(self, cfg: MargeConfig, index: int) -> nn.Module:
        return SelfOnlyDecoderLayer(cfg) if index < cfg.decoder_self_only_layers else RelevanceCrossLayer(cfg)


# ---- batches of documents ----------------------------------------------------------------------------

@dataclass(repr=False)
class MargeBatch:
    """M documents, N of which are targets (§2.1). Every document is evidence for every target but itself."""

    docs: Tensor  # (M, S) long: [bos] + pieces + [eos], padded with pad_id
    doc_mask: Tensor  # (M, S) bool, True = real token
    doc_ids: Tensor  # (M,) long: content ids; equal ids = the same text (never evidence for each other)
    target_rows: Tensor  # (N,) long: which documents are targets (rows of `docs`)
    target_in: Tensor  # (N, T) long: [language tag of the target] + pieces, the decoder input (§3)
    target_out: Tensor  # (N, T) long: pieces + [eos], padded with pad_id
    target_mask: Tensor  # (N, T) bool
    indices: list[int] = field(default_factory=list)  # corpus indices of the M documents
    pad_id: int = 0

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "MargeBatch":
        return map_tensors(self, lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> "MargeBatch":
        return map_tensors(self, torch.Tensor.pin_memory)

    def __len__(self) -> int:
        return self.target_rows.numel()

    def __repr__(self) -> str:
        return f"MargeBatch({self.docs.size(0)} documents, {len(self)} targets, target={tuple(self.target_in.shape)})"

    @property
    def num_target_tokens(self) -> int:
        return int(self.target_mask.sum())


def pad(rows: list[list[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Ragged id lists -> (len(rows), longest) long tensor and its bool mask."""
    width = max(len(r) for r in rows)
    tokens = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        tokens[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    return tokens, tokens != pad_id


def collate_documents(pieces: list[list[int]], members: list[int], targets: list[int], prefixes: list[int],
                      content_ids: list[int], bos_id: int, eos_id: int, pad_id: int = 0) -> MargeBatch:
    """A MargeBatch from corpus-level lists.

    pieces[i]: document i's pieces (no bos/eos); prefixes[i]: its language tag id, the first decoder
    input when it is a target; content_ids[i]: equal for documents with identical text.
    members: the batch's documents (corpus indices); targets: those of them to reconstruct.
    """
    row_of = {doc: row for row, doc in enumerate(members)}
    docs, doc_mask = pad([[bos_id, *pieces[d], eos_id] for d in members], pad_id)  # (M, S)
    target_in, _ = pad([[prefixes[t], *pieces[t]] for t in targets], pad_id)  # (N, T)
    target_out, target_mask = pad([[*pieces[t], eos_id] for t in targets], pad_id)  # (N, T)
    return MargeBatch(docs, doc_mask, torch.tensor([content_ids[d] for d in members]),
                      torch.tensor([row_of[t] for t in targets]), target_in, target_out, target_mask,
                      list(members), pad_id)


# ---- the model ---------------------------------------------------------------------------------------

class MargeTransformer(Transformer):
    """Encoder (its first L_r layers = the relevance model) + decoder with relevance-biased cross-attention."""

    config_class = MargeConfig

    def __init__(self, cfg: MargeConfig):
        if not 1 <= cfg.relevance_layers <= cfg.encoder_layers:
            raise MsgcoreError(f"relevance_layers={cfg.relevance_layers} must be in 1..{cfg.encoder_layers}")
        if not 0 <= cfg.decoder_self_only_layers < cfg.decoder_layers:
            raise MsgcoreError(f"decoder_self_only_layers={cfg.decoder_self_only_layers} must leave at least "
                               f"one of the {cfg.decoder_layers} decoder layers with cross-attention")
        if cfg.relevance_pooling not in ("bos", "mean"):
            raise MsgcoreError(f"unknown relevance_pooling {cfg.relevance_pooling!r}; use 'bos' or 'mean'")
        super().__init__(cfg)

    def build_encoder(self, cfg: MargeConfig) -> nn.Module:
        encoder = MargeEncoder(cfg, self.token_embedding if cfg.tie_embeddings else self.new_embedding(cfg))
        encoder.relevance_layers, encoder.relevance_pooling = cfg.relevance_layers, cfg.relevance_pooling
        return encoder

    def build_decoder(self, cfg: MargeConfig) -> nn.Module:
        return MargeDecoder(cfg, self.token_embedding)

    def betas(self) -> list[float]:
        """beta of each cross-attention layer, bottom to top (worth logging over training)."""
        return [layer.beta.item() for layer in self.decoder.layers if isinstance(layer, RelevanceCrossLayer)]

    def embed_documents(self, tokens: Tensor, mask: Tensor) -> Tensor:
        """g (B, D), unit vectors, no gradient: what the index is built from (§2.4)."""
        return self.encoder.embed_documents(tokens, mask)

    def encode(self, sources: list[Tensor], source_masks: list[Tensor]) -> list[EncoderOut]:
        """Plain path (fine-tuning, zero-shot translation): each source is one evidence document.

        # Deviation: with no target there is no f. With K sources they are encoded
        # separately and concatenated with a constant f, which the softmax ignores (as lucidrains'
        # default similarities = 1); so no bias at all.
        """
        outs = [self.encoder(tokens, mask) for tokens, mask in zip(sources, source_masks)]
        if len(outs) == 1:
            return outs
        return [EncoderOut(torch.cat([o.hidden for o in outs], 1), torch.cat([o.mask for o in outs], 1))]

    def encode_evidence(self, batch: MargeBatch) -> tuple[BiasedEncoderOut, Tensor]:
        """Encode every document once; the memory of each target and the relevance f (N, M)."""
        out, g = self.encoder.forward_with_relevance(batch.docs, batch.doc_mask)  # (M, S, D), (M, D)
        M, S, D = out.hidden.shape
        N = batch.target_rows.numel()
        same = batch.doc_ids[batch.target_rows][:, None] == batch.doc_ids[None, :]  # (N, M) x_i = z_j
        f = relevance(g[batch.target_rows], g, same)  # Eq. (1): (N, M)
        hidden = out.hidden.reshape(1, M * S, D).expand(N, -1, -1)  # (N, M*S, D): z_1..M concatenated (§2.3)
        mask = (batch.doc_mask[None] & ~same[:, :, None]).reshape(N, M * S)  # (N, M*S)
        bias = f.masked_fill(same, 0.0)[:, :, None].expand(N, M, S).reshape(N, M * S)  # (N, M*S) f over z_j's tokens
        return BiasedEncoderOut(hidden, mask, bias), f

    def forward(self, batch) -> Tensor:
        """Teacher-forced logits (N, T, V): each target reconstructed from the other documents (Eq. 2)."""
        if not isinstance(batch, MargeBatch):
            return super().forward(batch)
        memory, _ = self.encode_evidence(batch)
        return self.decode(batch.target_in, [memory]).logits  # the core `loss` sums -log p(x_i | z, f): Eq. (2)

    def freeze_for_zero_shot_transfer(self) -> None:
        """§3: zero-shot cross-lingual transfer freezes the word embeddings and the self-only decoder layers."""
        self.token_embedding.weight.requires_grad_(False)
        for layer in self.decoder.layers:
            if isinstance(layer, SelfOnlyDecoderLayer):
                layer.requires_grad_(False)
