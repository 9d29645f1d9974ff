"""The chapter's helpers: document data, MBART-DOCTRANS outputs, d-BLEU, adversarial sources, verdicts."""
import pytest
import sacrebleu
import torch

from msgcore.data import Corpus
from msgcore.experiments import paired_delta
from msgcore.experiments.trice import (current_sentence, document_bleu, joined_pair, previous_targets,
                                       shuffled_source, split_documents_at, train_stage2)
from msgcore.model import preset
from msgcore.models.trice import TriceConfig, TriceTransformer
from msgcore.tokenizer import SEP_PIECE, Tokenizer
from msgcore.utils import MsgcoreError


def doc_corpus():
    prev = ["", "a1", "a2", "", "b1"]
    cur = ["a1", "a2", "a3", "b1", "b2"]
    return Corpus("doc", "dev", ("de", "de"), "en", [prev, cur], [c.upper() for c in cur], doc_ids=[0, 0, 0, 1, 1])


def test_previous_targets_never_cross_a_document_boundary():
    assert previous_targets(doc_corpus()) == ["", "A1", "A2", "", "B1"]


def test_joined_pair_is_two_sentences_in_two_out():
    pair = joined_pair(doc_corpus(), previous_targets(doc_corpus()))
    assert pair.num_sources == 1 and pair.sources[0][1] == f"a1 {SEP_PIECE} a2"
    assert pair.target[1] == f"A1 {SEP_PIECE} A2"
    assert current_sentence(pair.target[1]) == "A2"
    assert current_sentence("no separator here") == "no separator here"


def test_split_documents_keeps_whole_documents():
    train, valid = split_documents_at(doc_corpus(), valid_docs=1)
    assert train.doc_ids == [0, 0, 0] and valid.doc_ids == [1, 1]
    assert (train.split, valid.split) == ("train", "val")


def test_document_bleu_joins_each_document():
    hyps, refs, docs = ["a b c", "d e f", "g h i"], ["a b c", "d e x", "g h i"], [0, 0, 1]
    expected = sacrebleu.corpus_bleu(["a b c d e f", "g h i"], [["a b c d e x", "g h i"]]).score
    assert document_bleu(hyps, refs, docs) == pytest.approx(expected)


def test_shuffled_source_replaces_every_sentence_of_one_source_only():
    corpus = Corpus("t", "test", ("de", "fr"), "en", [[f"de{i}" for i in range(20)], [f"fr{i}" for i in range(20)]],
                    [f"en{i}" for i in range(20)])
    de, fr = shuffled_source(corpus, 0, seed=3)
    assert fr == corpus.sources[1]
    assert sorted(de) == sorted(corpus.sources[0])  # a permutation of the same sentences...
    assert all(a != b for a, b in zip(de, corpus.sources[0]))  # ...with no sentence left in place
    assert shuffled_source(corpus, 0, seed=3) == [de, fr]  # seeded
    with pytest.raises(MsgcoreError, match="at least 2"):
        shuffled_source(corpus.subset([0]), 0)


def test_sep_piece_is_one_token_and_survives_decoding(tmp_path):
    texts = ["ein Hund läuft", "a dog runs", "zwei Katzen", "two cats"] * 20
    tok = Tokenizer.train(texts, vocab_size=60, langs=("de", "en"), symbols=(SEP_PIECE,), cache_dir=tmp_path)
    ids = tok.encode(f"ein Hund {SEP_PIECE} a dog")
    assert ids.count(tok.encode(SEP_PIECE)[-1]) == 1 and tok.langs == ("de", "en")
    assert current_sentence(tok.decode(ids)) == "a dog"


def test_paired_delta_signs():
    refs = [f"the cat number {i} sat on the mat" for i in range(30)]
    worse = [f"a dog number {i} sat" for i in range(30)]
    delta, p = paired_delta(refs, worse, refs, "bleu", n_samples=200)
    assert delta > 50 and p < 0.05
    delta, _ = paired_delta(refs, worse, refs, "ter", n_samples=200)
    assert delta < 0  # TER: the better system has the lower score
    assert paired_delta(refs, worse, list(worse), "bleu", n_samples=200) == (0.0, 1.0)  # identical: no evidence


def test_freezing_trains_only_the_new_fine_encoder(tmp_path):
    from test_trice_recipes import SCALE, toy_data

    data = toy_data(tmp_path)
    torch.manual_seed(0)
    single = TriceTransformer(TriceConfig(**preset("tiny", vocab_size=data.tokenizer.vocab_size, **SCALE.model).to_dict(),
                                          fine_layers=0))
    before = {n: p.detach().clone() for n, p in single.named_parameters()}
    run = train_stage2(single, data, SCALE, torch.device("cpu"), tmp_path / "frozen", freeze_old=True)
    changed = {n for n, p in run.model.named_parameters() if n in before and not torch.equal(p, before[n])}
    assert not changed  # every stage-1 weight is untouched
    assert any(p.requires_grad for p in run.model.fine_encoder.parameters())


def test_offline_smoke_runs_fall_back_to_the_synthetic_tasks(tmp_path, monkeypatch):
    import urllib.error

    from msgcore import download
    from msgcore.experiments.trice import TRICE_SCALES, prepare_tasks
    from msgcore.utils import DataError

    def offline(url, timeout):
        raise urllib.error.URLError("no network")

    monkeypatch.setenv("MSGCORE_DATA", str(tmp_path / "cache"))
    monkeypatch.setenv("MSGCORE_DATA_MIRROR", "")
    monkeypatch.setattr(download.urllib.request, "urlopen", offline)
    with pytest.raises(DataError, match="MSGCORE_DATA_MIRROR"):
        prepare_tasks(TRICE_SCALES["smoke"])
    tasks = prepare_tasks(TRICE_SCALES["smoke"], allow_synthetic=True)
    assert tasks.synthetic and all(data.synthetic for data in tasks.tasks.values())
    assert set(tasks.monolingual) == {"xa", "xb", "xt"}
    m30k, ted = tasks.tasks["m30k"].corpora, tasks.tasks["ted"].corpora
    assert set(m30k) == {"train", "val", "test_2016_flickr", "test_2017_flickr"}
    assert m30k["test_2016_flickr"].target != m30k["test_2017_flickr"].target
    assert ted["train"].doc_ids and not set(ted["train"].doc_ids) & set(ted["val"].doc_ids)
    assert tasks.tasks["ted_doc"].corpora["train"].num_sources == 1


def test_scale_limits_cut_whole_ted_test_documents(tmp_path, monkeypatch):
    import urllib.error
    from dataclasses import replace

    from msgcore import download
    from msgcore.experiments.trice import TRICE_SCALES, load_task_corpora

    monkeypatch.setenv("MSGCORE_DATA", str(tmp_path / "cache"))
    monkeypatch.setenv("MSGCORE_DATA_MIRROR", "")
    monkeypatch.setattr(download.urllib.request, "urlopen", lambda url, timeout: (_ for _ in ()).throw(
        urllib.error.URLError("no network")))
    scale = replace(TRICE_SCALES["smoke"], eval_examples=0, ted_test_documents=3)
    tasks, synthetic = load_task_corpora(scale, allow_synthetic=True)
    test = tasks["ted"]["test"]
    assert synthetic and sorted(set(test.doc_ids)) == [0, 1, 2] and len(test) == 30
    assert len(tasks["ted_sent"]["test"]) == 30


def test_paper_tables_quote_numbers_that_are_in_the_paper_text():
    from pathlib import Path

    from msgcore.experiments.trice import PAPER_TABLES

    paper = Path(__file__).resolve().parents[2] / "shared" / "papers" / "trice-huang-2021.txt"
    if not paper.is_file():
        pytest.skip("the paper's text is not beside this checkout")
    text = paper.read_text()

    def numbers(obj):
        if isinstance(obj, dict):
            for v in obj.values():
                yield from numbers(v)
        elif isinstance(obj, float):
            yield obj

    values = list(numbers(PAPER_TABLES))
    assert len(values) > 40
    missing = [v for v in values if f"{v:.2f}" not in text and f"{v:.1f}" not in text]
    assert not missing


def test_fixed_steps_trains_exactly_that_budget_and_validates_at_its_end():
    from msgcore.experiments.trice import TRICE_SCALES, fixed_steps

    cfg = fixed_steps(TRICE_SCALES["small"].stage2, 100)
    assert (cfg.max_steps, cfg.validate_every, cfg.patience) == (100, 100, 0)
    assert fixed_steps(TRICE_SCALES["small"].stage2, 0).max_steps == 1


def test_task_text_keeps_each_language_once_and_ape_german_is_the_mt():
    from msgcore.experiments.trice import task_text

    ape = Corpus("ape", "val", ("en", "de"), "de", [["src 1", "src 2", "  "], ["mt 1", "mt 2", "mt 3"]],
                 ["pe 1", "pe 2", "pe 3"])
    assert task_text(ape) == {"en": ["src 1", "src 2"], "de": ["mt 1", "mt 2", "mt 3"]}  # blank lines dropped
    assert task_text(ape, n=1) == {"en": ["src 1"], "de": ["mt 1"]}
    assert task_text(doc_corpus())["en"] == ["A1", "A2", "A3", "B1", "B2"]


def test_single_source_systems_are_tested_on_their_own_source(tmp_path, monkeypatch):
    """MBART-TRANS (Fr) was trained on the French column alone; decoding it on both sources (a bug once)
    scored it at half its BLEU."""
    import types
    import urllib.error

    from msgcore import download
    from msgcore.experiments.trice import TRICE_SCALES, multi30k_data, prepare_tasks

    monkeypatch.setenv("MSGCORE_DATA", str(tmp_path / "cache"))
    monkeypatch.setenv("MSGCORE_DATA_MIRROR", "")
    monkeypatch.setattr(download.urllib.request, "urlopen", lambda url, timeout: (_ for _ in ()).throw(
        urllib.error.URLError("no network")))
    tasks = prepare_tasks(TRICE_SCALES["smoke"], allow_synthetic=True).tasks
    ch = types.SimpleNamespace(tasks=tasks)
    both = tasks["m30k"].encoded["test_2016_flickr"]
    for system, k in (("MBART-TRANS (De)", 0), ("MBART-TRANS (Fr)", 1)):
        encoded = multi30k_data(ch, system).encoded["test_2016_flickr"]
        assert encoded.sources == [both.sources[k]] and encoded.target == both.target
    assert multi30k_data(ch, "TRICE").encoded["test_2016_flickr"].sources == both.sources
