"""Coverage-NAT: non-autoregressive translation with token- and sentence-level coverage.

Shan, Feng, Shao. "Modeling Coverage for Non-Autoregressive Neural Machine Translation".
IJCNN 2021 (arXiv:2104.11897). No public code: this file follows the equations as we read them.

Notation (batch-first; the paper's symbols where it has them):
    x_1 .. x_S      source tokens;  y_1 .. y_T target tokens (here y + </s>, see `CoverageNAT`)
    L               decoder layers; the top one (layer L) becomes the coverage layer
    A^k (T x S)     inter-attention (encoder-decoder attention) of iteration k, averaged over heads;
                    A^0 is the cross-attention of decoder layer L-1
    H^k             hidden states of iteration k; H^0 is the output of decoder layer L-1  §III-B, Eq. (7-10)
    C^k, B^k        coverage and coverage bias of iteration k                           Eq. (6), (8)
    lambda          trainable scale of the coverage bias in the attention logits       Eq. (9)
    K               iterations of the coverage layer: K_train (config) and K_dec (argument)
    E, W_s, W_e     source embedding, source projection, target embedding              §III-C, Eq. (11-14)
    p_t             output distribution at target position t
    alpha, beta     weights of the length and coverage-agreement losses               Eq. (15-16)
What this file changes with respect to msgcore.model.Transformer:
    * NAT-Base (§III-A): a non-causal decoder fed, at every target position, a uniform copy of the
      source embeddings (Gu et al. 2018) or, as in the paper, the <unk> embedding, plus the position;
      a length predictor over (target - source) length offsets;
    * TCIR (§III-B): the top decoder layer is run K times, each iteration on the previous one's output,
      its cross-attention biased by how much of each source token the earlier target positions covered
      in the previous iteration;
    * SCA (§III-C): a loss pulling the expected embedding of the (soft) hypothesis towards the
      projected bag-of-words of the source;
    * the losses (`CoverageNAT.loss`) and parallel decoding (`generate_nat`, `generate_lpd`),
      with the post-processing helpers `remove_consecutive_repeats` and `repeat_ratio`.
Equation numbers are the paper's (arXiv v1): (4) L_mle, (6) coverage, (7-10) one TCIR iteration,
(11-14) SCA, (15) the phase-1 loss, (16) the phase-2 loss.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from msgcore.attention import MultiHeadAttention
from msgcore.generation import strip
from msgcore.layers import DecoderLayer, EncoderOut
from msgcore.model import Decoder, DecoderOut, Transformer, TransformerConfig
from msgcore.tokenizer import EOS_ID, UNK_ID
from msgcore.utils import MsgcoreError


@dataclass
class CoverageNATConfig(TransformerConfig):
    use_coverage: bool = True  # False = NAT-Base (§III-A): the top decoder layer is a plain non-causal layer
    coverage_iterations: int = 3  # K_train: iterations of the coverage layer in training (K_dec: `iterations=`)
    coverage_scale_init: float = 1.0  # initial lambda, the trainable scale of the coverage bias (Eq. 9)
    max_length_offset: int = 128  # length classes: target - source length clipped to [-m, m], 2m + 1 classes
    length_loss_weight: float = 0.1  # alpha (Eq. 15-16)
    coverage_weight: float = 0.0  # beta (Eq. 16): 0 in phase 1, > 0 when fine-tuning with SCA (phase 2)
    label_smoothing: float = 0.0  # MLE label smoothing when the caller passes none (the Trainer always passes its own)
    decoder_input: str = "uniform_copy"  # "uniform_copy" (Gu et al. 2018) or "unk" (the paper, §III-A)
    unk_id: int = UNK_ID  # the decoder input at every target position when decoder_input = "unk"
    eos_id: int = EOS_ID  # the last target token; outputs are cut at the first one


# ---- small tensor helpers ---------------------------------------------------------------------

def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean over the real positions: x (B, L, D), mask (B, L) True = real -> (B, D)."""
    weights = mask.unsqueeze(-1).to(x.dtype)  # (B, L, 1)
    return (x * weights).sum(1) / weights.sum(1).clamp(min=1.0)


# ---- length prediction (§III-A) ---------------------------------------------------------------

def offset_to_class(offset: Tensor, max_offset: int) -> Tensor:
    """Length offset (target - source length) -> class in [0, 2m], clipped at +-m (as Seq-NAT)."""
    return offset.clamp(-max_offset, max_offset) + max_offset


def class_to_offset(length_class: Tensor, max_offset: int) -> Tensor:
    """Class in [0, 2m] -> length offset in [-m, m]."""
    return length_class - max_offset


# ---- token-level coverage iterative refinement (§III-B) ----------------------------------------

def coverage(attention: Tensor, target_mask: Tensor | None = None) -> Tensor:
    """C_{t,i} = min(sum_{t' < t} A_{t',i}, 1): what the strictly earlier target positions covered.

    attention (B, T, S) head-averaged inter-attention; target_mask (B, T) True = real position.
    Returns (B, T, S); row t = 0 is zero.
    """
    if target_mask is not None:
        attention = attention * target_mask.unsqueeze(-1).to(attention.dtype)  # padded rows cover nothing
    covered = attention.cumsum(1)  # (B, T, S): sum over t' <= t
    earlier = torch.cat([torch.zeros_like(covered[:, :1]), covered[:, :-1]], 1)  # sum over t' < t
    return earlier.clamp(max=1.0)  # Eq. (6): C^k_{t,i} = min(sum_{t'<t} A^{k-1}_{t',i}, 1)


class CoverageCrossAttention(MultiHeadAttention):
    """Cross-attention with an additive bias on the logits: softmax(QK^T / sqrt(d_model) + bias) V.

    Same parameters as MultiHeadAttention (a NAT-Base checkpoint loads into it). The math path is
    always taken, since the next iteration needs the weights. Eq. (9) is written for one attention over the whole
    d_model; ours has H heads, and each head's logits are divided by sqrt(d_model), as the equation writes it (see
    the Deviation in `forward`).
    """

    def forward(self, x: Tensor, memory: Tensor, mask: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
        """x (B, T, D), memory (B, S, D), mask (B, 1, 1, S) True = real key, bias (B, T, S).

        Returns the output (B, T, D) and the head-averaged weights A (B, T, S), before dropout.
        """
        q = self.split_heads(self.q_proj(x))  # (B, H, T, Dh)
        k, v = self.keys_values(x, memory, None)  # (B, H, S, Dh) each
        # The same bias for every head (see the Deviation in CoverageDecoderLayer).
        # Deviation: Eq. (9)'s single head sums its dot product over d_model dimensions; a head of ours sums over
        # d_head = d_model / H, yet is divided by the same sqrt(d_model). Its content logits are so sqrt(H) times
        # smaller than the equation's (and than our other attention layers', divided by sqrt(d_head)), and the
        # coverage bias lambda B weighs sqrt(H) times more against them than the paper's. lambda is trainable and
        # starts at 1; we keep the equation's divisor rather than rescale the bias by a factor the paper never uses.
        scores = q @ k.transpose(-2, -1) / math.sqrt(x.size(-1)) + bias.unsqueeze(1)  # Eq. (9): / sqrt(d_model) + lambda B
        scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)  # Eq. (9): A^k, (B, H, T, S)
        dropped = F.dropout(weights, p=self.dropout) if self.training and self.dropout > 0 else weights
        out = self.out_proj(self.merge_heads(dropped @ v))  # A^k V, the FFN's input in Eq. (10), (B, T, D)
        return out, weights.mean(1)


class NATDecoderLayer(DecoderLayer):
    """A decoder layer whose self-attention sees every real target position (no causal mask)."""

    def forward(self, x: Tensor, memory: list[EncoderOut], self_mask: Tensor,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """x (B, T, D); self_mask (B, 1, 1, T) True = real target key. Returns x and (B, H, T, S) or None."""
        h, _, _ = self.self_attn(self.before(x, self.self_attn_norm), mask=self_mask)  # not causal
        x = self.after(x, h, self.self_attn_norm)
        h, _, weights = self.cross_attend(self.before(x, self.cross_attn_norm), memory, None, need_weights)
        x = self.after(x, h, self.cross_attn_norm)
        x = self.after(x, self.ffn(self.before(x, self.ffn_norm)), self.ffn_norm)
        return x, weights


class CoverageDecoderLayer(NATDecoderLayer):
    """The iterative coverage layer replacing the top decoder layer (§III-B, Eq. 6-10).

    Iteration k = 1..K reads H^{k-1} and A^{k-1} (H^0, A^0: the output and head-averaged cross-attention
    of layer L-1): self-attention over H^{k-1} (Eq. 7), the coverage C^k of A^{k-1} (Eq. 6), the bias
    B^k = 1 - C^k (Eq. 8), cross-attention with logits QK^T/sqrt(d_model) + lambda B^k (Eq. 9) and the FFN
    (Eq. 10) give H^k and A^k. The iterations share this layer's weights; H^K is the decoder's output.
    # Deviation: each sub-layer keeps the decoder's residual connection and layer norm (the paper
    # omits them "for simplicity", §II), and the attentions keep their Q/K/V projections.
    # Deviation: multi-head attention gets one coverage per (t, i), computed from the head-averaged
    # attention A = mean_h A_h, and the same bias is added to every head.
    # Deviation: gradients flow through A^{k-1} into the coverage (nothing is detached); A^0 is
    # layer L-1's attention as returned by MultiHeadAttention (after attention dropout, if any).
    # Only iteration K's output is supervised (no loss on intermediate iterations).
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float, attention_dropout: float,
                 activation_dropout: float, pre_norm: bool, coverage_scale_init: float = 1.0):
        super().__init__(d_model, n_heads, d_ff, dropout, attention_dropout, activation_dropout, pre_norm)
        self.cross_attn = CoverageCrossAttention(d_model, n_heads, attention_dropout)
        # lambda (Eq. 9), a one-element vector (a 0-d tensor cannot be fingerprinted by the run cache)
        self.coverage_scale = nn.Parameter(torch.full((1,), float(coverage_scale_init)))

    def forward(self, x: Tensor, memory: list[EncoderOut], self_mask: Tensor, target_mask: Tensor,
                attention: Tensor, iterations: int, states: list | None = None) -> tuple[Tensor, Tensor]:
        """x = H^0 (B, T, D), the output of layer L-1; attention = A^0 (B, T, S), its head-averaged
        cross-attention. Returns H^K (B, T, D) and A^K (B, T, S); `states`, when a list, receives H^1..H^K.
        """
        if len(memory) != 1:
            raise MsgcoreError(f"the coverage layer attends to 1 source, got {len(memory)}")
        if iterations < 1:
            raise MsgcoreError(f"the coverage layer needs at least 1 iteration, got {iterations}")
        source = memory[0]
        key_mask = source.mask[:, None, None, :]  # (B, 1, 1, S)
        for _ in range(iterations):  # iteration k reads H^{k-1}, A^{k-1} and returns H^k, A^k
            h, _, _ = self.self_attn(self.before(x, self.self_attn_norm), mask=self_mask)
            s = self.after(x, h, self.self_attn_norm)  # Eq. (7): H-hat^k = Attn(H^{k-1}, H^{k-1}, H^{k-1})
            bias = self.coverage_scale * (1.0 - coverage(attention, target_mask))  # Eq. (6), (8): lambda B^k
            h, attention = self.cross_attn(self.before(s, self.cross_attn_norm), source.hidden, key_mask,
                                           bias)  # Eq. (9): A^k, and A^k E_enc
            y = self.after(s, h, self.cross_attn_norm)
            x = self.after(y, self.ffn(self.before(y, self.ffn_norm)), self.ffn_norm)  # Eq. (10): H^k
            if states is not None:
                states.append(x)
        return x, attention


@dataclass
class NATEncoderOut(EncoderOut):
    """An encoded source that also keeps its token ids (the decoder copies their embeddings)."""

    tokens: Tensor | None = None  # (B, S) source token ids

    def index_select(self, index: Tensor) -> "NATEncoderOut":
        tokens = None if self.tokens is None else self.tokens.index_select(0, index)
        return NATEncoderOut(self.hidden.index_select(0, index), self.mask.index_select(0, index), tokens)


def uniform_copy_index(source_mask: Tensor, target_mask: Tensor) -> Tensor:
    """(B, T) source position copied to each target position: round(t * S / T), at most S - 1.

    S and T are each sentence's real lengths (both count </s>), so the last target position (</s>)
    reads the source's </s> when S <= T. Uniform copy of Gu et al. (2018), §3.1.
    """
    S = source_mask.sum(1, keepdim=True).float()  # (B, 1)
    T = target_mask.sum(1, keepdim=True).clamp(min=1).float()  # (B, 1)
    t = torch.arange(target_mask.size(1), device=target_mask.device).float()  # (T,)
    index = torch.floor(t * S / T + 0.5).long()  # (B, T): round half up
    return torch.minimum(index, (S.long() - 1).clamp(min=0))


class NATDecoder(Decoder):
    """Non-causal decoder over copied-source (or <unk>) + position inputs; the top layer is the coverage
    layer (or not)."""

    def __init__(self, cfg: CoverageNATConfig, token_embedding: nn.Embedding):
        if cfg.decoder_input not in ("uniform_copy", "unk"):
            raise MsgcoreError(f"unknown decoder_input {cfg.decoder_input!r}; use 'uniform_copy' or 'unk'")
        super().__init__(cfg, token_embedding)
        self.cfg = cfg

    def build_layer(self, cfg: CoverageNATConfig, index: int) -> nn.Module:
        args = (cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.dropout, cfg.attention_dropout,
                cfg.activation_dropout, cfg.pre_norm)
        if cfg.use_coverage and index == cfg.decoder_layers - 1:
            return CoverageDecoderLayer(*args, coverage_scale_init=cfg.coverage_scale_init)
        return NATDecoderLayer(*args)

    def input_tokens(self, target_mask: Tensor, source: EncoderOut) -> Tensor:
        """(B, T) token id whose embedding feeds each target position; padding gets <pad>.

        # Deviation: the paper (§III-A) feeds <unk> at every position ("unk"). Every position then gets
        # the same vector but for its position encoding (chapter 5 measures the mean cosine between the
        # inputs of two positions with both), and a small model repeats many of its tokens; the default
        # is Gu et al.'s uniform copy of the source embeddings, which the paper's NAT-Base baseline
        # (fairseq's) also offers.
        """
        if self.cfg.decoder_input == "unk":
            tokens = torch.full_like(target_mask, self.cfg.unk_id, dtype=torch.long)  # (B, T)
        else:
            if getattr(source, "tokens", None) is None:
                raise MsgcoreError("decoder_input='uniform_copy' needs the source tokens: encode with CoverageNAT.encode")
            tokens = source.tokens.gather(1, uniform_copy_index(source.mask, target_mask))  # (B, T)
        return tokens.masked_fill(~target_mask, self.cfg.pad_id)

    def inputs(self, target_mask: Tensor, source: EncoderOut) -> Tensor:
        """sqrt(d) E[copied source token or <unk>] + PE[t] at every real position (§III-A), (B, T, D)."""
        return self.embed(self.input_tokens(target_mask, source))

    def forward(self, target_mask: Tensor, memory: list[EncoderOut], iterations: int,
                need_weights: bool = False) -> DecoderOut:
        """target_mask (B, T) True = real target position: all T positions are decoded at once.

        With need_weights, `cross_attention` holds (B, H, T, S) per plain layer and, for the
        coverage layer, the head-averaged A^K as (B, 1, T, S).
        """
        x = self.inputs(target_mask, memory[0])  # (B, T, D)
        self_mask = target_mask[:, None, None, :]  # (B, 1, 1, T): every real target position
        top = self.layers[-1]
        covering = isinstance(top, CoverageDecoderLayer)
        attention = []
        for layer in self.layers[:-1]:
            x, weights = layer(x, memory, self_mask, need_weights or covering)
            attention.append(weights)
        if covering:
            x, last = top(x, memory, self_mask, target_mask, attention[-1].mean(1), iterations)  # H^0, A^0
            attention.append(last.unsqueeze(1))
        else:
            x, weights = top(x, memory, self_mask, need_weights)
            attention.append(weights)
        logits = self.output_projection(self.final_norm(x))  # (B, T, V)
        return DecoderOut(logits, [], attention if need_weights else [])


# ---- sentence-level coverage agreement (§III-C) -------------------------------------------------

def bag_of_words(vectors: Tensor, mask: Tensor, projection: nn.Module) -> Tensor:
    """Mean_l ReLU(v_l W_s) over the real positions: vectors (B, L, D), mask (B, L) -> (B, D)."""
    return masked_mean(torch.relu(projection(vectors)), mask)


def coverage_agreement(source_tokens: Tensor, source_mask: Tensor, probs: Tensor, target_mask: Tensor,
                       source_embedding: Tensor, target_embedding: Tensor, projection: nn.Module) -> Tensor:
    """SCA distance per sentence (B,): ||E_src - E_hyp||_2 / sqrt(d) (Eq. 11-14).

    source_tokens, source_mask (B, S); probs (B, T, V) the output distributions p_t; target_mask
    (B, T); source_embedding E and target_embedding W_e (V, D); projection W_s (D -> D).
    Only the source goes through ReLU(. W_s) (Eq. 11): the hypothesis is the mean expected target
    embedding p_t W_e (Eq. 12-13), so W_s must map source words onto the target embedding space and
    cannot satisfy the loss by collapsing to zero.
    # Deviation: embeddings are the raw tables (no sqrt(d) scale); W_s has no bias; the means run
    # over real positions, and source and target keep their </s> (and any language tag), as the masks say.
    """
    e_src = bag_of_words(source_embedding[source_tokens], source_mask, projection)  # Eq. (11), (B, D)
    expected = probs @ target_embedding  # Eq. (12): E_hyp,t = p_t W_e, (B, T, D)
    e_hyp = masked_mean(expected, target_mask)  # Eq. (13), (B, D)
    return (e_src - e_hyp).norm(dim=-1) / math.sqrt(e_src.size(-1))  # Eq. (14)


# ---- the model ------------------------------------------------------------------------------

class CoverageNAT(Transformer):
    """Coverage-NAT (use_coverage=True) or NAT-Base (use_coverage=False) over one source.

    The target is the Trainer's `target_out` = y + </s>: `forward` returns its (B, T, V) logits
    decoded in parallel from the reference length, `loss` the paper's losses.
    # Deviation: lengths count the </s> on both sides (source: its mask, target: y + </s>), so the
    # decoder also predicts the final </s>; `generate_nat` cuts the output at the first </s>.
    """

    config_class = CoverageNATConfig

    def __init__(self, cfg: CoverageNATConfig):
        if cfg.use_coverage and cfg.decoder_layers < 2:
            raise MsgcoreError("the coverage layer takes A^0 from decoder layer L-1: use decoder_layers >= 2")
        super().__init__(cfg)
        self.length_predictor = nn.Linear(cfg.d_model, 2 * cfg.max_length_offset + 1)  # §III-A
        self.bag_projection = nn.Linear(cfg.d_model, cfg.d_model, bias=False)  # W_s (Eq. 11)
        self.reset_linear_parameters()  # again, now that the new layers exist

    def build_decoder(self, cfg: CoverageNATConfig) -> nn.Module:
        return NATDecoder(cfg, self.token_embedding)

    def encode(self, sources: list[Tensor], source_masks: list[Tensor]) -> list[NATEncoderOut]:
        """The Transformer's encoder output, keeping the source token ids for the decoder's copied inputs."""
        return [NATEncoderOut(m.hidden, m.mask, tokens)
                for m, tokens in zip(super().encode(sources, source_masks), sources)]

    # -- length ------------------------------------------------------------------------------
    def length_logits(self, source: EncoderOut) -> Tensor:
        """(B, 2m + 1) scores of the length offsets, from the mean of the encoder states (§III-A)."""
        # Deviation: the encoder states are not detached (the length loss also trains the encoder).
        return self.length_predictor(masked_mean(source.hidden, source.mask))

    def predict_lengths(self, source: EncoderOut) -> Tensor:
        """(B,) predicted target lengths (counting </s>): source length + argmax offset, at least 1."""
        offset = class_to_offset(self.length_logits(source).argmax(-1), self.cfg.max_length_offset)
        return (source.mask.sum(1) + offset).clamp(1, self.cfg.max_positions)

    # -- decoding ----------------------------------------------------------------------------
    def decode(self, target_mask: Tensor, memory: list[EncoderOut], iterations: int | None = None,
               need_weights: bool = False) -> DecoderOut:
        """All target positions at once. `iterations` = K_dec (default K_train = cfg.coverage_iterations).

        Not the autoregressive `decode(tokens, memory, cache, start_pos)`: use `generate_nat`.
        """
        if target_mask.dtype != torch.bool:
            raise MsgcoreError("CoverageNAT is non-autoregressive: decode() takes the (B, T) bool target "
                               "mask; translate with generate_nat, not msgcore.generation")
        iterations = self.cfg.coverage_iterations if iterations is None else iterations
        return self.decoder(target_mask, memory, iterations, need_weights)

    def generate(self, sources: list[Tensor], source_masks: list[Tensor], prefix_id: int, eos_id: int,
                 cfg=None, forbidden: Sequence[int] = ()) -> list[list[int]]:
        """The translation hook (`translate_encoded`, the Trainer's dev BLEU): parallel argmax decoding
        at the predicted length with K_dec = K_train. The search settings `cfg` do not apply."""
        return generate_nat(self, sources, source_masks, forbidden=forbidden)

    def forward(self, batch) -> Tensor:
        """Logits (B, T, V) for batch.target_out, decoded from the reference length (K = K_train)."""
        memory = self.encode(batch.sources, batch.source_masks)
        return self.decode(batch.target_mask, memory).logits

    # -- losses ------------------------------------------------------------------------------
    def loss(self, batch, label_smoothing: float | None = None) -> Tensor:
        """The Trainer's hook: the total loss summed over real target tokens (the Trainer averages).

        `label_smoothing` is the Trainer's epsilon (cfg.label_smoothing when None).
        # Deviation: the length and coverage terms are per-sentence means; scaling the total by the
        # token count keeps their weight relative to the per-token MLE as in Eq. (15-16).
        """
        return self.loss_terms(batch, label_smoothing)["total"] * batch.target_mask.sum()

    def loss_terms(self, batch, label_smoothing: float | None = None) -> dict[str, Tensor]:
        """mle + alpha * length (+ beta * coverage) (Eq. 15-16), each a mean (per token / per sentence).

        # Deviation: L_mle (Eq. 4) is label-smoothed with the Trainer's epsilon (0.1 by default), as
        # fairseq's NAT models are: (1 - eps) * NLL + eps * mean_v(-log p_v), per real target token.
        """
        cfg = self.cfg
        eps = cfg.label_smoothing if label_smoothing is None else label_smoothing
        memory = self.encode(batch.sources, batch.source_masks)
        logits = self.decode(batch.target_mask, memory).logits  # (B, T, V), Eq. (3)
        mle = F.cross_entropy(logits.float().flatten(0, 1), batch.target_out.flatten(), ignore_index=cfg.pad_id,
                              label_smoothing=eps)  # Eq. (4), per real target token
        offset = batch.target_mask.sum(1) - memory[0].mask.sum(1)  # (B,) reference length offset
        length = F.cross_entropy(self.length_logits(memory[0]).float(),
                                 offset_to_class(offset, cfg.max_length_offset))  # L_length (§III-A)
        with torch.set_grad_enabled(torch.is_grad_enabled() and cfg.coverage_weight > 0):  # phase 1: log only
            sca = coverage_agreement(batch.sources[0], batch.source_masks[0], logits.float().softmax(-1),
                                     batch.target_mask, self.encoder.embed.tokens.weight,
                                     self.decoder.embed.tokens.weight, self.bag_projection).mean()  # Eq. (11-14)
        total = mle + cfg.length_loss_weight * length + cfg.coverage_weight * sca  # Eq. (15), (16) when beta > 0
        return {"mle": mle, "length": length, "coverage": sca, "total": total}


# ---- inference ------------------------------------------------------------------------------

def lpd_candidates(predicted_length: Tensor | int, l: int) -> Tensor:
    """Length parallel decoding: l consecutive lengths around each prediction, (B,) -> (B, l).

    # Deviation: the window is [n - (l-1)//2, ...] (one more above than below when l is even),
    # shifted up where it would go below 1, so there are always l distinct lengths >= 1.
    """
    if l < 1:
        raise MsgcoreError(f"length parallel decoding needs l >= 1 candidates, got {l}")
    predicted = torch.as_tensor(predicted_length)
    start = (predicted - (l - 1) // 2).clamp(min=1)
    return start.unsqueeze(-1) + torch.arange(l, device=predicted.device)


@torch.no_grad()
def decode_lengths(model: CoverageNAT, memory: list[EncoderOut], lengths: Tensor, iterations: int | None = None,
                   forbidden: Sequence[int] = ()) -> list[list[int]]:
    """One parallel argmax pass with the given (B,) lengths; each output cut at its first </s>."""
    target_mask = torch.arange(int(lengths.max()), device=lengths.device) < lengths.unsqueeze(1)  # (B, T)
    logits = model.decode(target_mask, memory, iterations).logits  # (B, T, V)
    logits[..., [model.cfg.pad_id, *forbidden]] = float("-inf")
    tokens = logits.argmax(-1).tolist()  # Eq. (5): y_t = argmax p(y_t | X)
    return [strip(row[:n], model.cfg.eos_id) for row, n in zip(tokens, lengths.tolist())]


@torch.no_grad()
def generate_nat(model: CoverageNAT, sources: list[Tensor], source_masks: list[Tensor],
                 iterations: int | None = None, forbidden: Sequence[int] = ()) -> list[list[int]]:
    """Predict each length, then decode all positions at once (coverage layer K_dec = `iterations`).

    Returns token ids without </s>; consecutive repeats are kept (see `remove_consecutive_repeats`).
    Puts the model in eval mode.
    """
    model.eval()
    memory = model.encode(sources, source_masks)
    return decode_lengths(model, memory, model.predict_lengths(memory[0]), iterations, forbidden)


@torch.no_grad()
def generate_lpd(model: CoverageNAT, sources: list[Tensor], source_masks: list[Tensor], l: int,
                 iterations: int | None = None, forbidden: Sequence[int] = ()) -> list[list[list[int]]]:
    """Length parallel decoding: for each sentence the outputs for its `lpd_candidates` lengths (B x l).

    Choosing among them (rescoring with an autoregressive teacher) is left to the caller.
    """
    model.eval()
    memory = model.encode(sources, source_masks)
    lengths = lpd_candidates(model.predict_lengths(memory[0]), l)  # (B, l)
    B = lengths.size(0)
    rows = torch.arange(B, device=lengths.device).repeat_interleave(l)  # (B * l,) sentence of each row
    outputs = decode_lengths(model, [m.index_select(rows) for m in memory], lengths.flatten(), iterations, forbidden)
    return [outputs[b * l:(b + 1) * l] for b in range(B)]


# ---- post-processing --------------------------------------------------------------------------

def remove_consecutive_repeats(ids: Sequence[int]) -> list[int]:
    """Collapse runs of the same token: [5, 5, 6, 5] -> [5, 6, 5]."""
    return [token for i, token in enumerate(ids) if i == 0 or token != ids[i - 1]]


def repeat_ratio(outputs: Sequence[Sequence[int]]) -> float:
    """Percentage of output tokens equal to their predecessor (measured before deduplication)."""
    repeats = sum(sum(a == b for a, b in zip(ids, ids[1:])) for ids in outputs)
    total = sum(len(ids) for ids in outputs)
    return 100.0 * repeats / total if total else 0.0
