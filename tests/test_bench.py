"""The benchmark harness (msgcore.bench): batching baselines, the analytic FLOP count, forced-length
decoding and the report tables. Speed itself is measured by `python -m msgcore.bench`, never in a test."""
import random
import time

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from msgcore import bench
from msgcore.batching import EncodedCorpus, collate, padding_efficiency, token_batches
from msgcore.model import Transformer, preset
from msgcore.tokenizer import BOS_ID, EOS_ID


def test_random_batches_keep_the_budget_and_pad_more_than_length_buckets():
    rng = random.Random(0)
    lengths = [rng.randint(3, 60) for _ in range(500)]
    batches = bench.random_batches(lengths, max_tokens=256)
    assert sorted(i for b in batches for i in b) == list(range(500))
    assert all(len(b) * max(lengths[i] for i in b) <= 256 for b in batches)
    bucketed = token_batches(lengths, 256, shuffle=True, seed=0)
    assert padding_efficiency(bucketed, lengths) > padding_efficiency(batches, lengths) + 0.2


def toy_batch(B=3, S=7, T=5, vocab=50):
    gen = torch.Generator().manual_seed(0)
    sources = [[torch.randint(4, vocab, (S,), generator=gen).tolist() for _ in range(B)]]
    target = [torch.randint(4, vocab, (T - 1,), generator=gen).tolist() for _ in range(B)]
    return collate(EncodedCorpus(sources, target, BOS_ID, EOS_ID), range(B))


def test_analytic_training_flops_match_torchs_flop_counter(monkeypatch):
    # The counter does not see inside the fused CPU attention kernel: count the written-out attention.
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", bench.math_sdpa)
    cfg = preset("tiny", vocab_size=50, d_model=32, d_ff=64, dropout=0.0)
    model, batch = Transformer(cfg), toy_batch()
    with FlopCounterMode(display=False) as counter:
        model.loss(batch).backward()
    assert bench.train_flops(cfg, batch) == pytest.approx(counter.get_total_flops(), rel=0.02)


@pytest.mark.parametrize("beam", [1, 5])
def test_forced_length_decoding_gives_every_sentence_the_same_length(beam):
    torch.manual_seed(0)
    model = Transformer(preset("tiny", vocab_size=50, d_model=32, d_ff=64, dropout=0.0)).eval()
    batch = toy_batch()
    outputs = bench.generation("msgcore", model, beam, length=6)(batch.sources[0], batch.source_masks[0])
    assert [len(o) for o in outputs] == [6, 6, 6] and all(EOS_ID not in o for o in outputs)


def test_tables_compute_ratios_ablation_effects_and_targets():
    rows = [dict(kind="train", library="msgcore", preset="small", dtype="fp32", **{"target tokens/s": 300.0}),
            dict(kind="train", library="hf", preset="small", dtype="fp32", **{"target tokens/s": 200.0}),
            dict(kind="decode", library="msgcore", preset="small", dtype="fp32", beam=5, batch=64,
                 **{"generated tokens/s": 150.0}),
            dict(kind="decode", library="hf", preset="small", dtype="fp32", beam=5, batch=64,
                 **{"generated tokens/s": 100.0}),
            dict(kind="train", library="msgcore", preset="small", dtype="fp32", ablation="math attention",
                 **{"target tokens/s": 240.0})]
    for row in rows:
        if row["kind"] == "train":
            row.update({"peak memory (MB)": 1.0, "parameters (M)": 1.0, "model TFLOP/s": 0.1})
    report = {"rows": rows, "ratios": bench.ratios(rows), "padding": {"length-bucketed": 0.99, "random": 0.5}}
    tables = bench.tables(report)
    assert list(tables["ratios"]["msgcore / HF"]) == [1.5, 1.5]
    assert tables["ablations"].iloc[0]["speed with / without the change"] == 0.8
    assert list(tables["targets"]["met"]) == [True, False]  # training 1.5 >= 1.3; beam-5 decoding 1.5 < 2


def test_an_unknown_preset_is_refused_before_any_work(tmp_path, capsys):
    assert bench.main(["--presets", "huge", "--skip-hf", "--out", str(tmp_path / "out")]) == 2
    assert "unknown preset 'huge'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_change_on_top_of_an_ablation_is_measured_against_that_ablations_row():
    base = dict(kind="train", library="msgcore", preset="small", dtype="fp32", **{"target tokens/s": 300.0})
    bf16 = {**base, "dtype": "bf16", "ablation": "bf16 autocast", "target tokens/s": 480.0}
    stacked = {**bf16, "sdpa_backends": ["math"], "against": "bf16 autocast", "ablation": "bf16 + math kernel",
               "target tokens/s": 720.0}
    for row in (base, bf16, stacked):
        row.update({"peak memory (MB)": 1.0, "parameters (M)": 1.0, "model TFLOP/s": 0.1})
    table = bench.tables({"rows": [base, bf16, stacked], "ratios": [], "padding": {}})["ablations"]
    assert list(table["msgcore as is"]) == [300, 480] and list(table["speed with / without the change"]) == [1.6, 1.5]
    specs = bench.plan(["small"], torch.device("cpu"), skip_hf=True, with_compile=False)
    stacked_rows = [s for s in specs if "against" in s]
    for row in stacked_rows:
        assert sum(s.get("ablation") == row["against"] for s in specs) == 1  # its base row is measured too
    kernel = next(s for s in stacked_rows if s["against"] == "bf16 autocast")
    assert kernel["sdpa_backends"] == ["math"] and kernel["dtype"] == "bf16"
    for knob, value in (("loss", "torch"), ("dropout", "torch"), ("allocator", "default")):  # A/Bs in the book's setting
        row = next(s for s in stacked_rows if knob in s)
        assert row["against"] == kernel["ablation"] and row[knob] == value
        assert {k: v for k, v in row.items() if k not in (knob, "against", "ablation")} == \
            {k: v for k, v in kernel.items() if k not in ("against", "ablation")}
    done = next(s for s in stacked_rows if s["kind"] == "decode")
    assert done["done sentences"] == "kept" and done["lengths"] == "source"  # same lengths as its base row


def test_the_kernel_choice_of_a_spec_is_checked_like_the_trainers():
    from msgcore.utils import TrainingError

    with pytest.raises(TrainingError, match="unknown sdpa_backends"):
        bench.kernels({"sdpa_backends": ["fastest"]})
    with bench.kernels({}):  # no choice: torch's own
        pass


def test_time_shares_find_the_matrix_multiplications_of_the_profiled_steps():
    profiler = bench.step_profiler({"kind": "profile"})
    a = torch.randn(256, 256)
    profiler.start()
    start = time.perf_counter()
    for _ in range(20):
        (a @ a).relu_()
    seconds = time.perf_counter() - start
    profiler.stop()
    shares = bench.time_shares(profiler, seconds, steps=20)
    assert shares["matmul share"] > shares["other ops share"] and shares["fused attention share"] == 0
    assert shares["seconds per step"] == seconds / 20
    assert shares["top ops"][0][0] == "aten::mm"
    assert bench.step_profiler({"kind": "train"}) is None


def test_profile_rows_are_reported_apart_from_the_throughput_tables():
    specs = bench.plan(["small"], torch.device("cpu"), skip_hf=False, with_compile=False)
    profiles = [s for s in specs if s["kind"] == "profile" and s.get("setting") != "book"]
    assert {(s["of"], s["library"]) for s in profiles} == {(o, lib) for o in ("train", "decode") for lib in ("msgcore", "hf")}
    book = [s for s in specs if s["kind"] == "profile" and s.get("setting") == "book"]  # where the chapters train
    assert [(s["of"], s["library"], s["preset"], s["dtype"], s["sdpa_backends"]) for s in book] == \
        [("train", "msgcore", p, "bf16", ["math"]) for p in ("small", "tiny")]
    assert bench.setting_name(book[0]) == "bf16 + math kernel (the book's)"
    shares = {"matmul share": 0.6, "fused attention share": 0.05, "other ops share": 0.3, "outside ops share": 0.05,
              "top ops": [["aten::addmm", 0.4]]}
    rows = [{**s, **shares} for s in profiles]
    tables = bench.tables({"rows": rows, "ratios": bench.ratios(rows), "padding": {}})
    assert len(tables["profile"]) == 4 and tables["profile"].iloc[0]["matmul"] == "60%"
    assert tables["ratios"].empty and tables["train"].empty  # a profiled step is not a throughput measurement
    assert tables["training ops"].empty  # rows without the step time (older reports) give no per-op table


def test_training_ops_put_each_ops_milliseconds_per_step_side_by_side():
    def profile(library, seconds, top):
        return {"kind": "profile", "of": "train", "library": library, "preset": "small", "seconds per step": seconds,
                "top ops": top}

    rows = [profile("msgcore", 0.2, [["aten::mm", 0.5], ["aten::bernoulli_", 0.1]]),
            profile("hf", 0.25, [["aten::mm", 0.4], ["aten::native_layer_norm", 0.04]]),
            {"kind": "profile", "of": "decode", "library": "hf", "preset": "small", "seconds per step": 1.0,
             "top ops": [["aten::topk", 0.9]]}]  # decoding profiles are not in this table
    table = {r["op"]: r for r in bench.op_rows(rows)}
    assert list(table) == ["aten::mm", "aten::bernoulli_", "aten::native_layer_norm"]
    assert table["aten::mm"]["msgcore (ms/step)"] == 100.0 and table["aten::mm"]["HF (ms/step)"] == 100.0
    assert table["aten::mm"]["msgcore / HF"] == 1.0
    assert table["aten::bernoulli_"]["HF (ms/step)"] is None and table["aten::bernoulli_"]["msgcore / HF"] is None


def test_the_fused_qkv_ablation_computes_the_same_attention():
    from msgcore.attention import MultiHeadAttention
    from msgcore.bench import fused_queries_keys_values

    attn, x = MultiHeadAttention(32, 4).eval(), torch.randn(2, 5, 32)
    for got, expected in zip(fused_queries_keys_values(attn, x, None, None), attn.queries_keys_values(x, None, None)):
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    memory = torch.randn(2, 7, 32)  # cross-attention keeps its own projections
    for got, expected in zip(fused_queries_keys_values(attn, x, memory, None), attn.queries_keys_values(x, memory, None)):
        assert torch.equal(got, expected)


def test_the_new_tensor_ablation_computes_the_same_search_step():
    from msgcore.generation import best_candidates, step_log_probs

    torch.manual_seed(0)
    model = Transformer(preset("tiny", vocab_size=20, d_model=32, d_ff=64, dropout=0.0)).eval()
    memory = model.encode([torch.randint(4, 20, (2, 5))], [torch.ones(2, 5, dtype=torch.bool)])
    tokens = torch.randint(4, 20, (2, 3))
    with torch.no_grad():
        logp, _ = step_log_probs(model, tokens, memory, None, 0)
        expected, _ = bench.step_log_probs_in_a_new_tensor(model, tokens, memory, None, 0)
    assert torch.equal(logp, expected)
    scores, logp = torch.randn(2, 3), torch.log_softmax(torch.randn(6, 20), -1)
    expected = bench.candidates_in_a_new_tensor(scores, logp, 6)
    for got, want in zip(best_candidates(scores, logp.clone(), 6), expected):
        assert torch.equal(got, want)


def test_the_static_kv_cache_ablation_gives_the_same_hypotheses_from_two_buffers_per_tensor(monkeypatch):
    from msgcore import attention, layers
    from msgcore.generation import GenerationConfig, beam_search

    torch.manual_seed(0)
    model = Transformer(preset("tiny", vocab_size=40, d_model=32, d_ff=64, dropout=0.0)).eval()
    srcs, masks = [torch.randint(4, 40, (3, 6))], [torch.ones(3, 6, dtype=torch.bool)]
    masks[0][1, 2:] = False  # a short sentence, done early: its rows leave the batch
    cfg = GenerationConfig(beam_size=3, max_len_a=1.0, max_len_b=4)
    expected = beam_search(model, srcs, masks, 2, 3, cfg, forbidden=[0, 1, 2])
    static = bench.StaticKVCache(block=4)
    monkeypatch.setattr(layers, "reorder_with_room", static.reorder)
    monkeypatch.setattr(attention, "append_to_cache", bench.append_into_room)
    assert beam_search(model, srcs, masks, 2, 3, cfg, forbidden=[0, 1, 2]) == expected
    # 2 layers x (K, V), each in a pair of buffers of 4, then 8, then 12 positions: 10 steps grew it twice
    assert len(static.partner) == 2 * 2 * 2 * 3
    assert static.searching(lambda src, mask: "out")(None, None) == "out" and not static.partner


def test_target_measurements_run_again_in_turn_and_report_the_median_and_each_runs_ratio(monkeypatch):
    specs = [dict(kind=kind, library=lib, preset="small", dtype="fp32", **extra)
             for kind, extra in (("train", {}), ("decode", {"beam": 5, "batch": 64})) for lib in ("msgcore", "hf")]
    specs += [dict(kind="decode", library="msgcore", preset="small", dtype="fp32", beam=1, batch=64),  # no target
              dict(kind="train", library="msgcore", preset="small", dtype="fp32", ablation="bf16 autocast")]
    first = {"msgcore": 300.0, "hf": 200.0}
    measured = [(s, {**s, bench._metric(s): first[s["library"]]}) for s in specs]
    later = {("train", "msgcore"): [330.0, 270.0], ("train", "hf"): [150.0, 250.0],
             ("decode", "msgcore"): [600.0, 420.0], ("decode", "hf"): [200.0, 210.0]}
    calls = []

    def worker(spec, cfg):
        calls.append((spec["kind"], spec["library"]))
        return {bench._metric(spec): later[calls[-1]].pop(0)}

    monkeypatch.setattr(bench, "run_worker", worker)
    bench.repeat_target_measurements(measured, bench.BenchConfig(repeats=3))
    assert [library for _, library in calls] == ["msgcore", "hf"] * 4  # two more rounds of the four rows, in turn
    rows = [row for _, row in measured]
    assert rows[0]["runs"] == [300.0, 330.0, 270.0] and rows[0]["target tokens/s"] == 300.0  # the median
    assert "runs" not in rows[4] and "runs" not in rows[5]  # greedy decoding and ablations run once
    train, decode = bench.ratios(rows)[:2]
    assert train["ratio msgcore/hf"] == 1.5 and decode["ratio msgcore/hf"] == 2.1
    assert train["ratio of each run"] == [1.5, 2.2, 1.08]
    assert bench.run_range(train) == "1.08-2.20 (3 runs)" and bench.run_range({"ratio msgcore/hf": 1.0}) == ""
    targets = bench.target_rows({"ratios": [train, decode]})
    assert [(t["met"], t["met in every run"]) for t in targets] == [(True, False), (True, False)]  # 1.08 and 1.5


def test_fewer_than_one_run_is_refused_before_any_work(tmp_path, capsys):
    assert bench.main(["--repeats", "0", "--skip-hf", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: argument --repeats: 0 is out of range") and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_the_token_budget_rows_train_on_batches_of_their_own_budget():
    rng = random.Random(0)
    lengths = [rng.randint(3, 40) for _ in range(400)]
    specs = [s for s in bench.plan(["small"], torch.device("cpu"), skip_hf=True, with_compile=False)
             if "max_tokens" in s]
    assert sorted(s["max_tokens"] for s in specs) == [1024, 2048, 8192]
    cfg = bench.BenchConfig()
    for spec in [*specs, {"kind": "train"}]:
        budget = spec.get("max_tokens", cfg.max_tokens)
        batches = bench.training_batches(spec, cfg, lengths)
        assert sorted(i for b in batches for i in b) == list(range(400))
        assert max(len(b) * max(lengths[i] for i in b) for b in batches) <= budget
        assert max(len(b) * max(lengths[i] for i in b) for b in batches) > budget // 2  # batches fill their budget


def test_beam_ablations_repeat_with_their_baseline_and_other_ablations_run_once():
    plan = bench.plan(["small", "base"], torch.device("cpu"), skip_hf=False, with_compile=False)
    repeated = [s for s in plan if bench.repeated(s)]
    beam_ablations = [s for s in repeated if "ablation" in s]
    assert beam_ablations and all(s["kind"] == "decode" and s["beam"] == 5 for s in beam_ablations)
    assert {"train", "decode"} == {s["kind"] for s in repeated if "ablation" not in s}  # the targets' rows
    assert not any(bench.repeated(s) for s in plan if s["kind"] == "train" and "ablation" in s)
    assert not any(bench.repeated(s) for s in plan if s["kind"] == "decode" and s["beam"] == 1)


def test_the_matmul_peak_and_cpu_mfu(monkeypatch):
    monkeypatch.setattr(bench, "MATMUL_SHAPES", ((64, 32, 16), (32, 32, 32)))
    row = bench.peak_worker({"kind": "peak", "dtype": "bf16"}, bench.BenchConfig(device="cpu"))
    assert set(row["GFLOP/s by shape"]) == {"64x32x16", "32x32x32"}
    assert row["sustained GFLOP/s"] == max(row["GFLOP/s by shape"].values()) > 0
    train = dict(kind="train", library="msgcore", preset="small", dtype="fp32", **{"model TFLOP/s": 0.1})
    report = {"peak": {"fp32": 200.0, "bf16": 400.0}, "rows": [
        train, {**train, "dtype": "bf16", "sdpa_backends": ["math"], "ablation": bench.BOOK_SETTING,
                "model TFLOP/s": 0.3},
        {**train, "dtype": "bf16", "ablation": "bf16 autocast"},  # other ablations get no MFU row
        {**train, "library": "hf"}]}
    rows = bench.mfu_rows(report)
    assert [(r["setting"], r["MFU"]) for r in rows] == [("fp32", "50%"), ("bf16 autocast + math kernel (the book's)",
                                                                          "75%")]
    specs = bench.plan(["small"], torch.device("cpu"), skip_hf=True, with_compile=False)
    assert [s["dtype"] for s in specs if s["kind"] == "peak"] == ["fp32", "bf16"]  # in the same run as training


def test_the_book_setting_compares_msgcore_with_hfs_fastest_bf16_setting():
    specs = bench.plan(["small"], torch.device("cpu"), skip_hf=False, with_compile=False)
    book = [s for s in specs if s.get("setting") == "book" and s["kind"] == "train"]
    assert {(s["library"], s.get("hf_attention"), tuple(s.get("sdpa_backends", ()))) for s in book} == \
        {("msgcore", None, ("math",)), ("hf", "sdpa", ()), ("hf", "eager", ())}
    assert all(s["dtype"] == "bf16" and bench.repeated(s) for s in book)  # 3 alternating runs each
    assert not any(s.get("setting") for s in bench.plan(["small"], torch.device("cpu"), True, False)
                   if s["kind"] != "profile")  # without HF, only the book setting's profiles
    row = dict(kind="train", preset="small", dtype="bf16", setting="book", **{"model TFLOP/s": 0.2})
    fp32 = dict(kind="train", preset="small", dtype="fp32", **{"model TFLOP/s": 0.1})
    rows = [{**fp32, "library": "msgcore", "target tokens/s": 300.0, "runs": [300.0, 310.0]},
            {**fp32, "library": "hf", "target tokens/s": 250.0, "runs": [250.0, 250.0]},
            {**row, "library": "msgcore", "sdpa_backends": ["math"], "target tokens/s": 600.0, "runs": [600.0, 660.0]},
            {**row, "library": "hf", "hf_attention": "sdpa", "target tokens/s": 400.0, "runs": [400.0, 400.0]},
            {**row, "library": "hf", "hf_attention": "eager", "target tokens/s": 500.0, "runs": [500.0, 600.0]}]
    ratios = bench.ratios(rows)
    plain, book_ratio = ratios  # the fp32 rows pair with each other, never with a bf16 row
    assert plain["ratio msgcore/hf"] == pytest.approx(1.2)
    assert book_ratio["ratio msgcore/hf"] == pytest.approx(1.2) and "eager" in book_ratio["hf setting"]
    assert book_ratio["ratio of each run"] == pytest.approx([1.2, 1.1])
    targets = bench.target_rows({"ratios": ratios})
    assert [t["target"] for t in targets] == ["training (small): msgcore >= 1.3x HF",
                                              "training in the book's CPU setting (small): msgcore >= 1.3x HF"]
    report = {"peak": {"fp32": 200.0, "bf16": 400.0}, "rows": rows}
    assert [r["MFU"] for r in bench.mfu_rows(report)] == ["50%", "50%"]
