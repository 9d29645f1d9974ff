"""Chapter 0's seed loop: every scale's training seeds on one tokenizer, `--part` shares of them, and the protocol's
view of a direction trained on several seeds."""
from pathlib import Path

import pytest

from msgcore import chapters
from msgcore.foundations import baselines
from msgcore.recipes import RunResult
from msgcore.utils import MsgcoreError


def test_the_deciding_scales_train_three_seeds_from_the_notebooks_seed():
    assert baselines.baseline_seeds("small", 0) == (0, 1, 2)
    assert baselines.baseline_seeds("full", 5) == (5, 6, 7)
    assert baselines.baseline_seeds("smoke", 0) == (0,)
    with pytest.raises(MsgcoreError, match="scale"):
        baselines.baseline_seeds("huge")


@pytest.fixture
def recorded(monkeypatch):
    """train_translation replaced by a recorder: (direction's data, seed, folder) per call."""
    calls = []

    def fake(data, scale, device, out_dir, seed=0, progress=False):
        calls.append((data, seed, Path(out_dir).name))
        return f"run {data} {seed}"
    monkeypatch.setattr(baselines, "train_translation", fake)
    return calls


def test_one_tokenizer_and_data_serve_every_seed(recorded):
    data = {"De→En": "de-en data", "En→De": "en-de data"}
    runs = baselines.train_baselines("small", "cpu", "out", seed=0, data=data)
    assert runs == {"De→En": {s: f"run de-en data {s}" for s in (0, 1, 2)},
                    "En→De": {s: f"run en-de data {s}" for s in (0, 1, 2)}}
    assert {folder for _, _, folder in recorded} == {f"{d}-seed{s}" for d in ("De-En", "En-De") for s in (0, 1, 2)}


@pytest.mark.parametrize("part, seeds", [((0, 3), (0,)), ((1, 3), (1,)), ((2, 3), (2,)), ((0, 2), (0, 2)),
                                         ((1, 2), (1,)), ((0, 1), (0, 1, 2))])
def test_parts_share_the_seeds_between_processes(recorded, part, seeds):
    runs = baselines.train_baselines("small", "cpu", "out", seed=0, data={"De→En": "d"}, part=part)
    assert tuple(runs["De→En"]) == seeds


def test_the_parts_of_n_processes_cover_every_seed_once(recorded):
    for i in range(3):
        baselines.train_baselines("small", "cpu", "out", seed=10, data={"De→En": "d"}, part=(i, 3))
    assert sorted(seed for _, seed, _ in recorded) == [10, 11, 12]


def history(best_bleu: float) -> list[dict]:
    rows = [{"kind": "train", "step": 100 * i, "loss": 3.0 / i, "source_tokens": 1000 * i, "target_tokens": 900 * i}
            for i in range(1, 7)]
    rows += [{"kind": "valid", "step": 100 * i, "valid_bleu": best_bleu - 6 + i, "valid_noise": 0.1,
              "source_tokens": 1000 * i, "target_tokens": 900 * i} for i in range(1, 7)]
    return rows


def test_a_direction_on_three_seeds_is_one_system_with_paired_seed_ids():
    class Data:
        corpora = {"test_2016_flickr": type("C", (), {"target": ["a man rides a horse .", "two dogs play ."]})()}
    runs = {s: RunResult(None, history(30.0 + s), 1.0, Path(".")) for s in (3, 4, 5)}
    outputs = {s: {"test_2016_flickr": ["a man rides a horse .", "two dogs" + " play" * (s - 2) + " ."]}
               for s in (3, 4, 5)}
    system = baselines.baseline_system("De→En", runs, outputs, Data(), baselines.BASELINE_SCALES["small"])
    assert [run.seed for run in system.runs] == [3, 4, 5]
    bleu = system.measures["test_2016_flickr"]["BLEU"]
    assert sorted(bleu.scores) == [3, 4, 5]
    assert bleu.scores[3] > bleu.scores[5]  # each seed scored on its own outputs
    assert all(run.stages[0].updates == 600 for run in system.runs)


def test_chapter_0s_recipe_counts_its_seeds_and_chapter_5s_does_not(monkeypatch):
    before = {stem: chapters.recipe_fingerprint(stem, "small")
              for stem in ("ch00_transformer_baseline", "ch05_coverage_nat")}
    monkeypatch.setitem(baselines.BASELINE_SEEDS, "small", 5)
    assert chapters.recipe_fingerprint("ch00_transformer_baseline", "small") != before["ch00_transformer_baseline"]
    assert chapters.recipe_fingerprint("ch05_coverage_nat", "small") == before["ch05_coverage_nat"]
