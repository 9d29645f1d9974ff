"""Denoising pre-training data: mBART's span masking over monolingual text.

Liu et al., "Multilingual Denoising Pre-training for Neural Machine Translation" (mBART), TACL 2020
(arXiv:2001.08210), §2.1 "Noise function": spans whose lengths follow Poisson(lambda = 3.5) are
replaced by one <mask> token each until about 35% of the words are masked; the model reconstructs
the original text. The input ends with the language tag and the decoder starts from it.

TRICE (chapter 1) starts from mBART-cc25; our small stand-in is this objective run on the
training sides of the book's data.
# Deviation: mBART masks whole words and also permutes sentences; we mask sentencepiece pieces of
# single sentences (no permutation), and a span of Poisson length 0 is drawn again (no insertions).
# Deviation: a fraction `copy_ratio` of the sentences is left unmasked (clean in, clean out). mBART
# learns to copy from 25 languages of Common Crawl; a 2M-parameter model with minutes of training
# does not, and a model that cannot copy cannot post-edit (APE output is mostly the MT, copied).

The layout is the one every finetuning run of chapter 1 keeps (`msgcore.foundations.denoiser.encode_task`):
source "pieces </s> <lang>", decoder "<s> <lang> pieces", labels "<lang> pieces </s>".
"""
from __future__ import annotations

import math
import random
from collections.abc import Sequence

from msgcore.batching import EncodedCorpus
from msgcore.tokenizer import Tokenizer


def poisson(rng: random.Random, lam: float) -> int:
    """One Poisson(lam) sample (Knuth's multiplication method; fine for small lam)."""
    threshold, k, product = math.exp(-lam), 0, rng.random()
    while product > threshold:
        k += 1
        product *= rng.random()
    return k


def span_mask(tokens: Sequence[int], mask_id: int, rng: random.Random, mask_ratio: float = 0.35,
              poisson_lambda: float = 3.5) -> tuple[list[int], list[bool]]:
    """Mask round(mask_ratio * n) tokens in Poisson-length spans; each masked run becomes one <mask>.

    Returns the noised sequence and, for each original token, whether it was masked.
    """
    n = len(tokens)
    budget = round(mask_ratio * n)
    masked, count = [False] * n, 0
    while count < budget:
        length = poisson(rng, poisson_lambda)
        if length == 0:
            continue
        start = rng.randrange(n)
        for i in range(start, min(n, start + length)):
            if count < budget and not masked[i]:  # the last span is cut at the budget
                masked[i], count = True, count + 1
    return collapse(tokens, masked, mask_id), masked


def collapse(tokens: Sequence[int], masked: Sequence[bool], mask_id: int) -> list[int]:
    """Replace each maximal run of masked tokens by a single mask_id."""
    out = []
    for i, token in enumerate(tokens):
        if not masked[i]:
            out.append(token)
        elif i == 0 or not masked[i - 1]:
            out.append(mask_id)
    return out


def tagged_source(pieces: list[int], tokenizer: Tokenizer, lang: str) -> list[int]:
    """mBART's source layout: pieces, </s>, then the language tag."""
    return list(pieces) + [tokenizer.eos_id, tokenizer.lang_id(lang)]


def tagged_target(pieces: list[int], tokenizer: Tokenizer, lang: str) -> list[int]:
    """The target the decoder produces after <s>: the language tag, then the pieces."""
    return [tokenizer.lang_id(lang)] + list(pieces)


def copy_corpus(texts: dict[str, Sequence[str]], tokenizer: Tokenizer, max_len: int | None = None) -> EncodedCorpus:
    """Clean sentence in, the same sentence out: the denoiser's reconstruction gate and its dev set."""
    sources, targets = [], []
    for lang, sentences in texts.items():
        for pieces in tokenizer.encode_batch(list(sentences)):
            pieces = pieces[:max_len] if max_len else pieces
            sources.append(tagged_source(pieces, tokenizer, lang))
            targets.append(tagged_target(pieces, tokenizer, lang))
    return EncodedCorpus([sources], targets, tokenizer.bos_id, tokenizer.eos_id)


def denoising_corpus(texts: dict[str, Sequence[str]], tokenizer: Tokenizer, seed: int = 0,
                     mask_ratio: float = 0.35, poisson_lambda: float = 3.5, max_len: int = 128,
                     copy_ratio: float = 0.0) -> EncodedCorpus:
    """Monolingual text per language -> (noised text + </s> + <lang>) -> (<lang> text) examples.

    # Deviation: EncodedCorpus has one decoder prefix for all examples (<s>), so the target is
    # "<lang> text </s>": the decoder's first prediction is the language tag (trivial: the source
    # ends with it), and the text follows, as in mBART.
    """
    rng = random.Random(f"denoising:{seed}")
    sources, targets = [], []
    for lang, sentences in texts.items():
        tag = tokenizer.lang_id(lang)
        for pieces in tokenizer.encode_batch(list(sentences)):
            pieces = pieces[:max_len]
            if not pieces:
                continue
            noised, _ = span_mask(pieces, tokenizer.mask_id, rng, mask_ratio, poisson_lambda)
            if copy_ratio and rng.random() < copy_ratio:
                noised = pieces  # a clean example: learn to copy
            sources.append(noised + [tokenizer.eos_id, tag])
            targets.append([tag] + pieces)
    return EncodedCorpus([sources], targets, tokenizer.bos_id, tokenizer.eos_id)
