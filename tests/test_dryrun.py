"""Capped runs (msgcore.dryrun): every training loop stops at its cap, every loaded split is cut, capped runs keep to
their own corner of the run cache, and bad caps are refused in one line."""
import gzip
import json
from pathlib import Path

import pytest
import torch

from msgcore import data, dryrun, runcache
from msgcore.batching import encode_corpus
from msgcore.experiments import TranslationData, synthetic_splits, train_model
from msgcore.experiments.__main__ import main as experiments_main
from msgcore.model import Transformer, preset
from msgcore.tokenizer import Tokenizer
from msgcore.trainer import TrainConfig
from msgcore.utils import MsgcoreError


@pytest.fixture(scope="module")
def toy():
    corpora = synthetic_splits(("train", "val"), num_sources=1, seed=0)
    corpora = {"train": corpora["train"].subset(range(200)), "val": corpora["val"].subset(range(10))}
    tokenizer = Tokenizer.train(corpora["train"].texts(), vocab_size=60, model_type="unigram", seed=0)
    return TranslationData(tokenizer, corpora, {s: encode_corpus(c, tokenizer) for s, c in corpora.items()})


def model_for(toy):
    torch.manual_seed(0)
    return Transformer(preset("tiny", vocab_size=toy.tokenizer.vocab_size, pad_id=toy.tokenizer.pad_id))


def recipe(**kw):
    return TrainConfig(**{**dict(lr=1e-3, warmup_steps=2, max_tokens=256, max_epochs=50, max_steps=0,
                                 validate_every=0, valid_max_sentences=0, progress=False), **kw})


def test_no_caps_change_nothing():
    cfg = recipe(max_steps=40)
    assert not dryrun.caps() and dryrun.train_config(cfg) is cfg
    assert dryrun.updates(0) == 0 and dryrun.updates(7) == 7 and dryrun.sentences(1000) == 1000


def test_a_recipe_under_caps_trains_at_most_the_cap_and_validates_on_few_sentences():
    dryrun.set_caps(updates=3, sentences=5)
    capped = dryrun.train_config(recipe(max_steps=40, validate_every=10, valid_max_sentences=300))
    assert (capped.max_steps, capped.validate_every, capped.valid_max_sentences, capped.log_every) == (3, 3, 5, 3)
    unlimited = dryrun.train_config(recipe(max_steps=0, valid_max_sentences=0))  # 0 = no limit becomes the cap
    assert (unlimited.max_steps, unlimited.valid_max_sentences) == (3, 5)
    assert dryrun.train_config(recipe(max_steps=2)).max_steps == 2  # a loop shorter than the cap keeps its length
    dryrun.set_caps(sentences=5)  # data capped, updates not: an unlimited loop stays unlimited
    assert dryrun.train_config(recipe(max_steps=0, log_every=7)).log_every == 7


def test_a_capped_run_stops_at_the_cap_and_lives_in_its_own_cache_corner(toy, tmp_path, monkeypatch):
    monkeypatch.setenv("MSGCORE_RUNS", str(tmp_path / "cache"))
    dryrun.set_caps(updates=2)
    run = train_model(model_for(toy), toy, recipe(max_steps=40), torch.device("cpu"), tmp_path / "out")
    steps = [row["step"] for row in run.history if row.get("kind") == "valid"]
    assert steps == [2]  # validated once, at the cap
    entry = Path(json.loads((tmp_path / "out" / "run.json").read_text())["cache_entry"])
    assert entry.parent == tmp_path / "cache" / "capped-u2-s0"
    dryrun.set_caps()  # the same recipe uncapped is another run: it trains, and does not reuse the capped one
    assert runcache.cache_root() == tmp_path / "cache"
    again = train_model(model_for(toy), toy, recipe(max_steps=4), torch.device("cpu"), tmp_path / "out2")
    assert not again.reused and max(row["step"] for row in again.history) == 4


def test_a_loaded_split_is_cut_to_the_sentence_cap(tmp_path):
    for lang in ("de", "en"):
        with gzip.open(tmp_path / f"train.{lang}.gz", "wt", encoding="utf-8") as f:
            f.write("".join(f"{lang} sentence {i}\n" for i in range(10)))
    dryrun.set_caps(sentences=4)
    corpus = data.load_multi30k("train", "de", "en", data_dir=tmp_path)
    assert corpus.target == [f"en sentence {i}" for i in range(4)] and len(corpus.sources[0]) == 4


@pytest.mark.parametrize("value", ["two", "-1", "1.5"])
def test_a_bad_cap_in_the_environment_is_one_line_naming_it(monkeypatch, value):
    monkeypatch.setenv("MSGCORE_MAX_UPDATES", value)
    with pytest.raises(MsgcoreError, match="MSGCORE_MAX_UPDATES=.* is not a count"):
        dryrun.caps()


def test_the_command_line_refuses_a_bad_cap_before_any_work(capsys):
    assert experiments_main(["ch00", "--max-updates", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--max-updates" in err and "out of range" in err
    assert not dryrun.caps()


def test_the_command_line_caps_are_the_smaller_of_both(monkeypatch):
    import argparse

    from msgcore.options import add_cap_options, apply_cap_options

    parser = argparse.ArgumentParser()
    add_cap_options(parser)
    apply_cap_options(parser.parse_args(["--dry-run", "--max-updates", "1"]))
    assert dryrun.caps() == dryrun.Caps(1, dryrun.DRY_RUN[1])
    dryrun.set_caps()
    apply_cap_options(parser.parse_args(["--max-updates", "50"]))
    assert dryrun.caps() == dryrun.Caps(50, 0)


def test_the_denoiser_holds_out_at_most_half_of_a_short_text():
    from msgcore.foundations.denoiser import split_heldout

    texts = {"en": [f"e{i}" for i in range(1000)], "de": [f"d{i}" for i in range(24)]}  # a dry run's capped split
    train, heldout = split_heldout(texts, 200)
    assert (len(train["en"]), len(heldout["en"])) == (800, 200) and heldout["en"][0] == "e800"
    assert (len(train["de"]), len(heldout["de"])) == (12, 12)  # before: 0 left to pre-train on
    assert split_heldout(texts, 0) == (texts, {"en": [], "de": []})
