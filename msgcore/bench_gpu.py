"""The GPU bench: what a `small` update costs on a GPU, what each change of the update buys, and HF's BART beside it.

    python -m msgcore.bench_gpu                  # on a GPU: book/benchmarks/gpu/<device>.json and .md
    python -m msgcore.bench_gpu --tokens 8192    # only the target setting (8,192 tokens per batch)
    python -m msgcore.bench_gpu --quick          # the `tiny` preset, a few updates, on any device: a check of the path

On one H200, the book, HF and two variants at both settings took about 4 minutes in fresh processes; torch.compile's
first compile took 172 s more.

On a GPU a `small`-preset update (d = 256, 3 + 3 layers) is launch-bound: the matrix work is a small part of the
step, the rest is the host dispatching kernels one by one. Each variant changes one thing of the book's update
(`Trainer.train_step` in bf16 autocast with the fused AdamW, as every chapter trains on a GPU) and is timed on the
same token batches, after warm-up, each in a fresh process (so that no variant finds a cache another one filled):

    book                     the chapters' path as it stands (on a GPU, SDPA's kernels but cuDNN's attention:
                             attention.GPU_SDPA_BACKENDS)
    cuDNN attention allowed  SDPA may pick cuDNN's attention too (torch's own choice), which builds an execution
                             plan for every new shape
    foreach AdamW            the multi-tensor AdamW instead of the fused one: what the fused kernel buys
    background collate       the next batch collated, pinned and copied in a thread while this one trains
    CUDA graphs              each batch padded to one of a few bucket shapes, and the whole update (forward,
                             backward, clipping, the fused AdamW made capturable) captured as one CUDA graph per
                             bucket and replayed: one launch where the host launched every kernel
                             (msgcore.cuda_graphs). The captures are in the warm-up seconds, their count and time
                             in the report. CUDA only: on another device the bench skips it with one line
    torch.compile            the model's loss compiled (forward and loss; AOTAutograd compiles the backward),
                             dynamic shapes; the compile time is in the variant's warm-up seconds, not hidden

Golden check: from the same initial weights, with dropout off, every variant takes the same `GOLDEN_UPDATES`
updates on the same batches; the report gives the largest gap between its losses and the book's.

Beside them, HF transformers' `BartForConditionalGeneration` at the same dimensions (`HFBart`), wrapped so that the
book's own `Trainer` trains it: the same batches, bf16 autocast, fused AdamW, schedule, clipping, label-smoothed
loss and SDPA kernels, so that the ratio measures the model code alone. Decoding: beam 5 over the same 192 random
sources in batches of 64 by both, after one warm-up batch. The sources are random token ids at Multi30k's lengths
(msgcore.probe), so the bench needs no data.
"""
from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import re
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from queue import Empty
from typing import Callable, Iterator

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from msgcore import attention
from msgcore.batching import EncodedCorpus, collate, example_lengths, token_batches
from msgcore.cuda_graphs import GraphedUpdate, shape_of_indices
from msgcore.generation import GenerationConfig
from msgcore.loss import label_smoothed_cross_entropy
from msgcore.model import Transformer, TransformerConfig, preset
from msgcore.probe import (BOS, EOS, LENGTHS, PAD, VOCAB, book_precision, random_corpus, where_the_time_goes,
                           write_report)
from msgcore.trainer import Trainer, TrainConfig, lr_schedule, native_bf16
from msgcore.utils import MsgcoreError, device_name, git_commit, resolve_device

REPORTS = Path(__file__).resolve().parent.parent / "book" / "benchmarks" / "gpu"
SETTINGS = (("small", 8192), ("small", 2048))  # (preset, tokens per batch); the first is the target's setting
QUICK_SETTINGS = (("tiny", 512),)
GRAPHS = "CUDA graphs"
VARIANTS = ("book", "cuDNN attention allowed", "foreach AdamW", "background collate", GRAPHS, "torch.compile")
HF = "HF BART"
GOLDEN_UPDATES = 20
DECODE_BATCH, DECODE_BATCHES = 64, 4  # the first batch warms up
TARGETS = {"ms per update, small at 8192 tokens": 5.0, "training throughput vs HF": 1.3,
           "decoding throughput vs HF": 2.0}


# ---- the models ------------------------------------------------------------------------------------------------

class HFBart(nn.Module):
    """HF's BartForConditionalGeneration at a TransformerConfig's dimensions, with the hooks `Trainer` calls.

    # Deviation: BART itself is post-norm with learned positions and GELU; its cost per update is the same matrix
    work as ours at the same dimensions, which is what the ratio compares.
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        from transformers import BartConfig, BartForConditionalGeneration

        self.cfg = cfg
        self.bart = BartForConditionalGeneration(BartConfig(
            vocab_size=cfg.vocab_size, d_model=cfg.d_model, encoder_layers=cfg.encoder_layers,
            decoder_layers=cfg.decoder_layers, encoder_attention_heads=cfg.n_heads,
            decoder_attention_heads=cfg.n_heads, encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff,
            dropout=cfg.dropout, attention_dropout=0.0, activation_dropout=0.0, activation_function="relu",
            max_position_embeddings=cfg.max_positions, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS,
            decoder_start_token_id=BOS, forced_eos_token_id=None, scale_embedding=True, tie_word_embeddings=True))

    def parameter_groups(self) -> list[dict]:
        return [{"params": list(self.parameters()), "lr_scale": 1.0}]

    @staticmethod
    def kernels(device: torch.device):
        """The book's SDPA kernels on a GPU (attention.GPU_SDPA_BACKENDS), so that both models run the same ones."""
        return sdpa_kernel(attention.GPU_SDPA_BACKENDS) if device.type == "cuda" else contextlib.nullcontext()

    def loss(self, batch, label_smoothing: float = 0.0) -> torch.Tensor:
        with self.kernels(batch.target_in.device):
            logits = self.bart(input_ids=batch.sources[0], attention_mask=batch.source_masks[0],
                               decoder_input_ids=batch.target_in, decoder_attention_mask=batch.target_mask).logits
        return label_smoothed_cross_entropy(logits.flatten(0, 1), batch.target_out.flatten(), PAD, label_smoothing)

    def generate(self, sources, source_masks, bos: int, eos: int, cfg: GenerationConfig) -> list[list[int]]:
        """Beam search to the batch's longest source + `max_len_b` new tokens; the hypotheses without </s>."""
        tokens, mask = sources[0], source_masks[0]
        new_tokens = int(cfg.max_len_a * tokens.size(1)) + cfg.max_len_b
        with self.kernels(tokens.device):
            out = self.bart.generate(input_ids=tokens, attention_mask=mask, num_beams=cfg.beam_size,
                                     do_sample=False, max_new_tokens=new_tokens,
                                     decoder_start_token_id=bos, eos_token_id=eos, pad_token_id=PAD)
        return [[t for t in row[1:].tolist() if t not in (PAD, eos)] for row in out]


def build(name: str, cfg: TransformerConfig) -> nn.Module:
    torch.manual_seed(0)
    return HFBart(cfg) if name == HF else Transformer(cfg)


def trainer_for(variant: str, model: nn.Module, data: EncodedCorpus, max_tokens: int, device: torch.device,
                out: str) -> Trainer | GraphedUpdate:
    """The book's Trainer, changed as `variant` says (for CUDA graphs, wrapped: its `train_step` replays graphs)."""
    cfg = TrainConfig(max_tokens=max_tokens, amp=book_precision(device), progress=False, warmup_steps=100)
    trainer = Trainer(model, None, data, None, None, cfg, device, out)
    if variant == "foreach AdamW":
        groups = [{"params": g["params"], "lr": g["initial_lr"]} for g in trainer.optimizer.param_groups]
        trainer.optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=1e-8,
                                              weight_decay=cfg.weight_decay, foreach=True, fused=False)
        trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer,
                                                              lr_schedule(cfg.schedule, cfg.warmup_steps))
    elif variant == "torch.compile":
        model.loss = torch.compile(model.loss, dynamic=True)  # the instance's loss: Trainer.loss_sum calls it
    elif variant == GRAPHS:
        return GraphedUpdate(trainer)
    return trainer


# ---- the batches -----------------------------------------------------------------------------------------------

def on_device(data: EncodedCorpus, idx: list[int], device: torch.device, pin: bool = False):
    """One batch on `device` with its host-side counts (source tokens, target tokens)."""
    batch = collate(data, idx)
    counts = Trainer.source_tokens(batch), batch.num_target_tokens
    if pin and device.type == "cuda":
        return batch.pin_memory().to(device, non_blocking=True), counts
    return batch.to(device), counts


def batch_stream(variant: str, data: EncodedCorpus, batches: list[list[int]], device: torch.device) -> Iterator:
    """The batches on `device` in order: collated on this thread, or one ahead in a background thread."""
    if variant != "background collate":
        for idx in batches:
            yield on_device(data, idx, device)
        return
    with ThreadPoolExecutor(1) as pool:
        ahead = pool.submit(on_device, data, batches[0], device, True)
        for idx in batches[1:] + [None]:
            current = ahead.result()
            if idx is not None:
                ahead = pool.submit(on_device, data, idx, device, True)
            yield current


# ---- the measurements ------------------------------------------------------------------------------------------

def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_row(variant: str, preset_name: str, max_tokens: int, device: torch.device, steps: int, warmup: int,
              profile: bool = False) -> dict:
    """ms per update (median) and target tokens/s of `steps` updates after `warmup` (whose seconds, a compile
    included, are reported); with `profile`, torch.profiler's table of 5 more updates."""
    cfg = preset(preset_name, vocab_size=VOCAB, pad_id=PAD, dropout=0.1)
    model = build(variant, cfg)
    data = random_corpus(max(64, (warmup + steps + 5) * max_tokens // (LENGTHS[0] + LENGTHS[1]) * 2), seed=0)
    batches = token_batches(example_lengths(data), max_tokens, shuffle=True, seed=0)[:warmup + steps]
    with tempfile.TemporaryDirectory() as out:
        trainer = trainer_for(variant if variant != HF else "book", model, data, max_tokens, device, out)
        times, tokens, start = [], 0, time.perf_counter()
        warmup_s = 0.0
        if isinstance(trainer, GraphedUpdate):  # every bucket's graph before the timed updates, in the warm-up s
            trainer.capture([shape_of_indices(data, idx) for idx in batches])
        for i, (batch, (source_tokens, target_tokens)) in enumerate(batch_stream(variant, data, batches, device)):
            if i == warmup:
                synchronize(device)
                warmup_s = time.perf_counter() - start
            begin = time.perf_counter()
            _, n = trainer.train_step([batch], source_tokens, target_tokens)
            synchronize(device)  # each update timed on its own: the host may not run ahead of the device
            if i >= warmup:
                times.append(time.perf_counter() - begin)
                tokens += n

        def five_updates():
            for batch, (source_tokens, target_tokens) in batch_stream(variant, data, batches[:5], device):
                trainer.train_step([batch], source_tokens, target_tokens)

        table = where_the_time_goes(five_updates, device) if profile else None
    return {"variant": variant, "preset": preset_name, "tokens per batch": max_tokens,
            "ms per update": 1000 * statistics.median(times), "mean ms per update": 1000 * statistics.mean(times),
            "target tokens/s": tokens / sum(times),
            "updates timed": len(times), "warm-up s": warmup_s, **graph_counts(trainer),
            **({"profile": table} if table else {})}


def graph_counts(trainer) -> dict:
    """For CUDA graphs, how many were captured (one per bucket) and the seconds their captures took."""
    if not isinstance(trainer, GraphedUpdate):
        return {}
    return {"graphs": trainer.graphs, "capture s": trainer.capture_s}


def golden_losses(variant: str, preset_name: str, max_tokens: int, device: torch.device,
                  updates: int = GOLDEN_UPDATES) -> list[float]:
    """The losses of `updates` updates with dropout off, from the seed-0 weights, on the seed-0 batches."""
    model = build(variant, preset(preset_name, vocab_size=VOCAB, pad_id=PAD, dropout=0.0))
    data = random_corpus(max(64, (updates + 2) * max_tokens // (LENGTHS[0] + LENGTHS[1]) * 2), seed=0)
    batches = token_batches(example_lengths(data), max_tokens, shuffle=True, seed=0)[:updates]
    losses = []
    with tempfile.TemporaryDirectory() as out:
        trainer = trainer_for(variant, model, data, max_tokens, device, out)
        for batch, (source_tokens, target_tokens) in batch_stream(variant, data, batches, device):
            loss, _ = trainer.train_step([batch], source_tokens, target_tokens)
            losses.append(float(loss))
    return losses


def decode_row(name: str, preset_name: str, device: torch.device) -> dict:
    """Beam-5 decoding of DECODE_BATCHES batches of DECODE_BATCH random sources (the first one warms up)."""
    model = build(name, preset(preset_name, vocab_size=VOCAB, pad_id=PAD)).to(device).eval()
    cfg = GenerationConfig(beam_size=5, max_len_a=1.0, max_len_b=5)
    data = random_corpus(DECODE_BATCHES * DECODE_BATCH, seed=1)
    amp = torch.bfloat16 if native_bf16(device) else None
    generated, sentences, start = 0, 0, 0.0
    with torch.no_grad(), torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
        for i in range(DECODE_BATCHES):
            b = collate(data, list(range(i * DECODE_BATCH, (i + 1) * DECODE_BATCH))).to(device)
            hypotheses = model.generate(b.sources, b.source_masks, BOS, EOS, cfg)
            synchronize(device)
            if i == 0:
                start = time.perf_counter()
                continue
            generated, sentences = generated + sum(len(h) for h in hypotheses), sentences + len(hypotheses)
    seconds = time.perf_counter() - start
    return {"variant": name, "preset": preset_name, "generated tokens/s": generated / seconds,
            "ms per sentence": 1000 * seconds / sentences, "generated tokens": generated}


# ---- one measurement, one process -------------------------------------------------------------------------------

MEASUREMENTS = {"train": lambda *a: train_row(*a), "golden": lambda *a: golden_losses(*a),
                "decode": lambda *a: decode_row(*a)}


class MeasurementFailed(Exception):
    """A measurement's process failed: its error, or how it exited."""


def worker(kind: str, variant: str, args: tuple, queue) -> None:
    if variant == "cuDNN attention allowed":  # this process only
        attention.GPU_SDPA_BACKENDS.append(SDPBackend.CUDNN_ATTENTION)
    try:
        queue.put(MEASUREMENTS[kind](variant, *args))
    except Exception as error:  # the bench goes on without this row, and the report says why
        queue.put(MeasurementFailed(f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"))


def isolated(kind: str, variant: str, *args, fresh: bool = True):
    """One measurement (`MEASUREMENTS[kind]`) of `variant` in a fresh process (`fresh`), or here. A failure in the
    process, or its death, is a MeasurementFailed."""
    if not fresh:
        return MEASUREMENTS[kind](variant, *args)
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=worker, args=(kind, variant, args, queue))
    process.start()
    while True:
        try:
            result = queue.get(timeout=5)
            break
        except Empty:
            if not process.is_alive() and queue.empty():
                raise MeasurementFailed(f"its process exited with code {process.exitcode}") from None
    process.join()
    if isinstance(result, MeasurementFailed):
        raise result
    return result


# ---- the report ------------------------------------------------------------------------------------------------

def bench(device: torch.device, quick: bool = False, with_hf: bool = True, only: list[str] | None = None,
          fresh: bool = True, tokens: list[int] | None = None,
          save: Callable[[dict], None] = lambda report: None) -> dict:
    """Every row, in the order that keeps the cheap ones first; `save(report)` after each, so that a command cut
    off by its time limit still leaves what it measured."""
    settings = QUICK_SETTINGS if quick else tuple(s for s in SETTINGS if not tokens or s[1] in tokens)
    if not settings:
        raise MsgcoreError(f"--tokens {tokens} names no setting; choose from {[s[1] for s in SETTINGS]}")
    steps, warmup = (4, 2) if quick else (40, 10)  # torch.compile warms up for twice as many: its recompiles
    golden_updates = 3 if quick else GOLDEN_UPDATES
    variants = [v for v in (only or VARIANTS + (HF,)) if with_hf or v != HF]  # in the order asked
    report = {"device": device_name(device), "torch": torch.__version__, "commit": git_commit(),
              "precision": book_precision(device), "quick": quick, "fresh processes": fresh, "train": [], "golden": {}, "decode": []}
    variants = runnable(variants, device, report)
    last = [v for v in variants if v != "torch.compile"] + ["torch.compile"] * ("torch.compile" in variants)
    target_preset, target_tokens = settings[0]
    for variant in last:
        for preset_name, tokens in settings:
            profile = (preset_name, tokens) == settings[0] and variant in ("book", "torch.compile", HF)
            row = attempt(report, f"train {variant}, {preset_name} at {tokens}", isolated, "train", variant,
                          preset_name, tokens, device, steps, warmup * (2 if variant == "torch.compile" else 1),
                          profile, fresh=fresh)
            if row:
                report["train"].append(row)
                print(f"{variant}, {preset_name} at {tokens} tokens: {row['ms per update']:.2f} ms per update "
                      f"(warm-up {row['warm-up s']:.1f} s)", flush=True)
            save(report)
        if variant != HF:
            losses = attempt(report, f"golden {variant}", isolated, "golden", variant, target_preset, target_tokens,
                             device, golden_updates, fresh=fresh)
            if losses:
                report["golden"][variant] = losses
            save(report)
        if variant in ("book", "cuDNN attention allowed", HF):
            row = attempt(report, f"decode {variant}", isolated, "decode", variant, settings[0][0], device,
                          fresh=fresh)
            if row:
                report["decode"].append(row)
                print(f"{variant}, beam 5: {row['generated tokens/s']:,.0f} generated tokens/s", flush=True)
            save(report)
    return report


def runnable(variants: list[str], device: torch.device, report: dict) -> list[str]:
    """The variants that `device` can run; each one left out is one line in the report's "skipped" list."""
    if GRAPHS in variants and device.type != "cuda":
        why = (f"{GRAPHS}: CUDA graphs need a CUDA device, this is {device.type} (tests/test_bench_gpu.py checks "
               "its bucket padding on the CPU)")
        report.setdefault("skipped", []).append(why)
        print(f"skipped {why}", file=sys.stderr, flush=True)
    return [v for v in variants if v != GRAPHS or device.type == "cuda"]


def attempt(report: dict, what: str, measure: Callable, *args, **kwargs):
    """`measure(*args, **kwargs)`, or None after a MeasurementFailed, which the report's "failed" list keeps."""
    try:
        return measure(*args, **kwargs)
    except MeasurementFailed as error:
        report.setdefault("failed", []).append(f"{what}: {error}")
        print(f"{what} failed: {error}", file=sys.stderr, flush=True)
        return None


def golden_gap(report: dict, variant: str) -> float | None:
    """The largest |loss - book's loss| over the golden updates, or None when either was not measured."""
    book, other = report["golden"].get("book"), report["golden"].get(variant)
    if not book or not other:
        return None
    return max(abs(a - b) for a, b in zip(book, other))


def summary(report: dict) -> dict[str, float]:
    """The targets' measures: the fastest variant at the target setting (median ms), and the ratios of the book's
    path to HF, which runs the same kernels, in training (target tokens/s) and in beam-5 decoding (generated
    tokens/s). A variant's ratio to HF would not be like for like."""
    out = {}
    first = report["train"][0] if report["train"] else None
    if first is None:
        return out
    setting = (first["preset"], first["tokens per batch"])
    ours = [r for r in report["train"] if (r["preset"], r["tokens per batch"]) == setting and r["variant"] != HF]
    best = min(ours, key=lambda r: r["ms per update"])
    out[f"ms per update, {setting[0]} at {setting[1]} tokens"] = best["ms per update"]
    out["fastest variant"] = best["variant"]
    hf = [r for r in report["train"] if (r["preset"], r["tokens per batch"]) == setting and r["variant"] == HF]
    book = next((r for r in ours if r["variant"] == "book"), None)
    if hf and book:
        out["training throughput vs HF"] = book["target tokens/s"] / hf[0]["target tokens/s"]
    decode = {r["variant"]: r for r in report["decode"]}
    if "book" in decode and HF in decode:
        out["decoding throughput vs HF"] = decode["book"]["generated tokens/s"] / decode[HF]["generated tokens/s"]
    return out


def cell(value) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 1 else f"{value:,.1f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def measured_how(report: dict) -> list[str]:
    """How the report's rows were measured: in fresh processes or in one, and with which SDPA kernels."""
    lines = []
    if "fresh processes" in report:
        lines.append("Each measurement in a fresh process." if report["fresh processes"] else
                     "Every measurement in one process, in the table's order: a row may reuse what an earlier one "
                     "built (compiled kernels, cuDNN's plans).")
    if report.get("sdpa"):
        lines.append(f"SDPA kernels: {report['sdpa']}.")
    return ["", " ".join(lines)] if lines else []


def markdown(report: dict) -> str:
    """The report as Markdown: the variants, the golden gaps, decoding, the targets, then the profiler tables."""
    lines = [f"GPU bench on {report['device']} (torch {report['torch']}, commit {report['commit']}, precision "
             f"{report['precision']}).", *measured_how(report), "",
             "| variant | preset | tokens per batch | median ms per update | mean ms per update | target tokens/s | "
             "× book | warm-up s | golden max abs loss gap |", "|" + " --- |" * 9]
    book = {(r["preset"], r["tokens per batch"]): r for r in report["train"] if r["variant"] == "book"}
    for r in report["train"]:
        base = book.get((r["preset"], r["tokens per batch"]))
        ratio = r["target tokens/s"] / base["target tokens/s"] if base else None
        gap = golden_gap(report, r["variant"]) if r["variant"] not in ("book", HF) else None
        lines.append("| " + " | ".join(cell(c) for c in (r["variant"], r["preset"], r["tokens per batch"],
                                                         r["ms per update"], r.get("mean ms per update"),
                                                         r["target tokens/s"], ratio, r["warm-up s"])) +
                     f" | {'–' if gap is None else f'{gap:.1e}'} |")
    if report["decode"]:
        lines += ["", "| beam 5, batch 64 | generated tokens/s | ms per sentence |", "| --- | --- | --- |"]
        lines += [f"| {r['variant']} | {cell(r['generated tokens/s'])} | {cell(r['ms per sentence'])} |"
                  for r in report["decode"]]
    graphs = [f"{r['variant']}, {r['preset']} at {r['tokens per batch']:,} tokens: {r['graphs']} graphs (one per "
              f"bucket) captured in {r['capture s']:.1f} s, within its warm-up s."
              for r in report["train"] if "graphs" in r]
    if graphs:
        lines += ["", *graphs]
    if report.get("skipped") or report.get("failed"):
        lines += ["", *(f"Skipped: {line}." for line in report.get("skipped", ())),
                  *(f"Failed: {failure}." for failure in report.get("failed", ()))]
    measured = summary(report)
    if measured:
        lines += ["", "| target | measured | goal |", "| --- | --- | --- |"]
        for key, goal in TARGETS.items():
            if key in measured:
                sign = "≤" if key.startswith("ms") else "≥"
                lines.append(f"| {key} | {cell(measured[key])} | {sign} {goal} |")
    for r in report["train"]:
        if r.get("profile"):
            lines += ["", f"Where the time goes ({r['variant']}, {r['preset']} at {r['tokens per batch']} tokens, "
                          "5 updates; torch.profiler, the most host time first):", "", "```",
                      r["profile"].rstrip(), "```"]
    return "\n".join(lines) + "\n"


def tables(report: dict) -> dict:
    """The report as pandas tables for a page: training rows, decoding rows, and the targets."""
    import pandas as pd

    book = {(r["preset"], r["tokens per batch"]): r["target tokens/s"] for r in report["train"]
            if r["variant"] == "book"}
    train = pd.DataFrame([{"variant": r["variant"], "tokens per batch": r["tokens per batch"],
                           "median ms per update": r["ms per update"],
                           "mean ms per update": r.get("mean ms per update"),
                           "target tokens/s": r["target tokens/s"],
                           "× book": r["target tokens/s"] / book[(r["preset"], r["tokens per batch"])]
                           if (r["preset"], r["tokens per batch"]) in book else None,
                           "warm-up s": r["warm-up s"],
                           "golden loss gap": golden_gap(report, r["variant"])} for r in report["train"]])
    decode = pd.DataFrame([{k: r[k] for k in ("variant", "generated tokens/s", "ms per sentence")}
                           for r in report["decode"]])
    measured = summary(report)
    targets = pd.DataFrame([{"target": key, "measured": measured[key],
                             "goal": ("≤ " if key.startswith("ms") else "≥ ") + f"{goal:g}",
                             "met": "yes" if (measured[key] <= goal if key.startswith("ms") else
                                              measured[key] >= goal) else "no"}
                            for key, goal in TARGETS.items() if key in measured])
    return {"training": train, "decoding": decode, "targets": targets}


def profile_totals(profile: str) -> dict[str, float]:
    """torch.profiler's closing totals ("Self CPU time total: 189.107ms"), in ms."""
    totals = {}
    for what, value, unit in re.findall(r"^Self (CPU|CUDA) time total: ([0-9.]+)(us|ms|s)$", profile, re.M):
        totals[what] = float(value) * {"us": 1e-3, "ms": 1.0, "s": 1000.0}[unit]
    return totals


def findings(report: dict) -> list[str]:
    """What a report says, in sentences printed from its numbers."""
    out = []
    rows = {(r["variant"], r["tokens per batch"]): r for r in report["train"]}
    first = report["train"][0]["tokens per batch"] if report["train"] else None
    book = rows.get(("book", first))
    for other in ("no cuDNN attention", "cuDNN attention allowed"):
        variant = rows.get((other, first))
        if book and variant and book.get("mean ms per update") and variant.get("mean ms per update"):
            with_cudnn, without = (book, variant) if other.startswith("no") else (variant, book)
            out.append(f"cuDNN's attention, at {first:,} tokens: a mean update of "
                       f"{with_cudnn['mean ms per update']:.1f} ms (median {with_cudnn['ms per update']:.1f}) "
                       f"with it, {without['mean ms per update']:.1f} ms (median {without['ms per update']:.1f}) "
                       f"without it: {without['target tokens/s'] / with_cudnn['target tokens/s']:.1f}× the "
                       "throughput. The mean is what a run pays: cuDNN builds a plan for every new batch shape.")
    decode = {r["variant"]: r for r in report["decode"]}
    for other in ("no cuDNN attention", "cuDNN attention allowed"):
        if "book" in decode and other in decode:
            with_cudnn, without = ((decode["book"], decode[other]) if other.startswith("no")
                                   else (decode[other], decode["book"]))
            out.append(f"Beam-5 decoding: {with_cudnn['generated tokens/s']:,.0f} generated tokens/s with cuDNN's "
                       f"attention, {without['generated tokens/s']:,.0f} without it (a new key length at every step "
                       "is a new plan).")
    for r in report["train"]:
        totals = profile_totals(r.get("profile", ""))
        if "CUDA" in totals and "CPU" in totals:
            out.append(f"{r['variant']} at {r['tokens per batch']:,} tokens, 5 profiled updates: the GPU's kernels "
                       f"ran {totals['CUDA'] / 5:.1f} ms per update, the host's torch operators "
                       f"{totals['CPU'] / 5:.1f} ms (the profiler slows the host): the update waits on the host, "
                       "launching kernels one by one.")
    return out


def write(report: dict, out: Path) -> Path:
    return write_report(report, markdown(report), out)


def main(argv: list[str] | None = None) -> int:
    from msgcore.options import OneLineParser, device_option

    parser = OneLineParser(prog="python -m msgcore.bench_gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--device", type=device_option, default="auto")
    parser.add_argument("--quick", action="store_true", help="tiny preset, a few updates: a check of the path")
    parser.add_argument("--no-hf", action="store_true", help="leave out HF's BART (transformers not installed)")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS) + [HF], help="only these (default: all)")
    parser.add_argument("--tokens", type=int, nargs="+", choices=[s[1] for s in SETTINGS],
                        help="only the settings of these tokens per batch (default: all)")
    parser.add_argument("--out", type=Path, default=REPORTS, help="folder of the report (<device>.json and .md)")
    args = parser.parse_or_exit_code(argv)
    if isinstance(args, int):
        return args
    try:
        device = resolve_device(args.device)
        if not args.no_hf:
            try:
                import transformers  # noqa: F401
            except ImportError:
                raise MsgcoreError("HF's BART needs transformers (pip install transformers), or pass --no-hf")
        report = bench(device, args.quick, not args.no_hf, args.variants, tokens=args.tokens,
                       save=lambda r: write(r, args.out))
    except MsgcoreError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(write(report, args.out).read_text(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
