"""MixRep: sequence generation with mixed representations from two tokenizers.

Wu, Xie, Xia, Fan, Qin, Lai, Liu. "Sequence Generation with Mixed Representations". ICML 2020,
§3.1 (architecture, Eq. 1-7), §3.2 (co-teaching, Eq. 8-10), §4.1 (settings), §5.1 (stacked variant).

Notation (the paper's; s is a stream, "bpe" or "sp", and o the other one):
    x_bpe, x_sp      the same source sentence tokenized by BPE and by SentencePiece (unigram LM)
    H^l_s            layer l of enc_s; H^0_s = the embeddings of x_s
    S~^l_s, S^l_s    layer l of dec_s after its self-attention (Eq. 4-5) and after the encoder attention (Eq. 6-7)
    g                a drop-path gate on the branch that reads the other stream (§4.1)
What this file changes with respect to msgcore.model.Transformer:
    * two token embeddings (E_bpe, E_sp = `token_embedding`) and a mixed encoder: in every layer each stream
      attends to itself and to the other stream, and the two branches are added (Eq. 1-3);
    * two decoders, one per target segmentation; each decoder layer's encoder attention reads both encoders
      (`MixDecoderLayer.cross_attend`, Eq. 6-7); the decoders never see each other;
    * `loss`: both decoders' losses (Eq. 8). `decode` and `generate` serve the SP decoder (the paper reports the
      SP output); `stream("bpe")` is the BPE decoder as a model of its own for the same beam search;
    * co-teaching (Eq. 9-10): `co_teaching_targets` makes each decoder's translations into training targets for the
      other one; `co_teaching_corpus` appends them to the data (the authors' code, one offline round);
    * the data (§4.1): a `MixRepCorpus` holds one corpus in both segmentations, `collate_mixrep` pads it into the
      `MixRepBatch` that `loss` reads, and `MixRepTrainer` is the core Trainer batching that way.
The sources are ordered [x_bpe, x_sp]; `encode` returns [H^N_bpe, H^N_sp].
Where the text is vague we follow the authors' code (apeterswu/fairseq_mix, `transformer_dec_one.py`), marked
`# Code:`; where we differ from both, `# Deviation:`.
"""
from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass, field
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from msgcore.attention import KV, MultiHeadAttention
from msgcore.batching import Batch, EncodedCorpus, collate, encode_corpus, example_lengths, token_batches
from msgcore.data import Corpus
from msgcore.generation import GenerationConfig, generate
from msgcore.layers import DecoderLayer, EncoderOut, FeedForward, ResidualLayer
from msgcore.model import Decoder, DecoderOut, Transformer, TransformerConfig, build_embeddings
from msgcore.tokenizer import BOS_ID, EOS_ID, MODEL_TYPES, PAD_ID, Tokenizer
from msgcore.trainer import Trainer
from msgcore.utils import DataError, MsgcoreError

STREAMS = ("bpe", "sp")  # also the order of the sources and of the encoder outputs
OWNERS = ("keys", "queries")
MIXINGS = ("parallel", "stacked")
STACKED_ORDERS = ("other_first", "own_first")


@dataclass
class MixRepConfig(TransformerConfig):
    # vocab_size (inherited) is the SP vocabulary: E_sp, dec_sp's output layer, the primary stream.
    bpe_vocab_size: int = 8000  # the BPE vocabulary: E_bpe and dec_bpe's output layer
    enc_drop_path: float = 0.2  # p: the encoder's mix-attention branch is dropped with probability p (§4.1)
    dec_drop_path: float = 0.3  # p: the decoder's attention to the other encoder is dropped with probability p (§4.1)
    branch_scale: float = 0.5  # both branches are scaled by it: 0.5 = the code's average, 1.0 = Eq. (1)'s plain sum
    mix_attention_owner: str = "keys"  # attn_m^s is the key/value stream's self-attention (code) or the query's (§4.1)
    mixing: str = "parallel"  # "parallel" (§3.1, the model) or "stacked" (§5.1, Table 6)
    stacked_order: str = "other_first"  # stacked decoders: the other encoder first (§5.1's text) or own first (code)

    def __post_init__(self) -> None:
        """Refuse a setting the model cannot run, with one line naming the field."""
        choices = {"mix_attention_owner": OWNERS, "mixing": MIXINGS, "stacked_order": STACKED_ORDERS}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise MsgcoreError(f"MixRepConfig.{name} = {getattr(self, name)!r}; use one of {allowed}")
        for name in ("enc_drop_path", "dec_drop_path"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise MsgcoreError(f"MixRepConfig.{name} = {getattr(self, name)!r} is not in [0, 1]")
        if self.bpe_vocab_size < 5:
            raise MsgcoreError(f"MixRepConfig.bpe_vocab_size = {self.bpe_vocab_size!r} is too small")


def other(stream: str) -> str:
    """The other stream: "bpe" <-> "sp"."""
    return STREAMS[1 - STREAMS.index(stream)]


def check_stream(stream: str) -> str:
    if stream not in STREAMS:
        raise MsgcoreError(f"unknown MixRep stream {stream!r}; use one of {STREAMS}")
    return stream


def bpe_config(cfg: MixRepConfig) -> MixRepConfig:
    """The same config with the BPE vocabulary, to build the BPE stream's embedding and decoder."""
    return dataclasses.replace(cfg, vocab_size=cfg.bpe_vocab_size)


def branch_gate(p: float, training: bool) -> float:
    """The drop-path gate g of the other-stream branch (§4.1).

    # Code: in training one Bernoulli draw per call (per layer, per stream, per batch), shared by every example and
    # position: g = 0 with probability p, else 1, with no 1/(1-p) rescaling; at inference g = 1 - p.
    # Deviation: drawn from the torch RNG (the code uses numpy), which the Trainer's checkpoints restore.
    """
    if not training:
        return 1.0 - p
    return float(torch.rand(()).item() >= p)


def summed_cross_entropy(logits: Tensor, target_out: Tensor, pad_id: int, label_smoothing: float) -> Tensor:
    """Label-smoothed cross-entropy of logits (B, T, V) against target_out (B, T), summed over real tokens, in fp32."""
    return F.cross_entropy(logits.float().flatten(0, 1), target_out.flatten(), ignore_index=pad_id,
                           reduction="sum", label_smoothing=label_smoothing)


class TokenizerPair:
    """The two tokenizers of a MixRep model, `bpe` and `sp`.

    Wherever one tokenizer is expected (the Trainer's dev BLEU, `load_model`'s size check) it acts as the SP
    tokenizer, the primary stream. `to_bytes` stores both models, so a checkpoint holds the pair.
    """

    MAGIC = b"msgcore-tokenizer-pair\0"

    def __init__(self, bpe: Tokenizer, sp: Tokenizer):
        self.bpe, self.sp = bpe, sp

    def __getitem__(self, stream: str) -> Tokenizer:
        return self.bpe if check_stream(stream) == "bpe" else self.sp

    def to_bytes(self) -> bytes:
        """MAGIC, the length of the BPE model (8 bytes, big-endian), the BPE model, the SP model."""
        bpe = self.bpe.to_bytes()
        return self.MAGIC + struct.pack(">Q", len(bpe)) + bpe + self.sp.to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> "TokenizerPair":
        start = len(cls.MAGIC) + 8
        if not data.startswith(cls.MAGIC) or len(data) < start:
            raise DataError("not a MixRep tokenizer pair (a single tokenizer's model?)")
        (bpe_len,) = struct.unpack(">Q", data[len(cls.MAGIC):start])
        return cls(Tokenizer.from_bytes(data[start:start + bpe_len]), Tokenizer.from_bytes(data[start + bpe_len:]))

    # The primary (SP) tokenizer's interface.
    pad_id, bos_id, eos_id = PAD_ID, BOS_ID, EOS_ID

    @property
    def vocab_size(self) -> int:
        return self.sp.vocab_size

    def decode(self, ids) -> str:
        return self.sp.decode(ids)

    def decode_batch(self, batch) -> list[str]:
        return self.sp.decode_batch(batch)

    def __repr__(self) -> str:
        return f"TokenizerPair(bpe={self.bpe!r}, sp={self.sp!r})"


@dataclass(repr=False)
class MixRepBatch(Batch):
    """A Batch that carries the target in both segmentations.

    sources = [x_bpe (B, S_bpe), x_sp (B, S_sp)]; target_in/out/mask = the SP target (what `forward`, dev BLEU and
    the primary stream read); bpe_target_in/out/mask = the BPE target, each (B, T_bpe).
    """
    bpe_target_in: Tensor | None = None  # (B, T_bpe) prefix + y_bpe
    bpe_target_out: Tensor | None = None  # (B, T_bpe) y_bpe + eos, padded
    bpe_target_mask: Tensor | None = None  # (B, T_bpe) True = real position

    def targets(self, stream: str) -> tuple[Tensor, Tensor]:
        """(decoder input, labels) of one stream's target."""
        if check_stream(stream) == "bpe":
            return self.bpe_target_in, self.bpe_target_out
        return self.target_in, self.target_out

    @property
    def num_target_tokens(self) -> int:
        """N_bpe + N_sp: the loss is averaged over both streams' target tokens (the code's criterion and trainer)."""
        return int(self.target_mask.sum()) + int(self.bpe_target_mask.sum())


# ---- §3.1 the mixed encoder ------------------------------------------------------------------------

def per_stream(make) -> nn.ModuleDict:
    """One module per stream, e.g. per_stream(lambda: nn.LayerNorm(d))."""
    return nn.ModuleDict({stream: make() for stream in STREAMS})


class MixedEncoderLayer(ResidualLayer):
    """One layer of both encoders: self-attention + mix-attention added, then FFN, per stream (Eq. 1-2).

    # Code: per stream one attention module, one FFN and two norms (`nn.ModuleDict` keyed by stream). attn_m^s is
    # the *key/value* stream's self-attention module (the code) or the query stream's (§4.1: "all layers with the
    # same superscript are shared"), per `mix_attention_owner`; both have the same parameter count.
    # Code: h = branch_scale * attn_s + branch_scale * g * attn_m (0.5 and 0.5 in the code; Eq. (1) is a plain sum).
    # Deviation: pre-norm by default (as every chapter); each stream's norm is applied to its states before they
    # serve as queries and as the other stream's keys/values (the code's `normalize_before`).
    """

    def __init__(self, cfg: MixRepConfig):
        super().__init__(cfg.d_model, cfg.dropout, cfg.pre_norm)
        self.self_attn = per_stream(lambda: MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout))
        self.ffn = per_stream(lambda: FeedForward(cfg.d_model, cfg.d_ff, cfg.activation_dropout))
        self.self_attn_norm, self.ffn_norm = (per_stream(lambda: nn.LayerNorm(cfg.d_model)) for _ in range(2))
        self.owner, self.drop_path, self.branch_scale = cfg.mix_attention_owner, cfg.enc_drop_path, cfg.branch_scale

    def mix_attention(self, stream: str) -> MultiHeadAttention:
        """attn_m^stream, the module with which `stream` attends to the other stream."""
        return self.self_attn[other(stream) if self.owner == "keys" else stream]

    def forward(self, x: dict[str, Tensor], masks: dict[str, Tensor],
                need_weights: bool = False) -> tuple[dict[str, Tensor], dict[str, Tensor | None]]:
        """x[s] = H^{l-1}_s (B, S_s, D), masks[s] (B, S_s) True = real. Returns H^l_s per stream and the
        mix-attention weights (B, H, S_s, S_o) per stream (None unless `need_weights`).

        Both streams read layer l-1 only: they are updated in parallel.
        """
        normed = {s: self.before(x[s], self.self_attn_norm[s]) for s in STREAMS}  # (B, S_s, D)
        keys = {s: masks[s][:, None, None, :] for s in STREAMS}  # (B, 1, 1, S_s)
        out, weights = {}, {}
        for s in STREAMS:
            o = other(s)
            own, _, _ = self.self_attn[s](normed[s], mask=keys[s])  # attn_s^s(H_s, H_s, H_s)  (B, S_s, D)
            mixed, _, weights[s] = self.mix_attention(s)(normed[s], normed[o], keys[o],
                                                         need_weights=need_weights)  # attn_m^s(H_s, H_o, H_o), Eq. (3)
            gate = branch_gate(self.drop_path, self.training)
            h = self.branch_scale * own + self.branch_scale * gate * mixed  # Eq. (1) for bpe, Eq. (2) for sp
            h = self.after(x[s], h, self.self_attn_norm[s])
            out[s] = self.after(h, self.ffn[s](self.before(h, self.ffn_norm[s])), self.ffn_norm[s])
        return out, weights


class StackedMixEncoderLayer(ResidualLayer):
    """§5.1's stacked variant (Figure 2, Table 6): self-attention, then a mix-attention sub-layer over the other
    stream's post-self-attention state of the same layer, then FFN; each with its residual and norm.

    # Code (`transformer_stack.py`): a separate mix-attention module per stream (owned by the query stream), no
    # drop-path and no 0.5 weights.
    """

    def __init__(self, cfg: MixRepConfig):
        super().__init__(cfg.d_model, cfg.dropout, cfg.pre_norm)
        self.self_attn, self.mix_attn = (per_stream(lambda: MultiHeadAttention(cfg.d_model, cfg.n_heads,
                                                                                cfg.attention_dropout))
                                         for _ in range(2))
        self.ffn = per_stream(lambda: FeedForward(cfg.d_model, cfg.d_ff, cfg.activation_dropout))
        self.self_attn_norm, self.mix_attn_norm, self.ffn_norm = (per_stream(lambda: nn.LayerNorm(cfg.d_model))
                                                                  for _ in range(3))

    def forward(self, x: dict[str, Tensor], masks: dict[str, Tensor],
                need_weights: bool = False) -> tuple[dict[str, Tensor], dict[str, Tensor | None]]:
        keys = {s: masks[s][:, None, None, :] for s in STREAMS}  # (B, 1, 1, S_s)
        h = {}
        for s in STREAMS:
            own, _, _ = self.self_attn[s](self.before(x[s], self.self_attn_norm[s]), mask=keys[s])
            h[s] = self.after(x[s], own, self.self_attn_norm[s])  # (B, S_s, D) the post-self-attention state
        normed = {s: self.before(h[s], self.mix_attn_norm[s]) for s in STREAMS}
        out, weights = {}, {}
        for s in STREAMS:
            mixed, _, weights[s] = self.mix_attn[s](normed[s], normed[other(s)], keys[other(s)],
                                                    need_weights=need_weights)  # §5.1: mix-attention on top
            y = self.after(h[s], mixed, self.mix_attn_norm[s])
            out[s] = self.after(y, self.ffn[s](self.before(y, self.ffn_norm[s])), self.ffn_norm[s])
        return out, weights


class MixedEncoder(nn.Module):
    """enc_bpe and enc_sp: per stream an embedding block (x = sqrt(d) E_s[tok] + PE), N mixed layers, a final norm."""

    def __init__(self, cfg: MixRepConfig, token_embeddings: dict[str, nn.Embedding]):
        super().__init__()
        self.embed = nn.ModuleDict({s: build_embeddings(cfg, token_embeddings[s]) for s in STREAMS})
        layer_class = StackedMixEncoderLayer if cfg.mixing == "stacked" else MixedEncoderLayer
        self.layers = nn.ModuleList(layer_class(cfg) for _ in range(cfg.encoder_layers))
        self.final_norm = per_stream(lambda: nn.LayerNorm(cfg.d_model) if cfg.pre_norm else nn.Identity())

    def forward(self, tokens: list[Tensor], masks: list[Tensor],
                need_weights: bool = False) -> tuple[list[EncoderOut], list[dict[str, Tensor | None]]]:
        """tokens [x_bpe (B, S_bpe), x_sp (B, S_sp)] with masks (True = real). Returns [H^N_bpe, H^N_sp] and, per
        layer, each stream's mix-attention weights."""
        masks_by_stream = dict(zip(STREAMS, masks))
        x = {s: self.embed[s](t) for s, t in zip(STREAMS, tokens)}  # H^0_s (B, S_s, D)
        weights = []
        for layer in self.layers:
            x, layer_weights = layer(x, masks_by_stream, need_weights)
            weights.append(layer_weights)
        return [EncoderOut(self.final_norm[s](x[s]), masks_by_stream[s]) for s in STREAMS], weights


# ---- §3.1 the two decoders -------------------------------------------------------------------------

def check_two_encoders(memory: list[EncoderOut]) -> None:
    if len(memory) != 2:
        raise MsgcoreError(f"a MixRep decoder reads 2 encoder outputs (own, other), got {len(memory)}")


class MixDecoderLayer(DecoderLayer):
    """A decoder layer of dec_s whose encoder attention reads both encoders (Eq. 6-7).

    memory = [H^N_s, H^N_o] (own encoder first); the cache keeps one (k, v) per encoder in the same order.
    # Code: one encoder-attention module per decoder serves both encoders (the code's superscript sharing; Eq. 6-7
    # say "different parameters"); h = branch_scale * own + branch_scale * g * other, g gating the other encoder.
    """

    def __init__(self, cfg: MixRepConfig):
        super().__init__(cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.dropout, cfg.attention_dropout,
                         cfg.activation_dropout, cfg.pre_norm)
        self.drop_path, self.branch_scale = cfg.dec_drop_path, cfg.branch_scale

    def cross_attend(self, x: Tensor, memory: list[EncoderOut], cross_kv: list[KV] | None,
                     need_weights: bool) -> tuple[Tensor, list[KV], Tensor | None]:
        """x = S~^l_s (B, T, D). Returns the mixed attention (B, T, D), [(k, v) own, (k, v) other], weights or None."""
        check_two_encoders(memory)
        kv = cross_kv or [None, None]
        own, kv_own, w_own = self.cross_attn(x, memory[0].hidden, memory[0].mask[:, None, None, :], kv[0],
                                             need_weights=need_weights)  # attn^s_s(S~_s, H_s, H_s)
        oth, kv_oth, w_oth = self.cross_attn(x, memory[1].hidden, memory[1].mask[:, None, None, :], kv[1],
                                             need_weights=need_weights)  # attn^s_o(S~_s, H_o, H_o)
        gate = branch_gate(self.drop_path, self.training)
        h = self.branch_scale * own + self.branch_scale * gate * oth  # Eq. (6) for bpe, Eq. (7) for sp
        weights = torch.cat([w_own, w_oth], -1) if need_weights else None  # (B, H, T, S_s + S_o)
        return h, [kv_own, kv_oth], weights


class StackedMixDecoderLayer(DecoderLayer):
    """§5.1's stacked decoder layer: self-attention, then one encoder after the other, each its own sub-layer.

    `cross_attn` reads the own encoder, `other_attn` the other one.
    # Deviation: the order follows §5.1's text (dec_bpe: SP-enc-attention, then BPE-enc-attention) unless
    # `stacked_order="own_first"` (the code's order; footnote 9: "similar results"); the code's double residual
    # around the second attention is dropped (each sub-layer has one residual, as in the text's Figure 2).
    """

    def __init__(self, cfg: MixRepConfig):
        super().__init__(cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.dropout, cfg.attention_dropout,
                         cfg.activation_dropout, cfg.pre_norm)
        self.other_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.other_attn_norm = nn.LayerNorm(cfg.d_model)
        self.other_first = cfg.stacked_order == "other_first"

    def cross_block(self, x: Tensor, memory: list[EncoderOut], cross_kv: list[KV] | None,
                    need_weights: bool) -> tuple[Tensor, list[KV], Tensor | None]:
        check_two_encoders(memory)
        kv = list(cross_kv or [None, None])
        steps = [(0, self.cross_attn, self.cross_attn_norm), (1, self.other_attn, self.other_attn_norm)]
        weights = [None, None]
        for index, attention, norm in (steps[::-1] if self.other_first else steps):
            h, kv[index], weights[index] = attention(self.before(x, norm), memory[index].hidden,
                                                     memory[index].mask[:, None, None, :], kv[index],
                                                     need_weights=need_weights)
            x = self.after(x, h, norm)
        return x, kv, torch.cat(weights, -1) if need_weights else None


class MixDecoder(Decoder):
    def build_layer(self, cfg: MixRepConfig, index: int) -> nn.Module:
        return StackedMixDecoderLayer(cfg) if cfg.mixing == "stacked" else MixDecoderLayer(cfg)


# ---- the model ---------------------------------------------------------------------------------

class MixRepTransformer(Transformer):
    """Two mixed encoders and two decoders over one sentence in two segmentations; sources [x_bpe, x_sp].

    Per stream one joint vocabulary shared by its encoder input, decoder input and output layer (the code's
    `--share-all-embeddings`, per stream): E_sp is `token_embedding` (cfg.vocab_size), E_bpe `bpe_embedding`.
    """

    config_class = MixRepConfig
    tokenizer_class = TokenizerPair

    def build_encoder(self, cfg: MixRepConfig) -> nn.Module:
        """Makes E_bpe first (the encoder and dec_bpe share it), then the mixed encoder."""
        self.bpe_embedding = self.new_embedding(bpe_config(cfg))
        with torch.no_grad():
            self.bpe_embedding.weight[cfg.pad_id].zero_()
        embeddings = {"bpe": self.bpe_embedding, "sp": self.token_embedding}
        if not cfg.tie_embeddings:
            embeddings = {"bpe": self.new_embedding(bpe_config(cfg)), "sp": self.new_embedding(cfg)}
        return MixedEncoder(cfg, embeddings)

    def build_decoder(self, cfg: MixRepConfig) -> nn.Module:
        """{"bpe": dec_bpe, "sp": dec_sp}, each with its own stream's embedding and output layer."""
        return nn.ModuleDict({"bpe": MixDecoder(bpe_config(cfg), self.bpe_embedding),
                              "sp": MixDecoder(cfg, self.token_embedding)})

    def reset_linear_parameters(self) -> None:
        """Xavier-uniform weights and zero biases, except the output layers tied to an embedding."""
        embedding_weights = {id(m.weight) for m in self.modules() if isinstance(m, nn.Embedding)}
        for module in self.modules():
            if isinstance(module, nn.Linear) and id(module.weight) not in embedding_weights:
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def encode(self, sources: list[Tensor], source_masks: list[Tensor]) -> list[EncoderOut]:
        """[x_bpe (B, S_bpe), x_sp (B, S_sp)] -> [H^N_bpe, H^N_sp]."""
        if len(sources) != 2:
            raise MsgcoreError(f"MixRepTransformer reads one sentence in 2 segmentations [bpe, sp], got {len(sources)} "
                               "sources; encode the corpus with encode_mixrep")
        outs, _ = self.encoder(sources, source_masks)
        return outs

    def mix_attention(self, sources: list[Tensor], source_masks: list[Tensor]) -> list[dict[str, Tensor]]:
        """Per encoder layer and stream s, s's mix-attention over the other stream (B, H, S_s, S_o): the heatmap."""
        _, weights = self.encoder(sources, source_masks, need_weights=True)
        return weights

    def decode_stream(self, stream: str, tokens: Tensor, memory: list[EncoderOut], cache=None, start_pos: int = 0,
                      need_weights: bool = False) -> DecoderOut:
        """dec_stream on target tokens (B, T); memory is `encode`'s [H_bpe, H_sp], handed over own encoder first."""
        own = STREAMS.index(check_stream(stream))
        check_two_encoders(memory)
        return self.decoder[stream](tokens, [memory[own], memory[1 - own]], cache, start_pos, need_weights)

    def decode(self, tokens: Tensor, memory: list[EncoderOut], cache=None, start_pos: int = 0,
               need_weights: bool = False) -> DecoderOut:
        """The SP decoder, the primary stream (the paper's reported output and the code's `trans.txt`)."""
        return self.decode_stream("sp", tokens, memory, cache, start_pos, need_weights)

    def stream(self, name: str) -> "StreamView":
        """One decoder as a model of its own, for generate, beam search, translate_encoded and scoring."""
        return StreamView(self, check_stream(name))

    def loss(self, batch: MixRepBatch, label_smoothing: float = 0.0) -> Tensor:
        """Eq. (8): both decoders' label-smoothed cross-entropies, summed over both streams' real target tokens.

        # Code: the Trainer divides by the batch's N_bpe + N_sp, so the loss is the token mean over both streams
        # (the code's (L_bpe + L_sp) / 2 with gradients divided by (N_bpe + N_sp) / 2); Eq. (8) averages per sentence.
        Both encoders get gradients from both decoders. On co-teaching data (`co_teaching_targets`) the same loss
        is Eq. (9)'s, and on the union of both Eq. (10)'s.
        """
        if not isinstance(batch, MixRepBatch):
            raise MsgcoreError("MixRepTransformer.loss needs the target in both segmentations (a MixRepBatch); "
                               "collate with collate_mixrep")
        memory = self.encode(batch.sources, batch.source_masks)
        total = 0.0
        for stream in STREAMS:
            target_in, target_out = batch.targets(stream)
            logits = self.decode_stream(stream, target_in, memory).logits  # (B, T_s, V_s)
            total = total + summed_cross_entropy(logits, target_out, self.cfg.pad_id, label_smoothing)  # Eq. (8)
        return total


class StreamView:
    """dec_bpe or dec_sp of a MixRepTransformer with the interface the searches use (`encode`, `decode`,
    `generate`, `eval`). Each decoder runs its own beam search over the shared encoder outputs (the code's
    `_oneside_generate`, called once per stream)."""

    def __init__(self, model: MixRepTransformer, stream: str):
        self.model, self.stream = model, stream

    def eval(self) -> "StreamView":
        self.model.eval()
        return self

    def encode(self, sources: list[Tensor], source_masks: list[Tensor]) -> list[EncoderOut]:
        return self.model.encode(sources, source_masks)

    def decode(self, tokens: Tensor, memory: list[EncoderOut], cache=None, start_pos: int = 0,
               need_weights: bool = False) -> DecoderOut:
        return self.model.decode_stream(self.stream, tokens, memory, cache, start_pos, need_weights)

    def generate(self, sources: list[Tensor], source_masks: list[Tensor], prefix_id: int, eos_id: int,
                 cfg: GenerationConfig | None = None, forbidden: list[int] = ()) -> list[list[int]]:
        return generate(self, sources, source_masks, prefix_id, eos_id, cfg, forbidden)


# ---- §3.2 co-teaching ------------------------------------------------------------------------------

@torch.no_grad()
def co_teaching_targets(model: MixRepTransformer, sources: list[Tensor], source_masks: list[Tensor],
                        tokenizers: TokenizerPair, prefix_id: int,
                        cfg: GenerationConfig | None = None) -> dict[str, list[list[int]]]:
    """Eq. (9)'s targets for one batch: {"bpe": y^_{sp->bpe}, "sp": y^_{bpe->sp}} as token ids (no prefix, no eos).

    Each decoder translates the sources; its output is detokenized and re-tokenized with the other stream's
    tokenizer, so each decoder learns from the other decoder's predictions.
    # Code: beam search (beam 5, length penalty 1.0, `cfg`'s default) once, offline, where the paper says "sample"
    # and "iterate"; `co_teaching_corpus` appends the examples to the original data (Eq. 10, 1:1).
    # Deviation: detokenizing is SentencePiece's decode (both streams are sentencepiece models; no Moses).
    """
    forbidden = [PAD_ID, BOS_ID]
    texts = {s: tokenizers[s].decode_batch(model.stream(s).generate(sources, source_masks, prefix_id, EOS_ID, cfg,
                                                                    forbidden))
             for s in STREAMS}  # y^_s, detokenized
    return {s: tokenizers[s].encode_batch(texts[other(s)]) for s in STREAMS}  # y^_{o->s}


# ---- §4.1 the data: one corpus in two segmentations, its batches and trainer; Eq. (10)'s data -----
# The paper tokenizes every sentence with BPE (subword-nmt, 10k merges) and with SentencePiece's unigram LM (12k),
# each vocabulary joint over source and target. Here both are sentencepiece models trained by msgcore.tokenizer
# (`model_type` "bpe" and "unigram") on the same text; a `TokenizerPair` holds them. A `MixRepCorpus` is an
# EncodedCorpus whose two "sources" are [x_bpe, x_sp] and whose target is y_sp (the primary stream), y_bpe beside it.
# Deviation: SentencePiece's BPE on raw text stands for subword-nmt on Moses-tokenized text; both vocabularies
# default to the same size, so the two streams differ by the algorithm only (the paper: 10k and 12k).

def train_tokenizers(texts: Iterable[str], *, vocab_size: int = 8000, bpe_vocab_size: int | None = None,
                     bpe_type: str = "bpe", sp_type: str = "unigram", langs=(), cache_dir=None,
                     seed: int = 0) -> TokenizerPair:
    """The two tokenizers, trained on the same (joint source + target) text; each is cached by msgcore.tokenizer.

    `sp_type`/`bpe_type` pick each stream's sentencepiece algorithm ("bpe" or "unigram"): Table 8's variants mix
    BPE with another segmentation, e.g. BPE at another vocabulary size (`sp_type="bpe"`, another `vocab_size`).
    """
    for stream, kind in (("bpe", bpe_type), ("sp", sp_type)):
        if kind not in MODEL_TYPES:
            raise DataError(f"unknown tokenizer type {kind!r} for the {stream} stream; use one of {MODEL_TYPES}")
    texts = list(texts)
    bpe = Tokenizer.train(texts, vocab_size=bpe_vocab_size or vocab_size, model_type=bpe_type, langs=langs,
                          cache_dir=cache_dir, seed=seed)
    sp = Tokenizer.train(texts, vocab_size=vocab_size, model_type=sp_type, langs=langs, cache_dir=cache_dir, seed=seed)
    return TokenizerPair(bpe, sp)


def tokenizer_texts(corpus: Corpus) -> list[str]:
    """Every source and target sentence: the joint text both vocabularies are learned on (§4.1)."""
    return [text for column in corpus.sources for text in column] + list(corpus.target)


@dataclass(repr=False)
class MixRepCorpus(EncodedCorpus):
    """One corpus in two segmentations: sources = [x_bpe, x_sp] (each + eos), target = y_sp, bpe_target = y_bpe."""
    bpe_target: list[list[int]] = field(default_factory=list)  # N x len: the BPE target pieces (no bos/eos)

    def __post_init__(self) -> None:
        if len(self.sources) != 2:
            raise DataError(f"a MixRep corpus holds one source in 2 segmentations [bpe, sp], not {len(self.sources)}")
        counts = [len(self.sources[0]), len(self.sources[1]), len(self.bpe_target), len(self.target)]
        if len(set(counts)) != 1:
            raise DataError("mismatched segmentations: x_bpe, x_sp, y_bpe and y_sp hold {} sentences; they must be "
                            "one corpus segmented two ways".format(", ".join(map(str, counts))))

    def __repr__(self) -> str:
        return f"MixRepCorpus({len(self)} examples, bpe + sp)"


def pair_segmentations(bpe_data: EncodedCorpus, sp_data: EncodedCorpus,
                       tokenizers: TokenizerPair | None = None) -> MixRepCorpus:
    """A MixRepCorpus from one single-source corpus encoded by each tokenizer.

    With `tokenizers`, every source and target is also checked to read the same in both segmentations.
    """
    for stream, data in (("bpe", bpe_data), ("sp", sp_data)):
        if len(data.sources) != 1:
            raise DataError(f"the {stream} encoding has {len(data.sources)} sources; MixRep reads one source sentence")
    if len(bpe_data) != len(sp_data):
        raise DataError(f"mismatched segmentations: the BPE encoding has {len(bpe_data)} examples and the SP encoding "
                        f"{len(sp_data)}; they must be one corpus")
    if (bpe_data.target_prefix, bpe_data.eos_id) != (sp_data.target_prefix, sp_data.eos_id):
        raise DataError("mismatched segmentations: the BPE and SP encodings use different target prefix or eos ids")
    data = MixRepCorpus([bpe_data.sources[0], sp_data.sources[0]], sp_data.target, sp_data.target_prefix,
                        sp_data.eos_id, bpe_target=bpe_data.target)
    if tokenizers is not None:
        check_same_text(data, tokenizers)
    return data


def check_same_text(data: MixRepCorpus, tokenizers: TokenizerPair) -> None:
    """Raise DataError at the first example whose two segmentations decode to different text."""
    columns = [("source", data.sources[0], data.sources[1]), ("target", data.bpe_target, data.target)]
    for what, bpe_column, sp_column in columns:
        for i, (bpe_ids, sp_ids) in enumerate(zip(bpe_column, sp_column)):
            bpe_text, sp_text = tokenizers.bpe.decode(bpe_ids), tokenizers.sp.decode(sp_ids)
            if bpe_text != sp_text:
                raise DataError(f"mismatched segmentations: example {i}'s {what} reads {bpe_text!r} in BPE "
                                f"but {sp_text!r} in SP")


def encode_mixrep(corpus: Corpus, tokenizers: TokenizerPair, *, max_len: int | None = None) -> MixRepCorpus:
    """Encode a single-source corpus with both tokenizers; `max_len` truncates each sentence's pieces."""
    if corpus.num_sources != 1:
        raise DataError(f"MixRep translates one source sentence; {corpus!r} has {corpus.num_sources} sources")
    bpe = encode_corpus(corpus, tokenizers.bpe, max_len=max_len)
    sp = encode_corpus(corpus, tokenizers.sp, max_len=max_len)
    return pair_segmentations(bpe, sp)


def collate_mixrep(data: MixRepCorpus, indices, pad_id: int = PAD_ID) -> MixRepBatch:
    """Pad the examples at `indices` into a MixRepBatch: both sources, the SP target, the BPE target."""
    if not isinstance(data, MixRepCorpus):
        raise DataError(f"{data!r} holds one segmentation; encode the corpus with encode_mixrep")
    batch = collate(data, indices, pad_id)  # sources [x_bpe, x_sp] and y_sp
    bpe = collate(EncodedCorpus([], data.bpe_target, data.target_prefix, data.eos_id), indices, pad_id)  # y_bpe
    return MixRepBatch(**vars(batch), bpe_target_in=bpe.target_in, bpe_target_out=bpe.target_out,
                       bpe_target_mask=bpe.target_mask)


def mixrep_lengths(data: MixRepCorpus) -> list[int]:
    """The padded length each example needs: its longest source or target in either segmentation (+1)."""
    return [max(length, len(y_bpe) + 1) for length, y_bpe in zip(example_lengths(data), data.bpe_target)]


class MixRepTrainer(Trainer):
    """The core Trainer on a MixRepCorpus: batches carry both targets, token budgets count the longer one."""

    def collate(self, data: MixRepCorpus, indices: list[int]) -> MixRepBatch:
        return collate_mixrep(data, indices)

    def example_lengths(self, data: MixRepCorpus) -> list[int]:
        return mixrep_lengths(data)


@torch.no_grad()
def co_teaching_corpus(model: MixRepTransformer, data: MixRepCorpus, tokenizers: TokenizerPair,
                       device: torch.device | str = "cpu", cfg: GenerationConfig | None = None,
                       max_tokens: int = 6000) -> MixRepCorpus:
    """Eq. (10)'s data: `data` followed by one co-teaching example per example (Eq. 9).

    The new example i is (x_bpe, y^_{sp->bpe}, x_sp, y^_{bpe->sp}): the same sources, and as targets each decoder's
    translation re-tokenized for the other decoder (`co_teaching_targets`). The code's one offline round.
    """
    cfg = cfg or GenerationConfig()
    model.to(device).eval()
    generated = {stream: [[] for _ in range(len(data))] for stream in STREAMS}
    for indices in token_batches(mixrep_lengths(data), max_tokens // cfg.beam_size, shuffle=False):
        batch = collate(data, indices).to(device)
        targets = co_teaching_targets(model, batch.sources, batch.source_masks, tokenizers, data.target_prefix, cfg)
        for stream in STREAMS:
            for i, ids in zip(indices, targets[stream]):
                generated[stream][i] = ids
    return MixRepCorpus([column + column for column in data.sources], data.target + generated["sp"],
                        data.target_prefix, data.eos_id, bpe_target=data.bpe_target + generated["bpe"])
