"""What a chapter costs on a GPU: measured where a GPU executed it, otherwise estimated from what the book measured.

A chapter records its cold cost when it is executed (`msgcore.book.record_cost`): the page's own minutes and every
run-cache entry behind it, with that entry's minutes. A training run's log (`book/logs/<run>/log.json`, committed
with the chapter) splits its minutes into updates and the rest: validation decoding, checkpoints, data. The
estimate for a GPU moves each part at its own measured speed:

    updates       × the GPU's measured ms per update (`python -m msgcore.probe`: the book's update on the device)
    the rest      ÷ the measured decoding speed-up, GPU over CPU (`msgcore.bench_gpu` and `msgcore.bench`, beam 5)

On an H100-class GPU the seeds train side by side (`PROCESSES`, as `python -m msgcore.offline run --parts 3` runs
them; the probe measures the update in that many processes at once); the page itself runs once. A Colab T4 runs one
process at a time: its virtual machine has 2 vCPUs.

# Deviation: no T4 was measured. At the book's `small` update the GPU waits on the host, which launches its many
# small kernels one by one (the H200's profile in book/benchmarks/gpu/ shows it), so a T4 is taken at the H200's
# measured one-process time, unless arithmetic at the T4's datasheet peak would take longer (`t4_ms_per_update`).
# Deviation: every update is timed as the book's Transformer update. A paper's model that launches more kernels per
# update (MixRep's two streams and two decoders, say) takes longer there, so its estimate is low by up to that factor.
# Deviation: a CPU run that trained on 1 of 2 cores, beside another process, spent its validations and checkpoints
# at one thread's speed, so its "other" minutes, moved at the 2-thread decoding speed-up, are high by up to that
# ratio (2 threads over 1). They are a few percent of a chapter's minutes; the updates do not depend on the CPU.
# Every number computed here is labelled an estimate wherever it is shown.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from msgcore.utils import MsgcoreError

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = REPO_ROOT / "book" / "benchmarks"
LOGS = REPO_ROOT / "book" / "logs"

PROBE = "probe/nvidia-h200.json"  # the book's update on the lent H200, in 1 and in PROCESSES processes
GPU_DECODE = "gpu/nvidia-h200-without-cudnn.json"  # beam 5 at batch 64 with the book's GPU kernels (no cuDNN attention)
CPU_REPORT = "cpu--x86-64--2-threads.json"  # the same decoding on the 2 CPU threads the CPU chapters ran on
PROCESSES = 3  # seeds side by side on one H100-class GPU
T4_PEAK_FLOPS = 65e12  # FLOP/s, fp16 tensor cores: NVIDIA's T4 datasheet (a T4 has no native bf16)
RECIPE_BATCH = {"small": ("small", 2048), "full": ("small", 8192)}  # scale -> (preset, tokens per batch), chapter 0's
RUN_ENTRIES = ("run-", "natcurve-")  # the cache entries that are training runs, each with its log.json: a
#                                    `train_model` run, and a run that records a curve (chapter 5's phase 1)


@dataclass(frozen=True)
class Rates:
    """What the estimate multiplies by, each read from a committed report."""

    device: str  # the GPU measured (the probe's)
    gpu_ms: dict  # (preset, tokens per batch, processes) -> ms per update
    decode_speedup: float  # beam-5 generated tokens/s at batch 64, GPU over CPU
    params_m: float  # the `small` preset's parameters, in millions (the CPU report's)

    def t4_arithmetic_ms(self, tokens: int) -> float:
        """An update's arithmetic at the T4's peak: 6 FLOPs per parameter per token."""
        return 1000 * 6 * self.params_m * 1e6 * tokens / T4_PEAK_FLOPS

    def t4_ms_per_update(self, preset: str, tokens: int) -> float:
        """A T4's ms per update: the H200's measured launch-bound time, or the arithmetic if that is longer."""
        return max(self.gpu_ms[preset, tokens, 1], self.t4_arithmetic_ms(tokens))


def read_report(name: str, root: Path = BENCHMARKS) -> dict:
    path = root / name
    if not path.is_file():
        raise MsgcoreError(f"{path} is missing: the GPU estimates need the committed benchmark reports")
    return json.loads(path.read_text())


def rates(root: Path = BENCHMARKS) -> Rates:
    probe, gpu, cpu = read_report(PROBE, root), read_report(GPU_DECODE, root), read_report(CPU_REPORT, root)
    gpu_ms = {(r["preset"], r["tokens per batch"], r["processes"]): r["ms per update"]
              for r in probe["rows"] if r["measure"] == "train"}
    gpu_decode = next(r["generated tokens/s"] for r in gpu["decode"] if r["variant"] == "book")
    cpu_rows = [r for r in cpu["rows"] if r.get("library") == "msgcore" and r.get("preset") == "small"
                and "ablation" not in r]
    cpu_decode = next(r["generated tokens/s"] for r in cpu_rows
                      if r["kind"] == "decode" and r["beam"] == 5 and r["batch"] == 64)
    params = next(r["parameters (M)"] for r in cpu_rows if r["kind"] == "train")
    return Rates(probe["device"], gpu_ms, gpu_decode / cpu_decode, params)


# ---- what a chapter's CPU minutes were spent on ----------------------------------------------------------------------

def run_log(entry: str, logs: Path | None = None) -> list[dict] | None:
    """A training run's committed log (book/logs), else its run-cache copy; None for an entry that is not a run."""
    from msgcore import runcache

    for folder in (logs or LOGS, runcache.cache_root()):
        if folder is not None and (folder / entry / "log.json").is_file():
            return json.loads((folder / entry / "log.json").read_text())
    return None


def update_minutes(log: list[dict]) -> tuple[int, float]:
    """(updates, minutes spent in them): the updates times the median seconds per update of the log's training
    windows (a window that holds a validation is slower; the median leaves it out)."""
    train = [e for e in log if e.get("kind") == "train" and e.get("tokens_per_s") and "target_tokens" in e]
    if len(train) < 2:
        raise MsgcoreError("a run log needs two training rows to time its updates")
    updates = max(e["step"] for e in log if "step" in e)
    per_update = [(b["target_tokens"] - a["target_tokens"]) / b["tokens_per_s"] / (b["step"] - a["step"])
                  for a, b in zip(train, train[1:])]
    return updates, updates * statistics.median(per_update) / 60


@dataclass(frozen=True)
class Split:
    """A chapter's cold CPU minutes, split as the estimate needs them."""

    page: float  # the notebook's own execution (decoding the test sets, tables, plots): runs once
    updates: int  # the training runs' updates
    update_minutes: float  # minutes in those updates
    other: float  # the runs' other minutes (validations, checkpoints) and the artefacts' (tokenizers, decoded data)


def split(page_minutes: float, entries: list[dict], logs: Path | None = None) -> Split | str:
    """The split of a chapter's cold cost, from its provenance rows (`runcache.provenance_rows`); a reason instead
    when it cannot be split (an entry without minutes, a run without a log)."""
    updates, in_updates, other = 0, 0.0, 0.0
    for row in entries:
        if row.get("minutes") is None:
            return f"{row['entry']} has no minutes on record"
        log = run_log(row["entry"], logs)
        if log is None and row["entry"].startswith(RUN_ENTRIES):
            return f"the log of {row['entry']} is not committed"
        try:
            n, minutes = update_minutes(log) if log is not None else (0, 0.0)
        except MsgcoreError as e:
            return f"{row['entry']}: {e}"
        updates, in_updates, other = updates + n, in_updates + minutes, other + row["minutes"] - minutes
    return Split(page_minutes, updates, in_updates, max(other, 0.0))


def gpu_minutes(part: Split, r: Rates, preset: str, tokens: int) -> dict[str, float]:
    """Estimated minutes of the same work on one H100-class GPU (PROCESSES processes) and on one T4 (1 process)."""
    page = part.page / r.decode_speedup
    h100 = page + (part.updates * r.gpu_ms[preset, tokens, PROCESSES] / 60000
                   + part.other / r.decode_speedup) / PROCESSES
    t4 = page + part.updates * r.t4_ms_per_update(preset, tokens) / 60000 + part.other / r.decode_speedup
    return {"H100-class GPU": h100, "T4": t4}


def estimate(page_minutes: float, entries: list[dict], scale: str, r: Rates | None = None,
             logs: Path | None = None) -> dict[str, float] | str:
    """A CPU execution's estimated minutes on each GPU kind, or why there is none."""
    if scale not in RECIPE_BATCH:
        return f"no GPU estimate at scale {scale!r}"
    part = split(page_minutes, entries, logs)
    if isinstance(part, str):
        return part
    return gpu_minutes(part, r or rates(), *RECIPE_BATCH[scale])


def own_minutes(minutes: float, built: list[dict]) -> float:
    """An execution's minutes less those of the runs it trained itself (they are inside them)."""
    return max(minutes - sum(row["minutes"] or 0.0 for row in built), 0.0)


def page_line(elapsed_minutes: float, rows: list[dict], scale: str, device_type: str) -> str:
    """The sentence a chapter's provenance cell prints about what its execution would cost on a GPU, from its
    minutes so far and every run-cache entry it used (`runcache.provenance_rows()`)."""
    if device_type == "cuda":
        return "This page was executed on a GPU: the minutes above are measured there."
    page = own_minutes(elapsed_minutes, [row for row in rows if row.get("here") == "trained now"])
    minutes = estimate(page, rows, scale)
    if isinstance(minutes, str):
        return f"No GPU estimate for this execution: {minutes}."
    h100, t4 = minutes["H100-class GPU"], minutes["T4"]
    return (f"With an empty run cache, this page would take about {h100:.0f} minutes on one H100-class GPU "
            f"({PROCESSES} seeds side by side) and about {t4:.0f} on a Colab T4: estimates from its measured CPU "
            f"minutes and the measured GPU rates (the performance appendix shows how).")


def minutes_per_update(cost: dict, r: Rates | None = None, logs: Path | None = None) -> float | str:
    """One H100-class GPU's minutes per training update of a chapter, all its other work (validations, decoding, the
    page itself) spread over its updates, from the cost its notebook recorded (`msgcore.book.record_cost`): measured
    where a GPU executed it, else the estimate; or why there is none."""
    built = cost.get("built", [])
    part = split(own_minutes(cost["minutes"], built), cost["reused"] + built, logs)
    if isinstance(part, str):
        return part
    if not part.updates:
        return "no training updates on record"
    if cost.get("device type") == "cuda":
        return cost["cold minutes"] / part.updates
    if cost["scale"] not in RECIPE_BATCH:
        return f"no GPU estimate at scale {cost['scale']!r}"
    return gpu_minutes(part, r or rates(), *RECIPE_BATCH[cost["scale"]])["H100-class GPU"] / part.updates


def recorded_cost(stem: str, root: Path = REPO_ROOT) -> dict | None:
    """The cost a chapter's committed notebook recorded when it was executed (None: none recorded, or no notebook)."""
    import nbformat

    from msgcore.book import find_chapters

    path = find_chapters(root).get(stem)
    if path is None:
        return None
    return nbformat.read(path, as_version=4).metadata.get("msgcore", {}).get("cost")


def chapter_rate(stem: str, root: Path = REPO_ROOT) -> float | str:
    """One H100-class GPU's minutes per training update of a committed chapter (`minutes_per_update` of the cost its
    notebook recorded), or why there is none."""
    cost = recorded_cost(stem, root)
    if cost is None:
        return "its notebook recorded no cost"
    try:
        return minutes_per_update(cost)
    except MsgcoreError as e:  # a benchmark report is missing
        return str(e)


def chapter_rates(stems, root: Path = REPO_ROOT) -> dict[str, float | str]:
    """`chapter_rate` of each chapter: what the scoreboard's "GPU-minutes to decide" multiplies by."""
    return {stem: chapter_rate(stem, root) for stem in stems}


# ---- the appendix's tables ------------------------------------------------------------------------------------------

def rates_table(r: Rates):
    """The per-update and decoding figures the estimates use, with where each comes from."""
    import pandas as pd

    rows = []
    for scale, (preset, tokens) in RECIPE_BATCH.items():
        setting = f"{scale} scale: {preset} preset, {tokens:,} tokens"
        rows += [
            {"setting": setting, "device": f"{r.device}, 1 process", "ms per update": r.gpu_ms[preset, tokens, 1],
             "source": "measured (probe)"},
            {"setting": setting, "device": f"{r.device}, each of {PROCESSES} processes",
             "ms per update": r.gpu_ms[preset, tokens, PROCESSES], "source": "measured (probe)"},
            {"setting": setting, "device": "T4, 1 process", "ms per update": r.t4_ms_per_update(preset, tokens),
             "source": f"estimate: the H200's launch-bound time (arithmetic at the T4's peak: "
                       f"{r.t4_arithmetic_ms(tokens):.1f} ms)"},
        ]
    table = pd.DataFrame(rows)
    table["ms per update"] = table["ms per update"].round(1)
    return table


def chapter_table(root: Path = REPO_ROOT, r: Rates | None = None, chapters=None):
    """Per committed chapter (`chapters`: the stems to list; default the book's training chapters): its scale, the
    device and cold minutes of its execution, and its GPU minutes, measured or estimated (each cell says which)."""
    import nbformat
    import pandas as pd

    from msgcore.book import find_chapters
    from msgcore.chapters import CHAPTERS

    r = r or rates()
    rows = []
    for name, path in find_chapters(root).items():
        if name not in (CHAPTERS if chapters is None else chapters):
            continue
        cost = nbformat.read(path, as_version=4).metadata.get("msgcore", {}).get("cost")
        if cost is None:
            rows.append({"chapter": name, "scale": "–", "executed on": "not recorded", "cold minutes": "–",
                         f"one H100-class GPU ({PROCESSES} processes)": "–", "one T4": "–"})
            continue
        row = {"chapter": name, "scale": cost["scale"], "executed on": cost.get("device", "not recorded"),
               "cold minutes": cost["cold minutes"]}
        if cost.get("device type") == "cuda":
            row |= {f"one H100-class GPU ({PROCESSES} processes)": f"{cost['cold minutes']} (measured)",
                    "one T4": "–"}
        else:
            built = cost.get("built", [])
            minutes = estimate(own_minutes(cost["minutes"], built), cost["reused"] + built, cost["scale"], r)
            row |= ({f"one H100-class GPU ({PROCESSES} processes)": f"not estimated: {minutes}", "one T4": "–"}
                    if isinstance(minutes, str) else
                    {f"one H100-class GPU ({PROCESSES} processes)": f"≈ {minutes['H100-class GPU']:.0f} (estimate)",
                     "one T4": f"≈ {minutes['T4']:.0f} (estimate)"})
        rows.append(row)
    return pd.DataFrame(rows)
