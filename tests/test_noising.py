"""mBART-style span masking: the budget, the collapsed spans, recoverability and the Poisson lengths."""
import random
import statistics

import pytest

from msgcore.batching import collate
from msgcore.noising import collapse, denoising_corpus, poisson, span_mask
from msgcore.tokenizer import Tokenizer

MASK = 4


@pytest.mark.parametrize("n", [1, 5, 20, 57])
def test_span_mask_masks_the_budget_and_keeps_the_rest_in_order(n):
    tokens = list(range(100, 100 + n))
    rng = random.Random(n)
    for _ in range(50):
        noised, masked = span_mask(tokens, MASK, rng)
        assert sum(masked) == round(0.35 * n)
        assert [t for t in noised if t != MASK] == [t for t, m in zip(tokens, masked) if not m]
        runs = sum(1 for i, m in enumerate(masked) if m and (i == 0 or not masked[i - 1]))
        assert noised.count(MASK) == runs
        assert len(noised) == n - sum(masked) + runs


def test_collapse_on_a_hand_made_example():
    assert collapse([7, 8, 9, 10, 11], [False, True, True, False, True], MASK) == [7, MASK, 10, MASK]


def test_poisson_sampler_has_the_right_mean():
    rng = random.Random(0)
    samples = [poisson(rng, 3.5) for _ in range(20000)]
    assert statistics.mean(samples) == pytest.approx(3.5, abs=0.06)
    assert statistics.variance(samples) == pytest.approx(3.5, abs=0.15)


def test_denoising_corpus_layout(tmp_path):
    texts = {"en": ["a man rides a red bike down the hill ."] * 4, "de": ["ein Mann fährt ein rotes Rad ."] * 4}
    tok = Tokenizer.train([*texts["en"], *texts["de"]], vocab_size=60, langs=("en", "de"), cache_dir=tmp_path)
    corpus = denoising_corpus(texts, tok, seed=0)
    assert len(corpus) == 8
    first = corpus.sources[0][0]
    assert first[-2:] == [tok.eos_id, tok.lang_id("en")] and tok.mask_id in first
    assert corpus.target[0] == [tok.lang_id("en")] + tok.encode(texts["en"][0])
    assert corpus.sources[0][4][-1] == tok.lang_id("de")
    batch = collate(corpus, [0, 4])
    assert batch.target_in[0, :2].tolist() == [tok.bos_id, tok.lang_id("en")]


def test_copy_ratio_leaves_that_share_of_sentences_clean(tmp_path):
    texts = {"en": [f"a man rides bike number {i} down the hill ." for i in range(400)]}
    tok = Tokenizer.train(texts["en"], vocab_size=60, langs=("en",), cache_dir=tmp_path)
    noisy = denoising_corpus(texts, tok, seed=0, copy_ratio=0.0)
    mixed = denoising_corpus(texts, tok, seed=0, copy_ratio=0.5)
    assert all(tok.mask_id in s for s in noisy.sources[0])
    clean = sum(tok.mask_id not in s for s in mixed.sources[0])
    assert 150 < clean < 250
    assert all(s[:-2] == t[1:] for s, t in zip(mixed.sources[0], mixed.target) if tok.mask_id not in s)


def test_copy_corpus_is_clean_in_clean_out_with_language_tags(tmp_path):
    from msgcore.noising import copy_corpus

    texts = {"en": ["a red bike ."], "de": ["ein rotes Rad ."]}
    tok = Tokenizer.train([*texts["en"], *texts["de"]] * 10, vocab_size=40, langs=("en", "de"), cache_dir=tmp_path)
    corpus = copy_corpus(texts, tok)
    assert corpus.sources[0][1] == tok.encode("ein rotes Rad .") + [tok.eos_id, tok.lang_id("de")]
    assert corpus.target[1] == [tok.lang_id("de")] + tok.encode("ein rotes Rad .")
