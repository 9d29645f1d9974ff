"""POSTECH APE: a joint src/mt encoder and a multi-source attention decoder for automatic post-editing.

Lee, Shin, Lee. "Transformer-based Automatic Post-Editing Model with Joint Encoder and Multi-source
Attention of Decoder". WMT 2019 (APE shared task), §2.1-2.2, §3.2-3.3.

Notation (the paper's):
    x = src (T_x tokens), y = mt (T_y tokens), z = pe (T_z tokens, the target)
    H^i_src        output of src encoder layer i
    H^i_mt         mt states of layer i after its self-attention (optionally future-masked)   §2.1
    H^i_joint      LayerNorm(H^i_mt + MultiHead(H^i_mt, H^i_src, H^i_src))                    Eq. (1)
    E_src, E_joint the two encoder outputs: the top src and the top mt (joint) states
    H_pe           the decoder's self-attention output, the query of the multi-source attention  §2.2
What this file changes with respect to msgcore.model.Transformer:
    * `JointEncoder`: a src stack and an mt stack of the same depth N; mt layer i attends to the output of
      src layer i ("stack-level attention"), and mt layer i reads mt layer i-1's output;
    * the decoder's cross sub-layer (`DecoderLayer.cross_block`): parallel (H_1 + H_2) or sequential
      (E_joint first, then E_src) multi-source attention, with one attention module per source;
    * `loss`: a teacher-forcing ratio alpha < 1 feeds the model's own greedy predictions at a fraction
      1 - alpha of the decoder input positions (§3.2).
Ensembles (§3.3) are `msgcore.generation.Ensemble`, which works for any autoregressive model.
The sources are ordered [src, mt], as in `msgcore.data.load_ape`; `encode` returns [E_src, E_joint].

# Deviation: none of this is the authors' code (none was released). The one public reimplementation
# (aeceou/OpenNMT-py, lee_shin_wmt19.py) feeds every mt layer the mt embeddings and the *final* src
# states (no chaining, no stack-level attention) and builds the src padding mask from the mt length;
# this file does neither, and tests/test_postech_ape.py checks both.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from msgcore.attention import KV, MultiHeadAttention
from msgcore.embeddings import NormedEmbeddings
from msgcore.layers import DecoderLayer, EncoderLayer, EncoderOut, FeedForward, ResidualLayer
from msgcore.model import Decoder, Transformer, TransformerConfig, build_embeddings
from msgcore.utils import MsgcoreError

SRC, MT = 0, 1  # positions of the two sources in `sources`, and of E_src / E_joint in the memory
MULTI_SOURCE = ("parallel", "sequential")
TEACHER_FORCING_PASSES = ("parallel", "incremental")


@dataclass
class PostechConfig(TransformerConfig):
    multi_source: str = "sequential"  # the decoder's multi-source attention: "parallel" (Fig. 3a) or "sequential" (3b)
    mt_future_mask: bool = False  # the encoder's masking option (§2.1): causal self-attention in the mt stack
    teacher_forcing_ratio: float = 1.0  # alpha (§3.2): 1.0 = plain teacher forcing
    teacher_forcing_pass: str = "parallel"  # how the model's own inputs are picked when alpha < 1 (see `mixed_inputs`)
    pre_norm: bool = False  # the paper's equations are post-norm (Vaswani et al.); True = pre-norm (OpenNMT-py's)
    joint_encoder: bool = True  # False = the dual-source control: mt layers without the src-attention (Eq. 1 off)
    embedding_norm: bool = False  # LayerNorm after the embedding sum, as in the mBART stand-in (`from_pretrained`)

    def __post_init__(self) -> None:
        """Refuse a setting the model cannot run, with one line naming the field."""
        if self.multi_source not in MULTI_SOURCE:
            raise MsgcoreError(f"PostechConfig.multi_source = {self.multi_source!r}; use one of {MULTI_SOURCE}")
        if self.teacher_forcing_pass not in TEACHER_FORCING_PASSES:
            raise MsgcoreError(f"PostechConfig.teacher_forcing_pass = {self.teacher_forcing_pass!r}; "
                               f"use one of {TEACHER_FORCING_PASSES}")
        if not 0.0 <= self.teacher_forcing_ratio <= 1.0:
            raise MsgcoreError(f"PostechConfig.teacher_forcing_ratio = {self.teacher_forcing_ratio!r} is not in [0, 1]")


def postech_embeddings(cfg: PostechConfig, token_embedding: nn.Embedding) -> nn.Module:
    """Token + position embeddings; with `embedding_norm`, the LayerNorm of chapter 1's mBART stand-in after them
    (the same module, so that its pre-trained weights load by name)."""
    if not cfg.embedding_norm:
        return build_embeddings(cfg, token_embedding)
    plain = build_embeddings(cfg, token_embedding)
    return NormedEmbeddings(token_embedding, plain.positions, cfg.dropout, cfg.segment_stride)


# ---- §2.1 the joint encoder ------------------------------------------------------------------------

class JointEncoderLayer(ResidualLayer):
    """mt layer i: self-attention, attention to src layer i's output (Eq. 1), FFN.

    # Deviation (vague in the paper, Figure 1 is not in our copy): H^i_src is taken to be the *output* of src
    # layer i, and the FFN follows the joint representation H^i_joint, as in every Transformer layer.
    # Deviation: with pre_norm=True the stack-level src states are not normalized (only the top of a
    # pre-norm stack is), so a LayerNorm of this layer's own is applied to them before they become keys
    # and values; post-norm (the default, the paper's equations) needs none.
    """

    def __init__(self, cfg: PostechConfig):
        super().__init__(cfg.d_model, cfg.dropout, cfg.pre_norm)
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.src_attn = MultiHeadAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation_dropout)
        self.self_attn_norm, self.src_attn_norm, self.ffn_norm = (nn.LayerNorm(cfg.d_model) for _ in range(3))
        self.src_kv_norm = nn.LayerNorm(cfg.d_model) if cfg.pre_norm else nn.Identity()
        # Deviation (vague: "the first attention layer of the mt encoding module"): the future mask is
        # read as the first attention *sub-layer* of every mt layer, so it applies in all N mt layers.
        # The src-attention is never masked beyond src padding.
        self.causal = cfg.mt_future_mask
        self.joint = cfg.joint_encoder

    def forward(self, h_mt: Tensor, mt_mask: Tensor, h_src: Tensor, src_mask: Tensor,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """h_mt (B, T_y, D) = mt layer i-1's output; h_src (B, T_x, D) = src layer i's output.
        mt_mask (B, T_y) and src_mask (B, T_x): True = real token. Returns (B, T_y, D) and (B, H, T_y, T_x)."""
        h, _, _ = self.self_attn(self.before(h_mt, self.self_attn_norm), mask=mt_mask[:, None, None, :],
                                 causal=self.causal)
        h_mt = self.after(h_mt, h, self.self_attn_norm)  # H^i_mt (B, T_y, D)
        if not self.joint:  # the dual-source control: a plain encoder layer over mt
            return self.after(h_mt, self.ffn(self.before(h_mt, self.ffn_norm)), self.ffn_norm), None
        c_src, _, weights = self.src_attn(self.before(h_mt, self.src_attn_norm), self.src_kv_norm(h_src),
                                          src_mask[:, None, None, :], need_weights=need_weights)  # Eq. (1): C^i_src
        joint = self.after(h_mt, c_src, self.src_attn_norm)  # Eq. (1): H^i_joint = LayerNorm(H^i_mt + C^i_src)
        return self.after(joint, self.ffn(self.before(joint, self.ffn_norm)), self.ffn_norm), weights


class JointEncoder(nn.Module):
    """Two stacks of N layers: a standard src encoder and the mt encoder of `JointEncoderLayer`s.

    Both stacks share the token embedding (one vocabulary, §3.2) and the position table; positions
    restart at 0 in each source.
    """

    def __init__(self, cfg: PostechConfig, token_embedding: nn.Embedding):
        super().__init__()
        self.embed = postech_embeddings(cfg, token_embedding)
        self.src_layers = nn.ModuleList(
            EncoderLayer(cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.dropout, cfg.attention_dropout,
                         cfg.activation_dropout, cfg.pre_norm) for _ in range(cfg.encoder_layers))
        self.mt_layers = nn.ModuleList(JointEncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.src_final_norm = nn.LayerNorm(cfg.d_model) if cfg.pre_norm else nn.Identity()
        self.mt_final_norm = nn.LayerNorm(cfg.d_model) if cfg.pre_norm else nn.Identity()

    def forward(self, src: Tensor, src_mask: Tensor, mt: Tensor, mt_mask: Tensor,
                need_weights: bool = False) -> tuple[list[EncoderOut], list[Tensor | None]]:
        """src (B, T_x), mt (B, T_y) with masks (True = real). Returns [E_src, E_joint] and, per mt layer,
        its src-attention weights (B, H, T_y, T_x) (None unless `need_weights`)."""
        h_src, h_mt = self.embed(src), self.embed(mt)  # (B, T_x, D), (B, T_y, D)
        weights = []
        for src_layer, mt_layer in zip(self.src_layers, self.mt_layers):
            h_src, _ = src_layer(h_src, src_mask[:, None, None, :])  # H^i_src (B, T_x, D)
            h_mt, w = mt_layer(h_mt, mt_mask, h_src, src_mask, need_weights)  # layer i reads layer i-1 and H^i_src
            weights.append(w)
        e_src = EncoderOut(self.src_final_norm(h_src), src_mask)  # E_src (B, T_x, D)
        e_joint = EncoderOut(self.mt_final_norm(h_mt), mt_mask)  # E_joint (B, T_y, D)
        return [e_src, e_joint], weights


# ---- §2.2 the decoder's multi-source attention -----------------------------------------------------

class MultiSourceDecoderLayer(DecoderLayer):
    """A decoder layer with two cross-attention modules: `cross_attn` reads E_joint, `src_attn` reads E_src.

    The memory is [E_src, E_joint]; the cache keeps one (k, v) per source in the same order.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float, attention_dropout: float,
                 activation_dropout: float, pre_norm: bool):
        super().__init__(d_model, n_heads, d_ff, dropout, attention_dropout, activation_dropout, pre_norm)
        self.src_attn = MultiHeadAttention(d_model, n_heads, attention_dropout)
        self.src_attn_norm = nn.LayerNorm(d_model)

    @staticmethod
    def attend(attn: MultiHeadAttention, query: Tensor, source: EncoderOut, kv: KV | None,
               need_weights: bool) -> tuple[Tensor, KV, Tensor | None]:
        """MultiHead(query, E, E) with E's own padding mask: (B, T, D), its (k, v) and (B, H, T, S) or None."""
        return attn(query, source.hidden, source.mask[:, None, None, :], kv, need_weights=need_weights)

    @staticmethod
    def check(memory: list[EncoderOut]) -> None:
        if len(memory) != 2:
            raise MsgcoreError(f"the multi-source attention reads 2 encoder outputs (E_src, E_joint), got {len(memory)}")


class ParallelAttentionLayer(MultiSourceDecoderLayer):
    """Figure 3a: H_parallel = LayerNorm(H_pe + C_joint) + LayerNorm(H_pe + C_src)."""

    def cross_block(self, x: Tensor, memory: list[EncoderOut], cross_kv: list[KV] | None,
                    need_weights: bool) -> tuple[Tensor, list[KV], Tensor | None]:
        """x = H_pe (B, T, D). Returns H_parallel (B, T, D), [(k, v) of E_src, of E_joint], weights or None."""
        self.check(memory)
        kv = cross_kv or [None, None]
        c_joint, kv_joint, w_joint = self.attend(self.cross_attn, self.before(x, self.cross_attn_norm), memory[MT],
                                                 kv[MT], need_weights)  # C_joint = MultiHead(H_pe, E_joint, E_joint)
        c_src, kv_src, w_src = self.attend(self.src_attn, self.before(x, self.src_attn_norm), memory[SRC],
                                           kv[SRC], need_weights)  # C_src = MultiHead(H_pe, E_src, E_src)
        if self.pre_norm:
            # Deviation: in pre-norm, H_1 + H_2 would carry the residual twice (2 H_pe + ...), compounding
            # over layers; the pre-norm variant adds both attentions to one residual instead.
            x = x + self.dropout(c_joint) + self.dropout(c_src)
        else:
            x = self.after(x, c_joint, self.cross_attn_norm) + self.after(x, c_src, self.src_attn_norm)  # H_1 + H_2
        weights = torch.cat([w_src, w_joint], -1) if need_weights else None  # (B, H, T, T_x + T_y)
        return x, [kv_src, kv_joint], weights


class SequentialAttentionLayer(MultiSourceDecoderLayer):
    """Figure 3b: H' = LayerNorm(H_pe + C_joint), then H_seq = LayerNorm(H' + MultiHead(H', E_src, E_src))."""

    def cross_block(self, x: Tensor, memory: list[EncoderOut], cross_kv: list[KV] | None,
                    need_weights: bool) -> tuple[Tensor, list[KV], Tensor | None]:
        """x = H_pe (B, T, D). Returns H_seq (B, T, D), [(k, v) of E_src, of E_joint], weights or None."""
        self.check(memory)
        kv = cross_kv or [None, None]
        c_joint, kv_joint, w_joint = self.attend(self.cross_attn, self.before(x, self.cross_attn_norm), memory[MT],
                                                 kv[MT], need_weights)  # C_joint = MultiHead(H_pe, E_joint, E_joint)
        h = self.after(x, c_joint, self.cross_attn_norm)  # H' = LayerNorm(H_pe + C_joint)  (B, T, D)
        c_src, kv_src, w_src = self.attend(self.src_attn, self.before(h, self.src_attn_norm), memory[SRC],
                                           kv[SRC], need_weights)  # C_src = MultiHead(H', E_src, E_src)
        x = self.after(h, c_src, self.src_attn_norm)  # H_seq = LayerNorm(H' + C_src)
        weights = torch.cat([w_src, w_joint], -1) if need_weights else None  # (B, H, T, T_x + T_y)
        return x, [kv_src, kv_joint], weights


class PostechDecoder(Decoder):
    def __init__(self, cfg: PostechConfig, token_embedding: nn.Embedding):
        super().__init__(cfg, token_embedding)
        self.embed = postech_embeddings(cfg, token_embedding)

    def build_layer(self, cfg: PostechConfig, index: int) -> nn.Module:
        layer_class = ParallelAttentionLayer if cfg.multi_source == "parallel" else SequentialAttentionLayer
        return layer_class(cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.dropout, cfg.attention_dropout,
                           cfg.activation_dropout, cfg.pre_norm)


# ---- the model, and §3.2's teacher-forcing ratio ---------------------------------------------------

class PostechAPE(Transformer):
    """Joint encoder + multi-source attention decoder; sources [src, mt], target pe."""

    config_class = PostechConfig

    def build_encoder(self, cfg: PostechConfig) -> nn.Module:
        return JointEncoder(cfg, self.token_embedding if cfg.tie_embeddings else self.new_embedding(cfg))

    def build_decoder(self, cfg: PostechConfig) -> nn.Module:
        return PostechDecoder(cfg, self.token_embedding)

    def encode(self, sources: list[Tensor], source_masks: list[Tensor]) -> list[EncoderOut]:
        """sources [src (B, T_x), mt (B, T_y)] -> [E_src, E_joint]."""
        if len(sources) != 2:
            raise MsgcoreError(f"PostechAPE reads exactly 2 sources (src, mt), got {len(sources)}")
        outs, _ = self.encoder(sources[SRC], source_masks[SRC], sources[MT], source_masks[MT])
        return outs

    def stack_attention(self, sources: list[Tensor], source_masks: list[Tensor]) -> list[Tensor]:
        """Per mt layer i, its attention over src layer i's output, (B, H, T_y, T_x): the chapter's heatmap."""
        _, weights = self.encoder(sources[SRC], source_masks[SRC], sources[MT], source_masks[MT], need_weights=True)
        return weights

    @torch.no_grad()
    def mixed_inputs(self, target_in: Tensor, memory: list[EncoderOut]) -> tuple[Tensor, Tensor]:
        """Decoder inputs where a fraction 1 - alpha of the positions hold the model's own greedy predictions.

        target_in (B, T) = prefix + gold y_1..y_{T-1}. Input t > 0 is the gold y_{t-1} with probability alpha,
        else the model's argmax for position t-1. Returns the mixed inputs (B, T) and where they came from the
        model (B, T) bool. The prefix and padding are never replaced.
        # Deviation (vague, §3.2): one Bernoulli draw per (sentence, position), i.e. per token; the model
        # runs in its current mode (dropout on during training), without gradient through the choice.
        # Deviation: teacher_forcing_pass = "parallel" (default) takes the predictions from one teacher-forced
        # pass (the two-pass scheme of Mihaylova & Martins 2019): prediction t-1 is conditioned on the gold
        # prefix. "incremental" is the paper's wording exactly: step by step, prediction t-1 is conditioned on
        # the mixed prefix (T no-grad decoding steps with the KV cache, about a greedy decoding's cost).
        # Deviation: the pad token is never predicted (it would be an input the model never saw).
        """
        pad = self.cfg.pad_id
        use_model = torch.rand(target_in.shape, device=target_in.device) >= self.cfg.teacher_forcing_ratio
        use_model &= target_in != pad
        use_model[:, 0] = False  # the prefix token is always given
        if self.cfg.teacher_forcing_pass == "parallel":
            logits = self.decode(target_in, memory).logits  # (B, T, V) teacher-forced
            logits[..., pad] = float("-inf")
            predictions = logits.argmax(-1)  # (B, T): the model's guess for y_{t+1} at input position t
            shifted = torch.cat([target_in[:, :1], predictions[:, :-1]], 1)  # (B, T): its guess for input t
            return torch.where(use_model, shifted, target_in), use_model
        mixed, cache = target_in.clone(), None
        for t in range(target_in.size(1) - 1):
            out = self.decode(mixed[:, t:t + 1], memory, cache, start_pos=t)
            cache = out.cache
            logits = out.logits[:, -1]  # (B, V)
            logits[:, pad] = float("-inf")
            mixed[:, t + 1] = torch.where(use_model[:, t + 1], logits.argmax(-1), target_in[:, t + 1])
        return mixed, use_model

    def loss(self, batch, label_smoothing: float = 0.0) -> Tensor:
        """Label-smoothed cross-entropy against the gold pe, summed over real target tokens.

        With alpha < 1 the decoder reads `mixed_inputs` (§3.2); alpha = 1 is the plain teacher-forced loss.
        """
        memory = self.encode(batch.sources, batch.source_masks)
        target_in = batch.target_in  # (B, T)
        if self.cfg.teacher_forcing_ratio < 1.0:
            target_in, _ = self.mixed_inputs(target_in, memory)
        logits = self.decode(target_in, memory).logits  # (B, T, V)
        return F.cross_entropy(logits.float().flatten(0, 1), batch.target_out.flatten(), ignore_index=self.cfg.pad_id,
                               reduction="sum", label_smoothing=label_smoothing)


# ---- initialisation from a pre-trained single-source model (the chapter's mBART stand-in) ------------------

NEW_MODULES = ("src_attn.", "src_attn_norm.", "src_kv_norm.")  # what a single-source model does not have


def pretrained_state(single: Transformer) -> dict[str, Tensor]:
    """A single-source model's weights under PostechAPE's names: its encoder layers serve both stacks (the src
    stack whole, the mt stack's self-attention, FFN and norms), its decoder and embeddings the same modules."""
    mapped = {}
    for name, value in single.state_dict().items():
        if name.startswith("encoder.layers."):
            rest = name[len("encoder.layers."):]
            mapped["encoder.src_layers." + rest] = mapped["encoder.mt_layers." + rest] = value
        elif name.startswith("encoder.final_norm."):
            rest = name[len("encoder.final_norm."):]
            mapped["encoder.src_final_norm." + rest] = mapped["encoder.mt_final_norm." + rest] = value
        else:
            mapped[name] = value
    return mapped


def from_pretrained(single: Transformer, cfg: PostechConfig) -> PostechAPE:
    """A PostechAPE model that starts as `single` reading mt: the new attentions (mt->src in the joint encoder,
    the decoder's attention to E_src) get a zero output projection, so at initialisation E_joint is the
    pre-trained encoding of mt and the decoder reads it alone.

    # Deviation: the paper trains from scratch on 4.3M synthetic triplets; with thousands of triplets we start
    # from chapter 1's denoising model (a copier, like mBART) and open the new paths from zero (as adapters do),
    # so that training starts at the do-nothing output instead of at random text. It needs cfg.pre_norm and
    # cfg.embedding_norm to match the pre-trained model.
    """
    model = PostechAPE(cfg)
    missing, unexpected = model.load_state_dict(pretrained_state(single), strict=False)
    new = [name for name in missing if not any(part in name for part in NEW_MODULES)]
    if unexpected or new:
        raise MsgcoreError(f"the pre-trained model does not fit PostechAPE: unexpected {unexpected[:3]}, "
                           f"missing {new[:3]} (check pre_norm and embedding_norm)")
    with torch.no_grad():
        for name, module in model.named_modules():
            if name.endswith(".src_attn"):
                module.out_proj.weight.zero_()
                if module.out_proj.bias is not None:
                    module.out_proj.bias.zero_()
    return model
