"""The chapter's helpers: document data, MBART-DOCTRANS outputs, d-BLEU, adversarial sources, verdicts."""
import pytest
import sacrebleu
import torch

from msgcore.data import Corpus
from msgcore.experiments import paired_delta
from msgcore.experiments.trice import current_sentence, shuffled_source, train_stage2
from msgcore.foundations.denoiser import joined_pair, previous_targets, split_documents_at
from msgcore.metrics import document_bleu
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
    from test_trice_recipes import DENOISER, SCALE, toy_data

    data = toy_data(tmp_path)
    torch.manual_seed(0)
    single = TriceTransformer(TriceConfig(**preset("tiny", vocab_size=data.tokenizer.vocab_size, **DENOISER.model).to_dict(),
                                          fine_layers=0))
    before = {n: p.detach().clone() for n, p in single.named_parameters()}
    run = train_stage2(single, data, SCALE, torch.device("cpu"), tmp_path / "frozen", freeze_old=True)
    changed = {n for n, p in run.model.named_parameters() if n in before and not torch.equal(p, before[n])}
    assert not changed  # every stage-1 weight is untouched
    assert any(p.requires_grad for p in run.model.fine_encoder.parameters())


def test_offline_smoke_runs_fall_back_to_the_synthetic_tasks(tmp_path, monkeypatch):
    import urllib.error

    from msgcore import download
    from msgcore.foundations.denoiser import DENOISER_SCALES, prepare_tasks
    from msgcore.utils import DataError

    def offline(url, timeout):
        raise urllib.error.URLError("no network")

    monkeypatch.setenv("MSGCORE_DATA", str(tmp_path / "cache"))
    monkeypatch.setenv("MSGCORE_DATA_MIRROR", "")
    monkeypatch.setattr(download.urllib.request, "urlopen", offline)
    with pytest.raises(DataError, match="MSGCORE_DATA_MIRROR"):
        prepare_tasks(DENOISER_SCALES["smoke"])
    tasks = prepare_tasks(DENOISER_SCALES["smoke"], allow_synthetic=True)
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
    from msgcore.foundations.denoiser import DENOISER_SCALES, load_task_corpora

    monkeypatch.setenv("MSGCORE_DATA", str(tmp_path / "cache"))
    monkeypatch.setenv("MSGCORE_DATA_MIRROR", "")
    monkeypatch.setattr(download.urllib.request, "urlopen", lambda url, timeout: (_ for _ in ()).throw(
        urllib.error.URLError("no network")))
    scale = replace(DENOISER_SCALES["smoke"], eval_examples=0, ted_test_documents=3)
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
    from msgcore.experiments.trice import multi30k_data
    from msgcore.foundations.denoiser import DENOISER_SCALES, prepare_tasks

    monkeypatch.setenv("MSGCORE_DATA", str(tmp_path / "cache"))
    monkeypatch.setenv("MSGCORE_DATA_MIRROR", "")
    monkeypatch.setattr(download.urllib.request, "urlopen", lambda url, timeout: (_ for _ in ()).throw(
        urllib.error.URLError("no network")))
    tasks = prepare_tasks(DENOISER_SCALES["smoke"], allow_synthetic=True).tasks
    ch = types.SimpleNamespace(tasks=tasks)
    both = tasks["m30k"].encoded["test_2016_flickr"]
    for system, k in (("MBART-TRANS (De)", 0), ("MBART-TRANS (Fr)", 1)):
        encoded = multi30k_data(ch, system).encoded["test_2016_flickr"]
        assert encoded.sources == [both.sources[k]] and encoded.target == both.target
    assert multi30k_data(ch, "TRICE").encoded["test_2016_flickr"].sources == both.sources


# ---- the claims and their evidence (msgcore.verdicts) ------------------------------------------------------------

def fake_run(steps, bleu=(10.0, 12.0, 12.1), seconds=2.0):
    """A RunResult stand-in: a dev curve over `steps` updates, ending there."""
    import types

    every = steps // len(bleu)
    history = [{"kind": "valid", "step": every * (k + 1), "valid_bleu": b} for k, b in enumerate(bleu)]
    return types.SimpleNamespace(history=[{"kind": "train", "step": steps, "loss": 1.0}, *history],
                                 wall_time_s=seconds * steps)


def offline_corpora(scale, monkeypatch, tmp_path):
    """The smoke tasks of a chapter scale's denoiser, from the synthetic corpus (no network, no mirror)."""
    import urllib.error

    from msgcore import download
    from msgcore.foundations.denoiser import DENOISER_SCALES, load_task_corpora

    monkeypatch.setenv("MSGCORE_DATA", str(tmp_path / "cache"))
    monkeypatch.setenv("MSGCORE_DATA_MIRROR", "")
    monkeypatch.setattr(download.urllib.request, "urlopen", lambda url, timeout: (_ for _ in ()).throw(
        urllib.error.URLError("no network")))
    corpora, synthetic = load_task_corpora(DENOISER_SCALES[scale.denoiser], allow_synthetic=True)
    assert synthetic
    return corpora


def chapter_evidence(scale, corpora):
    """Every system, floor and gate the notebook builds, from stand-in runs and scores at `scale`."""
    import types

    from msgcore.experiments import trice

    seeds = tuple(scale.seeds)
    ch = types.SimpleNamespace(scale=scale, seeds=seeds,
                               tasks={name: types.SimpleNamespace(corpora=splits) for name, splits in corpora.items()})
    m30k = {(name, s): fake_run(300) for name in ("DualTrans", *trice.MULTI30K_SINGLE) for s in seeds[:1]}
    m30k.update({(name, s): fake_run(steps) for s in seeds
                 for name, steps in (("DualBART", 300), ("TRICE stage 1", 150), ("TRICE", 250))})
    bleu = {(name, s, test): 20.0 + 0.1 * s + (2 if name == "TRICE" else 0)
            for name, s in m30k for test in trice.M30K_TESTS}
    randomized = {("TRICE", s, f"Randomized {lang}"): value for s in seeds
                  for lang, value in (("De", 11.0), ("Fr", 8.0))}
    ape = {name: fake_run(300) for name in ("DualTrans", "DualBART", "TRICE stage 1", "TRICE")}
    ape_scores = {name: {"TER": 22.0, trice.APE_TER: 21.0, "BLEU": 60.0} for name in ("DualTrans", "DualBART", "TRICE")}
    variants = {name: fake_run(100, bleu=(60.0,)) for name in trice.VARIANTS}
    dev_bleu = {name: 60.0 for name in trice.VARIANTS}
    evidence = {**trice.floor_systems(ch), **trice.multi30k_systems(ch, m30k, bleu, randomized),
                **trice.ape_systems(ch, ape, ape_scores, variants, dev_bleu)}
    if scale.ted_systems:
        ted = {name: (fake_run(300), None) for name in ("MBART-TRANS", "MBART-DOCTRANS", "DualBART", "TRICE stage 1",
                                                         "TRICE")}
        evidence.update(trice.ted_systems(ch, ted, {name: {"s-BLEU": 20.0, "d-BLEU": 25.0}
                                                    for name in trice.PAPER_TABLES["table4"]}))
    recon = {"Multi30k": {"de": 98.0, "fr": 99.0, "en": 99.0}, "APE": {"en": 98.0, "de": 96.0},
             "TED": {"de": 82.0, "en": 86.0}}
    gates = trice.chapter_gates(recon, {name: bleu[name, seeds[0], "test_2016_flickr"] for name, _ in m30k
                                        if name != "TRICE stage 1"}, dev_bleu)
    return evidence, gates, m30k


@pytest.mark.parametrize("scale_name", ["smoke", "small", "full"])
def test_declared_claims_name_only_what_the_chapter_builds(scale_name, monkeypatch, tmp_path):
    """Every system, floor, single-source baseline and gate a claim names is one the chapter builds (from stand-in
    runs, on the smoke data); TED's claim is "not run" where the scale trains no TED system, and says its cost."""
    from dataclasses import replace

    from msgcore import verdicts
    from msgcore.experiments.trice import TRICE_SCALES, declared_claims

    scale = TRICE_SCALES[scale_name]
    corpora = offline_corpora(replace(TRICE_SCALES["smoke"], ted_systems=scale.ted_systems), monkeypatch, tmp_path)
    evidence, gates, _ = chapter_evidence(replace(TRICE_SCALES["smoke"], ted_systems=scale.ted_systems,
                                                  seeds=scale.seeds), corpora)
    claims = declared_claims(scale_name, seconds_per_update=1.5, coherence_note="explained")
    gate_names = {g.name for g in gates}
    for claim in claims:
        assert set(claim.gates) <= gate_names, claim.id
        if claim.id != "T4-TED" or scale.ted_systems:
            assert set(claim.systems()) <= set(evidence), claim.id
    judged = {v.id: v for v in verdicts.judge_all(claims, evidence, gates)}
    assert len(judged) == 16
    ted = judged["T4-TED"]
    if scale.ted_systems:
        assert ted.verdict == verdicts.NOT_DECIDED and ted.reason.startswith("gate failed: denoiser copies TED")
    else:
        assert ted.verdict == verdicts.NOT_RUN and "CPU-hours" in ted.reason and "1.50 s" in ted.reason


def test_claims_are_the_same_declared_before_and_after_the_runs():
    """The scoreboard re-declares the claims only to price the unrun ones at the measured throughput."""
    from dataclasses import replace

    from msgcore.experiments.trice import declared_claims

    before, after = declared_claims("small", coherence_note="n"), declared_claims("small", 2.0, coherence_note="n")
    assert [replace(c, cost="") for c in before] == [replace(c, cost="") for c in after]
    assert {c.id for c in before if c.cost} == {"T4-TED"}
    coherent = [c.id for c in before if c.coherence_note]
    assert coherent == ["T3-main", "T3-test2017"]  # the TRICE claims with a single-source baseline on Multi30k
    assert not declared_claims("small")[0].coherence_note


def test_trice_budget_is_both_stages_and_its_runs_are_stage_two(monkeypatch, tmp_path):
    from dataclasses import replace

    from msgcore.experiments.trice import TRICE_SCALES

    scale = replace(TRICE_SCALES["smoke"], seeds=(0, 1, 2))
    evidence, _, _ = chapter_evidence(scale, offline_corpora(scale, monkeypatch, tmp_path))
    trice_, dualbart = evidence["TRICE"], evidence["DualBART"]
    assert trice_.updates == 150 + 250 and dualbart.updates == 300
    assert [r.last_step for r in trice_.runs] == [250] * 3 and len(dualbart.runs) == 3
    assert trice_.scores["test_2016_flickr"]["BLEU"] == [22.0, 22.1, 22.2]  # seed order
    assert evidence["DualTrans"].scores["test_2016_flickr"]["BLEU"] == [20.0]
    assert evidence["TRICE (first seed)"].scores["test_2016_flickr"]["BLEU"] == [22.0]
    assert evidence["variant: – gradual finetuning"].updates == 100  # no stage 1 before it
    assert evidence["variant: None"].updates == 300 + 100
    assert all(evidence[name].updates is None and not evidence[name].runs
               for name in ("copy input (De)", "best constant (Multi30k)", "do nothing (MT)", "best constant (APE)"))


def test_floors_are_scored_on_each_claims_test_set(monkeypatch, tmp_path):
    import types

    from msgcore import floors
    from msgcore.experiments import trice

    corpora = offline_corpora(trice.TRICE_SCALES["smoke"], monkeypatch, tmp_path)
    ch = types.SimpleNamespace(scale=trice.TRICE_SCALES["smoke"],
                               tasks={name: types.SimpleNamespace(corpora=splits) for name, splits in corpora.items()})
    out = trice.floor_systems(ch)
    test = corpora["m30k"]["test_2017_flickr"]
    copied = floors.copy_input(test.sources[1], test.target)
    assert out["copy input (Fr)"].scores["test_2017_flickr"]["BLEU"] == [copied]
    ape = corpora["ape"]["test"]
    assert out["do nothing (MT)"].scores[trice.APE_TEST][trice.APE_TER] == [
        floors.copy_input(ape.sources[1], ape.target, "ter")]
    assert set(out["best constant (APE)"].scores) == {trice.APE_TEST, trice.APE_DEV}
    assert set(out["copy input (TED)"].scores) == {trice.TED_TEST}


def test_gates_block_on_the_lowest_language_and_on_two_sources_below_one():
    from msgcore.experiments import trice

    recon = {"Multi30k": {"de": 98.0, "en": 99.0}, "TED": {"de": 82.0, "en": 95.0}}
    m30k = {"DualTrans": 4.0, "MBART-TRANS (De)": 16.0, "MBART-TRANS (Fr)": 20.0, "DualBART": 19.0, "TRICE": 22.0}
    gates = {g.name: g for g in trice.chapter_gates(recon, m30k, {name: 60.0 for name in trice.VARIANTS})}
    assert gates[trice.denoiser_gate("Multi30k")].passed and not gates[trice.denoiser_gate("TED")].passed
    assert gates[trice.denoiser_gate("TED")].value == 82.0
    assert gates[trice.PRETRAINING_GATE].value == 15.0
    assert not gates[trice.multi_source_gate("DualBART")].passed and gates[trice.multi_source_gate("TRICE")].passed


def test_chapter0_figure_is_read_as_data(tmp_path):
    import json

    from msgcore.experiments.trice import chapter0_de_en, chapter0_difference

    assert chapter0_de_en(tmp_path / "missing.json") is None
    path = tmp_path / "ch00.json"
    floor = {"name": "copy input De→En", "scores": {"test_2016_flickr": {"BLEU": [3.0]}}, "updates": None}
    trained = {"name": "Transformer De→En", "scores": {"test_2016_flickr": {"BLEU": [39.2]}}, "updates": 1450}
    other = {"name": "Transformer En→De", "scores": {"test_2016_flickr": {"BLEU": [38.0]}}, "updates": 1400}
    path.write_text(json.dumps({"scale": "small", "systems": [floor, other, trained]}, ensure_ascii=False))
    assert chapter0_de_en(path) == {"name": "Transformer De→En", "scale": "small", "scores": [39.2]}
    assert chapter0_de_en(path, metric="chrF") is None
    small = chapter0_difference("small")
    assert "`small` preset (d=256, 3+3 layers)" in small and "beam 5" in small
    assert "TRICE here is the `small` preset (d=256, 3+3 layers)" in small and "with beam 4" in small
    assert "The training recipe and the decoding differ" in small  # the same model size: not listed as a difference
