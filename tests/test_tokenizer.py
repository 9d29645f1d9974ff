"""The SentencePiece wrapper: round trips, fixed special ids, language tags and the training cache."""
import pytest
import torch

from msgcore import tokenizer as tokenizer_module
from msgcore.tokenizer import Tokenizer
from msgcore.utils import DataError

SENTENCES = [
    "Ein kleines Mädchen klettert in ein Spielhaus aus Holz.",
    "Zwei Männer stehen vor einem großen Gebäude.",
    "Eine Frau in einem blauen Kleid überquert die Straße.",
    "Über der Brücke fliegen drei weiße Vögel.",
    "A little girl climbs into a wooden playhouse.",
    "Two men are standing in front of a large building.",
    "A woman in a blue dress crosses the street.",
    "Three white birds fly over the bridge.",
    "Un homme âgé lit le journal au café.",
]
TEXTS = SENTENCES * 4


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("tokenizers")


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_round_trip(model_type, cache):
    tok = Tokenizer.train(TEXTS, vocab_size=120, model_type=model_type, cache_dir=cache)
    for sentence in SENTENCES + ["Eine Frau überquert die weiße Brücke.", "Mädchen."]:
        ids = tok.encode(sentence)
        assert all(isinstance(i, int) and i > 3 for i in ids)
        assert tok.decode(ids) == sentence
    assert tok.decode_batch(tok.encode_batch(SENTENCES[:2])) == SENTENCES[:2]


def test_special_ids_and_lang_tags(cache):
    tok = Tokenizer.train(TEXTS, vocab_size=120, langs=("en", "de", "en"), cache_dir=cache)
    assert (tok.pad_id, tok.unk_id, tok.bos_id, tok.eos_id) == (0, 1, 2, 3)
    assert [tok.id_to_piece(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]
    assert tok.id_to_piece(tok.mask_id) == "<mask>" and tok.mask_id == 4
    assert tok.langs == ("en", "de") and (tok.lang_id("en"), tok.lang_id("de")) == (5, 6)
    assert tok.id_to_piece(tok.lang_id("de")) == "<2de>"
    with pytest.raises(DataError, match="no language tag for 'fr'; it knows: en, de"):
        tok.lang_id("fr")
    ids = tok.encode("Zwei Männer stehen vor einem großen Gebäude.")
    # decode drops bos, language tags and padding, and stops at the first eos
    decoded = tok.decode(torch.tensor([tok.lang_id("de"), tok.bos_id, *ids, tok.eos_id, 17, 0, 0]))
    assert decoded == "Zwei Männer stehen vor einem großen Gebäude."
    assert tok.vocab_size == len(tok) <= 120


def test_cache_hit_loads_without_training(cache, monkeypatch):
    first = Tokenizer.train(TEXTS, vocab_size=100, cache_dir=cache, seed=3)
    cached = list(cache.glob("*.model"))
    mtimes = {path: path.stat().st_mtime_ns for path in cached}

    def must_not_train(*args, **kwargs):
        raise AssertionError("trained again instead of using the cache")

    monkeypatch.setattr(tokenizer_module, "_train_sentencepiece", must_not_train)
    second = Tokenizer.train(iter(TEXTS), vocab_size=100, cache_dir=cache, seed=3)
    assert second.to_bytes() == first.to_bytes()
    assert {path: path.stat().st_mtime_ns for path in cached} == mtimes
    with pytest.raises(AssertionError):  # different options are a different model
        Tokenizer.train(TEXTS, vocab_size=101, cache_dir=cache, seed=3)


def test_save_load_and_bad_files(cache, tmp_path):
    tok = Tokenizer.train(TEXTS, vocab_size=120, cache_dir=cache)
    tok.save(tmp_path / "tok.model")
    assert Tokenizer.load(tmp_path / "tok.model").to_bytes() == tok.to_bytes()
    assert Tokenizer.from_bytes(tok.to_bytes()).encode("Ein Haus") == tok.encode("Ein Haus")
    with pytest.raises(DataError, match="tokenizer file .*missing.model not found"):
        Tokenizer.load(tmp_path / "missing.model")
    (tmp_path / "bad.model").write_bytes(b"not a model")
    with pytest.raises(DataError, match="bad.model: not a valid SentencePiece model"):
        Tokenizer.load(tmp_path / "bad.model")


def test_bad_training_requests(cache):
    with pytest.raises(DataError, match="unknown tokenizer model_type 'char'; valid: unigram, bpe"):
        Tokenizer.train(TEXTS, model_type="char", cache_dir=cache)
    with pytest.raises(DataError, match="no text"):
        Tokenizer.train(["", "  "], cache_dir=cache)


def test_an_unwritable_cache_trains_without_caching(tmp_path):
    a_file = tmp_path / "cache"
    a_file.write_text("a file where the cache folder should be")
    tok = Tokenizer.train(TEXTS, vocab_size=120, cache_dir=a_file)
    assert tok.decode(tok.encode(SENTENCES[0])) == SENTENCES[0]
