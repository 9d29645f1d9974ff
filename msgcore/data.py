"""Aligned multi-source corpora: loaders for the book's data sets and a learnable toy corpus.

A multi-source example is K source sentences and one target sentence, e.g. a German and a
French caption -> the English caption (Multi30k), or an English source and its German machine
translation -> the human post-edit (APE). A `Corpus` stores K source columns and one target
column of N sentences each.

Every loader validates its files and raises a one-line `DataError` that says what is wrong
and where: files of different line counts, empty lines (refused unless `skip_empty=True`),
invalid UTF-8, unknown languages or splits, and missing files. Lines are stripped of
surrounding whitespace (some files have trailing spaces or Windows line endings).
"""
from __future__ import annotations

import gzip
import hashlib
import os
import random
import tarfile
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Collection, Iterable, Iterator, Sequence

from msgcore import download, dryrun
from msgcore.utils import DataError

PathLike = str | os.PathLike

# Language codes each data set offers.
LANGUAGES: dict[str, tuple[str, ...]] = {
    "multi30k": ("en", "de", "fr", "cs"),
    "multi30k-task2": ("en", "de"),
    "wmt16-17-ape-en-de": ("en", "de"),
    "mlqe-pe-en-de": ("en", "de"),
    "doc-level-en-de": ("en", "de"),
    "synthetic": ("xa", "xb", "xc", "xd", "xt"),
}
# Multi30k split -> languages it has (the 2017 test set has no Czech).
MULTI30K_SPLITS: dict[str, tuple[str, ...]] = {
    "train": ("en", "de", "fr", "cs"),
    "val": ("en", "de", "fr", "cs"),
    "test_2016_flickr": ("en", "de", "fr", "cs"),
    "test_2017_flickr": ("en", "de", "fr"),
}
MULTI30K_TASK2_SPLITS = ("train", "val", "test_2016")  # the same images as task 1's train, val, test_2016_flickr
TASK2_DESCRIPTIONS = 5  # descriptions of each image in each language
APE_SPLITS = ("train", "dev", "test")
APE_DEV_SIZE = 1000   # the 1,000 triplets before the test set
APE_TEST_SIZE = 1000  # the last 1,000 triplets of train.{src,mt,pe}
MLQE_PE_SPLITS = ("train", "dev")
DOC_LEVEL_SPLITS = ("dev", "test")
DOC_LEVEL_CORPORA: dict[str, str] = {"ted": "IWSLT2017", "nc": "NC-2016", "europarl": "Europarl7"}
DOCUMENT_MARKER = "<d>"  # the line that opens each document in the doc-level files
NO_CONTEXT = ""          # the context of a document's first sentence: nothing (encodes to just [eos])
SYNTHETIC_SPLITS = ("train", "val", "test")


@dataclass
class Example:
    """One multi-source example."""
    sources: tuple[str, ...]  # K source sentences
    target: str               # the target sentence


@dataclass(repr=False)
class Corpus:
    """K aligned source columns and one target column of N sentences."""
    name: str                       # data set name, e.g. "multi30k"
    split: str                      # e.g. "train", "val", "test_2016_flickr"
    source_langs: tuple[str, ...]   # K language codes, one per source
    target_lang: str                # language code of the target
    sources: list[list[str]]        # K columns of N sentences
    target: list[str]               # N target sentences
    doc_ids: list[int] | None = None  # document index of each example (doc-level data), else None
    skipped_empty: int = 0          # examples dropped because a line was empty (skip_empty=True)

    def __post_init__(self) -> None:
        if len(self.sources) != len(self.source_langs):
            raise DataError(f"{self.name}/{self.split}: {len(self.sources)} source columns but "
                            f"{len(self.source_langs)} source languages")
        for lang, column in zip(self.source_langs, self.sources):
            if len(column) != len(self.target):
                raise DataError(f"{self.name}/{self.split}: source {lang!r} has {len(column)} sentences "
                                f"but the target has {len(self.target)}")
        if self.doc_ids is not None and len(self.doc_ids) != len(self.target):
            raise DataError(f"{self.name}/{self.split}: {len(self.doc_ids)} doc_ids for {len(self.target)} examples")

    def __len__(self) -> int:
        return len(self.target)

    def __getitem__(self, i: int) -> Example:
        return Example(sources=tuple(column[i] for column in self.sources), target=self.target[i])

    def __repr__(self) -> str:
        direction = "+".join(self.source_langs) + "->" + self.target_lang
        return f"Corpus({self.name!r}, split={self.split!r}, {direction}, {len(self)} examples)"

    @property
    def num_sources(self) -> int:
        """K, the number of sources per example."""
        return len(self.sources)

    def subset(self, indices: Iterable[int]) -> Corpus:
        """A corpus of the examples at `indices`, in that order."""
        indices = list(indices)
        return replace(self, sources=[[column[i] for i in indices] for column in self.sources],
                       target=[self.target[i] for i in indices],
                       doc_ids=None if self.doc_ids is None else [self.doc_ids[i] for i in indices])

    def texts(self) -> Iterator[str]:
        """Every source and target sentence, e.g. to train a joint tokenizer."""
        for column in self.sources:
            yield from column
        yield from self.target


# ---------------------------------------------------------------------------------------------
# Reading and validating files (no data-set specifics here)
# ---------------------------------------------------------------------------------------------

def capped(corpus: Corpus) -> Corpus:
    """`corpus`, or under a dry run's sentence cap (`msgcore.dryrun`) its first examples."""
    keep = dryrun.sentences(len(corpus))
    return corpus if keep == len(corpus) else corpus.subset(range(keep))


def decode_lines(data: bytes, name: str) -> list[str]:
    """Split raw bytes into stripped lines; invalid UTF-8 raises a DataError naming `name` and the line."""
    data = data.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 byte-order mark is not part of the first line
    chunks = data.split(b"\n")
    if chunks and chunks[-1] == b"":
        chunks.pop()  # the newline that ends the last line
    lines = []
    for line_no, chunk in enumerate(chunks, start=1):
        try:
            lines.append(chunk.decode("utf-8").strip())
        except UnicodeDecodeError as error:
            raise DataError(f"{name} line {line_no} is not valid UTF-8 (byte {chunk[error.start]:#04x} "
                            f"at column {error.start + 1})") from None
    return lines


def read_lines(path: PathLike) -> list[str]:
    """The stripped lines of a text file (gzip-compressed when it ends in .gz)."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{path} is a folder, not a text file")
    if not path.is_file():
        raise DataError(f"missing data file {path}; fetch the data with `python data_scripts/download.py` "
                        f"or set MSGCORE_DATA_MIRROR=/path/to/mirror")
    try:
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError, zlib.error) as error:
        raise DataError(f"{path} is not a readable gzip file ({error}); delete it and fetch it again") from None
    return decode_lines(data, str(path))


def check_same_length(columns: Sequence[Sequence[str]], names: Sequence[str]) -> None:
    """Parallel files must have the same number of lines."""
    for name, column in zip(names[1:], columns[1:]):
        if len(column) != len(columns[0]):
            raise DataError(f"{names[0]} has {len(columns[0])} lines but {name} has {len(column)} lines; "
                            f"the files of a parallel corpus must be line-aligned")


SKIP_EMPTY_HINT = "pass skip_empty=True to drop such examples"


def empty_rows(columns: Sequence[Sequence[str]], names: Sequence[str], *, skip_empty: bool,
               hint: str = SKIP_EMPTY_HINT) -> set[int]:
    """Indices of rows where any column is empty; refused with a DataError (ending in `hint`) unless `skip_empty`."""
    rows = set()
    for name, column in zip(names, columns):
        for i, line in enumerate(column):
            if not line:
                if not skip_empty:
                    raise DataError(f"{name} line {i + 1} is empty or only whitespace; {hint}")
                rows.add(i)
    return rows


def align_columns(columns: list[list[str]], names: Sequence[str], *, skip_empty: bool = False,
                  hint: str = SKIP_EMPTY_HINT) -> tuple[list[list[str]], int]:
    """Check that columns are aligned and non-empty; return (columns, number of dropped examples)."""
    check_same_length(columns, names)
    dropped = empty_rows(columns, names, skip_empty=skip_empty, hint=hint)
    if dropped:
        columns = [[line for i, line in enumerate(column) if i not in dropped] for column in columns]
    return columns, len(dropped)


def read_parallel(paths: Sequence[PathLike], *, skip_empty: bool = False,
                  hint: str = SKIP_EMPTY_HINT) -> list[list[str]]:
    """Read line-aligned files into one column of sentences per file (validated, see `align_columns`).

    `hint` ends the error about an empty line (a command line names its own option there)."""
    columns, _ = align_columns([read_lines(path) for path in paths], [str(path) for path in paths],
                               skip_empty=skip_empty, hint=hint)
    return columns


# ---------------------------------------------------------------------------------------------
# Argument checks shared by the loaders
# ---------------------------------------------------------------------------------------------

def _check_choice(what: str, value: str, valid: Iterable[str]) -> None:
    valid = tuple(valid)
    if value not in valid:
        raise DataError(f"unknown {what} {value!r}; valid: {', '.join(valid)}")


def _check_translation_langs(dataset: str, sources: tuple[str, ...], target: str) -> None:
    """Known languages, no source listed twice, and no source in the target language."""
    for lang in (*sources, target):
        _check_choice(f"language for {dataset}", lang, LANGUAGES[dataset])
    if not sources:
        raise DataError(f"{dataset}: give at least one source language")
    if len(set(sources)) != len(sources):
        raise DataError(f"{dataset}: a source language is listed twice in {sources}")
    if target in sources:
        raise DataError(f"{dataset}: source language {target!r} is the same as the target language; "
                        f"pick sources among {', '.join(lang for lang in LANGUAGES[dataset] if lang != target)}")


def _data_dir(dataset: str, data_dir: PathLike | None) -> Path:
    """`data_dir` if given (a folder holding the data set's files), else the verified cache copy."""
    return Path(data_dir) if data_dir is not None else download.ensure(dataset)


# ---------------------------------------------------------------------------------------------
# Loaders
# ---------------------------------------------------------------------------------------------

def load_multi30k(split: str, sources: Sequence[str] | str = ("de",), target: str = "en", *,
                  skip_empty: bool = False, data_dir: PathLike | None = None) -> Corpus:
    """Multi30k task 1 (Elliott et al., 2016): image captions aligned across en, de, fr, cs.

    `split` is one of train (29,000), val (1,014), test_2016_flickr (1,000), test_2017_flickr
    (1,000, no cs). `sources` are the K source languages, e.g. ("de", "fr") for 2 sources.
    `data_dir` is a folder holding `{split}.{lang}.gz`; by default the verified cache copy.
    """
    sources = (sources,) if isinstance(sources, str) else tuple(sources)
    _check_translation_langs("multi30k", sources, target)
    _check_choice("multi30k split", split, MULTI30K_SPLITS)
    for lang in (*sources, target):
        if lang not in MULTI30K_SPLITS[split]:
            raise DataError(f"multi30k split {split!r} has no {lang!r} file; languages there: "
                            f"{', '.join(MULTI30K_SPLITS[split])}")
    folder = _data_dir("multi30k", data_dir)
    paths = [folder / f"{split}.{lang}.gz" for lang in (*sources, target)]
    columns, skipped = align_columns([read_lines(p) for p in paths], [str(p) for p in paths],
                                     skip_empty=skip_empty)
    return capped(Corpus("multi30k", split, sources, target, columns[:-1], columns[-1], skipped_empty=skipped))


@dataclass
class ImageDescriptions:
    """Multi30k task 2: for each image, descriptions written independently in each language. The German ones are
    not translations of the English ones (their writers saw only the image): related documents, no bitext."""
    split: str
    images: list[str]  # the image file names, one per row
    descriptions: dict[str, list[tuple[str, ...]]]  # language -> per image, its TASK2_DESCRIPTIONS descriptions

    def __len__(self) -> int:
        return len(self.images)


def load_multi30k_task2(split: str, langs: Sequence[str] = ("en", "de"), *,
                        data_dir: PathLike | None = None) -> ImageDescriptions:
    """Multi30k task 2 (Elliott et al., 2016): 5 English (Flickr30k's) and 5 independent German descriptions of each
    of train 29,000 / val 1,014 / test_2016 1,000 images, the images of task 1's splits in the same order.
    `data_dir` is a folder holding `{split}.{k}.{lang}.gz` and `{split}_images.txt`; by default the verified cache
    copy. Empty descriptions are refused."""
    _check_choice("multi30k-task2 split", split, MULTI30K_TASK2_SPLITS)
    for lang in langs:
        _check_choice("language for multi30k-task2", lang, LANGUAGES["multi30k-task2"])
    folder = _data_dir("multi30k-task2", data_dir)
    paths = [folder / f"{split}_images.txt"] + [folder / f"{split}.{k}.{lang}.gz" for lang in langs
                                                 for k in range(1, TASK2_DESCRIPTIONS + 1)]
    columns, _ = align_columns([read_lines(p) for p in paths], [str(p) for p in paths],
                               hint="Multi30k task 2 has a description in every line")
    keep = dryrun.sentences(len(columns[0]))
    columns = [column[:keep] for column in columns]
    per_lang = {lang: columns[1 + i * TASK2_DESCRIPTIONS: 1 + (i + 1) * TASK2_DESCRIPTIONS]
                for i, lang in enumerate(langs)}
    return ImageDescriptions(split, columns[0], {lang: list(zip(*cols)) for lang, cols in per_lang.items()})


def load_ape(split: str, *, skip_empty: bool = False, data_dir: PathLike | None = None) -> Corpus:
    """WMT16+17 English-German APE triplets (16,068, IT domain, tokenized): (src en, mt de) -> pe de.

    The release has no dev/test split, so we split deterministically by position: the last
    1,000 triplets are `test`, the 1,000 before them `dev`, the first 14,068 `train`.
    """
    _check_choice("APE split", split, APE_SPLITS)
    folder = _data_dir("wmt16-17-ape-en-de", data_dir)
    paths = [folder / f"train.{ext}" for ext in ("src", "mt", "pe")]
    columns, names = [read_lines(p) for p in paths], [str(p) for p in paths]
    check_same_length(columns, names)
    dropped = empty_rows(columns, names, skip_empty=skip_empty)  # line numbers of the whole file
    test_start = len(columns[0]) - APE_TEST_SIZE
    dev_start = test_start - APE_DEV_SIZE
    if dev_start < 1:
        raise DataError(f"{names[0]} has {len(columns[0])} lines, too few for the {APE_DEV_SIZE} dev "
                        f"and {APE_TEST_SIZE} test triplets taken from its end")
    start, stop = {"train": (0, dev_start), "dev": (dev_start, test_start), "test": (test_start, len(columns[0]))}[split]
    rows = [i for i in range(start, stop) if i not in dropped]
    src, mt, pe = ([column[i] for i in rows] for column in columns)
    return capped(Corpus("wmt16-17-ape-en-de", split, ("en", "de"), "de", [src, mt], pe,
                         skipped_empty=stop - start - len(rows)))


def load_mlqe_pe(split: str, *, skip_empty: bool = False, data_dir: PathLike | None = None) -> Corpus:
    """MLQE-PE English-German post-editing (Fomicheva et al., 2020): (src en, mt de) -> pe de.

    Splits: train (7,000) and dev (1,000), read straight from `en-de-{split}.tar.gz`.
    """
    _check_choice("MLQE-PE split", split, MLQE_PE_SPLITS)
    archive = _data_dir("mlqe-pe-en-de", data_dir) / f"en-de-{split}.tar.gz"
    members = [f"en-de-{split}/{split}.{ext}" for ext in ("src", "mt", "pe")]
    columns = _read_tar_members(archive, members)
    names = [f"{archive}:{member}" for member in members]
    columns, skipped = align_columns(columns, names, skip_empty=skip_empty)
    return capped(Corpus("mlqe-pe-en-de", split, ("en", "de"), "de", columns[:2], columns[2], skipped_empty=skipped))


def _read_tar_members(archive: Path, members: Sequence[str]) -> list[list[str]]:
    """The stripped lines of text files inside a .tar.gz archive."""
    if not archive.is_file():
        raise DataError(f"missing data file {archive}; fetch the data with `python data_scripts/download.py` "
                        f"or set MSGCORE_DATA_MIRROR=/path/to/mirror")
    try:
        with tarfile.open(archive, "r:gz") as tar:
            columns = []
            for member in members:
                try:
                    data = tar.extractfile(member).read()
                except KeyError:
                    raise DataError(f"{archive} has no member {member}") from None
                columns.append(decode_lines(data, f"{archive}:{member}"))
            return columns
    except (tarfile.TarError, OSError, EOFError, zlib.error) as error:
        raise DataError(f"{archive} is not a readable .tar.gz file ({error}); delete it and fetch it again") from None


def load_doc_level(split: str, corpus: str = "ted", *, source_lang: str = "de", target_lang: str = "en",
                   context_lang: str | None = None, skip_empty: bool = False,
                   data_dir: PathLike | None = None) -> Corpus:
    """Document-level English-German data of Maruf et al. (2019): TED, News Commentary, Europarl.

    Each example has two sources, (previous sentence, current sentence), and the current sentence
    in `target_lang` as target. The previous sentence is taken from the same document only: the
    first sentence of each document gets `NO_CONTEXT` (the empty string, which encodes to just
    [eos]). `context_lang` (default: `source_lang`) picks the language of the previous sentence;
    with `context_lang == target_lang` it is the *reference* previous translation (an oracle at
    test time). `doc_ids` gives each example's document index. With `skip_empty=True` an example
    with an empty line is dropped and the previous kept sentence serves as context.
    Splits: dev and test (the training sets are not public in this form).
    """
    _check_choice("doc-level corpus", corpus, DOC_LEVEL_CORPORA)
    _check_choice("doc-level split", split, DOC_LEVEL_SPLITS)
    context_lang = context_lang or source_lang
    _check_translation_langs("doc-level-en-de", (source_lang,), target_lang)
    _check_choice("context language for doc-level-en-de", context_lang, LANGUAGES["doc-level-en-de"])
    folder = _data_dir("doc-level-en-de", data_dir) / DOC_LEVEL_CORPORA[corpus]
    paths = {lang: folder / f"concatenated_en2de_{split}_{lang}.txt" for lang in ("en", "de")}
    lines = {lang: read_lines(path) for lang, path in paths.items()}
    names = [str(paths["en"]), str(paths["de"])]
    check_same_length([lines["en"], lines["de"]], names)
    dropped = empty_rows([lines["en"], lines["de"]], names, skip_empty=skip_empty)
    documents = split_documents(lines["en"], lines["de"], names, dropped)
    contexts, currents, targets, doc_ids = [], [], [], []
    for doc_id, rows in enumerate(documents):
        previous = NO_CONTEXT
        for row in rows:
            contexts.append(previous)
            currents.append(lines[source_lang][row])
            targets.append(lines[target_lang][row])
            doc_ids.append(doc_id)
            previous = lines[context_lang][row]
    return capped(Corpus(f"doc-level-en-de/{corpus}", split, (context_lang, source_lang), target_lang,
                         [contexts, currents], targets, doc_ids=doc_ids, skipped_empty=len(dropped)))


def split_documents(first: list[str], second: list[str], names: Sequence[str],
                    dropped: Collection[int] = ()) -> list[list[int]]:
    """Group sentence rows into documents at `DOCUMENT_MARKER` lines, which both files must share.

    Returns one list of row indices per non-empty document, in file order; rows in `dropped` are left out.
    """
    documents: list[list[int]] = [[]]
    for row, (a, b) in enumerate(zip(first, second)):
        a_marks, b_marks = a == DOCUMENT_MARKER, b == DOCUMENT_MARKER
        if a_marks != b_marks:
            marked, other = (names[0], names[1]) if a_marks else (names[1], names[0])
            raise DataError(f"{marked} line {row + 1} opens a document ({DOCUMENT_MARKER}) but {other} "
                            f"line {row + 1} does not; the files are misaligned")
        if a_marks:
            if documents[-1]:
                documents.append([])
        elif row not in dropped:
            documents[-1].append(row)
    return [doc for doc in documents if doc]


# ---------------------------------------------------------------------------------------------
# A learnable toy corpus
# ---------------------------------------------------------------------------------------------

_SYLLABLES = ("ba", "do", "fi", "ka", "lo", "mi", "nu", "pe", "ra", "si", "tu", "ve", "zo", "gu")
# How each toy source language orders the words of the target sentence.
_WORD_ORDERS = {
    "xa": lambda words: list(words),                                   # same order
    "xb": lambda words: list(reversed(words)),                         # fully reversed (head-final)
    "xc": lambda words: [w for i in range(0, len(words), 2) for w in reversed(words[i:i + 2])],  # pairs swapped
    "xd": lambda words: list(words[1:]) + list(words[:1]),             # first word moves to the end
}
SYNTHETIC_TARGET_LANG = "xt"
MASKED_WORD = "?"


def toy_lexicon(lang: str, size: int) -> list[str]:
    """`size` distinct two-syllable words of toy language `lang`; word i translates concept i."""
    pool = [a + b for a in _SYLLABLES for b in _SYLLABLES]
    return random.Random(f"lexicon:{lang}").sample(pool, size)


def _split_of(sentence: str) -> str:
    """A fixed split for every target sentence (80/10/10), so the toy splits never overlap."""
    bucket = hashlib.sha256(sentence.encode()).digest()[0] % 10
    return "train" if bucket < 8 else "val" if bucket == 8 else "test"


def synthetic_corpus(n: int, num_sources: int = 2, seed: int = 0, split: str = "train", *,
                     vocab_size: int = 24, min_len: int = 3, max_len: int = 8,
                     mask_prob: float = 0.0) -> Corpus:
    """A seeded toy translation task that a tiny Transformer learns in seconds.

    Target sentences in toy language "xt" are random sequences of `vocab_size` concepts. Source k
    says the same thing in toy language "xa", "xb", "xc" or "xd": each has its own word for
    every concept and its own word order (same, reversed, pairs swapped, first word last).
    With `mask_prob > 0` each source word is independently replaced by "?", so combining the
    sources recovers more than any one of them. Same arguments -> same corpus; the splits
    train/val/test hold disjoint target sentences.
    """
    if not 1 <= num_sources <= len(_WORD_ORDERS):
        raise DataError(f"synthetic_corpus supports 1 to {len(_WORD_ORDERS)} sources, not {num_sources}")
    source_langs = tuple(_WORD_ORDERS)[:num_sources]
    _check_choice("synthetic split", split, SYNTHETIC_SPLITS)
    target_words = toy_lexicon(SYNTHETIC_TARGET_LANG, vocab_size)
    source_words = {lang: toy_lexicon(lang, vocab_size) for lang in source_langs}
    rng = random.Random(f"synthetic:{seed}:{split}")
    sources: list[list[str]] = [[] for _ in source_langs]
    target: list[str] = []
    while len(target) < n:
        concepts = [rng.randrange(vocab_size) for _ in range(rng.randint(min_len, max_len))]
        sentence = " ".join(target_words[c] for c in concepts)
        if _split_of(sentence) != split:
            continue
        target.append(sentence)
        for column, lang in zip(sources, source_langs):
            words = [MASKED_WORD if rng.random() < mask_prob else source_words[lang][c] for c in concepts]
            column.append(" ".join(_WORD_ORDERS[lang](words)))
    return Corpus("synthetic", split, source_langs, SYNTHETIC_TARGET_LANG, sources, target)
