"""The peers benchmark (msgcore.bench_peers): the training clock, the curve arithmetic, the report and the options.
No peer toolkit is needed: the peers run only under `python -m msgcore.bench_peers` with their own venv."""
import json

import pytest

from msgcore import bench_peers
from msgcore.batching import encode_corpus
from msgcore.data import synthetic_corpus
from msgcore.experiments import Scale, TranslationData
from msgcore.tokenizer import Tokenizer
from msgcore.trainer import TrainConfig


class FakeTime:
    """A clock that moves only when told to."""

    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_the_clock_leaves_evaluation_out_evaluates_at_each_point_and_stops_at_the_budget():
    now = FakeTime()

    def evaluate():
        now.t += 500.0  # a slow evaluation: none of it may count as training
        return 10.0 * len(clock.curve) + 10

    clock = bench_peers.BudgetClock(budget_s=60.0, points=3, evaluate=evaluate, now=now)
    clock.begin()
    stops = []
    for _ in range(20):
        now.t += 7.0  # one update takes 7 s of training
        stops.append(clock.after_update(tokens=100, sentences=4))
        if stops[-1]:
            break
    # points at 20, 40 and 60 s of training: reached after updates 3 (21 s), 6 (42 s) and 9 (63 s)
    assert [p["updates"] for p in clock.curve] == [3, 6, 9]
    assert [round(p["minutes"] * 60) for p in clock.curve] == [21, 42, 63]
    assert [p["test BLEU"] for p in clock.curve] == [10, 20, 30]
    assert stops == [False] * 8 + [True] and clock.expired
    now.t += 1000.0  # what happens after the stop (the final beam search, a checkpoint) is not training either
    summary = clock.summary()
    assert summary["train minutes"] == pytest.approx(63 / 60)
    assert summary["evaluation minutes (left out)"] == pytest.approx(1500 / 60)
    assert summary["target tokens/s"] == pytest.approx(900 / 63) and summary["sentences/s"] == pytest.approx(36 / 63)
    clock.finish()  # the last update was evaluated already: no extra point
    assert len(clock.curve) == 3


def test_finish_evaluates_a_run_that_ended_before_the_budget():
    now = FakeTime()
    clock = bench_peers.BudgetClock(budget_s=60.0, points=2, evaluate=lambda: 5.0, now=now)
    clock.begin()
    now.t += 10.0
    assert not clock.after_update(10, 1)
    clock.finish()
    assert clock.expired and [round(p["minutes"] * 60) for p in clock.curve] == [10]


def curve(*points):
    return [{"minutes": m, "updates": 10 * m, "target tokens": 1000 * m, "test BLEU": b} for m, b in points]


def test_time_to_reach_interpolates_from_the_origin_and_between_points():
    c = curve((2, 10), (4, 20), (6, 30), (8, 30))
    assert bench_peers.time_to_reach(c, 5) == pytest.approx(1.0)  # between (0, 0) and (2, 10)
    assert bench_peers.time_to_reach(c, 25) == pytest.approx(5.0)
    assert bench_peers.time_to_reach(c, 30) == pytest.approx(6.0)  # first reached at 6, not at the end
    assert bench_peers.time_to_reach(c, 31) is None
    assert bench_peers.time_to_reach(curve((1, 12), (2, 11), (3, 14)), 13) == pytest.approx(2 + 2 / 3)


def result(points, final):
    return {"curve": curve(*points), "final": {"test BLEU": final, "decoding": "beam 5"}}


def test_comparison_against_every_peer_and_the_time_fraction_to_the_best_peer():
    results = {"msgcore": result([(2, 20), (4, 30), (10, 38)], 39.0),
               "joeynmt": result([(5, 10), (10, 20)], 21.0),
               "hf": result([(5, 15), (10, 25)], 26.0)}
    cmp = bench_peers.comparison(results)
    assert [(r["peer"], r["difference"]) for r in cmp["peers"]] == [("joeynmt", 18.0), ("hf", 13.0)]
    assert cmp["best peer"] == "hf" and cmp["best peer greedy BLEU"] == 25
    assert cmp["best peer minutes"] == pytest.approx(10.0)
    assert cmp["msgcore minutes to reach it"] == pytest.approx(2.0 + 5 / 10 * 2)  # 25 between (2, 20) and (4, 30)
    assert cmp["time fraction"] == pytest.approx(0.3)
    assert cmp["msgcore higher than every peer"] and cmp["goal met"]


def test_comparison_misses_the_goal_when_msgcore_is_slower_or_below_a_peer():
    slow = {"msgcore": result([(5, 10), (10, 30)], 31.0), "hf": result([(5, 20), (10, 25)], 26.0)}
    cmp = bench_peers.comparison(slow)
    assert cmp["time fraction"] == pytest.approx(8.75 / 10) and not cmp["goal met"]
    below = {"msgcore": result([(10, 20)], 21.0), "hf": result([(10, 25)], 26.0)}
    cmp = bench_peers.comparison(below)
    assert cmp["msgcore minutes to reach it"] is None and cmp["time fraction"] is None
    assert not cmp["msgcore higher than every peer"] and not cmp["goal met"]
    assert bench_peers.comparison({"msgcore": below["msgcore"], "hf": {"error": "boom"}}) is None
    flat = {"msgcore": result([(10, 0.0)], 0.0), "hf": result([(10, 0.0)], 0.0)}  # nobody learned anything yet
    cmp = bench_peers.comparison(flat)
    assert cmp["msgcore minutes to reach it"] == 0 and cmp["time fraction"] is None and not cmp["goal met"]


def sample_report():
    def toolkit(points, final, **extra):
        return {**result(points, final), "version": "1.0", "parameters (M)": 7.6, "updates": 100,
                "train minutes": 10.0, "target tokens/s": 4000.0, "sentences/s": 270.0, "peak RSS (MB)": 1500.0,
                "wall minutes": 13.0, "settings": {"recipe": "its own", "lr": 1e-3}, **extra}

    for_points = [(5, 20.0), (10, 30.0)]
    toolkits = {"msgcore": toolkit(for_points, 31.0),
                "joeynmt": toolkit([(5, 10.0), (10, 20.0)], 21.5),
                "hf": {"error": "RuntimeError: out of memory", "wall minutes": 1.0}}
    return {"environment": {"device": "CPU (x86_64, 2 threads)", "cpu": "a CPU", "threads": 2, "torch": "2.x",
                            "python": "3.11", "git commit": "abc1234", "date": "today"},
            "config": {"minutes": 10.0, "threads": 2, "points": 2, "curve decoding": "greedy", "final beam": 5,
                       "test split": "test_2016_flickr", "test sentences": 1000, "toolkits": list(toolkits)},
            "toolkits": toolkits, "comparison": bench_peers.comparison(toolkits)}


def test_the_report_writer_names_the_file_by_device_and_writes_json_and_markdown(tmp_path):
    report = sample_report()
    path = bench_peers.write_report(report, tmp_path / "peers")
    assert path == tmp_path / "peers" / "cpu--x86-64--2-threads.json"
    assert json.loads(path.read_text()) == report
    text = path.with_suffix(".md").read_text()
    assert "| JoeyNMT" in text and "RuntimeError: out of memory" in text  # a failed toolkit is shown, not dropped
    assert "msgcore is above every peer" in text and "Goal" in text and "met" in text
    tables = bench_peers.tables(report)
    assert list(tables["comparison"]["msgcore - peer"]) == [9.5]
    assert list(tables["curves"]["toolkit"]) == ["msgcore", "msgcore", "JoeyNMT", "JoeyNMT"]
    assert tables["toolkits"].loc[0, "test BLEU, beam 5"] == 31.0


@pytest.mark.parametrize("argv, message", [
    (["--toolkits", "msgcore", "fairseq"], "unknown toolkit 'fairseq'"),
    (["--minutes", "0"], "--minutes must be positive"),
    (["--minutes", "-2"], "--minutes must be positive"),
    (["--minutes", "inf"], "--minutes must be positive and finite, not inf"),  # it never ended before
    (["--minutes", "nan"], "--minutes must be positive and finite, not nan"),
    (["--threads", "0"], "--threads must be positive"),
    (["--points", "0"], "--points must be positive"),
    (["--toolkits", "msgcore", "msgcore"], "named twice"),
])
def test_bad_options_get_one_line_before_any_work(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench_peers, "launch", lambda *a: pytest.fail("a worker started"))
    assert bench_peers.main([*argv, "--venv", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_missing_peers_venv_names_the_setup_script(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench_peers, "launch", lambda *a: pytest.fail("a worker started"))
    assert bench_peers.main(["--toolkits", "joeynmt", "--venv", str(tmp_path / "none"),
                             "--out", str(tmp_path / "out")]) == 2
    assert "bash book/benchmarks/peers/setup.sh" in capsys.readouterr().err


def test_the_budget_stops_a_msgcore_run(tmp_path):
    train = synthetic_corpus(2000, num_sources=1, seed=0, split="train")
    test = synthetic_corpus(30, num_sources=1, seed=0, split="test")
    tokenizer = Tokenizer.train(train.texts(), vocab_size=80, cache_dir=tmp_path / "tok")
    data = TranslationData(tokenizer, {"train": train, bench_peers.TEST_SPLIT: test},
                           {"train": encode_corpus(train, tokenizer),
                            bench_peers.TEST_SPLIT: encode_corpus(test, tokenizer)})
    scale = Scale("tiny", dict(d_model=32, d_ff=64, dropout=0.1),
                  TrainConfig(lr=1e-3, warmup_steps=10, max_tokens=256, max_epochs=1, amp="fp32"))
    job = {"minutes": 0.1, "points": 2, "curve_beam": 1, "final_beam": 2}
    now = FakeTime()

    def tick():  # every reading of the clock is 0.25 s later, so the test does not depend on the machine's speed
        now.t += 0.25
        return now.t

    out = bench_peers.msgcore_run(data, scale, job, tmp_path / "run", now=tick)
    # Stopped by the 6 s budget at the first update past it: without the stop, the lifted epoch cap would let it
    # train for a million epochs. Each update reads the clock once, each curve point twice more.
    assert 6.0 <= out["train minutes"] * 60 <= 6.5
    assert 20 <= out["updates"] <= 26 and out["target tokens/s"] > 0
    assert [p["updates"] for p in out["curve"]] == [12, out["updates"]]
    assert out["curve"][-1]["minutes"] * 60 >= 6.0
    assert out["evaluation minutes (left out)"] * 60 == pytest.approx(0.5)
    assert out["final"]["decoding"] == "beam 2" and 0 <= out["final"]["test BLEU"] <= 100


def test_each_msgcore_variant_is_compared_with_the_peers_only():
    results = {"msgcore": result([(2, 20), (10, 33)], 34.0), "msgcore-fused": result([(5, 20), (10, 30)], 31.0),
               "hf": result([(5, 15), (10, 25)], 26.0)}
    math, fused = bench_peers.comparison(results, "msgcore"), bench_peers.comparison(results, "msgcore-fused")
    assert [r["peer"] for r in fused["peers"]] == ["hf"] and [r["peer"] for r in math["peers"]] == ["hf"]
    assert math["time fraction"] < fused["time fraction"]
    assert bench_peers.comparison({k: results[k] for k in ("msgcore", "msgcore-fused")}) is None  # no peer
    report = {**sample_report(), "comparisons": {"msgcore": math, "msgcore-fused": fused}}
    lines = bench_peers.verdict(report)
    assert sum(line.startswith("Goal for msgcore,") for line in lines) == 1 and len(lines) == 6
    assert {"comparison", "comparison, msgcore, torch's choice of SDPA kernel"} <= set(bench_peers.tables(report))


def test_a_msgcore_row_names_its_attention_kernels_and_a_peer_row_does_not():
    assert bench_peers.kernel_note({"training": {"sdpa_backends": ["math"]}}) == \
        "; SDPA kernels: math (TrainConfig.sdpa_backends)"
    assert "torch chooses" in bench_peers.kernel_note({"training": {"sdpa_backends": []}})
    assert bench_peers.kernel_note({"recipe": "JoeyNMT's"}) == ""


def test_merge_keeps_the_earlier_toolkits_this_run_does_not_train_and_refuses_another_budget(tmp_path, capsys,
                                                                                          monkeypatch):
    report = sample_report()
    path = bench_peers.write_report(report, tmp_path)
    kept, problem = bench_peers.earlier_results(path, report["config"], ["msgcore"])
    assert problem is None and set(kept) == {"joeynmt", "hf"}
    assert kept["joeynmt"]["run"] == "commit abc1234, today"
    renamed = {**report, "toolkits": {**report["toolkits"], "msgcore-math": report["toolkits"]["msgcore"]}}
    old = tmp_path / "old.json"  # a variant an earlier bench ran under a name since dropped
    old.write_text(json.dumps(renamed))
    assert set(bench_peers.earlier_results(old, report["config"], ["msgcore"])[0]) == {"joeynmt", "hf"}
    _, problem = bench_peers.earlier_results(path, {**report["config"], "minutes": 5.0}, ["msgcore"])
    assert "minutes 10.0" in problem and "5.0" in problem
    assert bench_peers.earlier_results(tmp_path / "none.json", report["config"], ["msgcore"]) == ({}, None)
    monkeypatch.setattr(bench_peers, "launch", lambda *a: pytest.fail("a worker started"))
    monkeypatch.setattr(bench_peers, "report_slug", lambda env: path.stem)
    assert bench_peers.main(["--toolkits", "msgcore-fused", "--no-decoding", "--merge", "--minutes", "3",
                             "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --merge") and err.count("\n") == 1


# ---- the decoding anchor ----------------------------------------------------------------------------------

def test_the_decoding_table_gives_each_speed_as_a_multiple_of_msgcores_at_the_same_batch_size(tmp_path):
    rows = [{"decoder": "msgcore", "weights": "float32", "batch size": 1, "test BLEU": 38.0, "sentences/s": 10.0,
             "ms per sentence": 100.0},
            {"decoder": "CTranslate2", "weights": "int8", "batch size": 1, "test BLEU": 37.9, "sentences/s": 25.0,
             "ms per sentence": 40.0},
            {"decoder": "msgcore", "weights": "float32", "batch size": 64, "test BLEU": 38.0,
             "sentences/s": 50.0, "ms per sentence": 20.0},
            {"decoder": "CTranslate2", "weights": "float32", "batch size": 64, "test BLEU": 38.0,
             "sentences/s": 75.0, "ms per sentence": 13.3}]
    report = {**sample_report(), "decoding": {"rows": rows, "decoding": "beam 5", "model": "chapter 0's De->En run",
                                              "version": "CTranslate2 4.8.5", "sentences": 1000}}
    table = bench_peers.tables(report)["decoding anchor: beam 5"]
    assert list(table["speed vs msgcore"]) == ["1.00x", "2.50x", "1.00x", "1.50x"]
    text = bench_peers.write_report(report, tmp_path).with_suffix(".md").read_text()
    assert "### decoding anchor: beam 5" in text and "CTranslate2 4.8.5, 1000 test sentences" in text
    failed = {**sample_report(), "decoding": {"error": "ModuleNotFoundError: No module named 'ctranslate2'"}}
    assert "Failed: ModuleNotFoundError" in bench_peers.markdown(failed)


def test_msgcores_beam_search_gives_the_same_translations_one_sentence_a_call_and_sixty_four(tmp_path):
    import torch

    from msgcore.generation import GenerationConfig
    from msgcore.model import Transformer, preset

    corpus = synthetic_corpus(70, num_sources=1, seed=2)
    tokenizer = Tokenizer.train(corpus.texts(), vocab_size=80, cache_dir=tmp_path)
    torch.manual_seed(0)
    model = Transformer(preset("tiny", vocab_size=tokenizer.vocab_size, pad_id=tokenizer.pad_id, d_model=32,
                               d_ff=64)).eval()
    test, cfg = encode_corpus(corpus, tokenizer), GenerationConfig(beam_size=3, max_len_b=4)
    one = bench_peers.msgcore_decode(model, tokenizer, test, cfg, 1)
    assert len(one) == 70 and bench_peers.msgcore_decode(model, tokenizer, test, cfg, 64) == one  # padding is inert


def test_the_decoding_anchor_needs_the_peers_venv_unless_it_is_skipped(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(bench_peers, "launch", lambda *a: pytest.fail("a worker started"))
    assert bench_peers.main(["--toolkits", "msgcore", "--venv", str(tmp_path / "none"),
                             "--out", str(tmp_path / "out")]) == 2
    assert "peers' venv" in capsys.readouterr().err
    assert bench_peers.check(bench_peers.parse_args(["--toolkits", "msgcore", "--no-decoding", "--venv",
                                                     str(tmp_path / "none")])) is None


def test_joeynmt_at_equal_size_has_msgcore_smalls_dimensions_budget_and_schedule():
    from msgcore.foundations.baselines import BASELINE_SCALES
    from msgcore.model import PRESETS

    small, recipe = PRESETS["small"], BASELINE_SCALES["small"].train
    cfg = bench_peers.JOEYNMT_SMALL_CONFIG
    for part in ("encoder", "decoder"):
        side = cfg["model"][part]
        assert (side["num_layers"], side["num_heads"], side["hidden_size"], side["ff_size"]) == (
            small[f"{part}_layers"], small["n_heads"], small["d_model"], small["d_ff"])
        assert side["dropout"] == BASELINE_SCALES["small"].model["dropout"] and side["layer_norm"] == "pre"
    training = cfg["training"]
    assert (training["batch_size"], training["learning_rate_peak"], training["learning_rate_warmup"]) == (
        recipe.max_tokens, recipe.lr, recipe.warmup_steps)
    assert training["scheduling"] == "warmupinversesquareroot" and "patience" not in training
    assert tuple(training["adam_betas"]) == recipe.betas and training["clip_grad_norm"] == recipe.clip_norm
    assert bench_peers.JOEYNMT_CONFIG["model"]["encoder"]["num_layers"] == 6  # its own recipe's row is unchanged
