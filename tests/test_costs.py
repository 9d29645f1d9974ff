"""GPU cost estimates: how a chapter's measured CPU minutes are split and moved to a GPU's measured rates."""
from __future__ import annotations

from pathlib import Path

import json
import nbformat
import pytest

from msgcore import costs
from msgcore.utils import MsgcoreError

RATES = costs.Rates("GPU-X", {("small", 2048, 1): 30.0, ("small", 2048, 3): 36.0, ("small", 8192, 1): 40.0,
                              ("small", 8192, 3): 45.0}, decode_speedup=2.0, params_m=8.0)


def train_row(step: int, target_tokens: int, tokens_per_s: float) -> dict:
    return {"kind": "train", "step": step, "target_tokens": target_tokens, "tokens_per_s": tokens_per_s}


def write_log(folder: Path, entry: str, rows: list[dict]) -> None:
    (folder / entry).mkdir(parents=True)
    (folder / entry / "log.json").write_text(json.dumps(rows))


def steady_log(updates: int = 400, seconds_per_update: float = 0.5, tokens_per_update: int = 1000) -> list[dict]:
    """Windows of 100 updates at a steady speed, the third slowed 10x by a validation inside it."""
    rows = []
    for i, step in enumerate(range(100, updates + 1, 100)):
        slow = 10 if i == 2 else 1
        rows.append(train_row(step, step * tokens_per_update, tokens_per_update / seconds_per_update / slow))
    return rows + [{"kind": "valid", "step": updates, "valid_bleu": 30.0}]


def test_update_minutes_is_the_median_window_speed_times_the_updates() -> None:
    updates, minutes = costs.update_minutes(steady_log(updates=400, seconds_per_update=0.6))
    assert updates == 400
    assert minutes == pytest.approx(400 * 0.6 / 60)  # the window holding a validation does not count


def test_a_log_without_two_training_rows_is_refused() -> None:
    with pytest.raises(MsgcoreError, match="two training rows"):
        costs.update_minutes([train_row(50, 1000, 100.0)])


def test_split_puts_validation_and_artefact_minutes_apart_from_the_updates(tmp_path: Path) -> None:
    write_log(tmp_path, "run-a", steady_log(updates=400, seconds_per_update=0.6))  # 4.0 minutes in updates
    entries = [{"entry": "run-a", "minutes": 5.0}, {"entry": "tokenizer-b", "minutes": 1.5}]
    part = costs.split(2.0, entries, logs=tmp_path)
    assert part == costs.Split(page=2.0, updates=400, update_minutes=pytest.approx(4.0), other=pytest.approx(2.5))


def test_a_curve_run_is_split_as_the_training_run_it_is(tmp_path: Path) -> None:
    write_log(tmp_path, "natcurve-a", steady_log(updates=400, seconds_per_update=0.6))
    part = costs.split(0.0, [{"entry": "natcurve-a", "minutes": 5.0}], logs=tmp_path)
    assert (part.updates, part.update_minutes, part.other) == (400, pytest.approx(4.0), pytest.approx(1.0))


@pytest.mark.parametrize("entries, reason", [
    ([{"entry": "run-missing", "minutes": 3.0}], "the log of run-missing is not committed"),
    ([{"entry": "natcurve-missing", "minutes": 3.0}], "the log of natcurve-missing is not committed"),
    ([{"entry": "run-a", "minutes": None}], "run-a has no minutes on record"),
    ([{"entry": "run-capped", "minutes": 0.1}], "run-capped: a run log needs two training rows to time its updates"),
])
def test_split_says_why_it_cannot_split(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entries, reason) -> None:
    monkeypatch.setenv("MSGCORE_RUNS", str(tmp_path / "empty-cache"))
    write_log(tmp_path, "run-capped", [train_row(2, 300, 100.0)])  # a dry run's 2 updates: one training row
    assert costs.split(1.0, entries, logs=tmp_path) == reason


def test_gpu_minutes_moves_each_part_at_its_own_rate() -> None:
    part = costs.Split(page=4.0, updates=6000, update_minutes=50.0, other=6.0)
    minutes = costs.gpu_minutes(part, RATES, "small", 2048)
    # the page once, at the decoding speed-up; updates and the rest shared by 3 processes
    assert minutes["H100-class GPU"] == pytest.approx(4.0 / 2 + (6000 * 36.0 / 60000 + 6.0 / 2) / 3)
    # one process, each update at the launch-bound one-process time
    assert minutes["T4"] == pytest.approx(4.0 / 2 + 6000 * 30.0 / 60000 + 6.0 / 2)


def test_a_t4_update_is_the_arithmetic_at_its_peak_when_that_is_longer_than_the_launches() -> None:
    assert RATES.t4_ms_per_update("small", 2048) == 30.0  # 8M parameters: arithmetic ~1.5 ms
    huge = costs.Rates("GPU-X", RATES.gpu_ms, 2.0, params_m=2000.0)
    assert huge.t4_ms_per_update("small", 2048) == pytest.approx(1000 * 6 * 2000e6 * 2048 / costs.T4_PEAK_FLOPS)


def test_the_committed_reports_give_rates() -> None:
    r = costs.rates()
    assert r.gpu_ms[costs.RECIPE_BATCH["small"] + (costs.PROCESSES,)] > 0
    assert r.decode_speedup > 0 and r.params_m > 0


def test_a_missing_report_is_one_line_naming_it(tmp_path: Path) -> None:
    with pytest.raises(MsgcoreError, match=r"probe/nvidia-h200\.json is missing"):
        costs.rates(tmp_path)


def test_page_line_of_a_gpu_execution_estimates_nothing() -> None:
    assert "executed on a GPU" in costs.page_line(1.0, [], "small", "cuda")


def test_page_line_of_an_unknown_scale_says_so() -> None:
    assert costs.page_line(1.0, [], "smoke", "cpu") == "No GPU estimate for this execution: no GPU estimate at scale 'smoke'."


def chapter_notebook(path: Path, cost: dict | None) -> None:
    nb = nbformat.v4.new_notebook()
    if cost is not None:
        nb.metadata["msgcore"] = {"cost": cost}
    nbformat.write(nb, path)


def test_chapter_table_marks_measured_and_estimated_minutes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "book").mkdir()
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: book/intro\nchapters:\n- file: book/gpu\n"
                                       "- file: book/cpu\n- file: book/old\n")
    logs = tmp_path / "logs"
    write_log(logs, "run-a", steady_log())
    monkeypatch.setattr(costs, "LOGS", logs)
    chapter_notebook(tmp_path / "book" / "gpu.ipynb", {"scale": "small", "minutes": 9.0, "device type": "cuda",
                                                        "device": "GPU-X", "reused": [], "cold minutes": 9.0})
    chapter_notebook(tmp_path / "book" / "cpu.ipynb", {"scale": "small", "minutes": 1.0, "device type": "cpu",
                                                        "device": "CPU", "cold minutes": 6.0,
                                                        "reused": [{"entry": "run-a", "minutes": 5.0}]})
    chapter_notebook(tmp_path / "book" / "old.ipynb", None)
    table = costs.chapter_table(tmp_path, RATES, chapters={"gpu", "cpu", "old"}).set_index("chapter")
    gpu_column = f"one H100-class GPU ({costs.PROCESSES} processes)"
    assert table.loc["gpu", gpu_column] == "9.0 (measured)"
    assert table.loc["cpu", gpu_column].endswith("(estimate)") and table.loc["cpu", "one T4"].endswith("(estimate)")
    assert table.loc["old", "executed on"] == "not recorded"


def test_a_page_that_trained_its_runs_counts_them_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_log(tmp_path, "run-a", steady_log(updates=400, seconds_per_update=0.6))
    monkeypatch.setattr(costs, "LOGS", tmp_path)
    trained_now = [{"entry": "run-a", "here": "trained now", "minutes": 5.0}]
    warm = [{"entry": "run-a", "here": "reused", "minutes": 5.0}]
    # 7 minutes of which 5 trained run-a: the same estimate as a warm page of 2 minutes that reused it
    assert costs.page_line(7.0, trained_now, "small", "cpu") == costs.page_line(2.0, warm, "small", "cpu")
    assert "H100-class GPU" in costs.page_line(2.0, warm, "small", "cpu")


def test_minutes_per_update_spreads_a_chapter_over_its_updates(tmp_path: Path) -> None:
    write_log(tmp_path, "run-a", steady_log(updates=400, seconds_per_update=0.6))
    cpu = {"scale": "small", "minutes": 3.0, "device type": "cpu", "reused": [{"entry": "run-a", "minutes": 5.0}],
           "cold minutes": 8.0}
    whole = costs.gpu_minutes(costs.split(3.0, cpu["reused"], tmp_path), RATES, "small", 2048)["H100-class GPU"]
    assert costs.minutes_per_update(cpu, RATES, tmp_path) == pytest.approx(whole / 400)
    assert costs.minutes_per_update({**cpu, "device type": "cuda"}, RATES, tmp_path) == pytest.approx(8.0 / 400)
    assert costs.minutes_per_update({**cpu, "scale": "smoke"}, RATES, tmp_path) == "no GPU estimate at scale 'smoke'"
    assert costs.minutes_per_update({**cpu, "reused": []}, RATES, tmp_path) == "no training updates on record"


def test_chapter_rates_read_each_committed_notebook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "book").mkdir()
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: book/intro\nchapters:\n- file: book/gpu\n"
                                       "- file: book/old\n")
    logs = tmp_path / "logs"
    write_log(logs, "run-a", steady_log(updates=400))
    monkeypatch.setattr(costs, "LOGS", logs)
    chapter_notebook(tmp_path / "book" / "gpu.ipynb", {"scale": "small", "minutes": 2.0, "device type": "cuda",
                                                        "reused": [{"entry": "run-a", "minutes": 6.0}],
                                                        "cold minutes": 8.0})
    chapter_notebook(tmp_path / "book" / "old.ipynb", None)
    assert costs.chapter_rates(["gpu", "old", "gone"], tmp_path) == {
        "gpu": pytest.approx(8.0 / 400), "old": "its notebook recorded no cost", "gone": "its notebook recorded no cost"}
