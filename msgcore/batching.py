"""From a Corpus to padded tensors: encoding, collation and length-bucketed token batches.

Shapes are batch-first: B examples, S_k tokens in source k, T target tokens. Every source
ends in eos (optionally starts with a language tag); the decoder reads `prefix + y` and
predicts `y + eos`, where the prefix is bos or the target language tag (mBART style).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, fields, replace
from typing import Sequence

import torch
from torch import Tensor

from msgcore.data import Corpus
from msgcore.tokenizer import PAD_ID, Tokenizer


@dataclass(repr=False)
class EncodedCorpus:
    """The token ids of a Corpus."""
    sources: list[list[list[int]]]  # K x N x len: [lang tag] + pieces + [eos] per source sentence
    target: list[list[int]]         # N x len: target pieces only (no bos/eos)
    target_prefix: int              # first decoder input: bos id, or the target language tag id
    eos_id: int = 3                 # appended to the target to make the decoder's output

    def __len__(self) -> int:
        return len(self.target)

    def __repr__(self) -> str:
        return f"EncodedCorpus({len(self.sources)} sources, {len(self)} examples)"


def encode_corpus(corpus: Corpus, tokenizer: Tokenizer, *, max_len: int | None = None,
                  source_lang_tags: bool = False, target_lang_tag: bool = False) -> EncodedCorpus:
    """Encode every sentence; `max_len` truncates each sentence to that many pieces (before tags and eos)."""
    def pieces(texts: list[str]) -> list[list[int]]:
        return [ids[:max_len] for ids in tokenizer.encode_batch(texts)]

    sources = []
    for lang, column in zip(corpus.source_langs, corpus.sources):
        tag = [tokenizer.lang_id(lang)] if source_lang_tags else []
        sources.append([tag + ids + [tokenizer.eos_id] for ids in pieces(column)])
    prefix = tokenizer.lang_id(corpus.target_lang) if target_lang_tag else tokenizer.bos_id
    return EncodedCorpus(sources, pieces(corpus.target), prefix, tokenizer.eos_id)


def map_tensors(batch, fn):
    """A copy of a dataclass batch (of any batch class) with `fn` applied to each tensor field and to each tensor
    in a list field; other fields are kept."""
    changes = {}
    for f in fields(batch):
        value = getattr(batch, f.name)
        if isinstance(value, Tensor):
            changes[f.name] = fn(value)
        elif isinstance(value, list) and value and all(isinstance(v, Tensor) for v in value):
            changes[f.name] = [fn(v) for v in value]
    return replace(batch, **changes)


@dataclass(repr=False)
class Batch:
    """A padded batch of multi-source examples."""
    sources: list[Tensor]       # K x (B, S_k) long, padded with pad_id
    source_masks: list[Tensor]  # K x (B, S_k) bool, True = real token (may be attended to)
    target_in: Tensor           # (B, T) long: prefix + y, the decoder input
    target_out: Tensor          # (B, T) long: y + eos, the labels, padded with pad_id
    target_mask: Tensor         # (B, T) bool, True = real target position
    indices: list[int]          # example indices in the EncodedCorpus
    pad_id: int = PAD_ID        # the id used for padding

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """The same batch with every tensor on `device` (`non_blocking` for a copy from pinned memory)."""
        return map_tensors(self, lambda t: t.to(device, non_blocking=non_blocking))

    def pin_memory(self) -> Batch:
        """The same batch in page-locked host memory (a GPU copies it asynchronously)."""
        return map_tensors(self, torch.Tensor.pin_memory)

    def __len__(self) -> int:
        return len(self.indices)

    def __repr__(self) -> str:
        shapes = ", ".join(str(tuple(s.shape)) for s in self.sources)
        return f"Batch(sources=[{shapes}], target={tuple(self.target_in.shape)})"

    @property
    def num_target_tokens(self) -> int:
        """Real target positions (the tokens the loss is averaged over)."""
        return int(self.target_mask.sum())

    def concatenated(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """All sources of each example packed into one sequence (see `concatenate_sources`)."""
        return concatenate_sources(self.sources, self.source_masks, self.pad_id)


def concatenate_sources(sources: Sequence[Tensor], source_masks: Sequence[Tensor],
                        pad_id: int = PAD_ID) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Pack the K sources of each example into one sequence, for single-encoder models.

    Returns tokens, segment_ids, positions and mask, each (B, S) with S the longest packed
    example: source k's real tokens follow source k-1's without inner padding, carry
    segment id k and positions counting from 0 again; padding sits at the end with
    token pad_id, segment 0, position 0 and mask False.
    """
    lengths = torch.stack([mask.sum(1) for mask in source_masks], 1)  # (B, K)
    starts = lengths.cumsum(1) - lengths                              # (B, K) first column of each source
    batch_size, total = lengths.shape[0], int(lengths.sum(1).max())
    tokens = torch.full((batch_size, total), pad_id, dtype=torch.long, device=lengths.device)  # (B, S)
    segment_ids = torch.zeros_like(tokens)                 # (B, S)
    positions = torch.zeros_like(tokens)                   # (B, S)
    mask = torch.zeros_like(tokens, dtype=torch.bool)      # (B, S)
    for k, (source, source_mask) in enumerate(zip(sources, source_masks)):
        rows, offsets = source_mask.nonzero(as_tuple=True)  # each real token: its example, its position in source k
        columns = starts[rows, k] + offsets                  # where it goes in the packed sequence
        tokens[rows, columns] = source[rows, offsets]
        segment_ids[rows, columns] = k
        positions[rows, columns] = offsets
        mask[rows, columns] = True
    return tokens, segment_ids, positions, mask


def split_sources(packed: Tensor, source_masks: Sequence[Tensor]) -> list[Tensor]:
    """Undo `concatenate_sources` for states (B, S, D): one (B, S_k, D) tensor per source, zeros at padding."""
    lengths = torch.stack([mask.sum(1) for mask in source_masks], 1)  # (B, K)
    starts = lengths.cumsum(1) - lengths                              # (B, K)
    pieces = []
    for k, source_mask in enumerate(source_masks):
        rows, offsets = source_mask.nonzero(as_tuple=True)
        piece = packed.new_zeros(*source_mask.shape, packed.size(-1))  # (B, S_k, D)
        piece[rows, offsets] = packed[rows, starts[rows, k] + offsets]
        pieces.append(piece)
    return pieces


def _pad(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Right-pad sequences into a (B, L) long tensor and its (B, L) bool mask of real tokens."""
    longest = max(len(seq) for seq in sequences)
    tokens = torch.full((len(sequences), longest), pad_id, dtype=torch.long)
    for row, seq in enumerate(sequences):
        tokens[row, :len(seq)] = torch.tensor(seq, dtype=torch.long)
    lengths = torch.tensor([len(seq) for seq in sequences])
    mask = torch.arange(longest)[None, :] < lengths[:, None]
    return tokens, mask


def collate(encoded: EncodedCorpus, indices: Sequence[int], pad_id: int = PAD_ID) -> Batch:
    """Pad the examples at `indices` into a Batch."""
    indices = list(indices)
    sources, source_masks = [], []
    for column in encoded.sources:
        tokens, mask = _pad([column[i] for i in indices], pad_id)
        sources.append(tokens)
        source_masks.append(mask)
    targets = [encoded.target[i] for i in indices]
    target_in, target_mask = _pad([[encoded.target_prefix] + y for y in targets], pad_id)
    target_out, _ = _pad([y + [encoded.eos_id] for y in targets], pad_id)
    return Batch(sources, source_masks, target_in, target_out, target_mask, indices, pad_id)


def example_lengths(encoded: EncodedCorpus, *, concatenated: bool = False) -> list[int]:
    """The padded length each example needs: its longest source or its target + 1 (prefix / eos).

    With `concatenated=True` the sources count together, as in `Batch.concatenated()`.
    """
    lengths = []
    for i in range(len(encoded)):
        source_lengths = [len(column[i]) for column in encoded.sources]
        source_length = sum(source_lengths) if concatenated else max(source_lengths)
        lengths.append(max(source_length, len(encoded.target[i]) + 1))
    return lengths


def token_batches(lengths: Sequence[int], max_tokens: int, *, shuffle: bool, seed: int = 0, epoch: int = 0,
                  num_shards: int = 1, shard_id: int = 0) -> list[list[int]]:
    """Length-bucketed batches of example indices, each with B * (longest length) <= max_tokens.

    Examples are sorted by length (with `shuffle`, shuffled first so that equal lengths mix) and
    cut into batches; an example longer than `max_tokens` gets a batch of its own. With `shuffle`
    the batch order is shuffled too. The same (seed, epoch) always gives the same batches. With
    `num_shards > 1`, shard `shard_id` gets every num_shards-th batch, the tail dropped so that
    all shards get the same number of batches.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, not {max_tokens}")
    if not 0 <= shard_id < num_shards:
        raise ValueError(f"shard_id must be in [0, {num_shards}), not {shard_id}")
    rng = random.Random(f"token_batches:{seed}:{epoch}")
    order = list(range(len(lengths)))
    if shuffle:
        rng.shuffle(order)
    order.sort(key=lambda i: lengths[i])  # stable: ties keep the (shuffled or index) order
    batches = _cut(order, lengths, max_tokens)
    if shuffle:
        rng.shuffle(batches)
    usable = len(batches) - len(batches) % num_shards
    return batches[:usable][shard_id::num_shards]


def _cut(sorted_indices: list[int], lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Cut indices sorted by length into consecutive batches within the token budget."""
    batches: list[list[int]] = []
    batch: list[int] = []
    for i in sorted_indices:
        if batch and (len(batch) + 1) * lengths[i] > max_tokens:  # lengths[i] is the batch's longest
            batches.append(batch)
            batch = []
        batch.append(i)
    if batch:
        batches.append(batch)
    return batches


def padding_efficiency(batches: Sequence[Sequence[int]], lengths: Sequence[int]) -> float:
    """Real tokens / padded slots over all batches (1.0 = no padding)."""
    real = sum(lengths[i] for batch in batches for i in batch)
    padded = sum(len(batch) * max(lengths[i] for i in batch) for batch in batches)
    return real / padded if padded else 1.0
