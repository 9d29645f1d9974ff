"""The run cache: a hit on the same recipe, a miss on any change, a corrupt entry rebuilt, an interrupted run resumed."""
import json
from dataclasses import replace

import pytest
import torch

from msgcore import runcache
from msgcore.batching import encode_corpus
from msgcore.experiments import TranslationData, synthetic_splits, train_model
from msgcore.tokenizer import Tokenizer
from msgcore.model import Transformer, preset
from msgcore.trainer import TrainConfig


@pytest.fixture(scope="module")
def toy():
    corpora = synthetic_splits(("train", "val"), num_sources=1, seed=0)
    corpora = {"train": corpora["train"].subset(range(300)), "val": corpora["val"].subset(range(20))}
    tokenizer = Tokenizer.train(corpora["train"].texts(), vocab_size=60, model_type="unigram", seed=0)
    return TranslationData(tokenizer, corpora, {s: encode_corpus(c, tokenizer) for s, c in corpora.items()})


def cfg(**kw):
    return TrainConfig(**{**dict(lr=1e-3, warmup_steps=5, max_tokens=512, max_epochs=1, max_steps=6, progress=False,
                                 valid_max_sentences=20), **kw})


def fresh_model(data, seed=0):
    torch.manual_seed(seed)
    return Transformer(preset("tiny", vocab_size=data.tokenizer.vocab_size, pad_id=data.tokenizer.pad_id))


def test_fingerprint_is_by_value():
    a = {"x": torch.arange(4), "y": [1, 2, 3], "z": cfg()}
    b = {"z": cfg(), "y": [1, 2, 3], "x": torch.arange(4)}
    assert runcache.fingerprint(a) == runcache.fingerprint(b)
    assert runcache.fingerprint(a) != runcache.fingerprint({**a, "x": torch.arange(1, 5)})
    assert runcache.fingerprint(cfg()) != runcache.fingerprint(cfg(lr=2e-3))
    assert runcache.fingerprint(torch.tensor(1.5)) != runcache.fingerprint(torch.tensor(2.5))  # 0-d tensors


def test_a_changed_default_is_another_run():
    from dataclasses import dataclass

    @dataclass
    class Recipe:
        lr: float = 1e-3

    @dataclass
    class Recipe2:  # the same recipe after a release changed the default
        lr: float = 2e-3

    Recipe2.__name__ = "Recipe"
    assert runcache.fingerprint(Recipe()) != runcache.fingerprint(Recipe2())
    assert runcache.fingerprint(cfg()) != runcache.fingerprint(cfg(clip_norm=TrainConfig.clip_norm + 1))


# ---- the key covers the code and the numerics: one test per item -----------------------------------------------

def key_of(toy, model=None, train_cfg=None, trainer_class=None, device="cpu"):
    from msgcore.experiments import run_key
    from msgcore.trainer import Trainer

    return run_key(model or fresh_model(toy), train_cfg or cfg(), toy.encoded["train"], toy.encoded["val"],
                   toy.corpora["val"].target, trainer_class or Trainer, device)


@pytest.mark.parametrize("module", [*runcache.NUMERICS_MODULES, "msgcore.models.trice"])
def test_a_code_change_in_a_module_that_decides_numerics_is_a_miss(toy, monkeypatch, module):
    from msgcore.models.trice import TriceConfig, TriceTransformer

    tokenizer = toy.tokenizer
    torch.manual_seed(0)
    trice = TriceTransformer(TriceConfig(**{**preset("tiny").to_dict(), "vocab_size": tokenizer.vocab_size,
                                            "pad_id": tokenizer.pad_id}))
    before = key_of(toy, trice)
    real = runcache.module_syntax
    monkeypatch.setattr(runcache, "module_syntax", lambda name: real(name) + ("changed" if name == module else ""))
    assert key_of(toy, trice) != before


def test_the_model_module_and_its_base_classes_are_hashed(monkeypatch):
    from msgcore.models.mixrep import MixRepTrainer
    from msgcore.models.trice import TriceTransformer

    seen = []
    real = runcache.module_syntax
    monkeypatch.setattr(runcache, "module_syntax", lambda name: seen.append(name) or real(name))
    runcache.code_fingerprint(TriceTransformer, MixRepTrainer)
    assert {"msgcore.models.trice", "msgcore.model", "msgcore.models.mixrep", "msgcore.trainer"} <= set(seen)
    assert set(runcache.NUMERICS_MODULES) <= set(seen)


def test_comments_and_docstrings_do_not_change_the_code_key():
    code = 'def f(x):\n    """Doubles."""\n    return 2 * x  # twice\n'
    assert runcache.code_syntax(code) == runcache.code_syntax('def f(x):\n    """Twice x."""\n    return 2 * x\n')
    assert runcache.code_syntax(code) != runcache.code_syntax('def f(x):\n    return 3 * x\n')


@pytest.mark.parametrize("change", ["trainer class", "precision", "precision resolved by the device", "sdpa backend",
                                    "torch version"])
def test_the_trainer_class_precision_backend_and_torch_version_are_in_the_key(toy, monkeypatch, change):
    from msgcore.models.mixrep import MixRepTrainer

    before = key_of(toy)
    if change == "trainer class":
        after = key_of(toy, trainer_class=MixRepTrainer)
    elif change == "precision":
        after = key_of(toy, train_cfg=cfg(amp="bf16"))
    elif change == "precision resolved by the device":  # "auto": fp32 on a CPU, bf16 on a GPU
        assert key_of(toy, train_cfg=cfg(amp="auto")) == before  # on a CPU, auto is fp32
        after = key_of(toy, train_cfg=cfg(amp="auto"), device="cuda")
    elif change == "sdpa backend":
        after = key_of(toy, train_cfg=cfg(sdpa_backends=("math",)))
    else:
        monkeypatch.setattr(torch, "__version__", "0.0.1")
        after = key_of(toy)
    assert after != before


def test_an_artefact_key_covers_the_generation_code(monkeypatch):
    calls = []
    runcache.cached_artifact("toy", {"k": 1}, lambda: calls.append(1) or [1])
    runcache.cached_artifact("toy", {"k": 1}, lambda: calls.append(1) or [1])
    assert len(calls) == 1
    real = runcache.module_syntax
    monkeypatch.setattr(runcache, "module_syntax", lambda name: real(name) + ("x" if name == "msgcore.generation" else ""))
    runcache.cached_artifact("toy", {"k": 1}, lambda: calls.append(1) or [1])
    assert len(calls) == 2


def test_a_finished_entry_records_its_provenance(toy, tmp_path):
    run = train_model(fresh_model(toy), toy, cfg(), torch.device("cpu"), tmp_path / "a")
    meta = json.loads((run.out_dir / "meta.json").read_text())
    assert {"commit", "torch", "date", "device", "wall_time_s"} <= set(meta)
    assert meta["torch"] == torch.__version__ and meta["device"] == "cpu"
    assert meta["cpu threads"] == torch.get_num_threads() and meta["cpu cores"] == runcache.usable_cores()


def test_a_run_on_1_of_2_cores_takes_half_the_machine_and_its_provenance_says_so(tmp_path, monkeypatch):
    assert runcache.machine_share({"cpu threads": 1, "cpu cores": 2}) == 0.5
    for meta in ({}, {"cpu threads": 2, "cpu cores": 2}, {"cpu threads": 4, "cpu cores": 2},
                 {"cpu threads": 0, "cpu cores": 2}, {"cpu threads": "1", "cpu cores": 2},
                 {"cpu threads": True, "cpu cores": 2}, {"device": "cuda"}):
        assert runcache.machine_share(meta) == 1.0, meta  # unknown, whole or malformed: the whole machine
    monkeypatch.setenv("MSGCORE_RUNS", str(tmp_path))
    monkeypatch.setattr(runcache, "USED", {})
    for name, meta in (("run-one", {"cpu threads": 1, "cpu cores": 2}), ("run-two", {"cpu threads": 2, "cpu cores": 2})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "meta.json").write_text(json.dumps({"files": {}, "device": "cpu", "wall_time_s": 60, **meta}))
    (tmp_path / "run-bad").mkdir()
    (tmp_path / "run-bad" / "meta.json").write_text("[1, 2")
    assert runcache.machine_shares(["run-one", "run-two", "run-bad", "run-none"]) == {
        "run-one": 0.5, "run-two": 1.0, "run-bad": 1.0, "run-none": 1.0}
    rows = runcache.provenance_rows(["run-one", "run-two"])
    assert [row["device"] for row in rows] == ["cpu (1 of 2 cores)", "cpu"]


def test_provenance_rows_name_the_commit_of_every_entry_used_trained_or_reused(toy, tmp_path, monkeypatch):
    monkeypatch.setattr(runcache, "USED", {})
    first = train_model(fresh_model(toy), toy, cfg(max_steps=4), torch.device("cpu"), tmp_path / "a")
    train_model(fresh_model(toy), toy, cfg(max_steps=4), torch.device("cpu"), tmp_path / "b")  # reused
    monkeypatch.setattr(runcache, "USED", {})
    monkeypatch.setattr(runcache, "git_commit", lambda: "abc1234")
    train_model(fresh_model(toy, seed=1), toy, cfg(max_steps=4), torch.device("cpu"), tmp_path / "c")  # trained now
    train_model(fresh_model(toy), toy, cfg(max_steps=4), torch.device("cpu"), tmp_path / "d")  # reused
    rows = runcache.provenance_rows()
    assert [row["here"] for row in rows] == ["trained now", "reused"]
    assert rows[0]["trained at commit"] == "abc1234" and rows[1]["entry"] == first.out_dir.name
    assert rows[1]["trained at commit"] == json.loads((first.out_dir / "meta.json").read_text())["commit"]
    assert all(row["device"] == "cpu" and row["minutes"] is not None for row in rows)


def test_a_run_is_credited_to_the_commit_it_started_at_when_the_checkout_moves_while_it_trains(toy, tmp_path,
                                                                                                  monkeypatch):
    commits = iter(["start11", "later22"])  # HEAD when the run begins, then when it finishes
    monkeypatch.setattr(runcache, "git_commit", lambda: next(commits))
    run = train_model(fresh_model(toy, seed=3), toy, cfg(max_steps=3), torch.device("cpu"), tmp_path / "a")
    meta = json.loads((run.out_dir / "meta.json").read_text())
    assert meta["commit"] == "start11" and meta["finished at commit"] == "later22"


def test_a_resumed_build_keeps_the_commit_of_its_first_start(monkeypatch):
    monkeypatch.setattr(runcache, "git_commit", lambda: "first01")
    entry = runcache.artifact_entry("toy", {"k": "resume"})
    runcache.begin(entry)  # an interrupted build began here
    monkeypatch.setattr(runcache, "git_commit", lambda: "second2")
    runcache.cached_artifact("toy", {"k": "resume"}, lambda: [1])
    meta = json.loads((entry / "meta.json").read_text())
    assert meta["commit"] == "first01" and meta["finished at commit"] == "second2" and meta["wall_time_s"] >= 0


def test_two_processes_on_one_run_take_turns(tmp_path, monkeypatch):
    """The second waits for the first's lock; a lock whose process is gone is taken over."""
    import subprocess
    import sys
    import time

    entry = tmp_path / "run-x"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(2)"])
    entry.mkdir()
    (entry / ".lock").write_text(f"{sleeper.pid}\n")
    start = time.perf_counter()
    with runcache.entry_lock(entry, poll_s=0.2):
        waited = time.perf_counter() - start
        assert sleeper.poll() is not None  # we got the lock only once its holder had ended
    assert waited > 0.2 and not (entry / ".lock").exists()
    (entry / ".lock").write_text("4194400\n")  # no such process: stale
    with runcache.entry_lock(entry, poll_s=0.2):
        assert (entry / ".lock").read_text().strip() == str(__import__("os").getpid())


def test_same_recipe_is_reused_and_gives_the_same_weights(toy, tmp_path):
    first = train_model(fresh_model(toy), toy, cfg(), torch.device("cpu"), tmp_path / "a")
    second = train_model(fresh_model(toy), toy, cfg(), torch.device("cpu"), tmp_path / "b")
    assert not first.reused and second.reused
    assert first.out_dir == second.out_dir
    for p, q in zip(first.model.state_dict().values(), second.model.state_dict().values()):
        assert torch.equal(p, q)
    assert second.history == first.history
    assert json.loads((tmp_path / "b" / "run.json").read_text())["reused"] is True


@pytest.mark.parametrize("change", ["lr", "seed", "init", "data", "frozen"])
def test_any_change_of_recipe_is_a_miss(toy, tmp_path, change):
    train_model(fresh_model(toy), toy, cfg(), torch.device("cpu"), tmp_path / "a")
    model, train_cfg, train = fresh_model(toy), cfg(), None
    if change == "lr":
        train_cfg = cfg(lr=2e-3)
    elif change == "seed":
        train_cfg = cfg(seed=1)
    elif change == "init":
        model = fresh_model(toy, seed=1)
    elif change == "frozen":  # training only some parameters (TRICE's Table 7) was once served the full run
        for name, parameter in model.named_parameters():
            parameter.requires_grad_(name.startswith("decoder."))
    else:
        train = replace(toy.encoded["train"], target=toy.encoded["train"].target[:-1],
                        sources=[s[:-1] for s in toy.encoded["train"].sources])
    assert not train_model(model, toy, train_cfg, torch.device("cpu"), tmp_path / "b", train=train).reused


def test_corrupt_entry_is_refused_and_rebuilt(toy, tmp_path):
    first = train_model(fresh_model(toy), toy, cfg(), torch.device("cpu"), tmp_path / "a")
    with open(first.out_dir / "best.pt", "r+b") as f:
        f.seek(100)
        f.write(b"garbage")
    with pytest.warns(UserWarning, match="corrupt"):
        again = train_model(fresh_model(toy), toy, cfg(), torch.device("cpu"), tmp_path / "b")
    assert not again.reused
    for p, q in zip(first.model.state_dict().values(), again.model.state_dict().values()):
        assert torch.equal(p, q)  # same seed and recipe: the rebuilt run is the same run


def test_interrupted_run_resumes_to_the_same_result(toy, tmp_path, monkeypatch):
    straight = train_model(fresh_model(toy), toy, cfg(max_steps=8, validate_every=4), torch.device("cpu"), tmp_path / "a")
    monkeypatch.setenv("MSGCORE_RUNS", str(tmp_path / "other-cache"))
    from msgcore.trainer import Trainer

    calls = {"n": 0}
    real_step = Trainer.train_step

    def dying_step(self, batches, *rest):
        calls["n"] += 1
        if calls["n"] == 6:
            raise KeyboardInterrupt  # a kill after the step-4 checkpoint
        return real_step(self, batches, *rest)

    monkeypatch.setattr(Trainer, "train_step", dying_step)
    with pytest.raises(KeyboardInterrupt):
        train_model(fresh_model(toy), toy, cfg(max_steps=8, validate_every=4), torch.device("cpu"), tmp_path / "b")
    monkeypatch.setattr(Trainer, "train_step", real_step)
    resumed = train_model(fresh_model(toy), toy, cfg(max_steps=8, validate_every=4), torch.device("cpu"), tmp_path / "c")
    assert not resumed.reused
    assert [r["step"] for r in resumed.history] == [r["step"] for r in straight.history]
    for p, q in zip(straight.model.state_dict().values(), resumed.model.state_dict().values()):
        assert torch.equal(p, q)


def test_cached_artifact_is_built_once(monkeypatch):
    calls = []

    def build():
        calls.append(1)
        return {"ids": [[1, 2], [3]]}

    assert runcache.cached_artifact("toy", {"k": 1}, build) == {"ids": [[1, 2], [3]]}
    assert runcache.cached_artifact("toy", {"k": 1}, build) == {"ids": [[1, 2], [3]]}
    runcache.cached_artifact("toy", {"k": 2}, build)
    assert len(calls) == 2


def curve_run(value):
    return value["history"], value["wall_time_s"]


def test_a_training_artefact_keeps_its_log_and_its_whole_wall_time():
    value = {"history": [{"kind": "train", "step": 10}], "wall_time_s": 3600.0, "weights": torch.ones(2)}
    runcache.cached_artifact("curve", {"k": 1}, lambda: value, training=curve_run)
    entry = runcache.artifact_entry("curve", {"k": 1})
    meta, problem = runcache.verified(entry)
    assert problem is None and set(meta["files"]) == {"artifact.pt", "log.json"}
    assert meta["wall_time_s"] == 3600.0  # the run's, an interrupted build's earlier processes included
    assert json.loads((entry / "log.json").read_text()) == value["history"]


def test_a_training_artefact_finished_without_its_log_gets_it_when_read():
    value = {"history": [{"kind": "valid", "step": 5}], "wall_time_s": 99.0}
    runcache.cached_artifact("curve", {"k": 2}, lambda: value)  # an entry finished before artefacts kept their log
    entry = runcache.artifact_entry("curve", {"k": 2})
    assert "log.json" not in runcache.verified(entry)[0]["files"]
    assert runcache.cached_artifact("curve", {"k": 2}, lambda: pytest.fail("rebuilt"), training=curve_run) == value
    meta, problem = runcache.verified(entry)
    assert problem is None and meta["wall_time_s"] == 99.0 and "log.json" in meta["files"]


def test_cache_can_be_turned_off(toy, tmp_path, monkeypatch):
    monkeypatch.setenv("MSGCORE_RUNS", "off")
    run = train_model(fresh_model(toy), toy, cfg(), torch.device("cpu"), tmp_path / "a")
    assert run.out_dir == tmp_path / "a" and (tmp_path / "a" / "best.pt").is_file() and not run.reused


def test_reuse_and_training_are_logged_for_the_book_runner(toy, tmp_path, monkeypatch):
    log, built = tmp_path / "reused.txt", tmp_path / "built.txt"
    monkeypatch.setenv("MSGCORE_REUSE_LOG", str(log))
    monkeypatch.setenv("MSGCORE_BUILT_LOG", str(built))
    first = train_model(fresh_model(toy), toy, cfg(), torch.device("cpu"), tmp_path / "a")
    assert not log.exists() and built.read_text().splitlines() == [first.out_dir.name]
    train_model(fresh_model(toy), toy, cfg(), torch.device("cpu"), tmp_path / "b")
    assert log.read_text().splitlines() == [first.out_dir.name]
    assert built.read_text().splitlines() == [first.out_dir.name]  # a reuse builds nothing
