"""Chapter 4 recipes (POSTECH APE, Lee, Shin, Lee, WMT 2019): data helpers only, so far.

APE triplets are a two-source corpus: sources [src (en), mt (de)] -> target pe (de), the order
`msgcore.models.postech_ape.PostechAPE` expects. One joint tokenizer serves all three columns
(§3.2: "32k shared vocabulary", SentencePiece unigram), so the model can copy from mt.

The offline stand-in (smoke runs, tests): the seeded toy corpus gives src = toy language "xa" and
pe = "xt"; mt is pe with word-level errors (drop, substitute, swap), so copying mt is a real
baseline (do-nothing) that a working APE model must beat.
"""
from __future__ import annotations

import random

from msgcore.batching import encode_corpus
from msgcore.data import SYNTHETIC_TARGET_LANG, Corpus, load_ape, synthetic_corpus, toy_lexicon
from msgcore.experiments import TranslationData
from msgcore.tokenizer import Tokenizer
from msgcore.utils import DataError

APE_SPLITS = {"train": "train", "val": "dev", "test": "test"}  # our split name -> load_ape's


def noisy_copy(sentence: str, rng: random.Random, lexicon: list[str], rate: float) -> str:
    """A word-level corrupted copy: each word is dropped, substituted or swapped with the next one,
    each with probability rate / 3. Never returns an empty sentence."""
    words, out, i = sentence.split(), [], 0
    while i < len(words):
        r = rng.random()
        if r < rate / 3:  # drop
            i += 1
            continue
        if r < 2 * rate / 3:  # substitute
            out.append(rng.choice(lexicon))
        elif r < rate and i + 1 < len(words):  # swap with the next word
            out.extend([words[i + 1], words[i]])
            i += 1
        else:
            out.append(words[i])
        i += 1
    return " ".join(out) or sentence


def synthetic_ape(n: int, split: str = "train", seed: int = 0, error_rate: float = 0.3,
                  vocab_size: int = 24) -> Corpus:
    """n toy triplets (src "xa", mt "xt" with errors) -> pe "xt"; same arguments -> same corpus."""
    toy = synthetic_corpus(n, num_sources=1, seed=seed, split=split, vocab_size=vocab_size)
    rng = random.Random(f"synthetic-ape:{seed}:{split}")
    lexicon = toy_lexicon(SYNTHETIC_TARGET_LANG, vocab_size)
    mt = [noisy_copy(pe, rng, lexicon, error_rate) for pe in toy.target]
    return Corpus("synthetic-ape", toy.split, (toy.source_langs[0], SYNTHETIC_TARGET_LANG), SYNTHETIC_TARGET_LANG,
                  [toy.sources[0], mt], toy.target)


def ape_corpora(seed: int = 0, allow_synthetic: bool = False) -> tuple[dict[str, Corpus], bool]:
    """(split -> corpus, synthetic): WMT16/17 APE train/val(=dev)/test, or the toy stand-in when the real
    data is unavailable and `allow_synthetic` is set (smoke runs only; it is announced)."""
    try:
        return {name: load_ape(split) for name, split in APE_SPLITS.items()}, False
    except DataError as error:
        if not allow_synthetic or "MSGCORE_DATA_MIRROR" not in str(error):
            raise
        print(f"The APE data is unavailable ({error}); using the synthetic APE triplets instead.")
        sizes = {"train": 3000, "val": 200, "test": 200}
        return {name: synthetic_ape(size, name, seed) for name, size in sizes.items()}, True


def prepare_ape(corpora: dict[str, Corpus], vocab_size: int = 8000, max_len: int = 128, train_examples: int = 0,
                eval_examples: int = 0, seed: int = 0, tokenizer: Tokenizer | None = None,
                synthetic: bool = False) -> TranslationData:
    """Cut the splits (first N examples; 0 = all), train one shared unigram tokenizer on the training
    triplets (unless given), encode every split (training examples truncated to `max_len` pieces)."""
    corpora = dict(corpora)
    for name, corpus in corpora.items():
        limit = train_examples if name == "train" else eval_examples
        if limit:
            corpora[name] = corpus.subset(range(min(limit, len(corpus))))
    if tokenizer is None:
        train = corpora["train"]
        tokenizer = Tokenizer.train(train.texts(), vocab_size=vocab_size, model_type="unigram",
                                    langs=(*train.source_langs, train.target_lang), seed=seed)
    data = TranslationData(tokenizer, corpora, synthetic=synthetic)
    for name, corpus in corpora.items():
        data.encoded[name] = encode_corpus(corpus, tokenizer, max_len=max_len if name == "train" else None)
    return data


def do_nothing(corpus: Corpus) -> list[str]:
    """The APE baseline: the mt column, unchanged."""
    return list(corpus.sources[1])
