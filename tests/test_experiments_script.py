"""`python -m msgcore.experiments`: a chapter's runs as a plain script, packed and unpacked as one archive."""
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
    assert script.main(["ch01", "--scale", "smoke", "--device", "cpu", "--part", "1/2", "--out", str(tmp_path)]) == 2
    assert "trains in one process: --part is not supported" in capsys.readouterr().err
