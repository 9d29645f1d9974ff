"""Loaders and their validation: every bad input gets a one-line DataError saying what and where."""
import gzip
import io
import tarfile
from pathlib import Path

import pytest

from msgcore import data, download
from msgcore.utils import DataError

HAVE_MIRROR = download.mirror_dir() is not None
needs_mirror = pytest.mark.skipif(not HAVE_MIRROR, reason="no local data mirror")


def write_gz(path: Path, lines: list[str] | bytes) -> Path:
    raw = lines if isinstance(lines, bytes) else "".join(line + "\n" for line in lines).encode()
    path.write_bytes(gzip.compress(raw))
    return path


@pytest.fixture
def multi30k_dir(tmp_path):
    """A tiny Multi30k-shaped folder: 3 aligned train captions in en/de/fr."""
    write_gz(tmp_path / "train.en.gz", ["A dog runs.", "Two men talk. ", "A girl sings."])
    write_gz(tmp_path / "train.de.gz", ["Ein Hund rennt.", "Zwei Männer reden.\r", "Ein Mädchen singt."])
    write_gz(tmp_path / "train.fr.gz", ["Un chien court.", "Deux hommes parlent.", "Une fille chante."])
    return tmp_path


def test_multi30k_loads_aligned_and_stripped(multi30k_dir):
    corpus = data.load_multi30k("train", ("de", "fr"), "en", data_dir=multi30k_dir)
    assert len(corpus) == 3 and corpus.num_sources == 2
    assert corpus.source_langs == ("de", "fr") and corpus.target_lang == "en"
    assert corpus[1] == data.Example(("Zwei Männer reden.", "Deux hommes parlent."), "Two men talk.")
    sub = corpus.subset([2, 0])
    assert sub.target == ["A girl sings.", "A dog runs."] and sub.sources[1][0] == "Une fille chante."


def test_different_line_counts_name_both_files(multi30k_dir):
    write_gz(multi30k_dir / "train.fr.gz", ["Un chien court.", "Deux hommes parlent."])
    with pytest.raises(DataError, match=r"train.de.gz has 3 lines but .*train.fr.gz has 2 lines"):
        data.load_multi30k("train", ("de", "fr"), data_dir=multi30k_dir)


@pytest.mark.parametrize("empty", ["", "   \t"])
def test_empty_lines_refused_with_file_and_line(multi30k_dir, empty):
    write_gz(multi30k_dir / "train.fr.gz", ["Un chien court.", empty, "Une fille chante."])
    with pytest.raises(DataError, match=r"train.fr.gz line 2 is empty or only whitespace; pass skip_empty=True"):
        data.load_multi30k("train", ("de", "fr"), data_dir=multi30k_dir)


def test_skip_empty_drops_whole_example_and_counts_it(multi30k_dir):
    write_gz(multi30k_dir / "train.fr.gz", ["Un chien court.", "", "Une fille chante."])
    corpus = data.load_multi30k("train", ("de", "fr"), skip_empty=True, data_dir=multi30k_dir)
    assert corpus.skipped_empty == 1
    assert corpus.target == ["A dog runs.", "A girl sings."]
    assert corpus.sources[0] == ["Ein Hund rennt.", "Ein Mädchen singt."]


def test_invalid_utf8_names_file_and_line(multi30k_dir):
    write_gz(multi30k_dir / "train.de.gz", b"Ein Hund rennt.\nZwei M\xe4nner reden.\nEin M\xc3\xa4dchen singt.\n")
    with pytest.raises(DataError, match=r"train.de.gz line 2 is not valid UTF-8"):
        data.load_multi30k("train", data_dir=multi30k_dir)


def test_unknown_language_lists_valid_ones(multi30k_dir):
    with pytest.raises(DataError, match=r"unknown language for multi30k 'es'; valid: en, de, fr, cs"):
        data.load_multi30k("train", ("de", "es"), data_dir=multi30k_dir)


def test_unknown_split_lists_valid_ones(multi30k_dir):
    with pytest.raises(DataError, match=r"unknown multi30k split 'test'; valid: train, val, test_2016_flickr"):
        data.load_multi30k("test", data_dir=multi30k_dir)


def test_split_without_the_language(multi30k_dir):
    with pytest.raises(DataError, match=r"split 'test_2017_flickr' has no 'cs' file; languages there: en, de, fr"):
        data.load_multi30k("test_2017_flickr", ("de", "cs"), data_dir=multi30k_dir)


def test_source_equal_to_target_is_refused(multi30k_dir):
    with pytest.raises(DataError, match=r"source language 'en' is the same as the target language"):
        data.load_multi30k("train", ("de", "en"), "en", data_dir=multi30k_dir)


def test_missing_file_says_how_to_fetch(tmp_path):
    with pytest.raises(DataError) as error:
        data.load_multi30k("train", data_dir=tmp_path)
    assert "missing data file" in str(error.value) and "train.de.gz" in str(error.value)
    assert "data_scripts/download.py" in str(error.value) and "MSGCORE_DATA_MIRROR" in str(error.value)


def test_read_parallel_plain_files(tmp_path):
    (tmp_path / "a.txt").write_text("eins\nzwei\n", encoding="utf-8")
    (tmp_path / "b.txt").write_text("one\n\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"b.txt line 2 is empty"):
        data.read_parallel([tmp_path / "a.txt", tmp_path / "b.txt"])
    assert data.read_parallel([tmp_path / "a.txt", tmp_path / "b.txt"], skip_empty=True) == [["eins"], ["one"]]


def test_ape_split_is_positional(tmp_path):
    n = 2500
    for ext in ("src", "mt", "pe"):
        (tmp_path / f"train.{ext}").write_text("".join(f"{ext} {i}\n" for i in range(n)))
    splits = {split: data.load_ape(split, data_dir=tmp_path) for split in ("train", "dev", "test")}
    assert [len(c) for c in splits.values()] == [500, 1000, 1000]
    assert splits["dev"].target[0] == "pe 500" and splits["test"].target[-1] == f"pe {n - 1}"
    assert splits["test"][0].sources == ("src 1500", "mt 1500")
    with pytest.raises(DataError, match="unknown APE split 'val'; valid: train, dev, test"):
        data.load_ape("val", data_dir=tmp_path)
    (tmp_path / "train.pe").write_text("".join(f"pe {i}\n" if i != 2000 else " \n" for i in range(n)))
    with pytest.raises(DataError, match=r"train.pe line 2001 is empty"):  # line numbers count the whole file
        data.load_ape("train", data_dir=tmp_path)
    test = data.load_ape("test", skip_empty=True, data_dir=tmp_path)
    assert len(test) == 999 and test.skipped_empty == 1 and "pe 2000" not in test.target
    assert data.load_ape("dev", skip_empty=True, data_dir=tmp_path).skipped_empty == 0


def test_mlqe_pe_reads_the_archive(tmp_path):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for ext, text in [("src", "a house\n"), ("mt", "ein Haus\n"), ("pe", "ein Haus .\n")]:
            member = tarfile.TarInfo(f"en-de-dev/dev.{ext}")
            member.size = len(text.encode())
            tar.addfile(member, io.BytesIO(text.encode()))
    (tmp_path / "en-de-dev.tar.gz").write_bytes(buffer.getvalue())
    corpus = data.load_mlqe_pe("dev", data_dir=tmp_path)
    assert corpus[0] == data.Example(("a house", "ein Haus"), "ein Haus .")
    with pytest.raises(DataError, match="missing data file .*en-de-train.tar.gz"):
        data.load_mlqe_pe("train", data_dir=tmp_path)


def write_doc_files(folder: Path, de: list[str], en: list[str]) -> Path:
    corpus_dir = folder / "IWSLT2017"
    corpus_dir.mkdir(parents=True, exist_ok=True)
    (corpus_dir / "concatenated_en2de_dev_de.txt").write_bytes("".join(line + "\r\n" for line in de).encode())
    (corpus_dir / "concatenated_en2de_dev_en.txt").write_bytes("".join(line + "\r\n" for line in en).encode())
    return folder


def test_doc_level_contexts_stay_inside_documents(tmp_path):
    de = ["<d>", "A1", "A2", "A3", "<d>", "B1", "B2"]
    en = ["<d>", "a1", "a2", "a3", "<d>", "b1", "b2"]
    corpus = data.load_doc_level("dev", "ted", data_dir=write_doc_files(tmp_path, de, en))
    assert corpus.source_langs == ("de", "de") and corpus.target_lang == "en"
    assert corpus.sources == [["", "A1", "A2", "", "B1"], ["A1", "A2", "A3", "B1", "B2"]]
    assert corpus.target == ["a1", "a2", "a3", "b1", "b2"]
    assert corpus.doc_ids == [0, 0, 0, 1, 1]
    english = data.load_doc_level("dev", "ted", source_lang="en", target_lang="de", data_dir=tmp_path)
    assert english[3] == data.Example((data.NO_CONTEXT, "b1"), "B1")


def test_doc_level_misaligned_markers(tmp_path):
    folder = write_doc_files(tmp_path, ["<d>", "A1", "<d>", "B1"], ["<d>", "a1", "b0", "b1"])
    with pytest.raises(DataError, match=r"concatenated_en2de_dev_de.txt line 3 opens a document"):
        data.load_doc_level("dev", data_dir=folder)
    with pytest.raises(DataError, match="unknown doc-level corpus 'wmt'; valid: ted, nc, europarl"):
        data.load_doc_level("dev", "wmt", data_dir=folder)
    with pytest.raises(DataError, match="same as the target language"):
        data.load_doc_level("dev", source_lang="en", target_lang="en", data_dir=folder)


def test_synthetic_corpus_is_deterministic_and_has_k_sources():
    corpus = data.synthetic_corpus(50, num_sources=3, seed=1)
    assert corpus.num_sources == 3 and corpus.source_langs == ("xa", "xb", "xc") and corpus.target_lang == "xt"
    assert corpus.sources == data.synthetic_corpus(50, num_sources=3, seed=1).sources
    assert corpus.target != data.synthetic_corpus(50, num_sources=3, seed=2).target
    test = data.synthetic_corpus(50, num_sources=3, seed=1, split="test")
    assert not set(test.target) & set(data.synthetic_corpus(500, seed=1).target)  # splits never overlap
    example = corpus[0]
    assert len(example.sources[0].split()) == len(example.target.split())
    assert example.sources[1].split() != example.sources[0].split() or len(example.target.split()) == 1
    vocabulary = {word for sentence in corpus.texts() for word in sentence.split()}
    assert len(vocabulary) <= 4 * 24
    with pytest.raises(DataError, match="1 to 4 sources"):
        data.synthetic_corpus(5, num_sources=5)


@needs_mirror
def test_real_multi30k_train_is_aligned(tmp_path_factory):
    folder = download.ensure("multi30k", cache=tmp_path_factory.mktemp("cache"))
    corpus = data.load_multi30k("train", ("de", "fr", "cs"), "en", data_dir=folder)
    assert len(corpus) == 29000 and all(len(column) == 29000 for column in corpus.sources)
    assert corpus[0].target.startswith("Two young, White males are outside")
    assert len(data.load_multi30k("test_2017_flickr", ("de", "fr"), data_dir=folder)) == 1000


@needs_mirror
def test_real_ape_split_sizes(tmp_path_factory):
    folder = download.ensure("wmt16-17-ape-en-de", cache=tmp_path_factory.mktemp("cache"))
    assert [len(data.load_ape(split, data_dir=folder)) for split in ("train", "dev", "test")] == [14068, 1000, 1000]


@needs_mirror
def test_real_doc_level_ted_dev(tmp_path_factory):
    folder = download.ensure("doc-level-en-de", cache=tmp_path_factory.mktemp("cache"))
    corpus = data.load_doc_level("dev", "ted", data_dir=folder)
    assert len(corpus) == 8967 and max(corpus.doc_ids) + 1 == 93
    assert not any(data.DOCUMENT_MARKER in s for s in corpus.texts())
    firsts = {i for i in range(len(corpus)) if i == 0 or corpus.doc_ids[i] != corpus.doc_ids[i - 1]}
    assert len(firsts) == 93 and all(corpus.sources[0][i] == data.NO_CONTEXT for i in firsts)
    assert all(corpus.sources[0][i] == corpus.sources[1][i - 1] for i in range(len(corpus)) if i not in firsts)


def test_a_folder_given_as_a_file_says_so(tmp_path):
    with pytest.raises(DataError, match="is a folder, not a text file") as error:
        data.read_lines(tmp_path)
    assert "download" not in str(error.value)


def test_a_byte_order_mark_is_stripped(tmp_path):
    path = tmp_path / "bom.txt"
    path.write_bytes("\ufeffErste Zeile\nzweite\n".encode())
    assert data.read_lines(path) == ["Erste Zeile", "zweite"]


def test_the_empty_line_hint_can_name_a_command_line_option(tmp_path):
    (tmp_path / "a").write_text("x\n\n")
    (tmp_path / "b").write_text("y\nz\n")
    with pytest.raises(DataError, match=r"a line 2 is empty or only whitespace; pass --skip-empty"):
        data.read_parallel([tmp_path / "a", tmp_path / "b"], hint="pass --skip-empty")


def task2_dir(tmp_path: Path, images: int = 2, lines: dict[str, int] | None = None) -> Path:
    """A Multi30k-task-2-shaped val split: `images` images, 5 descriptions each in en and de."""
    (tmp_path / "val_images.txt").write_text("".join(f"{i}.jpg\n" for i in range(images)))
    for lang in ("en", "de"):
        for k in range(1, 6):
            n = (lines or {}).get(f"val.{k}.{lang}.gz", images)
            write_gz(tmp_path / f"val.{k}.{lang}.gz", [f"{lang} description {k} of image {i}" for i in range(n)])
    return tmp_path


def test_task2_groups_five_independent_descriptions_per_image_and_language(tmp_path):
    d = data.load_multi30k_task2("val", data_dir=task2_dir(tmp_path))
    assert len(d) == 2 and d.images == ["0.jpg", "1.jpg"] and set(d.descriptions) == {"en", "de"}
    assert d.descriptions["de"][1] == tuple(f"de description {k} of image 1" for k in range(1, 6))
    assert data.load_multi30k_task2("val", ("de",), data_dir=tmp_path).descriptions.keys() == {"de"}


def test_task2_refuses_a_short_file_an_unknown_split_and_a_language_it_lacks(tmp_path):
    folder = task2_dir(tmp_path, lines={"val.3.de.gz": 1})
    with pytest.raises(DataError, match=r"val_images.txt has 2 lines but .*val.3.de.gz has 1 lines"):
        data.load_multi30k_task2("val", data_dir=folder)
    with pytest.raises(DataError, match="test_2016"):
        data.load_multi30k_task2("test_2016_flickr", data_dir=folder)
    with pytest.raises(DataError, match="fr"):
        data.load_multi30k_task2("val", ("fr",), data_dir=folder)


@needs_mirror
def test_real_task2_describes_task1s_images_without_translating_them(tmp_path_factory):
    folder = download.ensure("multi30k-task2", cache=tmp_path_factory.mktemp("cache"))
    d = data.load_multi30k_task2("val", data_dir=folder)
    task1 = data.load_multi30k("val", "de", "en")
    assert len(d) == len(task1) == 1014 and all(len(row) == 5 for row in d.descriptions["de"])
    assert sum(task1.target[i] in d.descriptions["en"][i] for i in range(len(d))) > 0.9 * len(d)  # Flickr30k's
    assert sum(task1.sources[0][i] in d.descriptions["de"][i] for i in range(len(d))) < 0.01 * len(d)  # no bitext
