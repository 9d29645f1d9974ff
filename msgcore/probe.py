"""The throughput probe: what one update and one beam-5 decode cost on this device, on the book's own code path.

    python -m msgcore.probe                    # into book/benchmarks/probe/ (its first version: 2.1 min on an H200)
    python -m msgcore.probe --quick            # a few updates of the `tiny` preset: a check of the path, no numbers

Each measurement runs in a fresh worker process. A training setting (preset, tokens per batch) times
`Trainer.train_step` on the real collate, in the book's precision for the device (bf16 on a GPU with native bf16),
after warm-up: milliseconds per update and target tokens per second, in 1 process, then in `PROCESSES` processes at
once on the same device (how chapters train their seeds side by side), whose summed throughput says what sharing
the device buys. Decoding times beam 5 after a warm-up batch: at batch 64, at the chapters' decoding batch
(`DECODE_TOKENS`) and at 4 times it. The batches are random token ids at Multi30k's lengths (8 to 32
pieces), so the probe needs no data and no tokenizer. Chapters size their recipes from this report's figures.
The updates of one setting (`PROFILED`) and the decoding at batch 64 are also profiled (torch.profiler): the
report says where their time goes.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from typing import Callable
from pathlib import Path

import torch

from msgcore.batching import EncodedCorpus, collate, example_lengths, token_batches
from msgcore.generation import GenerationConfig
from msgcore.model import Transformer, preset
from msgcore.trainer import DECODE_TOKENS, Trainer, TrainConfig, native_bf16
from msgcore.utils import MsgcoreError, atomic_write, device_name, git_commit, resolve_device

REPORTS = Path(__file__).resolve().parent.parent / "book" / "benchmarks" / "probe"
TRAIN_SETTINGS = (("small", 2048), ("small", 8192), ("base", 8192))  # (preset, tokens per batch)
QUICK_SETTINGS = (("tiny", 512),)
PROCESSES = (1, 3)  # processes training at once on the device
PROFILED = ("small", 8192)  # the training setting whose updates are profiled too (in 1 process)
VOCAB = 8000  # the book's joint vocabulary
LENGTHS = (8, 32)  # pieces per sentence, as Multi30k's
EOS, BOS, PAD = 3, 2, 0


def random_corpus(n: int, seed: int = 0) -> EncodedCorpus:
    """`n` sentence pairs of random ids at Multi30k's lengths (no data needed)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(*LENGTHS, (2, n), generator=g).tolist()
    ids = lambda k: torch.randint(4, VOCAB, (k,), generator=g).tolist()
    return EncodedCorpus([[ids(k) + [EOS] for k in lengths[0]]], [ids(k) for k in lengths[1]], BOS, EOS)


def book_precision(device: torch.device) -> str:
    """The precision a chapter trains in on `device` (TrainConfig.amp="auto" on a GPU; the CPU recipes' bf16)."""
    return "auto" if device.type == "cuda" else "bf16"


def where_the_time_goes(run: Callable[[], None], device: torch.device, rows: int = 15) -> str:
    """torch.profiler's table of `run()` (after the timed work: every kernel is loaded), the operators with the most
    host time first: on a launch-bound GPU the host's time is the step's, and the call counts show each sync
    (`cudaStreamSynchronize`, `cudaMemcpy`) and each launch."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)


def train_measure(preset_name: str, max_tokens: int, device: torch.device, steps: int, warmup: int,
                  profile: bool = False) -> dict:
    """ms per update and target tokens/s of `steps` timed updates after `warmup`, through Trainer.train_step;
    with `profile`, the profiler's table of 5 more updates."""
    torch.manual_seed(0)
    model = Transformer(preset(preset_name, vocab_size=VOCAB, pad_id=PAD, dropout=0.1))
    cfg = TrainConfig(max_tokens=max_tokens, amp=book_precision(device), progress=False, warmup_steps=100)
    data = random_corpus(40 * max_tokens // 20)
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(model, None, data, None, None, cfg, device, out)
        batches = token_batches(example_lengths(data), max_tokens, shuffle=True, seed=0)
        times, tokens = [], 0
        for i, idx in enumerate(batches[:warmup + steps]):
            start = time.perf_counter()
            batch = collate(data, idx)
            _, n = trainer.train_step([batch.to(device)], trainer.source_tokens(batch), batch.num_target_tokens)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i >= warmup:
                times.append(time.perf_counter() - start)
                tokens += n

        def five_updates():
            for idx in batches[:5]:
                batch = collate(data, idx)
                trainer.train_step([batch.to(device)], trainer.source_tokens(batch), batch.num_target_tokens)

        table = where_the_time_goes(five_updates, device) if profile else None
    return {"ms per update": 1000 * statistics.median(times), "target tokens/s": tokens / sum(times),
            "updates timed": len(times), **({"profile": table} if table else {})}


def decode_measure(preset_name: str, device: torch.device, batch: int | None = 64,
                   max_tokens: int | None = None, profile: bool = False) -> dict:
    """Beam-5 decoding of random sources: generated tokens/s and ms per sentence, after one untimed warm-up batch.

    Batches hold `batch` sentences, or as many as `max_tokens` (source tokens x beam) allows, as `translate_encoded`
    packs a chapter's decoding. The random model never prefers </s>, so every hypothesis runs to its length limit:
    the worst case of a trained model's decoding.
    """
    torch.manual_seed(0)
    model = Transformer(preset(preset_name, vocab_size=VOCAB, pad_id=PAD)).to(device).eval()
    cfg = GenerationConfig(beam_size=5, max_len_a=1.0, max_len_b=5)
    if max_tokens:
        data = random_corpus(3 * max_tokens // (cfg.beam_size * sum(LENGTHS) // 2), seed=1)  # about 3 batches
        batches = token_batches(example_lengths(data), max_tokens // cfg.beam_size, shuffle=False)
    else:
        data = random_corpus(4 * batch, seed=1)
        batches = [list(range(first, first + batch)) for first in range(0, len(data), batch)]
    amp = torch.bfloat16 if native_bf16(device) else None
    generated, sentences, start = 0, 0, None
    with torch.no_grad(), torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
        for i, idx in enumerate(batches):
            b = collate(data, idx).to(device)
            hypotheses = model.generate(b.sources, b.source_masks, BOS, EOS, cfg)
            if i == 0:  # the warm-up batch: CUDA's lazy kernel loading and the allocator's first blocks
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                start = time.perf_counter()
                continue
            generated, sentences = generated + sum(len(h) for h in hypotheses), sentences + len(idx)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start

    def one_batch():
        with torch.no_grad(), torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            b = collate(data, batches[1]).to(device)
            model.generate(b.sources, b.source_masks, BOS, EOS, cfg)

    table = where_the_time_goes(one_batch, device) if profile else None
    return {"generated tokens/s": generated / seconds, "ms per sentence": 1000 * seconds / sentences,
            "sentences per batch": round(sentences / (len(batches) - 1)), **({"profile": table} if table else {})}


def worker(spec: dict, queue) -> None:
    """One measurement in a fresh process (spec: kind, preset, tokens, device, steps, warmup)."""
    torch.set_num_threads(spec.get("threads", 2))
    device = torch.device(spec["device"])
    if spec["kind"] == "train":
        row = train_measure(spec["preset"], spec["tokens"], device, spec["steps"], spec["warmup"],
                            spec.get("profile", False))
    else:
        row = decode_measure(spec["preset"], device, spec.get("batch"), spec.get("max_tokens"),
                             spec.get("profile", False))
    queue.put(row)


def measure(spec: dict, processes: int) -> dict:
    """Run `processes` copies of one measurement at once; their median ms and summed throughput."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    workers = [ctx.Process(target=worker, args=(spec, queue)) for _ in range(processes)]
    for w in workers:
        w.start()
    rows = [queue.get() for _ in workers]
    for w in workers:
        w.join()
    numbers = [key for key in rows[0] if key != "profile"]
    out = {key: (sum(r[key] for r in rows) if "/s" in key else statistics.median(r[key] for r in rows))
           for key in numbers}
    return {**out, **({"profile": rows[0]["profile"]} if "profile" in rows[0] else {})}


def probe(device: torch.device, quick: bool = False, steps: int = 30, warmup: int = 10) -> dict:
    """Every setting: training in 1 and PROCESSES processes, then beam-5 decoding; the report as a dict."""
    settings = QUICK_SETTINGS if quick else TRAIN_SETTINGS
    steps, warmup = (3, 1) if quick else (steps, warmup)
    rows = []
    for preset_name, tokens in settings:
        for n in (1,) if quick else PROCESSES:
            spec = {"kind": "train", "preset": preset_name, "tokens": tokens, "device": str(device),
                    "steps": steps, "warmup": warmup,
                    "profile": n == 1 and (quick or (preset_name, tokens) == PROFILED)}
            rows.append({"measure": "train", "preset": preset_name, "tokens per batch": tokens, "processes": n,
                         **measure(spec, n)})
            print(f"train {preset_name} at {tokens} tokens, {n} process(es): {rows[-1]['ms per update']:.1f} ms "
                  f"per update", flush=True)
    decode = settings[0][0]
    book_tokens = DECODE_TOKENS.get(device.type, DECODE_TOKENS["cpu"])
    batches = ((64, None),) if quick else ((64, None), (None, book_tokens), (None, 4 * book_tokens))
    for batch, max_tokens in batches:
        spec = {"kind": "decode", "preset": decode, "device": str(device), "batch": batch, "max_tokens": max_tokens,
                "profile": batch is not None}
        what = f"batch {batch}" if batch else f"{max_tokens} tokens" + (" (the chapters')" if max_tokens ==
                                                                        book_tokens else "")
        rows.append({"measure": f"decode, beam 5, {what}", "preset": decode, "processes": 1, **measure(spec, 1)})
        print(f"{rows[-1]['measure']}: {rows[-1]['ms per sentence']:.2f} ms per sentence", flush=True)
    return {"device": device_name(device), "torch": torch.__version__, "commit": git_commit(),
            "precision": book_precision(device), "quick": quick, "rows": rows}


def markdown(report: dict) -> str:
    """The report as a Markdown table, with what was measured where."""
    columns = ["measure", "preset", "tokens per batch", "processes", "ms per update", "target tokens/s",
               "sentences per batch", "generated tokens/s", "ms per sentence"]
    lines = [f"Probe on {report['device']} (torch {report['torch']}, commit {report['commit']}, precision "
             f"{report['precision']}).", "", "| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    for row in report["rows"]:
        cells = [row.get(c, "–") for c in columns]
        lines.append("| " + " | ".join(f"{c:,.1f}" if isinstance(c, float) else str(c) for c in cells) + " |")
    for row in report["rows"]:
        if row.get("profile"):
            what = f"{row['measure']}, {row['preset']}" + (f" at {row['tokens per batch']} tokens"
                                                           if "tokens per batch" in row else "")
            lines += ["", f"Where the time goes ({what}; torch.profiler, the most host time first):", "", "```",
                      row["profile"].rstrip(), "```"]
    return "\n".join(lines) + "\n"


def write_report(report: dict, text: str, out: Path) -> Path:
    """`report` as out/<device>.json and its Markdown `text` as out/<device>.md, each written whole or not at all;
    returns the .md path (the GPU bench writes its reports this way too)."""
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in report["device"]).strip("-").lower()
    out.mkdir(parents=True, exist_ok=True)
    for suffix, content in ((".json", json.dumps(report, indent=1)), (".md", text)):
        with atomic_write(out / f"{name}{suffix}", "w") as f:
            f.write(content)
    return out / f"{name}.md"


def main(argv: list[str] | None = None) -> int:
    from msgcore.options import OneLineParser, device_option

    parser = OneLineParser(prog="python -m msgcore.probe", description=__doc__.splitlines()[0])
    parser.add_argument("--device", type=device_option, default="auto")
    parser.add_argument("--quick", action="store_true", help="tiny preset, a few updates: a check of the path")
    parser.add_argument("--out", type=Path, default=REPORTS, help="folder of the report (<device>.json and .md)")
    args = parser.parse_or_exit_code(argv)
    if isinstance(args, int):
        return args
    try:
        device = resolve_device(args.device)
        report = probe(device, args.quick)
    except MsgcoreError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    write_report(report, markdown(report), args.out)
    print(markdown(report), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
