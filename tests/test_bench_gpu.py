"""The GPU bench (msgcore.bench_gpu), checked on the CPU: each variant is the book's update changed in one way
only (its losses equal the book's), the background stream yields the same batches, and the report's targets."""
import importlib.util

import pytest
import torch

from msgcore import bench_gpu
from msgcore.batching import example_lengths, token_batches
from msgcore.probe import random_corpus

CPU = torch.device("cpu")


@pytest.mark.parametrize("variant", ["foreach AdamW", "background collate"])
def test_a_variant_takes_the_books_updates_with_the_same_losses(variant):
    book = bench_gpu.golden_losses("book", "tiny", 256, CPU, updates=3)
    other = bench_gpu.golden_losses(variant, "tiny", 256, CPU, updates=3)
    assert len(book) == 3 and book[0] > book[-1] - 1.0  # three real updates on random tokens
    assert other == pytest.approx(book, abs=1e-4)


def test_the_background_stream_yields_the_same_batches_in_order():
    data = random_corpus(200)
    batches = token_batches(example_lengths(data), 256, shuffle=True, seed=0)[:6]
    direct = list(bench_gpu.batch_stream("book", data, batches, CPU))
    ahead = list(bench_gpu.batch_stream("background collate", data, batches, CPU))
    assert len(direct) == len(ahead) == 6
    for (a, counts_a), (b, counts_b) in zip(direct, ahead):
        assert counts_a == counts_b and torch.equal(a.target_out, b.target_out)
        assert torch.equal(a.sources[0], b.sources[0]) and a.indices == b.indices


def test_foreach_adamw_replaces_the_fused_optimizer_and_keeps_the_schedule(tmp_path):
    model = bench_gpu.build("book", bench_gpu.preset("tiny", vocab_size=bench_gpu.VOCAB))
    trainer = bench_gpu.trainer_for("foreach AdamW", model, random_corpus(50), 256, CPU, str(tmp_path))
    assert trainer.optimizer.defaults["foreach"] is True and trainer.scheduler.optimizer is trainer.optimizer
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(trainer.cfg.lr / trainer.cfg.warmup_steps,
                                                                    rel=0.5)


def report(**rows) -> dict:
    train = [{"variant": v, "preset": "small", "tokens per batch": 8192, "ms per update": ms,
              "target tokens/s": 8192 / ms, "warm-up s": 1.0} for v, ms in rows.items()]
    return {"device": "GPU", "torch": "2", "commit": "abc", "precision": "auto", "train": train,
            "golden": {"book": [9.0, 8.0], "torch.compile": [9.0, 8.05]},
            "decode": [{"variant": "book", "generated tokens/s": 3000.0, "ms per sentence": 5.0},
                       {"variant": bench_gpu.HF, "generated tokens/s": 1000.0, "ms per sentence": 9.0}]}


def test_the_summary_takes_the_fastest_variant_and_the_ratios_to_hf():
    r = report(book=10.0, **{"torch.compile": 4.0, bench_gpu.HF: 20.0})
    measured = bench_gpu.summary(r)
    assert measured["ms per update, small at 8192 tokens"] == 4.0 and measured["fastest variant"] == "torch.compile"
    assert measured["training throughput vs HF"] == pytest.approx(2.0)  # the book's path: HF runs its kernels
    assert measured["decoding throughput vs HF"] == pytest.approx(3.0)
    assert bench_gpu.golden_gap(r, "torch.compile") == pytest.approx(0.05)
    assert bench_gpu.golden_gap(r, "foreach AdamW") is None  # not measured: no gap is claimed
    text = bench_gpu.markdown(r)
    assert "| torch.compile | small | 8,192 | 4.0 |" in text
    assert "| training throughput vs HF | 2.0 | ≥ 1.3 |" in text and "5.0e-02" in text


def test_a_report_cut_off_before_any_row_has_no_targets():
    assert bench_gpu.summary({"train": [], "decode": [], "golden": {}}) == {}


@pytest.mark.skipif(importlib.util.find_spec("transformers") is not None, reason="transformers is installed")
def test_without_transformers_the_bench_stops_with_one_line_before_any_work(tmp_path, capsys):
    assert bench_gpu.main(["--device", "cpu", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--no-hf" in err and not (tmp_path / "out").exists()


def test_a_measurement_in_a_fresh_process_gives_what_it_gives_here():
    here = bench_gpu.golden_losses("book", "tiny", 256, CPU, updates=2)
    # bf16 on the CPU: another process may split the reductions differently, a rounding apart
    assert bench_gpu.isolated("golden", "cuDNN attention allowed", "tiny", 256, CPU, 2) == pytest.approx(here, abs=1e-3)


def test_the_profilers_totals_are_read_in_milliseconds_whatever_their_unit():
    text = "...\nSelf CPU time total: 189.107ms\nSelf CUDA time total: 340us\n"
    assert bench_gpu.profile_totals(text) == {"CPU": pytest.approx(189.107), "CUDA": pytest.approx(0.34)}
    assert bench_gpu.profile_totals("Self CPU time total: 1.5s") == {"CPU": pytest.approx(1500.0)}


def test_the_findings_compare_cudnn_with_and_without_from_the_report():
    r = report(book=10.0, **{"no cuDNN attention": 5.0})
    for row, mean in zip(r["train"], (40.0, 5.5)):
        row["mean ms per update"] = mean
        row["target tokens/s"] = 8192 / mean
    r["decode"][1]["variant"] = "no cuDNN attention"
    said = " ".join(bench_gpu.findings(r))
    assert "a mean update of 40.0 ms (median 10.0) with it, 5.5 ms (median 5.0) without it: 7.3×" in said
    assert "3,000 generated tokens/s with cuDNN's attention, 1,000 without it" in said
    tables = bench_gpu.tables(r)
    assert list(tables["targets"]["met"]) == ["yes"]  # 5.0 ms at most and tables["training"]["× book"].iloc[1] == pytest.approx(40 / 5.5)


def test_tokens_that_name_no_setting_are_refused_before_any_work():
    with pytest.raises(bench_gpu.MsgcoreError, match="names no setting"):
        bench_gpu.bench(CPU, tokens=[123])


def test_a_measurement_that_fails_in_its_process_is_one_line_and_the_bench_goes_on():
    with pytest.raises(bench_gpu.MeasurementFailed, match=r"^MsgcoreError: unknown preset 'huge'"):
        bench_gpu.isolated("golden", "book", "huge", 256, CPU, 1)
    r = report(book=10.0)

    def fails():
        raise bench_gpu.MeasurementFailed("its process exited with code -9")

    assert bench_gpu.attempt(r, "decode book", fails) is None
    assert r["failed"] == ["decode book: its process exited with code -9"]
    assert "Failed: decode book: its process exited with code -9." in bench_gpu.markdown(r)
