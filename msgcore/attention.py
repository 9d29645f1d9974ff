"""Multi-head attention: the one attention module of msgcore.

Vaswani et al., "Attention Is All You Need", NeurIPS 2017 (arXiv:1706.03762), §3.2.

Notation (shapes are batch-first):
    B batch, H heads, T query length, S key length, D model width, Dh = D / H head width.

One module serves self-attention, causal self-attention and cross-attention:
    * self-attention:  `attn(x)`                      keys/values come from x
    * cross-attention: `attn(x, memory=enc_hidden)`   keys/values come from the encoder
Masks are bool and True means "may attend", as in `F.scaled_dot_product_attention`, or float: an
additive bias on the logits (-inf = may not attend), e.g. MARGE's relevance bias; `additive_mask`
merges a bool mask and a bias into one. A query row with no key to attend to gets zero weights and
a zero output on both paths (SDPA does this on CPU; the math path is written to match), never NaN.

The KV cache is explicit: a `(k, v)` pair, each (B, H, S, Dh), is passed in and returned.
    * self-attention appends this step's keys/values to the cached ones (`append_to_cache`);
    * cross-attention computes keys/values from `memory` once and afterwards reuses the cache.
Beam search reorders the cache at every step; `reorder_with_room` copies the chosen rows into a buffer one
position longer, so the next step's append writes into that room instead of copying the whole cache again.

On a GPU, SDPA may pick any of its kernels but cuDNN's (`GPU_SDPA_BACKENDS`).

Beam search keeps the encoder output at one row per sentence while the decoder runs k hypotheses per
sentence: when x has k times as many rows as the memory, cross-attention folds each sentence's k
hypotheses into the query length, (B*k, T, D) -> (B, k*T, D), so the keys and values of a sentence are
projected and read once, not once per hypothesis.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

KV = tuple[Tensor, Tensor]  # (k, v), each (B, H, S, Dh)
# SDPA's kernels on a GPU: all but cuDNN's, which builds an execution plan for every new shape (each batch length in
# training, each key length while decoding). On one H200 (torch 2.11, book/benchmarks/gpu) leaving it out took a
# `small` update at 8k tokens from a mean of 147 ms (median 29) to 25 ms, and beam-5 decoding from 794 to 11,019
# generated tokens/s.
GPU_SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float, is_causal: bool) -> Tensor:
    """F.scaled_dot_product_attention, on a GPU restricted to GPU_SDPA_BACKENDS."""
    if q.device.type != "cuda":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal)
    with sdpa_kernel(GPU_SDPA_BACKENDS):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal)


def attention_math(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                   dropout_p: float = 0.0) -> tuple[Tensor, Tensor]:
    """Scaled dot-product attention written out, for teaching, tests and attention maps.

    q (B, H, T, Dh), k and v (B, H, S, Dh), mask broadcastable to (B, H, T, S): bool (True = may
    attend) or float (added to the logits, -inf = may not attend).
    Returns the output (B, H, T, Dh) and the attention weights (B, H, T, S).
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # Eq. (1): QK^T / sqrt(d_k)
    if mask is not None:
        scores = scores + mask if mask.is_floating_point() else scores.masked_fill(~mask, float("-inf"))
    dead = scores.isneginf().all(-1, keepdim=True)  # (B, H, T, 1) rows with no key: weights 0, not NaN
    weights = torch.softmax(scores.masked_fill(dead, 0.0).float(), dim=-1)  # Eq. (1): softmax(.)
    weights = weights.masked_fill(dead, 0.0).to(q.dtype)
    weights = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
    return weights @ v, weights  # Eq. (1): softmax(.) V


def additive_mask(mask: Tensor | None, bias: Tensor) -> Tensor:
    """One float mask from a bool mask (True = may attend) and an additive bias, both broadcastable
    to (B, H, T, S): the bias where attending is allowed, -inf elsewhere."""
    return bias if mask is None else bias.masked_fill(~mask, float("-inf"))


def causal_mask(query_len: int, key_len: int, device: torch.device) -> Tensor:
    """(T, S) bool mask where query t may attend to keys up to its own position.

    With a cache of key_len - query_len earlier positions, query t sits at key_len - query_len + t.
    """
    offset = key_len - query_len
    q_pos = torch.arange(query_len, device=device).unsqueeze(1) + offset
    return torch.arange(key_len, device=device).unsqueeze(0) <= q_pos


def reorder_with_room(cached: Tensor, index: Tensor) -> Tensor:
    """Rows `index` of cached keys or values (B, H, t, Dh), copied into a buffer (B', H, t+1, Dh) and returned
    as its first t positions: the next `append_to_cache` fills the last one in place (once: a second
    append from the same cache concatenates, so two branches never share the room)."""
    if cached.requires_grad:
        return cached.index_select(0, index)  # autograd cannot follow a copy into a buffer: no room
    _, H, t, Dh = cached.shape
    buffer = cached.new_empty(index.numel(), H, t + 1, Dh)
    torch.index_select(cached, 0, index, out=buffer[:, :, :t])
    return buffer[:, :, :t]


def append_to_cache(cached: Tensor, new: Tensor) -> Tensor:
    """cached (B, H, t, Dh) followed by new (B, H, T, Dh) along time: in place when `cached` is the start
    of a buffer with exactly T positions of room after it (`reorder_with_room`), else by concatenation."""
    B, H, t, Dh = cached.shape
    full = (B, H, t + new.size(2), Dh)
    strides = (H * full[2] * Dh, full[2] * Dh, Dh, 1)  # those of a contiguous (B, H, t+T, Dh) buffer
    room = (cached.stride() == strides and cached.storage_offset() == 0 and not getattr(cached, "room_taken", False)
            and cached.untyped_storage().nbytes() >= B * H * full[2] * Dh * cached.element_size())
    if not room:
        return torch.cat([cached, new], dim=2)
    cached.room_taken = True  # a second step from this cache (another branch) must not overwrite this one
    extended = cached.as_strided(full, strides)
    extended[:, :, t:] = new
    return extended


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O, head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    Eq. on p. 5 of Vaswani et al. 2017. `forward` returns (output, cache, weights); weights are
    None unless `need_weights=True`, which takes the math path (SDPA does not return weights).
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.n_heads, self.head_dim, self.dropout = n_heads, d_model // n_heads, dropout
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)  # W^Q for all heads at once
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)  # W^K
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)  # W^V
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)  # W^O

    def split_heads(self, x: Tensor) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def merge_heads(self, x: Tensor) -> Tensor:
        B, _, T, _ = x.shape
        return x.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)  # (B, T, D)

    def queries_keys_values(self, x: Tensor, memory: Tensor | None, cache: KV | None) -> tuple[Tensor, Tensor, Tensor]:
        """Q = x W^Q and this call's K, V (`keys_values`), split into heads.

        Three GEMMs, as the paper writes them; `python -m msgcore.bench` measures one fused x [W^Q; W^K; W^V]
        GEMM for self-attention as an ablation.
        """
        return (self.split_heads(self.q_proj(x)), *self.keys_values(x, memory, cache))

    def keys_values(self, x: Tensor, memory: Tensor | None, cache: KV | None) -> KV:
        """This call's keys and values, combined with the cache as the attention kind requires."""
        if memory is not None and cache is not None:
            return cache  # cross-attention: K/V of the encoder output were computed at step 0
        source = x if memory is None else memory
        k, v = self.split_heads(self.k_proj(source)), self.split_heads(self.v_proj(source))
        if memory is None and cache is not None:  # self-attention: append this step
            k, v = append_to_cache(cache[0], k), append_to_cache(cache[1], v)
        return k, v

    @staticmethod
    def queries_per_memory_row(x: Tensor, memory: Tensor | None, cache: KV | None) -> int:
        """g: how many rows of x read each row of the memory (1, or the beam size in beam search)."""
        if memory is None:
            return 1
        rows = cache[0].size(0) if cache is not None else memory.size(0)
        if rows == x.size(0):
            return 1
        if rows == 0 or x.size(0) % rows:
            raise ValueError(f"cross-attention got {x.size(0)} query rows for {rows} memory rows; "
                             "the query rows must be the memory rows or a multiple of them (beam search)")
        return x.size(0) // rows

    def forward(self, x: Tensor, memory: Tensor | None = None, mask: Tensor | None = None,
                cache: KV | None = None, causal: bool = False,
                need_weights: bool = False) -> tuple[Tensor, KV, Tensor | None]:
        """x (B, T, D); memory (B, S, D) for cross-attention; mask broadcastable to (B, H, T, S),
        bool (True = may attend) or float (an additive bias on the logits, -inf = may not attend).

        `causal=True` lets query t see keys <= t (counting cached positions). For cross-attention x
        may hold g rows per memory row (beam search: rows b*g .. b*g+g-1 read memory row b); the mask
        then has the memory's rows and a query length of 1.
        Returns output (B, T, D), the new cache (k, v) and the weights (B, H, T, S) or None.
        """
        g = self.queries_per_memory_row(x, memory, cache)
        if g == 1:
            return self.attend(x, memory, mask, cache, causal, need_weights)
        if mask is not None and mask.dim() == 4 and mask.size(2) != 1:
            raise ValueError(f"a cross-attention mask shared by {g} hypotheses needs query length 1, "
                             f"got {tuple(mask.shape)}")
        B, T, D = x.shape
        out, kv, weights = self.attend(x.reshape(B // g, g * T, D), memory, mask, cache, causal,
                                       need_weights)  # (B/g, g*T, D): a sentence's hypotheses read its keys together
        if weights is not None:
            weights = weights.unflatten(2, (g, T)).transpose(1, 2).flatten(0, 1)  # (B, H, T, S)
        return out.reshape(B, T, D), kv, weights

    def attend(self, x: Tensor, memory: Tensor | None, mask: Tensor | None, cache: KV | None, causal: bool,
               need_weights: bool) -> tuple[Tensor, KV, Tensor | None]:
        """`forward` once the rows of x and of the memory match."""
        q, k, v = self.queries_keys_values(x, memory, cache)  # (B, H, T, Dh), (B, H, S, Dh), (B, H, S, Dh)
        T, S = q.size(2), k.size(2)
        use_is_causal = causal and T == S and mask is None  # SDPA's fast causal path
        if causal and not use_is_causal and T > 1:
            step_mask = causal_mask(T, S, x.device)  # (T, S)
            if mask is None:
                mask = step_mask
            else:
                mask = additive_mask(step_mask, mask) if mask.is_floating_point() else mask & step_mask
        if mask is not None and mask.is_floating_point():
            mask = mask.to(q.dtype)  # SDPA wants a float mask in the query's dtype (e.g. under autocast)
        dropout_p = self.dropout if self.training else 0.0
        if need_weights:
            if use_is_causal:
                mask = causal_mask(T, S, x.device)
            out, weights = attention_math(q, k, v, mask, dropout_p)
        else:
            out = sdpa(q, k, v, mask, dropout_p, use_is_causal)
            weights = None
        return self.out_proj(self.merge_heads(out)), (k, v), weights
