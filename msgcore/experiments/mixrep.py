"""Chapter 2's data: one corpus tokenized two ways for MixRep (Wu et al., ICML 2020, §3.1-3.2, §4.1).

The paper tokenizes every sentence with BPE (subword-nmt, 10k merges) and with SentencePiece's unigram LM (12k),
each vocabulary joint over source and target. Here both are sentencepiece models trained by msgcore.tokenizer
(`model_type` "bpe" and "unigram") on the same text; a `TokenizerPair` holds them.
# Deviation: SentencePiece's BPE on raw text stands for subword-nmt on Moses-tokenized text; both vocabularies
# default to the same size, so the two streams differ by the algorithm only (the paper: 10k and 12k).

A `MixRepCorpus` is an EncodedCorpus whose two "sources" are [x_bpe, x_sp] and whose target is y_sp (the primary
stream), with y_bpe beside it; `collate_mixrep` pads it into the `MixRepBatch` that `MixRepTransformer.loss`
reads, and `MixRepTrainer` is the core Trainer collating that way. `co_teaching_corpus` builds Eq. (10)'s data.
The chapter's experiments (baselines, tables, claims) are not here yet.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import torch

from msgcore.batching import EncodedCorpus, collate, encode_corpus, example_lengths, token_batches
from msgcore.data import Corpus
from msgcore.generation import GenerationConfig
from msgcore.models.mixrep import STREAMS, MixRepBatch, MixRepTransformer, TokenizerPair, co_teaching_targets
from msgcore.tokenizer import MODEL_TYPES, PAD_ID, Tokenizer
from msgcore.trainer import Trainer
from msgcore.utils import DataError


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
