"""Encoder and decoder layers (Vaswani et al. 2017, §3.1 and Figure 1).

Each sub-layer is wrapped in a residual connection and layer normalisation:
    post-norm (the paper):  x = LayerNorm(x + Dropout(Sublayer(x)))
    pre-norm:               x = x + Dropout(Sublayer(LayerNorm(x)))
# Deviation: pre-norm is our default; it trains stably without a long warmup at small scale
# (Xiong et al. 2020). Set `pre_norm=False` for the paper's arrangement.

Hooks for the papers' models: `DecoderLayer.cross_attend` is the only place where the decoder
looks at the encoder output, so a multi-source model overrides that one method; `cross_block`
wraps it in the residual connection and norm, for a model that needs to change those too.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from msgcore.attention import KV, MultiHeadAttention, reorder_with_room
from msgcore.utils import MsgcoreError


@dataclass
class EncoderOut:
    """One encoded source."""

    hidden: Tensor  # (B, S, D) top-layer states
    mask: Tensor  # (B, S) bool, True = real token

    def index_select(self, index: Tensor) -> "EncoderOut":
        """Rows `index` of the batch, e.g. to repeat each sentence once per beam."""
        return EncoderOut(self.hidden.index_select(0, index), self.mask.index_select(0, index))


@dataclass
class LayerCache:
    """What one decoder layer keeps between decoding steps."""

    self_kv: KV | None = None  # (k, v) of all earlier target positions, each (B, H, t, Dh)
    cross_kv: list[KV] | None = None  # one (k, v) per encoded source, computed at step 0

    def index_select(self, index: Tensor, cross_index: Tensor | None = None) -> "LayerCache":
        """Reorder the batch (beam search): the self-attention K/V to the hypothesis rows `index`; the cross K/V,
        which have the memory's rows (one per sentence, shared by its beams), to `cross_index` (None = unchanged:
        no sentence left the batch)."""
        self_kv = tuple(reorder_with_room(t, index) for t in self.self_kv)  # room for the next step's keys
        cross_kv = self.cross_kv
        if cross_index is not None and cross_kv is not None:
            cross_kv = [tuple(t.index_select(0, cross_index) for t in kv) for kv in cross_kv]
        return LayerCache(self_kv, cross_kv)


def keep_mask(shape: torch.Size, p: float, device: torch.device) -> Tensor:
    """A bool mask of `shape`, each element True (kept) with probability 1 - p, p taken to 16 bits.

    Each element reads one 16-bit lane of int64 draws over their full range (`random_`, four lanes per draw):
    # Deviation: P(drop) is round(p * 2^16) / 2^16, not p (|difference| < 8e-6).
    """
    n = math.prod(shape)
    lanes = torch.empty((n + 3) // 4, dtype=torch.int64, device=device).random_(-2 ** 63, None).view(torch.int16)
    return (lanes[:n] >= round(p * 65536) - 32768).view(shape)


class Dropout(nn.Module):
    """Inverted dropout (Srivastava et al., 2014): zero each element with probability p, scale the rest by
    1 / (1 - p); the identity in eval mode. On a GPU it is torch's dropout. On a CPU torch draws one Bernoulli sample
    per element from a scalar generator, which took 16% of a bf16 training step at `small` on 2 threads; the mask
    of `keep_mask` is about 3x faster over forward and backward."""

    def __init__(self, p: float):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise MsgcoreError(f"dropout probability {p} is out of range (0 <= p < 1)")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu":
            return nn.functional.dropout(x, self.p, training=True)
        return x * (keep_mask(x.shape, self.p, x.device).to(x.dtype) * (1.0 / (1.0 - self.p)))

    def extra_repr(self) -> str:
        return f"p={self.p}"


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (§3.3, Eq. 2)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float):
        super().__init__()
        self.w1, self.w2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.dropout = Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(self.dropout(torch.relu(self.w1(x))))  # Eq. (2)


class ResidualLayer(nn.Module):
    """Shared residual/normalisation plumbing of the encoder and decoder layers."""

    def __init__(self, d_model: int, dropout: float, pre_norm: bool):
        super().__init__()
        self.pre_norm = pre_norm
        self.dropout = Dropout(dropout)

    def before(self, x: Tensor, norm: nn.LayerNorm) -> Tensor:
        """The sub-layer's input: normalised first in pre-norm."""
        return norm(x) if self.pre_norm else x

    def after(self, x: Tensor, sublayer_out: Tensor, norm: nn.LayerNorm) -> Tensor:
        """Residual connection; post-norm normalises the sum (§5.4)."""
        y = x + self.dropout(sublayer_out)
        return y if self.pre_norm else norm(y)


class EncoderLayer(ResidualLayer):
    """Self-attention then FFN (§3.1, Figure 1 left)."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float,
                 attention_dropout: float, activation_dropout: float, pre_norm: bool):
        super().__init__(d_model, dropout, pre_norm)
        self.self_attn = MultiHeadAttention(d_model, n_heads, attention_dropout)
        self.ffn = FeedForward(d_model, d_ff, activation_dropout)
        self.self_attn_norm, self.ffn_norm = nn.LayerNorm(d_model), nn.LayerNorm(d_model)

    def forward(self, x: Tensor, mask: Tensor, need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """x (B, S, D); mask (B, 1, 1, S) True = real key."""
        h, _, weights = self.self_attn(self.before(x, self.self_attn_norm), mask=mask,
                                       need_weights=need_weights)
        x = self.after(x, h, self.self_attn_norm)
        x = self.after(x, self.ffn(self.before(x, self.ffn_norm)), self.ffn_norm)
        return x, weights


class DecoderLayer(ResidualLayer):
    """Causal self-attention, cross-attention to the encoder, FFN (§3.1, Figure 1 right)."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float,
                 attention_dropout: float, activation_dropout: float, pre_norm: bool):
        super().__init__(d_model, dropout, pre_norm)
        self.self_attn = MultiHeadAttention(d_model, n_heads, attention_dropout)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, attention_dropout)
        self.ffn = FeedForward(d_model, d_ff, activation_dropout)
        self.self_attn_norm, self.cross_attn_norm, self.ffn_norm = (nn.LayerNorm(d_model) for _ in range(3))

    def cross_attend(self, x: Tensor, memory: list[EncoderOut], cross_kv: list[KV] | None,
                     need_weights: bool) -> tuple[Tensor, list[KV], Tensor | None]:
        """Hook: attend to the encoder output. The base model has exactly one source."""
        if len(memory) != 1:
            raise MsgcoreError(f"this decoder attends to 1 source, got {len(memory)}; "
                               "concatenate the sources or use a multi-source model")
        mask = memory[0].mask[:, None, None, :]  # (B, 1, 1, S)
        h, kv, weights = self.cross_attn(x, memory[0].hidden, mask, cross_kv[0] if cross_kv else None,
                                         need_weights=need_weights)
        return h, [kv], weights

    def cross_block(self, x: Tensor, memory: list[EncoderOut], cross_kv: list[KV] | None,
                    need_weights: bool) -> tuple[Tensor, list[KV], Tensor | None]:
        """Hook: the whole cross sub-layer, residual connection and norm included: x (B, T, D) -> x.

        The default wraps `cross_attend` like every other sub-layer; a model whose sources combine
        around the residual connection (several norms, sources in sequence) overrides this instead.
        """
        h, cross_kv, weights = self.cross_attend(self.before(x, self.cross_attn_norm), memory, cross_kv, need_weights)
        return self.after(x, h, self.cross_attn_norm), cross_kv, weights

    def forward(self, x: Tensor, memory: list[EncoderOut], cache: LayerCache | None = None,
                need_weights: bool = False) -> tuple[Tensor, LayerCache, Tensor | None]:
        """x (B, T, D): this step's target states (T = 1 when decoding incrementally)."""
        cache = cache or LayerCache()
        h, self_kv, _ = self.self_attn(self.before(x, self.self_attn_norm), cache=cache.self_kv, causal=True)
        x = self.after(x, h, self.self_attn_norm)
        x, cross_kv, weights = self.cross_block(x, memory, cache.cross_kv, need_weights)
        x = self.after(x, self.ffn(self.before(x, self.ffn_norm)), self.ffn_norm)
        return x, LayerCache(self_kv, cross_kv), weights
