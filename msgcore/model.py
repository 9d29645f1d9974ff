"""The sequence-to-sequence Transformer (Vaswani et al. 2017, arXiv:1706.03762, §3 and Figure 1).

Read top to bottom: the config and its presets, the encoder, the decoder, the model.

Hooks that the papers' models override (one small file each in msgcore/models/):
    Encoder.build_layer / Decoder.build_layer   swap in another layer class
    DecoderLayer.cross_attend (layers.py)       how the decoder reads the encoded sources
    Transformer.encode                          how the K sources are encoded (one EncoderOut each)
    Transformer.generate                        how a batch is translated (a non-autoregressive model)
    Transformer.build_encoder / build_decoder   replace a whole stack
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor, nn

from msgcore.embeddings import Embeddings, LearnedPositions, SinusoidalPositions
from msgcore.generation import GenerationConfig, generate
from msgcore.layers import DecoderLayer, EncoderLayer, EncoderOut, LayerCache
from msgcore.loss import label_smoothed_cross_entropy
from msgcore.tokenizer import Tokenizer
from msgcore.utils import MsgcoreError


@dataclass
class TransformerConfig:
    vocab_size: int = 8000  # joint source/target sentencepiece vocabulary
    d_model: int = 256  # model width D
    n_heads: int = 4  # attention heads H (D must divide by H)
    d_ff: int = 1024  # inner width of the feed-forward sub-layer
    encoder_layers: int = 3  # N in the encoder stack
    decoder_layers: int = 3  # N in the decoder stack
    dropout: float = 0.1  # P_drop on embeddings and sub-layer outputs (§5.4)
    attention_dropout: float = 0.0  # dropout on attention weights
    activation_dropout: float = 0.0  # dropout inside the FFN, after the ReLU (fairseq's default 0)
    pre_norm: bool = True  # LayerNorm before each sub-layer (False = the paper's post-norm)
    positions: str = "sinusoidal"  # "sinusoidal" (§3.5) or "learned"
    max_positions: int = 1024  # longest sequence the position table covers
    tie_embeddings: bool = True  # one matrix for source/target embeddings and the output layer (§3.4)
    segment_stride: int = 1000  # TRICE segment sinusoid evaluated at k * stride for source k
    pad_id: int = 0  # padding token id

    def to_dict(self) -> dict:
        return asdict(self)


PRESETS: dict[str, dict] = {
    "tiny": dict(d_model=128, n_heads=4, d_ff=512, encoder_layers=2, decoder_layers=2),
    "small": dict(d_model=256, n_heads=4, d_ff=1024, encoder_layers=3, decoder_layers=3),
    "base": dict(d_model=512, n_heads=8, d_ff=2048, encoder_layers=6, decoder_layers=6),
}


def preset(name: str, **overrides) -> TransformerConfig:
    """A config from PRESETS, e.g. preset("small", vocab_size=8000, dropout=0.3)."""
    if name not in PRESETS:
        raise MsgcoreError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return TransformerConfig(**{**PRESETS[name], **overrides})


def build_embeddings(cfg: TransformerConfig, token_embedding: nn.Embedding) -> Embeddings:
    if cfg.positions not in ("sinusoidal", "learned"):
        raise MsgcoreError(f"unknown positions {cfg.positions!r}; use 'sinusoidal' or 'learned'")
    table = SinusoidalPositions if cfg.positions == "sinusoidal" else LearnedPositions
    return Embeddings(token_embedding, table(cfg.d_model, cfg.max_positions), cfg.dropout, cfg.segment_stride)


@dataclass
class DecoderOut:
    logits: Tensor  # (B, T, V)
    cache: list[LayerCache]  # one per decoder layer, for the next incremental step
    cross_attention: list[Tensor] = field(default_factory=list)  # per layer (B, H, T, S) if asked for


class Encoder(nn.Module):
    """A stack of N encoder layers over embedded tokens (§3.1)."""

    def __init__(self, cfg: TransformerConfig, token_embedding: nn.Embedding):
        super().__init__()
        self.embed = build_embeddings(cfg, token_embedding)
        self.layers = nn.ModuleList(self.build_layer(cfg, i) for i in range(cfg.encoder_layers))
        self.final_norm = nn.LayerNorm(cfg.d_model) if cfg.pre_norm else nn.Identity()

    def build_layer(self, cfg: TransformerConfig, index: int) -> nn.Module:
        """Hook: the layer at depth `index`."""
        return EncoderLayer(cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.dropout, cfg.attention_dropout,
                            cfg.activation_dropout, cfg.pre_norm)

    def forward(self, tokens: Tensor, mask: Tensor, positions: Tensor | None = None,
                segment_ids: Tensor | None = None) -> EncoderOut:
        """tokens (B, S), mask (B, S) True = real; optional positions/segment ids (B, S)."""
        x = self.embed(tokens, positions, segment_ids)  # (B, S, D)
        attn_mask = mask[:, None, None, :]  # (B, 1, 1, S): every query sees the real keys
        for layer in self.layers:
            x, _ = layer(x, attn_mask)
        return EncoderOut(self.final_norm(x), mask)


class Decoder(nn.Module):
    """A stack of N decoder layers and the output projection to vocabulary logits (§3.1, §3.4)."""

    def __init__(self, cfg: TransformerConfig, token_embedding: nn.Embedding):
        super().__init__()
        self.embed = build_embeddings(cfg, token_embedding)
        self.layers = nn.ModuleList(self.build_layer(cfg, i) for i in range(cfg.decoder_layers))
        self.final_norm = nn.LayerNorm(cfg.d_model) if cfg.pre_norm else nn.Identity()
        self.output_projection = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.output_projection.weight = token_embedding.weight  # §3.4: shared weight matrix

    def build_layer(self, cfg: TransformerConfig, index: int) -> nn.Module:
        """Hook: the layer at depth `index`."""
        return DecoderLayer(cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.dropout, cfg.attention_dropout,
                            cfg.activation_dropout, cfg.pre_norm)

    def forward(self, tokens: Tensor, memory: list[EncoderOut], cache: list[LayerCache] | None = None,
                start_pos: int = 0, need_weights: bool = False) -> DecoderOut:
        """tokens (B, T) are target positions start_pos .. start_pos+T-1; `cache` holds the earlier ones."""
        x = self.embed(tokens, start_pos=start_pos)  # (B, T, D)
        cache = cache or [None] * len(self.layers)
        new_cache, attention = [], []
        for layer, layer_cache in zip(self.layers, cache):
            x, layer_cache, weights = layer(x, memory, layer_cache, need_weights)
            new_cache.append(layer_cache)
            attention.append(weights)
        logits = self.output_projection(self.final_norm(x))  # (B, T, V)
        return DecoderOut(logits, new_cache, attention if need_weights else [])


class Transformer(nn.Module):
    """Encoder-decoder Transformer over one source sequence.

    A multi-source model subclasses this and overrides `encode` (and the decoder's `cross_attend`);
    `generate` and the `Trainer` only use `encode`, `decode` and `forward`.
    """

    config_class = TransformerConfig  # what `load_model` rebuilds the config with
    tokenizer_class = Tokenizer  # what `load_model` rebuilds the checkpoint's tokenizer with (`from_bytes`)

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.token_embedding = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        nn.init.normal_(self.token_embedding.weight, std=cfg.d_model ** -0.5)
        with torch.no_grad():
            self.token_embedding.weight[cfg.pad_id].zero_()
        self.encoder = self.build_encoder(cfg)
        self.decoder = self.build_decoder(cfg)
        self.reset_linear_parameters()

    def build_encoder(self, cfg: TransformerConfig) -> nn.Module:
        """Hook: the encoder stack (shares the token embedding with the decoder when tied)."""
        embedding = self.token_embedding if cfg.tie_embeddings else self.new_embedding(cfg)
        return Encoder(cfg, embedding)

    def build_decoder(self, cfg: TransformerConfig) -> nn.Module:
        """Hook: the decoder stack."""
        return Decoder(cfg, self.token_embedding)

    @staticmethod
    def new_embedding(cfg: TransformerConfig) -> nn.Embedding:
        embedding = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=cfg.pad_id)
        nn.init.normal_(embedding.weight, std=cfg.d_model ** -0.5)
        return embedding

    def reset_linear_parameters(self) -> None:
        """Xavier-uniform weights and zero biases for every linear layer except the tied output."""
        for module in self.modules():
            if isinstance(module, nn.Linear) and module.weight is not self.token_embedding.weight:
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def parameter_groups(self) -> list[dict]:
        """Hook: optimizer parameter groups; `lr_scale` multiplies the trainer's learning rate."""
        return [{"params": list(self.parameters()), "lr_scale": 1.0}]

    def encode(self, sources: list[Tensor], source_masks: list[Tensor]) -> list[EncoderOut]:
        """Hook: encode the K sources, each (B, S_k) with mask (B, S_k); one EncoderOut per source."""
        if len(sources) != 1:
            raise MsgcoreError(f"Transformer encodes exactly 1 source, got {len(sources)}; "
                               "concatenate them (Batch.concatenated) or use a multi-source model")
        return [self.encoder(sources[0], source_masks[0])]

    def decode(self, tokens: Tensor, memory: list[EncoderOut], cache: list[LayerCache] | None = None,
               start_pos: int = 0, need_weights: bool = False) -> DecoderOut:
        return self.decoder(tokens, memory, cache, start_pos, need_weights)

    def generate(self, sources: list[Tensor], source_masks: list[Tensor], prefix_id: int, eos_id: int,
                 cfg: GenerationConfig | None = None, forbidden: list[int] = ()) -> list[list[int]]:
        """Hook: translate a batch to token ids (no prefix, no </s>): greedy or beam search (`cfg`)."""
        return generate(self, sources, source_masks, prefix_id, eos_id, cfg, forbidden)

    def forward(self, batch) -> Tensor:
        """Teacher-forced logits (B, T, V) for a `Batch` (sources, source_masks, target_in)."""
        memory = self.encode(batch.sources, batch.source_masks)
        return self.decode(batch.target_in, memory).logits

    def loss(self, batch, label_smoothing: float = 0.0) -> Tensor:
        """Hook: the training loss summed over the batch's real target tokens (the Trainer averages).

        Label-smoothed cross-entropy (§5.4), computed in fp32 whatever the autocast dtype (msgcore.loss).
        """
        logits = self(batch)  # (B, T, V)
        return label_smoothed_cross_entropy(logits.flatten(0, 1), batch.target_out.flatten(), self.cfg.pad_id,
                                            label_smoothing)
