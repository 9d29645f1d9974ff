"""Chapters executed on a GPU machine with no internet, and their evidence brought home.

    python -m msgcore.offline stage                       # here, with internet: wheels, data and commit in .offline/
    python -m msgcore.offline run --scale small --chapter ch05_coverage_nat --out OUT    # there, on the GPU box
    python -m msgcore.offline unpack OUT/evidence.tar.gz  # here again: the evidence into book/, README regenerated

`stage` writes a folder git ignores (`.offline/`): the wheels papermill needs beyond a PyTorch image (`WHEELS`, for
the target's Python), a copy of the data the chapters read, and the commit of this checkout. It prints its size: it
travels with the working tree.

`run` installs the wheels into a folder of its own, records the device (nvidia-smi, torch, CUDA, cuDNN), runs the
throughput probe when asked (`--probe`: 2 minutes on an H200; its report comes back), executes the chapters once at `smoke` on
the device (1.3 to 2 minutes a chapter on an H200, which catches CUDA-only failures before real minutes are
spent; `--no-smoke` once a chapter has passed), then, for every chapter at
once, fills the run cache with its seeds in parallel processes (`python -m msgcore.experiments --part i/N`) and
executes its notebook at the asked scale as soon as they are done, all under a deadline. A GPU's first command is the probe and every chapter at `smoke`:

    python -m msgcore.offline run --probe --scale smoke --chapter ch00_transformer_baseline ... --out OUT

Whatever happens, it packs the evidence into `OUT/evidence.tar.gz`: the executed notebooks, their `results/*.json` and every run's `log.json` and `meta.json`
(under `book/logs/`; a run cut off at the deadline, its log so far as `partial-log.json`), never a checkpoint; and `OUT/summary.txt` says what ran and how long. The run cache stays in
`--cache` (`runs/offline-cache`, which git ignores, by default), so that a second command on the same machine goes
on from the runs the first one finished.

`unpack` checks every member of the archive before writing anything (a file under `book/` of one of those kinds,
nothing else), writes them, and regenerates README's results block. Nothing is retrained: the notebooks and results
name the GPU, torch and commit that produced them, and `python -m msgcore.book run --in-place` refuses to replace a
chapter executed on a GPU with a CPU execution.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from msgcore.utils import MsgcoreError, atomic_write, git_commit

REPO_ROOT = Path(__file__).resolve().parent.parent
BUNDLE = REPO_ROOT / ".offline"  # what `stage` writes (git ignores it) and `run` reads
CACHE = REPO_ROOT / "runs" / "offline-cache"  # the run cache `run` fills; it outlives one command on the machine
# Papermill's closure beyond a PyTorch image (cp312, manylinux x86-64), resolved once with `pip download` and pinned.
# Not needed at run time, so not shipped: debugpy, jedi, parso (10 MB). The image has the rest (pyyaml, requests,
# click, tqdm, packaging, psutil, pygments ...).
WHEELS = {"papermill": "2.7.0", "nbclient": "0.11.0", "nbformat": "5.11.1", "ipykernel": "7.4.0",
          "jupyter_client": "8.10.0", "jupyter_core": "5.9.1", "pyzmq": "27.3.0", "tornado": "6.6.1",
          "traitlets": "5.16.1", "jsonschema": "4.26.0", "jsonschema_specifications": "2025.9.1",
          "referencing": "0.37.0", "rpds_py": "2026.9.1", "fastjsonschema": "2.22.3", "ipython": "9.18.1",
          "prompt_toolkit": "3.0.53", "wcwidth": "0.9.4", "stack_data": "0.6.3", "executing": "2.3.0",
          "asttokens": "3.0.2", "pure_eval": "0.2.4", "pexpect": "4.9.0", "ptyprocess": "0.7.0", "comm": "0.2.3",
          "matplotlib_inline": "0.2.2", "nest_asyncio2": "1.7.4", "ipython_pygments_lexers": "1.1.1",
          "platformdirs": "4.14.8", "tenacity": "9.2.1", "entrypoints": "0.4.2"}
TARGET_PYTHON = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_26_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64")
DATA_SETS = ("multi30k", "multi30k-task2", "wmt16-17-ape-en-de", "mlqe-pe-en-de", "doc-level-en-de")
BUNDLE_LIMIT = 40 * 2 ** 20  # the bundle travels beside the working tree, 64 MiB in all
EVIDENCE_LIMIT = 15 * 2 ** 20  # one file back from the GPU box is at most 16 MiB
CHAPTER_STEMS = {"ch00": "ch00_transformer_baseline", "ch01": "ch01_trice", "ch02": "ch02_mixrep",
                 "ch03": "ch03_marge", "ch04": "ch04_postech_ape", "ch05": "ch05_coverage_nat"}
ENTRY = re.compile(r"^[a-z]+-[0-9a-f]{16}$")  # a run cache entry's folder: its kind and key
# What an evidence archive may hold: an executed notebook, its results file, a run's log or meta.
MEMBER = re.compile(r"^book/(?:[A-Za-z0-9_]+\.ipynb|results/[A-Za-z0-9_]+\.json|"
                    r"logs/[A-Za-z0-9_.-]+/(?:log|meta|partial-log)\.json|benchmarks/probe/[A-Za-z0-9_.-]+\.(?:json|md))$")


# ---- stage: here, with internet -------------------------------------------------------------------------------

def stage(bundle: Path = BUNDLE, mirror: Path | None = None, with_wheels: bool = True) -> int:
    """Write the bundle (built beside it, then moved into place whole); returns its size in bytes."""
    mirror = Path(mirror or os.environ.get("MSGCORE_DATA_MIRROR") or REPO_ROOT.parent / "shared" / "data")
    missing = [name for name in DATA_SETS if not (mirror / name).is_dir()]
    if missing:
        raise MsgcoreError(f"the data mirror {mirror} lacks {', '.join(missing)}: set MSGCORE_DATA_MIRROR to a copy "
                           f"of the book's data (data_scripts/ downloads it)")
    bundle.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(dir=bundle.parent, prefix=f".{bundle.name}-"))
    try:
        for name in DATA_SETS:
            shutil.copytree(mirror / name, work / "data" / name)
        for name in ("README.md", "SHA256SUMS"):
            if (mirror / name).is_file():
                shutil.copy2(mirror / name, work / "data" / name)
        if with_wheels:
            download_wheels(work / "wheels")
        (work / "COMMIT").write_text(git_commit() + "\n")
        size = folder_size(work)
        if size > BUNDLE_LIMIT:
            raise MsgcoreError(f"the bundle is {size / 2 ** 20:.1f} MiB, over the {BUNDLE_LIMIT / 2 ** 20:.0f} MiB "
                               f"that may travel beside the working tree")
        shutil.rmtree(bundle, ignore_errors=True)
        work.rename(bundle)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return size


def download_wheels(folder: Path) -> None:
    """Every pinned wheel for the target's Python and platform, without their dependencies (WHEELS is the closure)."""
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           TARGET_PYTHON, "--implementation", "cp", *platforms, "-d", str(folder),
           *(f"{name}=={version}" for name, version in WHEELS.items())]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise MsgcoreError(f"pip could not download the wheels: {(done.stderr.strip().splitlines() or ['?'])[-1]}")


def folder_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


# ---- run: on the GPU box ----------------------------------------------------------------------------------------

@dataclass
class Step:
    """One command of a `run`, as the summary reports it."""

    name: str
    command: list[str]
    returncode: int | None = None  # None: not started (no time left)
    minutes: float = 0.0
    timed_out: bool = False
    tail: list[str] = field(default_factory=list)  # its last lines of output


def install_wheels(bundle: Path, site: Path) -> bool:
    """Install the bundle's wheels into `site` (no index, no dependencies); False when it has none."""
    wheels = sorted((bundle / "wheels").glob("*.whl"))
    if not wheels:
        return False
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                           "--no-cache-dir", "--upgrade", "--target", str(site), *map(str, wheels)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise MsgcoreError(f"the wheels did not install: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return True


def device_report() -> str:
    """nvidia-smi's table (where there is one), torch, CUDA, cuDNN and the device torch sees."""
    import torch

    lines = [f"torch {torch.__version__}", f"CUDA {torch.version.cuda}",
             f"cuDNN {torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None}"]
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        lines.append(f"device {props.name}, {props.total_memory / 2 ** 30:.0f} GiB, capability {props.major}.{props.minor}")
    else:
        lines.append("device: no CUDA device (CPU)")
    smi = shutil.which("nvidia-smi")
    if smi:
        lines.append(subprocess.run([smi], capture_output=True, text=True).stdout)
    return "\n".join(lines)


def run_step(step: Step, env: dict, deadline: float) -> Step:
    """Run one command in its own process group, killed whole at the deadline; its output's tail is kept."""
    left = deadline - time.monotonic()
    if left <= 5:
        return step
    start = time.monotonic()
    with subprocess.Popen(step.command, env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, start_new_session=True) as process:
        try:
            out, _ = process.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            out, _ = process.communicate()
            step.timed_out = True
        step.returncode = process.returncode
    step.minutes = (time.monotonic() - start) / 60
    step.tail = (out or "").splitlines()[-20:]
    print(f"{step.name}: exit {step.returncode}{' (deadline)' if step.timed_out else ''}, {step.minutes:.1f} min",
          flush=True)
    return step


def short_name(chapter: str) -> str:
    """"ch05_coverage_nat" -> "ch05", as `python -m msgcore.experiments` names it."""
    return next(k for k, v in CHAPTER_STEMS.items() if v == chapter)


def supports_parts(chapter: str) -> bool:
    """Whether a chapter's training script can split its seeds over processes (`--part`)."""
    import inspect

    from msgcore.experiments.__main__ import chapter_function

    return "part" in inspect.signature(chapter_function(short_name(chapter))).parameters


def parts_for(chapter: str, parts: int, scale: str, device: str, seed: int, extra: list[str]) -> list[list[str]]:
    """The commands that fill the run cache for one chapter: `parts` processes, each its share of the seeds."""
    return [[sys.executable, "-m", "msgcore.experiments", short_name(chapter), "--scale", scale, "--device", device,
             "--seed", str(seed), "--part", f"{i}/{parts}", *extra] for i in range(parts)]


def run_parallel(steps: list[Step], env: dict, deadline: float, logs: Path) -> list[Step]:
    """Start every step at once (each in its own process group, its output to a file in `logs`, so that no pipe
    fills and stalls it) and wait for all, killing those still running at the deadline. Each step's minutes are its
    own, measured when it exits."""
    logs.mkdir(parents=True, exist_ok=True)
    running = []
    for i, step in enumerate(steps):
        output = logs / f"{re.sub(r'[^A-Za-z0-9_.-]+', '-', step.name)}-{i}.txt"
        with open(output, "w") as sink:
            process = subprocess.Popen(step.command, env=env, cwd=REPO_ROOT, stdout=sink, stderr=subprocess.STDOUT,
                                       text=True, start_new_session=True)
        running.append((step, process, time.monotonic(), output))
    pending = list(running)
    while pending:
        for item in [item for item in pending if item[1].poll() is not None]:
            pending.remove(item)
            item[0].minutes = (time.monotonic() - item[2]) / 60
        if pending and time.monotonic() >= deadline:
            for step, process, begun, _ in pending:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                step.timed_out, step.minutes = True, (time.monotonic() - begun) / 60
            pending = []
        time.sleep(0.2 if pending else 0)
    for step, process, _, output in running:
        step.returncode = process.returncode
        step.tail = output.read_text(errors="replace").splitlines()[-20:]
        print(f"{step.name}: exit {step.returncode}{' (deadline)' if step.timed_out else ''}, "
              f"{step.minutes:.1f} min", flush=True)
    return steps


def parts_per_chapter(parts: int | list[int], chapters: list[str]) -> list[int]:
    """Each chapter's number of processes: one number for every chapter, or one per chapter; else a one-line
    error, before any work."""
    counts = [parts] if isinstance(parts, int) else list(parts)
    if len(counts) == 1:
        counts *= len(chapters)
    if len(counts) != len(chapters) or min(counts, default=1) < 1:
        raise MsgcoreError(f"--parts takes one number of processes (1 or more) for every chapter, or one per "
                           f"chapter ({len(chapters)}), not {' '.join(map(str, parts if isinstance(parts, list) else [parts]))}")
    return counts


def chapter_pipeline(chapter: str, scale: str, device: str, seed: int, parts: int, caps: list[str], env: dict,
                     deadline: float, notebook_min: float, work: Path) -> list[Step]:
    """One chapter's steps: its seed shares side by side (stopped `notebook_min` minutes before the deadline), then
    at once its notebook, into `work/run/<chapter>`. `run` starts one pipeline per chapter at the same time, so a
    chapter whose runs finish early is executed while another still trains."""
    steps = []
    if parts > 1 and supports_parts(chapter):
        shares = [Step(f"{chapter} part {i}/{parts}", command)
                  for i, command in enumerate(parts_for(chapter, parts, scale, device, seed, caps))]
        steps += run_parallel(shares, env, deadline - 60 * notebook_min, work / "outputs")
    book = [sys.executable, "-m", "msgcore.book", "run", "--device", device, "--chapter", chapter]
    steps.append(run_step(Step(f"{chapter} at {scale}", [*book, "--scale", scale, "--seed", str(seed), "--out",
                                                       str(work / "run" / chapter), *caps]), env, deadline))
    return steps


def run(out: Path, chapters: list[str], scale: str, device: str = "cuda", bundle: Path = BUNDLE, seed: int = 0,
        parts: int | list[int] = 3, deadline_min: float = 8.0, smoke: bool = True, dry_run: bool = False,
        probe: bool = False, cache: Path = CACHE, notebook_min: float = 1.5) -> tuple[Path, list[str]]:
    """Everything `python -m msgcore.offline run` does; returns the evidence archive (written whatever happened) and
    the steps that failed or were cut off (empty when all went through).
    With `probe`, the throughput probe (msgcore.probe) runs first, and its report comes back with the evidence.
    The runs go to `cache`, where a later command on the same machine finds them. Every chapter's pipeline (its
    seed shares, then its notebook: `chapter_pipeline`) starts at once."""
    from concurrent.futures import ThreadPoolExecutor

    shares = parts_per_chapter(parts, chapters)
    if not 0 <= notebook_min < deadline_min:
        raise MsgcoreError(f"--notebook-min {notebook_min:g} must be at least 0 and below --deadline-min "
                           f"{deadline_min:g}")
    began, deadline = time.time(), time.monotonic() + 60 * deadline_min
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="msgcore-offline-"))
    site = work / "site"
    cache.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MSGCORE_RUNS": str(cache.resolve()),
           "MSGCORE_DATA_MIRROR": str((bundle / "data").resolve()),
           "MSGCORE_COMMIT": (bundle / "COMMIT").read_text().strip() if (bundle / "COMMIT").is_file() else git_commit(),
           "PYTHONPATH": os.pathsep.join([str(site), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    install_wheels(bundle, site)
    (out / "device.txt").write_text(device_report())
    caps = ["--dry-run"] if dry_run else []
    book = [sys.executable, "-m", "msgcore.book", "run", "--device", device, "--chapter", *chapters]
    steps = []
    if probe:
        steps.append(run_step(Step("throughput probe", [sys.executable, "-m", "msgcore.probe", "--device", device,
                                                        *(["--quick"] if dry_run else []), "--out",
                                                        str(work / "probe" / "book" / "benchmarks" / "probe")]),
                              env, deadline))
    if smoke and scale != "smoke":
        steps.append(run_step(Step("smoke pass", [*book, "--scale", "smoke", "--out", str(work / "smoke"), *caps]),
                              {**env, "MSGCORE_RUNS": str(work / "smoke-cache")}, deadline))
    with ThreadPoolExecutor(max_workers=len(chapters)) as pool:
        pipelines = [pool.submit(chapter_pipeline, chapter, scale, device, seed, n, caps, env, deadline,
                                 notebook_min, work) for chapter, n in zip(chapters, shares)]
        steps += [step for pipeline in pipelines for step in pipeline.result()]
    archive = pack(out / "evidence.tar.gz", work, cache, chapters, probe, since=began)
    (out / "summary.txt").write_text(summary(steps, archive))
    shutil.rmtree(work, ignore_errors=True)
    return archive, [s.name for s in steps if s.returncode != 0 or s.timed_out]


def evidence_files(work: Path, cache: Path, chapters: list[str], probe: bool = False,
                   since: float | None = None) -> list[tuple[Path, str]]:
    """(file, name in the archive) for every piece of evidence a run left in its `work` folder and `cache`: each
    chapter's executed notebook (whole or cut off at the deadline) and results file from `work/run/<chapter>`, when
    written after `since` (the book's own copies, older, are not this run's evidence); the probe's report (when it
    ran); every finished cache entry's log.json and meta.json (a dry run's entries sit one folder deeper, under its
    caps); and an unfinished entry's log as `partial-log.json`, so that runs cut off at a deadline still say how far
    they got and how fast."""
    def fresh(path: Path) -> bool:
        return path.is_file() and (since is None or path.stat().st_mtime >= since)

    files = []
    for chapter in chapters:
        book = work / "run" / chapter / "book"
        for path, name in ((book / f"{chapter}.ipynb", f"book/{chapter}.ipynb"),
                           (book / "results" / f"{chapter}.json", f"book/results/{chapter}.json")):
            if fresh(path):
                files.append((path, name))
    reports = work / "probe" / "book" / "benchmarks" / "probe"
    if probe:
        files += [(path, f"book/benchmarks/probe/{path.name}") for path in sorted(reports.glob("*.*")) if path.is_file()]
    if not cache.is_dir():
        return files
    finished = sorted({meta.parent for pattern in ("*/meta.json", "*/*/meta.json") for meta in cache.glob(pattern)})
    for entry in finished:
        for kind in ("log.json", "meta.json"):
            if (entry / kind).is_file():
                files.append((entry / kind, f"book/logs/{entry.name}/{kind}"))
    unfinished = [entry for pattern in ("*/", "*/*/") for entry in sorted(cache.glob(pattern))
                  if ENTRY.match(entry.name) and entry not in finished and not (entry / "meta.json").is_file()]
    for entry in unfinished:
        logs = sorted(entry.rglob("log.json"), key=lambda path: path.stat().st_mtime)
        if logs:
            files.append((logs[-1], f"book/logs/{entry.name}/partial-log.json"))
    return files


def pack(archive: Path, work: Path, cache: Path, chapters: list[str], probe: bool = False,
         since: float | None = None) -> Path:
    """The evidence as one gzipped tar (never a checkpoint); refused when it would not come back (over 15 MiB)."""
    with atomic_write(archive, "wb") as f, tarfile.open(fileobj=f, mode="w:gz") as tar:
        for path, name in evidence_files(work, cache, chapters, probe, since):
            tar.add(path, arcname=name)
    if archive.stat().st_size > EVIDENCE_LIMIT:
        raise MsgcoreError(f"{archive} is {archive.stat().st_size / 2 ** 20:.1f} MiB: over what may come back")
    return archive


def summary(steps: list[Step], archive: Path) -> str:
    lines = [f"{s.name}: " + ("not started (no time left)" if s.returncode is None else
                              f"exit {s.returncode}{', cut off at the deadline' if s.timed_out else ''}, "
                              f"{s.minutes:.1f} min") for s in steps]
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    lines.append(f"{archive.name}: {len(names)} files, {archive.stat().st_size / 2 ** 20:.2f} MiB")
    for s in steps:
        if s.returncode not in (0, None) or s.timed_out:
            lines += [f"--- the end of {s.name}'s output:", *s.tail]
    return "\n".join(lines) + "\n"


# ---- unpack: here again -----------------------------------------------------------------------------------------

def checked_members(archive: Path) -> list[tarfile.TarInfo]:
    """Every member of an evidence archive, each checked before anything is written: a regular file whose name
    `MEMBER` allows (an executed notebook, a results file, a run's log or meta under book/), nothing else."""
    try:
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
    except (tarfile.TarError, EOFError, OSError) as error:
        raise MsgcoreError(f"{archive} is not a readable evidence archive ({type(error).__name__})") from None
    for member in members:
        if not member.isfile():
            raise MsgcoreError(f"{archive} refused: {member.name!r} is not a plain file")
        if not MEMBER.match(member.name):
            raise MsgcoreError(f"{archive} refused: {member.name!r} is not evidence under book/ (an executed "
                               f"notebook, a results file, a run's log.json or meta.json)")
    return members


def cut_off(notebook: Path) -> bool:
    """Whether an executed notebook stopped before its last code cell ran (killed at a deadline, or failed): such
    a page would hold some of a chapter's outputs and not its results, so `unpack` leaves the book's page as it is."""
    cells = [c for c in json.loads(notebook.read_text(encoding="utf-8")).get("cells", []) if c.get("cell_type") == "code"]
    return not cells or any(c.get("execution_count") is None for c in cells if "".join(c.get("source", "")).strip())


def unpack(archive: Path, root: Path = REPO_ROOT) -> list[str]:
    """Write an evidence archive's files into the checkout at `root` (every member checked first, each file parsed
    as JSON, or as UTF-8 text for the probe's table, then moved into place atomically), then regenerate README's
    results block; returns the names."""
    from msgcore import scoreboard

    members = checked_members(archive)
    staging = Path(tempfile.mkdtemp(prefix="msgcore-unpack-"))
    try:
        with tarfile.open(archive) as tar:
            tar.extractall(staging, members=members, filter="data")
        for member in members:
            try:
                text = (staging / member.name).read_text(encoding="utf-8")
                if not member.name.endswith(".md"):  # the probe's table; everything else is JSON
                    json.loads(text)
            except (UnicodeDecodeError, json.JSONDecodeError):
                raise MsgcoreError(f"{archive} refused: {member.name} is not readable "
                                   f"{'text' if member.name.endswith('.md') else 'JSON'}") from None
        skipped = [m for m in members if m.name.endswith(".ipynb") and cut_off(staging / m.name)]
        for member in skipped:
            print(f"skipped {member.name}: cut off before its last cell ran", file=sys.stderr)
        members = [m for m in members if m not in skipped]
        for member in members:
            target = root / member.name
            target.parent.mkdir(parents=True, exist_ok=True)
            with atomic_write(target, "wb") as f:
                f.write((staging / member.name).read_bytes())
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if (root / "README.md").is_file():
        scoreboard.main(["--results", str(root / "book" / "results"), "--readme", str(root / "README.md")])
    return [m.name for m in members]


# ---- report: what the runs in a logs folder cost ---------------------------------------------------------------

def run_row(entry: Path) -> dict | None:
    """One training run's cost and outcome from its cache entry's log (None when it holds no training log): its
    updates, wall minutes and ms per update (finished runs: meta.json's wall time, all of this run's processes
    together), median target tokens/s, best dev BLEU and where, and whether it finished or was cut off."""
    finished = (entry / "log.json").is_file()
    path = entry / ("log.json" if finished else "partial-log.json")
    if not path.is_file():
        return None
    log = json.loads(path.read_text())
    meta = json.loads((entry / "meta.json").read_text()) if (entry / "meta.json").is_file() else {}
    train = [e for e in log if e.get("kind") == "train"]
    valid = [e for e in log if e.get("kind") == "valid" and e.get("valid_bleu") is not None]
    if not train:
        return None
    updates = max(e["step"] for e in train + valid)
    wall = meta.get("wall_time_s")
    best = max(valid, key=lambda e: e["valid_bleu"]) if valid else None
    speeds = sorted(e["tokens_per_s"] for e in train)
    return {"entry": entry.name, "status": "finished" if finished else "cut off", "device": meta.get("device", "–"),
            "commit": meta.get("commit", "–"), "updates": updates, "epochs": max(e["epoch"] for e in train),
            "minutes": round(wall / 60, 1) if wall else "–",
            "ms per update (wall, validations included)": round(1000 * wall / updates) if wall else "–",
            "target tokens/s (median of the training windows)": f"{speeds[len(speeds) // 2]:,.0f}",
            "best dev BLEU": f"{best['valid_bleu']:.2f} at {best['step']:,}" if best else "–"}


def report(logs: Path) -> str:
    """A markdown table of every training run under `logs` (book/logs, or an unpacked archive's): what sizing a
    scale for a GPU command needs."""
    import pandas as pd

    from msgcore.scoreboard import markdown_table

    if not logs.is_dir():
        raise MsgcoreError(f"{logs} is not a folder of run logs")
    rows = []
    for entry in sorted(path for path in logs.iterdir() if path.is_dir()):
        try:
            row = run_row(entry)
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError, ValueError) as error:
            raise MsgcoreError(f"{entry} holds no readable training log ({type(error).__name__})") from None
        rows += [row] if row else []
    if not rows:
        raise MsgcoreError(f"{logs} holds no training run's log")
    return markdown_table(pd.DataFrame(rows)) + "\n"


# ---- the command line -----------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    from msgcore.options import OneLineParser

    parser = OneLineParser(prog="python -m msgcore.offline", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    st = commands.add_parser("stage", help="write the bundle (wheels, data, commit), here with internet")
    st.add_argument("--bundle", type=Path, default=BUNDLE)
    st.add_argument("--no-wheels", action="store_true", help="no wheels (the target already has papermill)")
    rn = commands.add_parser("run", help="on the GPU box: execute chapters, pack the evidence into --out")
    rn.add_argument("--out", type=Path, required=True)
    rn.add_argument("--chapter", nargs="+", required=True, choices=list(CHAPTER_STEMS.values()))
    rn.add_argument("--scale", choices=["smoke", "small", "full"], default="small")
    rn.add_argument("--device", default="cuda")
    rn.add_argument("--bundle", type=Path, default=BUNDLE)
    rn.add_argument("--seed", type=int, default=0)
    rn.add_argument("--parts", type=int, nargs="+", default=[3], help="processes that fill each chapter's run "
                    "cache, one per share of its runs: one number for every chapter, or one per chapter, in order")
    rn.add_argument("--probe", action="store_true", help="first, the throughput probe (msgcore.probe); its report "
                                                         "comes back under book/benchmarks/probe/")
    rn.add_argument("--deadline-min", type=float, default=8.0, help="minutes after which everything is cut off")
    rn.add_argument("--notebook-min", type=float, default=1.5, help="minutes kept after the seed shares for the "
                    "notebooks")
    rn.add_argument("--no-smoke", action="store_true", help="skip the smoke pass")
    rn.add_argument("--cache", type=Path, default=CACHE, help="the run cache, kept for the next command")
    rn.add_argument("--dry-run", action="store_true", help="every loop capped (msgcore.dryrun): a check of the path")
    up = commands.add_parser("unpack", help="write an evidence archive into book/ and regenerate README")
    up.add_argument("archive", type=Path)
    up.add_argument("--root", type=Path, default=REPO_ROOT, help="the checkout to write into")
    rp = commands.add_parser("report", help="a markdown table of what each run under a logs folder cost")
    rp.add_argument("logs", type=Path, nargs="?", default=REPO_ROOT / "book" / "logs")
    args = parser.parse_or_exit_code(argv)
    if isinstance(args, int):
        return args
    try:
        if args.command == "stage":
            size = stage(args.bundle, with_wheels=not args.no_wheels)
            print(f"{args.bundle}: {size / 2 ** 20:.1f} MiB ({'wheels, ' if not args.no_wheels else ''}data, commit)")
        elif args.command == "run":
            archive, failed = run(args.out, args.chapter, args.scale, args.device, args.bundle, args.seed,
                                  args.parts, args.deadline_min, not args.no_smoke, args.dry_run, args.probe, args.cache,
                                  args.notebook_min)
            print((args.out / "summary.txt").read_text(), end="")
            print(f"evidence: {archive}")
            if failed:
                print(f"error: {', '.join(failed)} did not finish cleanly (the evidence is packed all the same)",
                      file=sys.stderr)
                return 1
        elif args.command == "report":
            print(report(args.logs), end="")
        else:
            for name in unpack(args.archive, args.root):
                print(f"wrote {name}")
    except MsgcoreError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
