"""Encoding, collation, packing of concatenated sources and token-budget batching."""
import random

import pytest
import torch

from msgcore.batching import (Batch, EncodedCorpus, collate, encode_corpus, example_lengths, padding_efficiency,
                              token_batches)
from msgcore.data import synthetic_corpus
from msgcore.tokenizer import Tokenizer

LENGTHS = [random.Random(0).randint(1, 40) for _ in range(500)]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    corpus = synthetic_corpus(60, num_sources=2, seed=0)
    tokenizer = Tokenizer.train(corpus.texts(), vocab_size=80, langs=("xa", "xb", "xt"),
                                cache_dir=tmp_path_factory.mktemp("tok"))
    return corpus, tokenizer


def test_encode_corpus_layout(toy):
    corpus, tok = toy
    encoded = encode_corpus(corpus, tok)
    assert len(encoded) == 60 and len(encoded.sources) == 2
    assert encoded.sources[0][0] == tok.encode(corpus.sources[0][0]) + [tok.eos_id]
    assert encoded.target[0] == tok.encode(corpus.target[0]) and encoded.target_prefix == tok.bos_id
    tagged = encode_corpus(corpus, tok, max_len=2, source_lang_tags=True, target_lang_tag=True)
    assert tagged.sources[1][0] == [tok.lang_id("xb")] + tok.encode(corpus.sources[1][0])[:2] + [tok.eos_id]
    assert len(tagged.target[0]) <= 2 and tagged.target_prefix == tok.lang_id("xt")


def test_collate_masks_match_lengths(toy):
    corpus, tok = toy
    encoded = encode_corpus(corpus, tok)
    batch = collate(encoded, [3, 0, 7])
    for k in range(2):
        assert batch.source_masks[k].sum(1).tolist() == [len(encoded.sources[k][i]) for i in (3, 0, 7)]
        assert (batch.sources[k][~batch.source_masks[k]] == 0).all()
    target_lengths = [len(encoded.target[i]) + 1 for i in (3, 0, 7)]
    assert batch.target_mask.sum(1).tolist() == target_lengths and batch.num_target_tokens == sum(target_lengths)
    y = encoded.target[0]
    assert batch.target_in[1, :len(y) + 1].tolist() == [tok.bos_id] + y
    assert batch.target_out[1, :len(y) + 1].tolist() == y + [tok.eos_id]
    assert (batch.target_out[~batch.target_mask] == 0).all()
    assert batch.to("cpu").indices == [3, 0, 7]


def test_concatenated_packs_sources_on_a_hand_made_example():
    encoded = EncodedCorpus(sources=[[[11, 12, 3], [21, 3]], [[31, 3], [41, 42, 43, 3]]],
                            target=[[5], [6]], target_prefix=2)
    tokens, segment_ids, positions, mask = collate(encoded, [0, 1]).concatenated()
    assert tokens.tolist() == [[11, 12, 3, 31, 3, 0], [21, 3, 41, 42, 43, 3]]
    assert segment_ids.tolist() == [[0, 0, 0, 1, 1, 0], [0, 0, 1, 1, 1, 1]]
    assert positions.tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 0, 1, 2, 3]]
    assert mask.tolist() == [[True] * 5 + [False], [True] * 6]
    assert example_lengths(encoded) == [3, 4] and example_lengths(encoded, concatenated=True) == [5, 6]


def test_token_budget_and_each_index_once():
    batches = token_batches(LENGTHS, max_tokens=120, shuffle=True, seed=1, epoch=0)
    assert sorted(i for batch in batches for i in batch) == list(range(len(LENGTHS)))
    assert all(len(batch) * max(LENGTHS[i] for i in batch) <= 120 for batch in batches)
    assert padding_efficiency(batches, LENGTHS) > 0.8
    # an example longer than the budget still gets a batch of its own
    assert token_batches([5, 50, 5], max_tokens=20, shuffle=False) == [[0, 2], [1]]


def test_batches_are_deterministic_per_seed_and_epoch():
    first = token_batches(LENGTHS, 120, shuffle=True, seed=1, epoch=0)
    assert first == token_batches(LENGTHS, 120, shuffle=True, seed=1, epoch=0)
    assert first != token_batches(LENGTHS, 120, shuffle=True, seed=1, epoch=1)
    assert first != token_batches(LENGTHS, 120, shuffle=True, seed=0, epoch=1)
    unshuffled = token_batches(LENGTHS, 120, shuffle=False)
    flat = [i for batch in unshuffled for i in batch]
    assert flat == sorted(range(len(LENGTHS)), key=lambda i: (LENGTHS[i], i))


def test_shards_are_disjoint_and_equal_sized():
    shards = [token_batches(LENGTHS, 120, shuffle=True, seed=2, num_shards=3, shard_id=s) for s in range(3)]
    assert len({len(shard) for shard in shards}) == 1
    seen = [i for shard in shards for batch in shard for i in batch]
    assert len(seen) == len(set(seen))
    with pytest.raises(ValueError, match="shard_id"):
        token_batches(LENGTHS, 120, shuffle=False, num_shards=2, shard_id=2)


def test_batch_is_a_dataclass_of_batch_first_tensors(toy):
    corpus, tok = toy
    encoded = encode_corpus(corpus, tok)
    batch = collate(encoded, range(4))
    assert isinstance(batch, Batch) and len(batch) == 4
    assert all(s.shape[0] == 4 and s.dtype == torch.long for s in batch.sources)
    assert batch.target_in.shape == batch.target_out.shape == batch.target_mask.shape
