"""The GPU bench (msgcore.bench_gpu), checked on the CPU: each variant is the book's update changed in one way
only (its losses equal the book's), the background stream yields the same batches, and the report's targets. The
CUDA-graphs variant needs CUDA: here its buckets and its padding (msgcore.cuda_graphs) are checked, and that the bench
skips it with one line."""
import importlib.util

import pytest
import torch

from msgcore import bench_gpu, cuda_graphs
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


# ---- CUDA graphs over bucketed shapes: the padding, checked on the CPU --------------------------------------------

def bench_shapes(max_tokens: int) -> list[tuple[int, int, int]]:
    """(B, S, T) of the bench's batches at `max_tokens` (bench_gpu.train_row's data: 10 warm-up, 40 timed)."""
    data = random_corpus(max(64, 55 * max_tokens // sum(bench_gpu.LENGTHS) * 2), seed=0)
    batches = token_batches(example_lengths(data), max_tokens, shuffle=True, seed=0)
    return [cuda_graphs.shape_of_indices(data, idx) for idx in batches]


@pytest.mark.parametrize("max_tokens", [8192, 2048, 512])
def test_every_batch_maps_to_a_bucket_at_least_as_large_and_the_buckets_are_few(max_tokens):
    shapes = bench_shapes(max_tokens)
    buckets = [cuda_graphs.bucket_of(shape) for shape in shapes]
    for (rows, source, target), (b_rows, b_source, b_target) in zip(shapes, buckets):
        assert rows <= b_rows <= 1.25 * rows  # at most a quarter more rows
        assert source <= b_source < source + cuda_graphs.LENGTH_STEP and b_source % cuda_graphs.LENGTH_STEP == 0
        assert target <= b_target < target + cuda_graphs.LENGTH_STEP and b_target % cuda_graphs.LENGTH_STEP == 0
    assert len(shapes) > 60 and len(set(buckets)) <= 12  # one graph per bucket: a few captures, not one per batch
    padded = sum(b * (s + t) for b, s, t in buckets) / sum(b * (s + t) for b, s, t in shapes)
    assert padded < 1.3


def test_the_buckets_are_bounded_for_any_shape():
    shapes = [(rows, source, target) for rows in range(1, 1025) for source in (1, 7, 8, 9, 63) for target in (5, 64)]
    buckets = {cuda_graphs.bucket_of(shape) for shape in shapes}
    rows = {b[0] for b in buckets}
    assert len(rows) <= 4 * 10 + 1  # four row sizes per doubling, 2^0 .. 2^10
    assert all(cuda_graphs.round_rows(r) >= r for r in range(1, 5000))
    assert cuda_graphs.round_rows(300) == 320 and cuda_graphs.round_rows(513) == 640 and cuda_graphs.round_rows(7) == 7
    assert cuda_graphs.round_length(1021, limit=1024) == 1024 and cuda_graphs.round_length(1030, limit=1024) == 1030


def test_a_batch_shape_is_read_off_the_lengths_as_collate_makes_it():
    data = random_corpus(40)
    idx = [3, 17, 5, 30]
    assert cuda_graphs.shape_of_indices(data, idx) == cuda_graphs.shape_of(bench_gpu.collate(data, idx))


def test_a_padded_batch_gives_the_unpadded_loss_and_gradients_in_fp32():
    torch.manual_seed(0)
    model = bench_gpu.Transformer(bench_gpu.preset("tiny", vocab_size=bench_gpu.VOCAB, pad_id=bench_gpu.PAD,
                                                   dropout=0.0))
    data = random_corpus(60)
    for idx in token_batches(example_lengths(data), 256, shuffle=True, seed=0)[:3]:
        batch = bench_gpu.collate(data, idx)
        padded = cuda_graphs.pad_to_bucket(batch, (len(idx) + 5, batch.sources[0].size(1) + 11,
                                                   batch.target_in.size(1) + 9))  # rows and columns of padding
        assert padded.num_target_tokens == batch.num_target_tokens
        losses, grads = [], []
        for b in (batch, padded):
            model.zero_grad()
            loss = model.loss(b, 0.1) / batch.num_target_tokens
            loss.backward()
            losses.append(loss.item())
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
        assert losses[1] == pytest.approx(losses[0], abs=1e-5) and torch.isfinite(grads[1]).all()
        assert torch.allclose(grads[1], grads[0], atol=1e-6, rtol=1e-4)


def test_a_batch_that_does_not_fit_its_bucket_is_refused():
    batch = bench_gpu.collate(random_corpus(10), list(range(10)))
    with pytest.raises(bench_gpu.MsgcoreError, match="does not fit the bucket"):
        cuda_graphs.pad_to_bucket(batch, (9, 64, 64))


def test_the_bucketed_update_takes_the_books_updates_with_the_same_losses(tmp_path):
    """The graphs' update run eagerly on padded batches: its losses and weights are the book's, in fp32."""
    data = random_corpus(120)
    batches = token_batches(example_lengths(data), 256, shuffle=True, seed=0)[:3]
    runs = []
    for bucketed in (False, True):
        model = bench_gpu.build("book", bench_gpu.preset("tiny", vocab_size=bench_gpu.VOCAB, pad_id=bench_gpu.PAD,
                                                         dropout=0.0))
        cfg = bench_gpu.TrainConfig(max_tokens=256, amp="fp32", progress=False, warmup_steps=100)
        trainer = bench_gpu.Trainer(model, None, data, None, None, cfg, CPU, str(tmp_path))
        update = cuda_graphs.BucketedUpdate(trainer) if bucketed else trainer
        losses = [float(update.train_step([bench_gpu.collate(data, idx)])[0]) for idx in batches]
        runs.append((losses, torch.cat([p.detach().flatten() for p in model.parameters()]), trainer))
    (book, book_weights, book_trainer), (padded, padded_weights, padded_trainer) = runs
    assert padded == pytest.approx(book, abs=1e-5)
    assert torch.allclose(padded_weights, book_weights, atol=1e-5)
    assert padded_trainer.state.step == 3
    assert padded_trainer.scheduler.get_last_lr() == book_trainer.scheduler.get_last_lr()
    assert padded_trainer.state.target_tokens == book_trainer.state.target_tokens


def test_without_cuda_the_graphs_variant_is_skipped_with_one_line_and_the_bench_goes_on(tmp_path, capsys):
    with pytest.raises(bench_gpu.MsgcoreError, match="^CUDA graphs need a CUDA device, not cpu$"):
        bench_gpu.golden_losses(bench_gpu.GRAPHS, "tiny", 256, CPU, updates=1)  # a worker reports this one line
    capsys.readouterr()
    assert bench_gpu.main(["--device", "cpu", "--quick", "--no-hf", "--variants", bench_gpu.GRAPHS,
                           "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("skipped CUDA graphs: CUDA graphs need a CUDA device, this is cpu")
    text = next(tmp_path.glob("*.md")).read_text()
    assert "Skipped: CUDA graphs: CUDA graphs need a CUDA device, this is cpu" in text and "Failed" not in text


def test_the_report_says_how_many_graphs_were_captured_and_how_long_it_took():
    r = report(book=10.0, **{bench_gpu.GRAPHS: 5.0})
    r["train"][1].update({"graphs": 9, "capture s": 2.25})
    text = bench_gpu.markdown(r)
    assert "CUDA graphs, small at 8,192 tokens: 9 graphs (one per bucket) captured in 2.2 s, within its warm-up s." \
        in text
    assert bench_gpu.GRAPHS in bench_gpu.VARIANTS and bench_gpu.VARIANTS[-1] == "torch.compile"


def test_the_weights_and_optimizer_state_that_warm_ups_change_are_put_back_in_place():
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    saved = cuda_graphs.snapshot(optimizer)  # before the first step: no optimizer state yet
    weight = model.weight
    for _ in range(2):
        model(torch.ones(4, 3)).sum().backward()
        optimizer.step()
    state = optimizer.state[weight]
    moments = state["exp_avg"]
    assert not torch.equal(weight, saved[id(weight)]) and moments.abs().sum() > 0
    cuda_graphs.restore(optimizer, saved)
    assert torch.equal(weight, saved[id(weight)]) and model.weight is weight  # the same tensor: a graph holds it
    assert state["exp_avg"] is moments and moments.abs().sum() == 0 and float(state["step"]) == 0  # fresh AdamW


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler")  # no optimizer step here: the schedule alone
def test_the_capturable_optimizer_keeps_the_books_schedule_in_a_tensor(tmp_path):
    model = bench_gpu.build("book", bench_gpu.preset("tiny", vocab_size=bench_gpu.VOCAB))
    book = bench_gpu.trainer_for("book", model, random_corpus(50), 256, CPU, str(tmp_path))
    trainer = bench_gpu.trainer_for("book", model, random_corpus(50), 256, CPU, str(tmp_path))
    cuda_graphs.capturable_adamw(trainer)
    group = trainer.optimizer.param_groups[0]
    assert group["capturable"] and group["fused"] and isinstance(group["lr"], torch.Tensor)
    assert trainer.scheduler.optimizer is trainer.optimizer
    for _ in range(3):
        assert float(group["lr"]) == pytest.approx(book.optimizer.param_groups[0]["lr"], rel=1e-6)
        trainer.scheduler.step()
        book.scheduler.step()
