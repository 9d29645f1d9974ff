"""Hostile input against `python -m msgcore` (issue 11): every bad input is one line "error: ..." with exit
status 2 before any work is spent, no partial output is left behind, and resume never corrupts a run silently.

tests/README.md tabulates the cases. Training here is tiny (synthetic corpus, `tiny` preset, a few dozen steps).
"""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import torch

from msgcore import __main__ as cli
from msgcore.__main__ import main
from msgcore.data import synthetic_corpus
from msgcore.tokenizer import Tokenizer
from msgcore.trainer import Trainer, load_checkpoint

TINY = ["--preset", "tiny", "--vocab-size", "60", "--warmup", "10", "--lr", "3e-3", "--max-tokens", "1024",
        "--max-epochs", "1", "--device", "cpu"]


def write_corpus(folder: Path, n: int, seed: int = 0, split: str = "train") -> list[str]:
    """Two files (source xa, target xt) of the synthetic corpus; returns their paths."""
    corpus = synthetic_corpus(n, num_sources=1, seed=seed, split=split)
    folder.mkdir(parents=True, exist_ok=True)
    src, tgt = folder / f"{split}.xa", folder / f"{split}.xt"
    src.write_text("\n".join(corpus.sources[0]) + "\n")
    tgt.write_text("\n".join(corpus.target) + "\n")
    return [str(src), str(tgt)]


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MSGCORE_DATA", str(tmp_path_factory.getbasetemp() / "msgcore-cache"))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    return {"train": write_corpus(root, 200), "valid": write_corpus(root, 20, split="val"), "root": root}


def train_args(files, out, *extra) -> list[str]:
    return ["train", "--train-files", *files["train"], "--valid-files", *files["valid"], *TINY, "--out", str(out),
            *extra]


@pytest.fixture(scope="module")
def run(files, tmp_path_factory):
    """A finished tiny run (20 updates, validated at the last one)."""
    out = tmp_path_factory.mktemp("run")
    os.environ["MSGCORE_DATA"] = str(tmp_path_factory.getbasetemp() / "msgcore-cache")
    assert main(train_args(files, out, "--max-steps", "20")) == 0
    return out


def one_line_error(capsys, *words) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    for word in words:
        assert word in err, err
    return err


def copy_run(run: Path, dst: Path) -> Path:
    dst.mkdir()
    for name in ("last.pt", "best.pt", "log.json"):
        (dst / name).write_bytes((run / name).read_bytes())
    return dst


def no_training(monkeypatch):
    """Fail the test if any training work starts (a tokenizer or a training step)."""
    def forbidden(*args, **kwargs):
        raise AssertionError("work was spent before the error")
    monkeypatch.setattr(Tokenizer, "train", forbidden)
    monkeypatch.setattr(Trainer, "train", forbidden)


# ---------------------------------------------------------------------------- 1-5: silent corruption

def test_resume_uses_the_checkpoint_tokenizer(run, files, tmp_path, monkeypatch):
    out = copy_run(run, tmp_path / "r")
    monkeypatch.setattr(Tokenizer, "train", lambda *a, **k: pytest.fail("resume retrained the tokenizer"))
    assert main(train_args(files, out, "--max-steps", "22", "--resume", str(out / "last.pt"))) == 0
    assert load_checkpoint(out / "last.pt")["tokenizer"] == load_checkpoint(run / "last.pt")["tokenizer"]


def test_resume_from_a_best_pt_is_refused_it_has_no_optimizer_state(run, files, tmp_path, capsys):
    out = copy_run(run, tmp_path / "r")
    assert main(train_args(files, out, "--max-steps", "22", "--resume", str(out / "best.pt"))) == 2
    one_line_error(capsys, "best.pt", "optimizer state", "last.pt")


@pytest.mark.parametrize("change, words", [
    (["--spm-type", "bpe"], ["spm_type"]),
    (["--lr", "1e-3"], ["lr=0.003", "lr=0.001"]),
    (["--seed", "1"], ["seed"]),
    (["--max-tokens", "512"], ["max_tokens"]),
    (["--dropout", "0.3"], ["dropout"]),
    (["--lr", "1e-3", "--seed", "2"], ["lr", "seed"]),
])
def test_resume_refuses_changed_options_naming_them(run, files, tmp_path, capsys, monkeypatch, change, words):
    out = copy_run(run, tmp_path / "r")
    before = (out / "last.pt").read_bytes()
    no_training(monkeypatch)
    assert main(train_args(files, out, "--resume", str(out / "last.pt"), *change)) == 2
    one_line_error(capsys, "--resume", *words)
    assert (out / "last.pt").read_bytes() == before


def test_resume_refuses_other_training_files(run, files, tmp_path, capsys, monkeypatch):
    out = copy_run(run, tmp_path / "r")
    other = write_corpus(tmp_path / "other", 200, seed=5)
    no_training(monkeypatch)
    args = train_args(files, out, "--resume", str(out / "last.pt"))
    args[args.index("--train-files") + 1: args.index("--train-files") + 3] = other
    assert main(args) == 2
    one_line_error(capsys, "other training data")


def test_best_pt_is_written_before_last_pt(files, tmp_path, monkeypatch):
    """A kill between the two saves leaves best.pt at least as new as the best recorded in last.pt."""
    order = []
    save = Trainer.save_checkpoint

    def recording(self, path, **kw):
        order.append((Path(path).name, self.state.step))
        save(self, path, **kw)
    monkeypatch.setattr(Trainer, "save_checkpoint", recording)
    assert main(train_args(files, tmp_path / "o", "--max-steps", "4", "--validate-every", "2")) == 0
    first_validation = [name for name, step in order if step == 2]
    assert first_validation == ["best.pt", "last.pt"]


def test_resume_adopts_a_newer_best_pt(run, files, tmp_path, capsys):
    """last.pt from before the best improved (a kill between the saves): resume takes best.pt's record."""
    out = copy_run(run, tmp_path / "r")
    best = load_checkpoint(out / "best.pt")
    best["state"]["best_bleu"] = 77.0
    torch.save(best, out / "best.pt")
    assert main(train_args(files, out, "--max-steps", "21", "--resume", str(out / "last.pt"))) == 0
    assert load_checkpoint(out / "last.pt")["state"]["best_bleu"] == 77.0


def test_a_fresh_run_into_an_existing_run_is_refused(run, files, tmp_path, capsys, monkeypatch):
    out = copy_run(run, tmp_path / "r")
    before = (out / "best.pt").read_bytes()
    no_training(monkeypatch)
    assert main(train_args(files, out, "--max-steps", "2")) == 2
    one_line_error(capsys, "already holds a run", "--resume", "--overwrite")
    assert (out / "best.pt").read_bytes() == before


def test_overwrite_replaces_an_existing_run(run, files, tmp_path):
    out = copy_run(run, tmp_path / "r")
    assert main(train_args(files, out, "--max-steps", "2", "--overwrite")) == 0
    assert load_checkpoint(out / "last.pt")["state"]["step"] == 2
    assert not (out / ".lock").exists()


def test_a_second_run_into_a_locked_folder_is_refused(files, tmp_path, capsys, monkeypatch):
    out = tmp_path / "o"
    out.mkdir()
    (out / ".lock").write_text(f"{os.getpid()}\n")  # a live process holds it
    no_training(monkeypatch)
    assert main(train_args(files, out, "--max-steps", "2")) == 2
    one_line_error(capsys, "another run", str(os.getpid()))
    assert sorted(p.name for p in out.iterdir()) == [".lock"]


def test_a_stale_lock_is_taken_over(files, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / ".lock").write_text("4194400\n")  # above Linux's largest pid: no such process
    assert main(train_args(files, out, "--max-steps", "2")) == 0
    assert not (out / ".lock").exists()


@pytest.mark.parametrize("command, option, value", [
    ("translate", "--len-penalty", "nan"), ("translate", "--len-penalty", "inf"),
    ("train", "--max-steps", "-1"), ("train", "--max-epochs", "0"), ("train", "--update-freq", "0"),
    ("score", "--bootstrap", "-5"),
    # 9: every numeric option has a range
    ("translate", "--beam", "0"), ("translate", "--beam", "-3"), ("translate", "--beam", "100000"),
    ("train", "--max-tokens", "0"), ("train", "--max-tokens", "-5"), ("train", "--lr", "nan"), ("train", "--lr", "-1"),
    ("train", "--warmup", "0"), ("train", "--update-freq", "-1"), ("train", "--dropout", "2"),
    ("train", "--device", "bogus"), ("translate", "--device", "bogus"), ("train", "--vocab-size", "3"),
    ("train", "--save-every", "-2"), ("train", "--seed", "x"),
])
def test_bad_option_values_are_one_line_errors(tmp_path, capsys, monkeypatch, command, option, value):
    no_training(monkeypatch)
    base = {"train": ["train", "--dataset", "synthetic", "--out", str(tmp_path / "o")],
            "translate": ["translate", "--checkpoint", "c.pt", "--input", "i", "--output", str(tmp_path / "h")],
            "score": ["score", "--hyp", "h", "--ref", "r"]}[command]
    assert main([*base, option, value]) == 2
    one_line_error(capsys, option)
    assert not (tmp_path / "o").exists() and not (tmp_path / "h").exists()


# ---------------------------------------------------------------------------- 6-7: checked up front

@pytest.mark.parametrize("case", ["more validation files", "empty validation file", "empty training file"])
def test_data_problems_are_found_before_training(files, tmp_path, capsys, monkeypatch, case):
    no_training(monkeypatch)
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    train, valid = list(files["train"]), list(files["valid"])
    if case == "more validation files":
        valid = [valid[0], *valid]
    elif case == "empty validation file":
        valid = [str(empty), str(empty)]
    else:
        train = [str(empty), str(empty)]
    args = ["train", "--train-files", *train, "--valid-files", *valid, *TINY, "--out", str(tmp_path / "o")]
    assert main(args) == 2
    one_line_error(capsys, {"more validation files": "one validation file per training file",
                            "empty validation file": "validation data is empty",
                            "empty training file": "training data is empty"}[case])
    assert not (tmp_path / "o" / "last.pt").exists()


def test_out_that_is_a_file_or_read_only_is_refused_up_front(files, tmp_path, capsys, monkeypatch):
    no_training(monkeypatch)
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert main(train_args(files, a_file)) == 2
    one_line_error(capsys, "is a file")
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        assert main(train_args(files, locked / "run")) == 2
        one_line_error(capsys, "read-only")
    finally:
        locked.chmod(0o755)


def test_a_full_disk_keeps_the_previous_checkpoint(run, files, tmp_path, capsys, monkeypatch):
    out = copy_run(run, tmp_path / "r")
    before = (out / "last.pt").read_bytes()

    def full_disk(obj, f, *args, **kwargs):
        f.write(b"partial")
        raise RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 4096 vs 2048")
    monkeypatch.setattr(torch, "save", full_disk)
    assert main(train_args(files, out, "--max-steps", "21", "--resume", str(out / "last.pt"))) == 2
    err = one_line_error(capsys, "no space left on device while writing", "the previous checkpoint is intact")
    assert "last.pt" in err or "best.pt" in err
    assert (out / "last.pt").read_bytes() == before
    assert not list(out.glob(".*.tmp")) and not (out / ".lock").exists()


# ---------------------------------------------------------------------------- 8, 10-15: translate and score

def test_a_line_longer_than_the_position_table_is_truncated_with_a_warning(run, tmp_path, capsys):
    src, hyp = tmp_path / "in.xa", tmp_path / "out.xt"
    words = synthetic_corpus(1, num_sources=1, seed=0).sources[0][0]
    src.write_text(words + "\n" + " ".join([words] * 300) + "\n")
    assert main(["translate", "--checkpoint", str(run / "best.pt"), "--input", str(src), "--output", str(hyp),
                 "--beam", "1", "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("warning: 1 input line") and "line 2" in err
    assert len(hyp.read_text().splitlines()) == 2


def test_source_limit_fits_the_output_budget_in_the_position_table(run):
    from msgcore.generation import GenerationConfig
    from msgcore.trainer import load_model

    model, _ = load_model(run / "best.pt")
    cfg = GenerationConfig()
    limit = cli.source_limit(model, cfg)
    assert cfg.max_len_a * (limit + 1) + cfg.max_len_b <= model.cfg.max_positions
    assert cfg.max_len_a * (limit + 3) + cfg.max_len_b > model.cfg.max_positions


@pytest.mark.parametrize("damage, words", [
    ("unknown config field", ["model_config", "unexpected"]),
    ("weights do not fit", ["weights do not fit"]),
    ("tokenizer of another size", ["tokenizer has", "embedding"]),
])
def test_a_damaged_checkpoint_is_refused_by_translate(run, tmp_path, capsys, damage, words):
    checkpoint = load_checkpoint(run / "best.pt")
    if damage == "unknown config field":
        checkpoint["model_config"]["colour"] = "blue"
    elif damage == "weights do not fit":
        checkpoint["model_config"]["d_ff"] = 64
    else:
        other = synthetic_corpus(200, num_sources=1, seed=1)
        checkpoint["tokenizer"] = Tokenizer.train(other.texts(), vocab_size=40, cache_dir=tmp_path).to_bytes()
    torch.save(checkpoint, tmp_path / "bad.pt")
    src = tmp_path / "in.xa"
    src.write_text("x\n")
    assert main(["translate", "--checkpoint", str(tmp_path / "bad.pt"), "--input", str(src),
                 "--output", str(tmp_path / "o"), "--device", "cpu"]) == 2
    one_line_error(capsys, *words)
    assert not (tmp_path / "o").exists()


def test_score_refuses_two_empty_files(tmp_path, capsys):
    (tmp_path / "h").write_text("")
    (tmp_path / "r").write_text("")
    assert main(["score", "--hyp", str(tmp_path / "h"), "--ref", str(tmp_path / "r")]) == 2
    one_line_error(capsys, "both empty")


def test_translate_output_that_is_a_folder_or_read_only(run, tmp_path, capsys):
    src = tmp_path / "in.xa"
    src.write_text("x\n")
    args = ["translate", "--checkpoint", str(run / "best.pt"), "--input", str(src), "--device", "cpu", "--output"]
    assert main([*args, str(tmp_path)]) == 2
    one_line_error(capsys, "is a folder")
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        assert main([*args, str(locked / "hyp.txt")]) == 2
        one_line_error(capsys, "read-only")
    finally:
        locked.chmod(0o755)
    assert not (locked / "hyp.txt").exists()


def test_msgcore_data_that_is_a_file_is_refused(files, tmp_path, capsys, monkeypatch):
    a_file = tmp_path / "cache"
    a_file.write_text("x")
    monkeypatch.setenv("MSGCORE_DATA", str(a_file))
    no_training(monkeypatch)
    assert main(train_args(files, tmp_path / "o")) == 2
    one_line_error(capsys, "MSGCORE_DATA", "is a file")


def test_ctrl_c_says_how_to_resume_without_a_traceback(files, tmp_path, capsys, monkeypatch):
    out = tmp_path / "o"

    def interrupted_after_a_checkpoint(self):
        self.save_checkpoint(self.out_dir / "last.pt")
        raise KeyboardInterrupt
    monkeypatch.setattr(Trainer, "run_epoch", interrupted_after_a_checkpoint)
    assert main(train_args(files, out, "--max-steps", "5")) == 130
    assert capsys.readouterr().err == f"interrupted; resume with --resume {out / 'last.pt'}\n"
    assert not (out / ".lock").exists()


def test_a_folder_given_as_an_input_file_says_so(run, tmp_path, capsys):
    assert main(["translate", "--checkpoint", str(run / "best.pt"), "--input", str(tmp_path),
                 "--output", str(tmp_path / "o.txt"), "--device", "cpu"]) == 2
    err = one_line_error(capsys, "is a folder")
    assert "download" not in err
    assert main(["score", "--hyp", str(tmp_path), "--ref", str(tmp_path)]) == 2
    one_line_error(capsys, "is a folder")


def test_hints_name_command_line_options(files, tmp_path, capsys, run):
    src = Path(files["train"][0]).read_text().splitlines()
    bad = tmp_path / "train.xa"
    bad.write_text("\n".join(["", *src[1:]]) + "\n")
    assert main(["train", "--train-files", str(bad), files["train"][1], "--valid-files", *files["valid"], *TINY,
                 "--out", str(tmp_path / "o")]) == 2
    err = one_line_error(capsys, "--skip-empty")
    assert "skip_empty=True" not in err
    two = [str(bad), str(bad)]
    assert main(["translate", "--checkpoint", str(run / "best.pt"), "--input", *two, "--output",
                 str(tmp_path / "h"), "--device", "cpu"]) == 2
    err = one_line_error(capsys, "--input")
    assert "Batch" not in err


def test_skip_empty_trains_without_the_empty_example(files, tmp_path):
    src = Path(files["train"][0]).read_text().splitlines()
    bad = tmp_path / "train.xa"
    bad.write_text("\n".join(["", *src[1:]]) + "\n")
    assert main(["train", "--train-files", str(bad), files["train"][1], "--valid-files", *files["valid"], *TINY,
                 "--max-steps", "1", "--skip-empty", "--out", str(tmp_path / "o")]) == 0


def test_a_byte_order_mark_in_score_inputs_is_stripped(tmp_path, capsys):
    (tmp_path / "h").write_bytes("\ufeffthe cat sat on the mat\n".encode())
    (tmp_path / "r").write_text("the cat sat on the mat\n")
    assert main(["score", "--hyp", str(tmp_path / "h"), "--ref", str(tmp_path / "r"), "--metrics", "bleu"]) == 0
    assert capsys.readouterr().out.startswith("BLEU 100.00")


# ---------------------------------------------------------------------------- 16-19: behaviour users expect

def test_no_best_bleu_line_without_a_validation(files, tmp_path):
    trainer = type("T", (), {})()
    trainer.state = type("S", (), {"best_bleu": -1.0, "best_step": -1, "step": 7})()
    line = cli.run_summary(trainer, str(tmp_path))
    assert "-1.00" not in line and "no validation ran" in line


def test_the_run_summary_names_the_checkpoint_to_translate(run, files, tmp_path, capsys):
    out = tmp_path / "o"
    assert main(train_args(files, out, "--max-steps", "3")) == 0
    stdout = capsys.readouterr().out
    assert "best dev BLEU" in stdout and "best.pt to translate" in stdout


def test_outputs_get_the_usual_permissions(run, tmp_path):
    old = os.umask(0o022)
    try:
        src, hyp = tmp_path / "in.xa", tmp_path / "out.xt"
        src.write_text("x\n")
        assert main(["translate", "--checkpoint", str(run / "best.pt"), "--input", str(src), "--output", str(hyp),
                     "--beam", "1", "--device", "cpu"]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(hyp.stat().st_mode) == 0o644
    assert stat.S_IMODE((run / "last.pt").stat().st_mode) & 0o044 == 0o044


def test_save_every_checkpoints_between_validations(files, tmp_path, monkeypatch):
    saved = []
    save = Trainer.save_checkpoint

    def recording(self, path, **kw):
        saved.append((Path(path).name, self.state.step))
        save(self, path, **kw)
    monkeypatch.setattr(Trainer, "save_checkpoint", recording)
    assert main(train_args(files, tmp_path / "o", "--max-steps", "7", "--max-tokens", "256",
                                 "--save-every", "3")) == 0
    assert ("last.pt", 3) in saved and ("last.pt", 6) in saved


def test_max_steps_validates_the_last_step(files, tmp_path):
    out = tmp_path / "o"
    assert main(train_args(files, out, "--max-steps", "3")) == 0  # 200 pairs: the epoch is longer than 3 updates
    valid = [row for row in json.loads((out / "log.json").read_text()) if row["kind"] == "valid"]
    assert valid[-1]["step"] == 3
    assert load_checkpoint(out / "best.pt")["state"]["step"] == load_checkpoint(out / "last.pt")["state"]["best_step"]


# ---------------------------------------------------------------------------- issue 12, item 11: defaults

def test_help_shows_every_default_and_the_checkpoint_to_translate(capsys):
    assert main(["train", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for option in ("--lr", "--warmup", "--max-tokens", "--dropout", "--max-epochs", "--vocab-size", "--patience"):
        assert "chapter 0's recipe" in text and option in text
    from msgcore.experiments import cli_recipe
    assert f"tiny {cli_recipe('tiny')['lr']}" in text and "(default: 0)" in text
    assert main(["translate", "--help"]) == 0
    assert "best.pt" in capsys.readouterr().out


def test_defaults_are_chapter_0s_recipe(files, tmp_path, monkeypatch):
    from msgcore import experiments

    seen = {}

    def capture(self):
        seen.update(lr=self.cfg.lr, warmup=self.cfg.warmup_steps, max_tokens=self.cfg.max_tokens,
                    max_epochs=self.cfg.max_epochs, dropout=self.model.cfg.dropout, patience=self.cfg.patience)
    monkeypatch.setattr(Trainer, "train", capture)
    assert main(["train", "--train-files", *files["train"], "--valid-files", *files["valid"], "--preset", "tiny",
                 "--device", "cpu", "--out", str(tmp_path / "o")]) == 0
    recipe = experiments.cli_recipe("tiny")
    scale = experiments.BASELINE_SCALES[experiments.CLI_RECIPE_SCALES["tiny"]]
    assert seen == {k: recipe[k] for k in seen} and seen["lr"] == scale.train.lr
    assert seen["warmup"] == scale.train.warmup_steps and seen["max_tokens"] == scale.train.max_tokens


def test_the_default_recipe_overfits_the_synthetic_corpus(tmp_path):
    """Only the budget is given (--max-steps, --max-epochs, validation interval): lr, warmup, batch size,
    dropout and vocabulary are the defaults."""
    pairs = write_corpus(tmp_path / "data", 100)
    out = tmp_path / "o"
    assert main(["train", "--train-files", *pairs, "--valid-files", *pairs, "--preset", "tiny", "--device", "cpu",
                 "--max-steps", "300", "--max-epochs", "1000", "--validate-every", "150", "--out", str(out)]) == 0
    best = load_checkpoint(out / "best.pt")["state"]["best_bleu"]
    assert best > 90


@pytest.mark.parametrize("module", ["msgcore.__main__", "msgcore.offline", "msgcore.probe", "msgcore.bench",
                                    "msgcore.experiments.__main__"])
def test_every_entry_point_returns_0_after_help_and_2_after_a_usage_error_in_one_line(module, capsys):
    import importlib

    entry = importlib.import_module(module).main
    assert entry(["--help"]) == 0
    capsys.readouterr()
    assert entry(["--no-such-option"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "--help" in err


def test_a_disk_too_small_for_the_checkpoints_is_refused_before_any_work(files, tmp_path, capsys, monkeypatch):
    """The free space is checked against the checkpoints' size (7 copies of the weights at most) before the
    tokenizer or a training step; nothing is left in --out."""
    import shutil
    from collections import namedtuple

    from msgcore import __main__ as cli

    no_training(monkeypatch)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(cli.shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 2**20, 2**20))
    assert main(train_args(files, tmp_path / "o", "--max-steps", "2")) == 2
    err = one_line_error(capsys, "--out", "1.0 MiB free on its disk", "checkpoints need about")
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir()), err
    assert shutil.disk_usage is not None


def test_the_checkpoint_space_counts_what_a_resumed_run_already_holds(tmp_path):
    from msgcore.trainer import checkpoint_space

    assert checkpoint_space(1000, tmp_path) == 28_000
    (tmp_path / "last.pt").write_bytes(b"x" * 12_000)
    (tmp_path / "best.pt").write_bytes(b"x" * 4_000)
    assert checkpoint_space(1000, tmp_path) == 12_000
    assert checkpoint_space(10, tmp_path) == 0
