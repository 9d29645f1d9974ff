"""`python -m msgcore.experiments`: a chapter's runs as a plain script, packed and unpacked as one archive."""
from dataclasses import replace

import pytest
import torch

from msgcore import runcache
from msgcore.batching import encode_corpus
from msgcore.experiments import TranslationData, synthetic_splits, train_model
from msgcore.experiments import __main__ as script
from msgcore.model import Transformer, preset
from msgcore.tokenizer import Tokenizer
from msgcore.trainer import TrainConfig


def toy_chapter(scale, device, out_dir, seed=0):
    corpora = synthetic_splits(("train", "val"), num_sources=1, seed=seed)
    corpora = {"train": corpora["train"].subset(range(200)), "val": corpora["val"].subset(range(10))}
    tok = Tokenizer.train(corpora["train"].texts(), vocab_size=60, model_type="unigram", seed=seed)
    data = TranslationData(tok, corpora, {s: encode_corpus(c, tok) for s, c in corpora.items()})
    torch.manual_seed(seed)
    model = Transformer(preset("tiny", vocab_size=tok.vocab_size, pad_id=tok.pad_id))
    cfg = TrainConfig(lr=1e-3, warmup_steps=2, max_tokens=512, max_epochs=1, max_steps=3, progress=False)
    return train_model(model, data, cfg, device, out_dir)


@pytest.fixture
def toy(monkeypatch):
    monkeypatch.setitem(script.CHAPTERS, "toy", (__name__, "toy_chapter"))
    monkeypatch.setattr(runcache, "REUSED", [])


def test_pack_then_unpack_elsewhere_gives_cache_hits(toy, tmp_path, monkeypatch, capsys):
    archive = tmp_path / "cache.tar"
    assert script.main(["toy", "--scale", "smoke", "--device", "cpu", "--out", str(tmp_path / "a"),
                        "--pack", str(archive)]) == 0
    assert runcache.REUSED == [] and archive.is_file()
    monkeypatch.setenv("MSGCORE_RUNS", str(tmp_path / "fresh-cache"))  # another machine's cache
    assert script.main(["--unpack", str(archive)]) == 0
    assert script.main(["toy", "--scale", "smoke", "--device", "cpu", "--out", str(tmp_path / "b")]) == 0
    assert len(runcache.REUSED) == 1 and "1 runs reused" in capsys.readouterr().out


def test_unknown_chapter_is_refused_before_any_work(toy, tmp_path, capsys):
    assert script.main(["toy", "ch99", "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown chapter 'ch99'") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "a").exists()


def test_missing_archive_is_refused(tmp_path, capsys):
    assert script.main(["--unpack", str(tmp_path / "none.tar")]) == 2
    assert "no such archive" in capsys.readouterr().err


def test_part_splits_a_chapters_seeds_over_processes(tmp_path, monkeypatch, capsys):
    """--part i/N: process i trains every N-th seed, and process 0 alone the first seed's own runs (ablations)."""
    from msgcore.experiments import coverage_nat as nat

    trained, ablated = [], []
    monkeypatch.setattr(nat, "chapter0_data", lambda scale, seed: {pair: None for pair in nat.NAT_SCALES[scale].directions})
    monkeypatch.setattr(nat, "train_direction", lambda data, *a, **k: type("D", (), {"name": "De→En", "key": "de-en"})())
    monkeypatch.setattr(nat, "train_main_systems", lambda d, scale, device, out, seeds: trained.append(tuple(seeds)) or {})
    monkeypatch.setattr(nat, "train_ablations", lambda *a, **k: ablated.append(a[-1]) or {})
    for i in range(3):
        assert script.main(["ch05", "--scale", "small", "--device", "cpu", "--seed", "10", "--part", f"{i}/3",
                            "--out", str(tmp_path)]) == 0
    assert trained == [(10,), (11,), (12,)] and ablated == [10]
    assert script.main(["ch05", "--scale", "small", "--device", "cpu", "--part", "3/3"]) == 2
    assert "i must be in 0..N-1" in capsys.readouterr().err
    monkeypatch.setitem(script.CHAPTERS, "ch03", ("msgcore.experiments.marge", "prepare_starts"))  # no `part`
    assert script.main(["ch03", "--scale", "smoke", "--device", "cpu", "--part", "1/2", "--out", str(tmp_path)]) == 2
    assert "trains in one process: --part is not supported" in capsys.readouterr().err


def test_chapter_3s_parts_split_its_seeds_and_process_0_makes_the_full_pass(monkeypatch, tmp_path):
    """Chapter 3 by seed: process i trains every N-th seed's chain of runs and its share of chapter 0's supervised
    seeds; process 0 then passes over every seed (finding the others' runs in the cache) and keeps the supervised."""
    from types import SimpleNamespace

    from msgcore.experiments import marge

    seeds, supervised = [], []
    monkeypatch.setattr(marge, "start_chapter", lambda scale, device, out, seed: SimpleNamespace(
        seeds=(seed, seed + 1, seed + 2), supervised=()))
    monkeypatch.setattr(marge, "prepare_starts", lambda ch: None)
    monkeypatch.setattr(marge, "seed_runs", lambda ch, s, out: seeds.append(s))
    monkeypatch.setattr(marge, "supervised_runs", lambda ch, scale, out, part=(0, 1): supervised.append(part) or part)
    chapters = [marge.run_chapter("small", "cpu", tmp_path, seed=10, part=(i, 3)) for i in (1, 2, 0)]
    assert seeds == [11, 12, 10, 10, 11, 12] and supervised == [(1, 3), (2, 3), (0, 3), (0, 1)]
    assert chapters[-1].supervised == (0, 1) and chapters[0].supervised == ()


def fake_postech(monkeypatch, trained: list):
    """Chapter 4 with every run faked: a run is trained once (recorded), then found in a shared cache."""
    from msgcore.experiments import postech_ape as ape

    cache = {}

    def run(key):
        if key not in cache:
            trained.append(key)
            cache[key] = type("Run", (), {"key": key})()
        return cache[key]

    scale = ape.check_options("small", 0)
    monkeypatch.setattr(ape, "start_chapter", lambda name, device, out, seed=0: ape.Chapter(scale, name, None,
                                                                                           device, out, seed))
    monkeypatch.setattr(ape, "train_generic", lambda ch, system, fields: run((system, ape.GENERIC, ch.seed)))
    monkeypatch.setattr(ape, "finetune", lambda ch, generic, system, fields, alpha, seed: run((system, alpha, seed)))
    monkeypatch.setattr(ape, "train_concat", lambda ch, seed: (run((ape.CONCAT, ape.GENERIC, seed)),
                                                               run((ape.CONCAT, 1.0, seed))))
    monkeypatch.setattr(ape, "best_single", lambda ch: ("Par w/ mask", 0.5))
    return ape


def test_chapter_4s_parts_train_every_run_once_and_process_0_returns_the_whole_chapter(monkeypatch, tmp_path):
    trained = []
    ape = fake_postech(monkeypatch, trained)
    whole = ape.run_chapter("small", "cpu", tmp_path, seed=10)
    alone = sorted(trained, key=str)
    assert ("Par w/ mask", 0.5, 12) in alone and (ape.DUAL, 1.0, 11) in alone and len(alone) == len(set(alone))
    trained.clear()
    ape = fake_postech(monkeypatch, trained)
    chapters, shares = [], []
    for i in (1, 2, 0):
        chapters.append(ape.run_chapter("small", "cpu", tmp_path, seed=10, part=(i, 3)))
        shares.append(len(trained) - sum(shares))
    assert sorted(trained, key=str) == alone  # the same runs, each trained once
    assert set(chapters[-1].runs) == set(whole.runs)  # process 0's pass holds the whole chapter
    assert all(n >= 1 for n in shares), shares  # one after another, the first takes on what no other started
    assert script.main(["ch04", "--scale", "small", "--device", "cpu", "--part", "3/3"]) == 2


def fake_trice(monkeypatch, trained: list, tmp_path):
    """Chapter 1 with every run faked at its training functions: a run, keyed by its function, folder and seed, is
    trained once (recorded), then found in a shared cache."""
    import types

    from msgcore.experiments import trice

    cache = {}

    def run(*key):
        if key not in cache:
            trained.append(key)
            cache[key] = types.SimpleNamespace(model=f"model {key}", key=key)
        return cache[key]

    def fake(name):
        return lambda pretrained, data, scale, device, out, seed=0, *a, **k: run(name, str(out), seed)

    scale = replace(trice.get_scale(trice.TRICE_SCALES, "small"), ted_systems=True)
    chapter = trice.Chapter(scale, None, "cpu", tmp_path, 10)
    monkeypatch.setattr(trice.Chapter, "tasks", property(lambda self: {k: k for k in
                                                                        ("ape", "m30k", "m30k_de", "m30k_fr", "ted",
                                                                         "ted_sent", "ted_doc")}))
    monkeypatch.setattr(trice.Chapter, "pretrained", property(lambda self: "pretrained"))
    monkeypatch.setattr(trice, "start_chapter", lambda *a, **k: chapter)
    for name in ("train_dualtrans", "train_dualbart", "train_mbart_trans", "train_stage1", "train_stage2"):
        monkeypatch.setattr(trice, name, fake(name))
    monkeypatch.setattr(trice, "train_trice", lambda pretrained, data, scale, device, out, seed=0, **k: (
        run("stage1", str(out), seed), run("stage2", str(out), seed)))
    monkeypatch.setattr(trice, "dualbart_fixed", lambda ch: run("dualbart_fixed", "", ch.seed))
    return trice


def test_chapter_1s_parts_train_every_run_once_and_process_0_returns_the_whole_chapter(monkeypatch, tmp_path):
    trained = []
    trice = fake_trice(monkeypatch, trained, tmp_path)
    whole = trice.run_chapter("small", "cpu", tmp_path, seed=10)
    alone = sorted(trained)
    assert len(alone) == len(set(alone)) and ("stage2", str(tmp_path / "trice-12"), 12) in alone
    trained.clear()
    trice = fake_trice(monkeypatch, trained, tmp_path)
    chapters, shares = [], []
    for i in (1, 2, 0):
        chapters.append(trice.run_chapter("small", "cpu", tmp_path, seed=10, part=(i, 3)))
        shares.append(len(trained) - sum(shares))
    assert sorted(trained) == alone and all(n > 0 for n in shares)  # the same runs, each trained once
    assert chapters[-1].keys() == whole.keys() and chapters[-1]["m30k"].keys() == whole["m30k"].keys()
    assert chapters[-1]["analysis"].keys() == whole["analysis"].keys()


def test_chapter_2s_parts_share_its_jobs_and_process_0_makes_the_full_pass(monkeypatch, tmp_path):
    import types

    from msgcore.experiments import mixrep

    scale = mixrep.check_options("smoke", 0)
    calls = []
    chapter = mixrep.Chapter(scale, "smoke", None, "cpu", tmp_path, 10)
    monkeypatch.setattr(mixrep.Chapter, "primary", property(lambda self: types.SimpleNamespace(name="De→En")))
    monkeypatch.setattr(mixrep, "start_chapter", lambda *a, **k: chapter)
    for name in ("table3_seed", "table2_runs", "extra_after_table3", "ablation_runs", "curve_point"):
        monkeypatch.setattr(mixrep, name, lambda ch, *args, name=name: calls.append((name, *args)))
    monkeypatch.setattr(mixrep, "train_chapter", lambda ch: calls.append(("full pass",)) or ch)
    for job in mixrep.share_jobs(chapter):
        job()
    jobs, shares = list(calls), []
    calls.clear()
    for i in (1, 2, 0):
        mixrep.run_chapter("smoke", "cpu", tmp_path, seed=10, part=(i, 3))
        shares.append(list(calls))
        calls.clear()
    assert sorted(c for share in shares for c in share if c != ("full pass",)) == sorted(jobs)
    assert [("full pass",) in share for share in shares] == [False, False, True]
    assert ("table3_seed", mixrep.direction_name(*scale.directions[0]), chapter.seeds[-1]) in jobs and len(jobs) > 2
