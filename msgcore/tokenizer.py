"""A thin wrapper over a SentencePiece model with fixed special ids and language tags.

Ids 0-4 are always pad, unk, bos (<s>), eos (</s>) and <mask> (for denoising pre-training); then
come the language tags "<2en>", "<2de>", ... (one per language given at training time), then the
learned pieces. Trained
models are cached by a hash of their training text and options, so rerunning a notebook
reuses the same model instead of training it again.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
from pathlib import Path
from typing import Iterable, Sequence

import sentencepiece as spm

from msgcore import download
from msgcore.utils import DataError, atomic_write

logger = logging.getLogger(__name__)

PAD_ID, UNK_ID, BOS_ID, EOS_ID, MASK_ID = 0, 1, 2, 3, 4
MASK_PIECE = "<mask>"
SEP_PIECE = "<sep>"  # joins two sentences into one sequence (document-level "two in, two out")
MODEL_TYPES = ("unigram", "bpe")
_FIRST_LANG_ID = 5
# SentencePiece's result depends on its thread count, so it is fixed: same text -> same model on any machine.
TRAIN_THREADS = 4
_LANG_TAG = re.compile(r"<2([^>\s]+)>")


def lang_tag(lang: str) -> str:
    """The piece that names a language, e.g. "<2de>"."""
    return f"<2{lang}>"


class Tokenizer:
    """Text <-> ids with SentencePiece; see the module docstring for the id layout."""

    def __init__(self, processor: spm.SentencePieceProcessor, proto: bytes):
        self._sp = processor
        self._proto = proto
        self.langs: tuple[str, ...] = self._find_langs()  # languages with a tag, in id order
        self._lang_ids = {lang: _FIRST_LANG_ID + i for i, lang in enumerate(self.langs)}

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def train(cls, texts: Iterable[str], *, vocab_size: int = 8000, model_type: str = "unigram",
              langs: Sequence[str] = (), symbols: Sequence[str] = (), cache_dir: str | os.PathLike | None = None,
              seed: int = 0) -> Tokenizer:
        """Train on `texts` (or load the cached model trained on the same texts and options).

        `vocab_size` is an upper bound: tiny corpora get a smaller vocabulary. `symbols` are extra
        pieces kept whole, after the language tags (e.g. SEP_PIECE to join two sentences). The model is cached
        as `<cache_dir>/<sha256>.model`, `cache_dir` defaulting to `<download.cache_dir()>/tokenizers`.
        """
        if model_type not in MODEL_TYPES:
            raise DataError(f"unknown tokenizer model_type {model_type!r}; valid: {', '.join(MODEL_TYPES)}")
        texts = [text for text in texts if text.strip()]
        if not texts:
            raise DataError("cannot train a tokenizer on no text (all texts are empty)")
        langs = tuple(dict.fromkeys(langs))
        options = {"vocab_size": vocab_size, "model_type": model_type, "langs": langs, "seed": seed,
                   "symbols": [MASK_PIECE, *symbols],
                   "sentencepiece": spm.__version__}
        cache_file = Path(cache_dir or download.cache_dir() / "tokenizers") / f"{_fingerprint(texts, options)}.model"
        if cache_file.is_file():
            try:
                return cls.load(cache_file)
            except DataError:
                pass  # a corrupt cache entry: train again and overwrite it
        tokenizer = cls.from_bytes(_train_sentencepiece(texts, vocab_size, model_type, langs, tuple(symbols), seed))
        try:
            tokenizer.save(cache_file)
        except OSError as error:  # a read-only cache or a file in its place: the cache is only a shortcut
            logger.warning("tokenizer not cached in %s (%s)", cache_file.parent, error)
        return tokenizer

    @classmethod
    def from_bytes(cls, proto: bytes) -> Tokenizer:
        """A tokenizer from a serialized SentencePiece model."""
        processor = spm.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(proto)
        except (RuntimeError, OSError, TypeError) as error:
            raise DataError(f"not a valid SentencePiece model ({error})") from None
        expected = {PAD_ID: processor.pad_id(), UNK_ID: processor.unk_id(),
                    BOS_ID: processor.bos_id(), EOS_ID: processor.eos_id()}
        if any(want != got for want, got in expected.items()):
            raise DataError("this SentencePiece model was not trained by msgcore: its special ids are not "
                            "pad=0, unk=1, bos=2, eos=3")
        return cls(processor, bytes(proto))

    def to_bytes(self) -> bytes:
        """The serialized SentencePiece model."""
        return self._proto

    def save(self, path: str | os.PathLike) -> None:
        """Write the model to `path` atomically."""
        with atomic_write(path, "wb") as f:
            f.write(self._proto)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Tokenizer:
        """Read a model written by `save`; a missing or corrupt file raises DataError."""
        path = Path(path)
        if not path.is_file():
            raise DataError(f"tokenizer file {path} not found")
        try:
            return cls.from_bytes(path.read_bytes())
        except DataError as error:
            raise DataError(f"tokenizer file {path}: {error}") from None

    # -- ids ----------------------------------------------------------------------------------

    @property
    def pad_id(self) -> int:
        return PAD_ID

    @property
    def unk_id(self) -> int:
        return UNK_ID

    @property
    def bos_id(self) -> int:
        return BOS_ID

    @property
    def eos_id(self) -> int:
        return EOS_ID

    @property
    def mask_id(self) -> int:
        return MASK_ID

    @property
    def vocab_size(self) -> int:
        """Number of ids, specials and language tags included."""
        return self._sp.get_piece_size()

    def __len__(self) -> int:
        return self.vocab_size

    def lang_id(self, lang: str) -> int:
        """The id of the language tag of `lang`."""
        if lang not in self._lang_ids:
            raise DataError(f"the tokenizer has no language tag for {lang!r}; it knows: "
                            f"{', '.join(self.langs) or 'none (train with langs=...)'}")
        return self._lang_ids[lang]

    def id_to_piece(self, token_id: int) -> str:
        """The piece an id stands for, e.g. "▁Haus"."""
        return self._sp.id_to_piece(int(token_id))

    # -- text <-> ids -------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """The ids of the pieces of `text` (no bos/eos)."""
        return self._sp.encode(text, out_type=int)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`encode` for many texts at once."""
        return self._sp.encode(list(texts), out_type=int)

    def pieces(self, text: str) -> list[str]:
        """The pieces of `text` as strings, to look at a segmentation."""
        return self._sp.encode(text, out_type=str)

    def decode(self, ids: Iterable[int]) -> str:
        """Detokenized text: stops at the first eos and drops pad, bos and language tags."""
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        if EOS_ID in ids:
            ids = ids[:ids.index(EOS_ID)]
        specials = {PAD_ID, BOS_ID, *self._lang_ids.values()}
        return self._sp.decode([i for i in ids if i not in specials])

    def decode_batch(self, batch: Iterable[Iterable[int]]) -> list[str]:
        """`decode` for many id sequences (a list of lists or a (B, T) tensor)."""
        return [self.decode(ids) for ids in batch]

    def _find_langs(self) -> tuple[str, ...]:
        """Language tags are the pieces right after the specials that look like "<2xx>"."""
        langs = []
        for token_id in range(_FIRST_LANG_ID, self._sp.get_piece_size()):
            match = _LANG_TAG.fullmatch(self._sp.id_to_piece(token_id))
            if not match:
                break
            langs.append(match.group(1))
        return tuple(langs)

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size}, langs={self.langs})"


def _fingerprint(texts: Sequence[str], options: dict) -> str:
    """sha256 of the training options and texts: the name of the cached model."""
    digest = hashlib.sha256(json.dumps(options, sort_keys=True).encode())
    for text in texts:
        digest.update(text.encode("utf-8") + b"\0")
    return digest.hexdigest()


def _train_sentencepiece(texts: list[str], vocab_size: int, model_type: str, langs: tuple[str, ...],
                         symbols: tuple[str, ...], seed: int) -> bytes:
    """Train a SentencePiece model in memory and return its serialized bytes."""
    model = io.BytesIO()
    spm.set_random_generator_seed(seed)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts), model_writer=model, vocab_size=vocab_size, model_type=model_type,
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            user_defined_symbols=[MASK_PIECE] + [lang_tag(lang) for lang in langs] + list(symbols),
            hard_vocab_limit=False,           # tiny corpora: a smaller vocabulary instead of an error
            character_coverage=1.0,           # keep every character (umlauts, accents)
            normalization_rule_name="nmt_nfkc",  # normalizes but stays detokenizable
            minloglevel=2, num_threads=TRAIN_THREADS)
    except RuntimeError as error:
        raise DataError(f"SentencePiece training failed: {error}") from None
    return model.getvalue()
