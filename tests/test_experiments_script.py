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
