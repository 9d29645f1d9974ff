"""Token, position and segment embeddings.

Vaswani et al. 2017, §3.4 (embeddings scaled by sqrt(d_model)) and §3.5 (sinusoidal positions):
    PE(pos, 2i) = sin(pos / 10000^(2i/d)),  PE(pos, 2i+1) = cos(pos / 10000^(2i/d))

The segment embedding is the fixed sinusoid that TRICE (Huang et al., ACL 2021, §2.3, Eq. 8) adds
to mark which source a token of a concatenated input belongs to. Following the authors' code,
source k is given the sinusoid at "position" k * segment_stride (0, 1000, 2000, ...).

# Deviation: the paper's Eq. 8 numbers the sources from 1 ("the k-th source sentence"); the authors' code numbers
# them from 0, so the first source's segment code is the sinusoid of position 0. We follow the code.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from msgcore.layers import Dropout


def sinusoid(positions: Tensor, d_model: int) -> Tensor:
    """Sinusoids of §3.5 for integer positions of any shape (...) -> (..., d_model)."""
    half = torch.arange(0, d_model, 2, device=positions.device, dtype=torch.float32)
    inv_freq = torch.exp(-math.log(10000.0) * half / d_model)  # 1 / 10000^(2i/d)
    angles = positions.float().unsqueeze(-1) * inv_freq  # (..., d/2)
    table = torch.zeros(*positions.shape, d_model, device=positions.device)
    table[..., 0::2] = torch.sin(angles)  # PE(pos, 2i)
    table[..., 1::2] = torch.cos(angles[..., : d_model // 2])  # PE(pos, 2i+1)
    return table


class SinusoidalPositions(nn.Module):
    """Fixed positional encodings (§3.5), precomputed up to `max_positions`."""

    def __init__(self, d_model: int, max_positions: int):
        super().__init__()
        self.register_buffer("table", sinusoid(torch.arange(max_positions), d_model), persistent=False)

    def forward(self, positions: Tensor) -> Tensor:
        return self.table[positions]  # (B, T) -> (B, T, D)


class LearnedPositions(nn.Embedding):
    """Learned positional embeddings, the alternative the paper found to perform nearly the same (§3.5)."""

    def __init__(self, d_model: int, max_positions: int):
        super().__init__(max_positions, d_model)
        nn.init.normal_(self.weight, std=d_model ** -0.5)


class SegmentEmbedding(nn.Module):
    """Fixed sinusoidal segment embedding E_seg[k] = PE(k * stride) (TRICE §2.3, Eq. 8)."""

    def __init__(self, d_model: int, stride: int = 1000):
        super().__init__()
        self.d_model, self.stride = d_model, stride

    def forward(self, segment_ids: Tensor) -> Tensor:
        return sinusoid(segment_ids * self.stride, self.d_model)  # (B, T) -> (B, T, D)


class Embeddings(nn.Module):
    """x = sqrt(d) * E_tok[token] + PE[position] (+ E_seg[segment]), then dropout (§3.4, §5.4).

    `positions` default to 0..T-1 (offset by `start_pos` during incremental decoding).
    `segment_ids` are optional: when given, the segment embedding is added.
    """

    def __init__(self, token_embedding: nn.Embedding, positions: nn.Module, dropout: float,
                 segment_stride: int = 1000):
        super().__init__()
        self.tokens, self.positions = token_embedding, positions
        self.segments = SegmentEmbedding(token_embedding.embedding_dim, segment_stride)
        self.scale = math.sqrt(token_embedding.embedding_dim)
        self.dropout = Dropout(dropout)

    def forward(self, tokens: Tensor, positions: Tensor | None = None, segment_ids: Tensor | None = None,
                start_pos: int = 0) -> Tensor:
        return self.dropout(self.summed(tokens, positions, segment_ids, start_pos))

    def summed(self, tokens: Tensor, positions: Tensor | None, segment_ids: Tensor | None,
               start_pos: int) -> Tensor:
        """sqrt(d) E_tok[x] + PE[i] (+ E_seg[k]), before dropout: (B, T) -> (B, T, D)."""
        if positions is None:
            positions = torch.arange(start_pos, start_pos + tokens.size(1), device=tokens.device)
            positions = positions.unsqueeze(0).expand_as(tokens)  # (B, T)
        x = self.scale * self.tokens(tokens) + self.positions(positions)  # (B, T, D)
        if segment_ids is not None:
            x = x + self.segments(segment_ids)  # TRICE Eq. (8): + E_seg[k]
        return x


class NormedEmbeddings(Embeddings):
    """x = LayerNorm(sqrt(d) E_tok[x] + E_pos[i] (+ E_seg[k])), then dropout: mBART's `layernorm_embedding` (Liu et al.,
    2020), which the TRICE authors' code applies after adding the segment embedding (Eq. 8). The shared denoiser and
    every model fine-tuned from it embed this way."""

    def __init__(self, token_embedding: nn.Embedding, positions: nn.Module, dropout: float, segment_stride: int = 1000):
        super().__init__(token_embedding, positions, dropout, segment_stride)
        self.norm = nn.LayerNorm(token_embedding.embedding_dim)

    def forward(self, tokens: Tensor, positions: Tensor | None = None, segment_ids: Tensor | None = None,
                start_pos: int = 0) -> Tensor:
        x = self.summed(tokens, positions, segment_ids, start_pos)  # (B, T, D), Eq. (8)
        return self.dropout(self.norm(x))  # the LayerNorm after the segment embedding (the authors' code)

