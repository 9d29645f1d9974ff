"""Execute the book's chapter notebooks at one scale and, optionally, build the HTML book.

    python -m msgcore.book run [--scale smoke|small|full] [--chapter NAME ...] [--in-place]
                               [--out DIR] [--build] [--device auto] [--seed 0] [--timeout SECONDS]
    python -m msgcore.book main    # README's main command (see `main_job`)

Chapters are the notebooks listed in ``_toc.yml`` (every ``file:`` entry whose ``.ipynb`` exists), in
TOC order. Each is executed by papermill, which injects ``scale``, ``device`` and ``seed`` in a cell
after the one tagged ``parameters``; the runner tags that injected cell ``remove-cell`` so the HTML
stays clean.

The book sources (``_config.yml``, ``_toc.yml``, the folders holding the TOC's pages) are always
copied into a run directory (default ``runs/<scale>-<YYYYmmdd-HHMMSS>``) and the chapters are executed
there, with the notebook's folder as working directory. The committed notebooks are left untouched,
except with ``--in-place`` (small and full scales only): then each chapter that ran without error
replaces its committed notebook atomically, without papermill's injected-parameters cell (which would
override a reader's parameters cell; the values stay in the notebook's papermill metadata and provenance cell). The run stops at the first failing chapter, prints a
summary table and exits with status 1. ``--build`` then runs ``jupyter-book build <run dir> -W``.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import yaml

from msgcore.options import add_cap_options, apply_cap_options
from msgcore.utils import WRITE_ERRORS, MsgcoreError, atomic_write, check_device, check_seed, \
    check_writable_dir, os_error_line, resolve_device

SCALES = ("smoke", "small", "full")
REPO_ROOT = Path(__file__).resolve().parent.parent
BOOK_FILES = ("_config.yml", "_toc.yml")
STATIC = "_static"  # the book's own CSS (wrapping long output lines), copied beside the config
WRAP_RULE = "white-space: pre-wrap"  # what the built HTML's stylesheet must carry
LOCAL_MATHJAX = "_static/mathjax/tex-chtml.js"  # the MathJax the built pages load (sphinx-mathjax-offline)
COPY_IGNORE = shutil.ignore_patterns(".ipynb_checkpoints", "_build", "__pycache__", ".*.tmp")


class BookError(MsgcoreError):
    """A bad request to the runner: unknown chapter or scale, a refused option."""


class BuildError(BookError):
    """`jupyter-book build` failed (or is missing)."""


@dataclass
class ChapterResult:
    """The outcome of one chapter: status is "ok", "FAILED" or "not run"."""

    chapter: str
    scale: str
    status: str
    minutes: float | None = None
    error: str = ""
    reused: list[str] = field(default_factory=list)  # run-cache entries the chapter reused instead of training
    built: list[str] = field(default_factory=list)  # run-cache entries the chapter trained or built itself


@dataclass
class RunReport:
    """What one `run_book` call did: where, which chapters, and the built HTML index (if any)."""

    run_dir: Path
    results: list[ChapterResult] = field(default_factory=list)
    html_index: Path | None = None

    @property
    def ok(self) -> bool:
        return all(r.status == "ok" for r in self.results)


# ----------------------------------------------------------------------------- chapters

def _toc_entries(node: object) -> Iterator[str]:
    """Every `root:` and `file:` value of a parsed _toc.yml, in document order."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("root", "file") and isinstance(value, str):
                yield value
            else:
                yield from _toc_entries(value)
    elif isinstance(node, list):
        for item in node:
            yield from _toc_entries(item)


def check_root(root: Path) -> None:
    """The book root must be a folder holding _toc.yml (one line otherwise)."""
    root = Path(root)
    if not root.is_dir():
        raise BookError(f"the book root {root} is {'a file' if root.exists() else 'missing'}, not a folder; "
                        f"pass --root DIR (a folder holding _toc.yml)")
    if not (root / "_toc.yml").is_file():
        raise BookError(f"the book root {root} has no _toc.yml; pass --root DIR (a folder holding _toc.yml)")


def find_chapters(root: Path) -> dict[str, Path]:
    """Chapter name (the notebook's file stem) -> notebook path, for each TOC entry that is a notebook."""
    check_root(root)
    toc = yaml.safe_load((Path(root) / "_toc.yml").read_text(encoding="utf-8"))
    chapters: dict[str, Path] = {}
    for entry in _toc_entries(toc):
        path = Path(root) / (entry if entry.endswith(".ipynb") else f"{entry}.ipynb")
        if path.is_file():
            chapters[path.stem] = path
    return chapters


def select_chapters(chapters: dict[str, Path], names: Sequence[str] | None) -> dict[str, Path]:
    """The chapters asked for (all when `names` is empty), in TOC order; accepts 'book/x.ipynb' for 'x'."""
    if not names:
        return dict(chapters)
    wanted = {Path(n).name.removesuffix(".ipynb") for n in names}
    unknown = sorted(wanted - set(chapters))
    if unknown:
        raise BookError(f"unknown chapter {unknown[0]!r}; known chapters: {', '.join(chapters) or '(none)'}")
    return {name: path for name, path in chapters.items() if name in wanted}


def book_sources(root: Path) -> list[Path]:
    """What a run directory needs to build: the config, the TOC, *.bib files and the TOC's top folders."""
    toc = yaml.safe_load((root / "_toc.yml").read_text(encoding="utf-8"))
    folders = {Path(entry).parts[0] for entry in _toc_entries(toc) if len(Path(entry).parts) > 1}
    files = [root / name for name in BOOK_FILES] + sorted(root.glob("*.bib"))
    folders |= {STATIC}
    return [p for p in files if p.is_file()] + [root / f for f in sorted(folders) if (root / f).is_dir()]


# ----------------------------------------------------------------------------- running

def default_scale() -> str:
    """`full` when a CUDA GPU is visible, else `smoke`."""
    import torch

    return "full" if torch.cuda.is_available() else "smoke"


def check_options(scale: str, in_place: bool) -> None:
    if scale not in SCALES:
        raise BookError(f"unknown scale {scale!r}; known scales: {', '.join(SCALES)}")
    if in_place and scale == "smoke":
        raise BookError("--in-place is refused at smoke scale: smoke outputs never replace the committed notebooks")


def make_run_dir(root: Path, scale: str, out: Path | None) -> Path:
    """Create the run directory and copy the book sources into it."""
    run_dir = Path(out) if out else root / "runs" / f"{scale}-{datetime.now():%Y%m%d-%H%M%S}"
    run_dir = run_dir.resolve()
    if run_dir == root.resolve():
        raise BookError("--out must not be the book root: the committed notebooks would be overwritten")
    try:
        check_writable_dir(run_dir, "--out")
    except MsgcoreError as error:
        raise BookError(str(error)) from None
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        copy_sources(root, run_dir)
    except OSError as error:  # shutil.Error too: its message lists every failed copy
        if created:
            shutil.rmtree(run_dir, ignore_errors=True)
        raise BookError(f"cannot copy the book into {run_dir}: {copy_error_reason(error)}") from None
    hide_placeholder_buttons(run_dir / "_config.yml")
    return run_dir


def copy_sources(root: Path, run_dir: Path) -> None:
    for src in book_sources(root):
        if src.is_dir():
            shutil.copytree(src, run_dir / src.name, ignore=COPY_IGNORE, dirs_exist_ok=True)
        else:
            shutil.copy2(src, run_dir / src.name)


def copy_error_reason(error: OSError) -> str:
    """One reason for a failed copy: the first of shutil.Error's list (with how many files failed), or the error's."""
    if isinstance(error, shutil.Error) and error.args and isinstance(error.args[0], list) and error.args[0]:
        failures = error.args[0]
        why = re.sub(r"^\[Errno \d+\] ", "", str(failures[0][2])).split(": '")[0].lower()  # without the path
        return f"{why} ({len(failures)} file{'s' * (len(failures) > 1)} not copied)"
    return WRITE_ERRORS.get(error.errno) or os_error_line(error)


PLACEHOLDER = "YOUR-ACCOUNT"  # repository.url until a fork sets its own: no page may link to it


def hide_placeholder_buttons(config_path: Path) -> bool:
    """Turn off the launch, repository, issues and edit buttons in a run directory's copy of the config while
    `repository.url` is unset or the placeholder: a reader would otherwise get "not found" on Colab and GitHub.
    The intro says how to set the one setting. Returns whether the copy was changed."""
    config = yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}
    url = (config.get("repository") or {}).get("url") or ""
    if url and PLACEHOLDER not in url:
        return False
    config["launch_buttons"] = {**(config.get("launch_buttons") or {}), "colab_url": "", "binderhub_url": "",
                                "jupyterhub_url": "", "thebe": False}
    config["html"] = {**(config.get("html") or {}), "use_repository_button": False, "use_issues_button": False,
                      "use_edit_page_button": False}
    with atomic_write(config_path, "w", encoding="utf-8") as f:
        yaml.safe_dump(config, f, sort_keys=False, allow_unicode=True)
    return True


def tag_parameter_cells(path: Path) -> None:
    """Show the `parameters` cell on the page (readers edit its `scale` line, e.g. on Colab), and remove papermill's
    `injected-parameters` cell from it (the provenance cell says what the run was given)."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        tags = cell.metadata.get("tags", [])
        if "injected-parameters" in tags and "remove-cell" not in tags:
            cell.metadata["tags"] = [*tags, "remove-cell"]
        elif "parameters" in tags and "remove-cell" in tags:
            cell.metadata["tags"] = [tag for tag in tags if tag != "remove-cell"]
    with atomic_write(path, "w", encoding="utf-8") as f:
        nbformat.write(nb, f)


def strip_injected_parameters(path: Path) -> int:
    """Remove papermill's `injected-parameters` cells from a notebook; returns how many were removed.

    A committed notebook must not keep one: it sits right after the `parameters` cell and would override
    what a reader sets there (e.g. `scale = "full"` on Colab). The run's parameters stay in the notebook's
    `metadata.papermill.parameters` and in its provenance cell. The file is rewritten (atomically) only if a
    cell was removed."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    kept = [cell for cell in nb.cells if "injected-parameters" not in cell.metadata.get("tags", [])]
    removed = len(nb.cells) - len(kept)
    if removed:
        nb.cells = kept
        with atomic_write(path, "w", encoding="utf-8") as f:
            nbformat.write(nb, f)
    return removed


def _one_line(text: str, limit: int = 200) -> str:
    lines = str(text).strip().splitlines()
    line = lines[0] if lines else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


PROGRESS_EVERY_S = 60.0  # how often a running chapter reports its cell and its run in training


def running_cell(notebook: Path) -> str | None:
    """'cell 7 of 31 (`# Both directions go ...`) for 4.2 min' for the cell papermill is executing, read from the
    output notebook it saves as each cell starts; None when no cell runs (or the file is mid-write)."""
    import json

    try:
        cells = [c for c in json.loads(notebook.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "code"]
    except (OSError, ValueError, KeyError):
        return None
    for number, cell in enumerate(cells, 1):
        meta = cell.get("metadata", {}).get("papermill", {})
        if meta.get("status") == "running" and meta.get("start_time"):
            started = datetime.fromisoformat(meta["start_time"].replace("Z", "+00:00"))
            minutes = (datetime.now(started.tzinfo) - started).total_seconds() / 60
            source = "".join(cell.get("source", ""))
            return f"cell {number} of {len(cells)} (`{_one_line(source, 40)}`) for {minutes:.1f} min"
    return None


def run_in_training(cache: Path | None, since: float) -> str | None:
    """'training run-1a2b...: update 750, loss 3.21, 8.1k target tokens/s, dev BLEU 31.4 at update 750' from the
    newest unfinished run cache entry changed after `since` (its log.json, written at each validation)."""
    import json

    if cache is None or not cache.is_dir():
        return None
    logs = [log for log in cache.glob("*/log.json") if not (log.parent / "meta.json").exists()]
    logs += [log for log in cache.glob("*/work/log.json") if not (log.parent.parent / "meta.json").exists()]
    logs = [log for log in logs if log.stat().st_mtime >= since]
    if not logs:
        return None
    newest = max(logs, key=lambda log: log.stat().st_mtime)
    try:
        history = json.loads(newest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    train = [row for row in history if row.get("kind") == "train"]
    valid = [row for row in history if row.get("kind") == "valid" and "valid_bleu" in row]
    if not train:
        return None
    name = newest.parent.name if newest.parent.name != "work" else newest.parent.parent.name
    line = f"training {name}: update {train[-1]['step']:,}, loss {train[-1]['loss']:.2f}"
    if "tokens_per_s" in train[-1]:
        line += f", {train[-1]['tokens_per_s'] / 1000:.1f}k target tokens/s"
    if valid:
        line += f", dev BLEU {valid[-1]['valid_bleu']:.1f} at update {valid[-1]['step']:,}"
    return line


class ChapterProgress:
    """While a chapter executes, print every PROGRESS_EVERY_S seconds which cell runs and for how long, and the
    training run in flight, on the runner's console only (the notebooks stay as they are)."""

    def __init__(self, notebook: Path, every_s: float = PROGRESS_EVERY_S):
        import threading

        from msgcore import runcache

        self.notebook, self.every_s, self.since = notebook, every_s, time.time()
        self.cache = runcache.cache_root()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.report, daemon=True)

    def report(self) -> None:
        while not self.stopped.wait(self.every_s):
            parts = [part for part in (running_cell(self.notebook), run_in_training(self.cache, self.since)) if part]
            if parts:
                print("  " + "; ".join(parts), flush=True)

    def __enter__(self) -> ChapterProgress:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join()


def reused_entries(reuse_log: Path) -> list[str]:
    """The run-cache entries a chapter reused (or built: the same format), each once, in the order first named (a
    notebook may read one entry twice; counting it twice would also count its minutes twice in the cold cost)."""
    return list(dict.fromkeys(reuse_log.read_text().split())) if reuse_log.is_file() else []


def execute_chapter(src: Path, dst: Path, scale: str, device: str = "auto", seed: int = 0,
                    timeout: float | None = None) -> ChapterResult:
    """Run notebook `src` with papermill into `dst` (cwd = dst's folder); never raises on a cell error."""
    import papermill as pm

    start = time.perf_counter()
    logs = {"MSGCORE_REUSE_LOG": dst.with_suffix(".reused.txt"),  # msgcore.runcache appends each reused entry here
            "MSGCORE_BUILT_LOG": dst.with_suffix(".built.txt")}  # and each entry it trained or built
    for env, log in logs.items():
        log.unlink(missing_ok=True)
        os.environ[env] = str(log.resolve())  # the kernel inherits the runner's environment
    try:
        with ChapterProgress(dst):
            pm.execute_notebook(
                str(src), str(dst), parameters=dict(scale=scale, device=device, seed=seed),
                kernel_name="python3", cwd=str(dst.parent), progress_bar=False, log_output=False,
                request_save_on_cell_execute=True, execution_timeout=timeout,
                extra_arguments=["--IPKernelApp.log_level=ERROR"])  # no "running over TCP" warning per chapter
        error = ""
    except pm.PapermillExecutionError as e:
        error = f"cell In[{e.exec_count}] `{_one_line(e.source, 60)}`: {e.ename}: {_one_line(e.evalue)}"
    except Exception as e:  # a dead kernel, a cell timeout, an unreadable notebook
        error = f"{type(e).__name__}: {_one_line(e)}"
    finally:
        for env in logs:
            os.environ.pop(env, None)
    minutes = (time.perf_counter() - start) / 60
    reused, built = (reused_entries(log) for log in logs.values())
    if error:
        return ChapterResult(src.stem, scale, "FAILED", minutes, error, reused, built)
    tag_parameter_cells(dst)
    result = ChapterResult(src.stem, scale, "ok", minutes, reused=reused, built=built)
    record_cost(dst, result, device)
    return result


def record_cost(path: Path, result: ChapterResult, device: str = "auto") -> dict:
    """Store in the executed notebook's metadata (`msgcore.cost`) what this execution cost: its minutes, the device
    it ran on, each run-cache entry it reused with the commit and minutes of the run that made it, each entry it
    trained or built itself (its minutes are inside the execution's), and the cold cost (this execution plus the
    reused entries' minutes; `cold is a lower bound` when an entry has no minutes on record). A CPU run that trained
    on 1 of 2 cores, while another process trained on the other, counts for half its minutes
    (`runcache.machine_share`): the cold cost is the machine's time, and two such processes share it."""
    import nbformat

    from msgcore import runcache
    from msgcore.utils import device_name

    rows = runcache.provenance_rows(result.reused)
    shares = runcache.machine_shares([row["entry"] for row in rows])
    known = [row["minutes"] * shares[row["entry"]] for row in rows if row["minutes"] is not None]
    resolved = resolve_device(device)
    cost = {"scale": result.scale, "minutes": round(result.minutes, 1), "device type": resolved.type,
            "device": device_name(resolved), "reused": rows, "built": runcache.provenance_rows(result.built),
            "cold minutes": round(result.minutes + sum(known), 1), "cold is a lower bound": len(known) < len(rows)}
    nb = nbformat.read(path, as_version=4)
    nb.metadata.setdefault("msgcore", {})["cost"] = cost
    with atomic_write(path, "w", encoding="utf-8") as f:
        nbformat.write(nb, f)
    return cost


def chapter_costs(root: Path = REPO_ROOT):
    """What each committed chapter cost when it was executed, read from its notebook (`record_cost`; papermill's
    duration alone for a notebook executed before costs were recorded), and the device it ran on."""
    import nbformat
    import pandas as pd

    rows = []
    for name, path in find_chapters(root).items():
        meta = nbformat.read(path, as_version=4).metadata
        cost = meta.get("msgcore", {}).get("cost")
        duration = meta.get("papermill", {}).get("duration")
        if cost is None:
            rows.append({"chapter": name, "scale": "–", "minutes of the committed execution":
                         round(duration / 60, 1) if duration else "–", "reused runs": "not recorded",
                         "cold minutes": "not recorded", "device": "not recorded"})
            continue
        cold = f"≥ {cost['cold minutes']}" if cost["cold is a lower bound"] else cost["cold minutes"]
        rows.append({"chapter": name, "scale": cost["scale"], "minutes of the committed execution": cost["minutes"],
                     "reused runs": len(cost["reused"]), "cold minutes": cold,
                     "device": cost.get("device", "not recorded")})
    return pd.DataFrame(rows)


RESULTS_FOLDER = "results"  # beside the notebooks: each chapter writes results/<notebook stem>.json (msgcore.verdicts)


def publish(executed: Path, committed: Path) -> None:
    """Atomically replace the committed notebook with the executed one, and its scoreboard file with the one the
    execution wrote (results/<notebook stem>.json), if it wrote one."""
    for source, target in ((executed, committed), *scoreboard_files(executed, committed)):
        data = source.read_bytes()
        with atomic_write(target, "wb") as f:
            f.write(data)


def scoreboard_files(executed: Path, committed: Path) -> list[tuple[Path, Path]]:
    """[(run dir's results file, committed results file)] when the executed chapter wrote one, else []."""
    name = f"{executed.stem}.json"
    written = executed.parent / RESULTS_FOLDER / name
    return [(written, committed.parent / RESULTS_FOLDER / name)] if written.is_file() else []


def absolute_data_mirror() -> None:
    """Chapters run with their own folder as working directory: a relative $MSGCORE_DATA_MIRROR is made absolute
    here, against the directory the runner was started in."""
    mirror = os.environ.get("MSGCORE_DATA_MIRROR", "")
    if mirror and not os.path.isabs(mirror):
        os.environ["MSGCORE_DATA_MIRROR"] = os.path.abspath(mirror)


def run_chapters(root: Path, run_dir: Path, chapters: dict[str, Path], scale: str, *, in_place: bool,
                 device: str, seed: int, timeout: float | None) -> list[ChapterResult]:
    """Execute the chapters in order; stop at the first failure (the rest are "not run")."""
    results: list[ChapterResult] = []
    start = time.perf_counter()
    for name, src in chapters.items():
        dst = run_dir / src.relative_to(root)
        print(progress_line(results, len(chapters), name, scale, time.perf_counter() - start), flush=True)
        result = execute_chapter(src, dst, scale, device, seed, timeout)
        results.append(result)
        if result.reused:
            print(f"  reused {len(result.reused)} cached runs: {', '.join(result.reused)}", flush=True)
        if result.status != "ok":
            print(f"FAILED {name}: {result.error}\n  the executed notebook, with the error: {dst}", flush=True)
            break
        if in_place:
            strip_injected_parameters(dst)  # the reader's parameters cell must win in the committed notebook
            publish(dst, src)
            print(f"  replaced {src}", flush=True)
    results += [ChapterResult(name, scale, "not run") for name in list(chapters)[len(results):]]
    return results


def progress_line(done: Sequence[ChapterResult], total: int, name: str, scale: str, elapsed_s: float) -> str:
    """'[2/5] ch01_trice at small: 12.3 min elapsed, about 37 min left' (the mean chapter so far, times those left)."""
    left = total - len(done)
    minutes = [r.minutes for r in done if r.minutes is not None]
    estimate = (f"about {sum(minutes) / len(minutes) * left:.0f} min left" if minutes
                else "estimate after the first chapter")
    return f"[{len(done) + 1}/{total}] {name} at {scale}: {elapsed_s / 60:.1f} min elapsed, {estimate}"


def format_summary(results: Sequence[ChapterResult]) -> str:
    """A plain-text table: chapter, scale, status, minutes."""
    width = max([len("chapter")] + [len(r.chapter) for r in results])
    lines = [f"{'chapter':<{width}}  {'scale':<5}  {'status':<7}  {'minutes':>7}  {'reused runs':>11}"]
    for r in results:
        minutes = f"{r.minutes:.1f}" if r.minutes is not None else "-"
        lines.append(f"{r.chapter:<{width}}  {r.scale:<5}  {r.status:<7}  {minutes:>7}  {len(r.reused):>11}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- building

def jupyter_book_executable() -> str:
    """The jupyter-book beside this Python (the same venv), else the one on PATH."""
    exe = Path(sys.executable).parent / "jupyter-book"
    if exe.is_file():
        return str(exe)
    found = shutil.which("jupyter-book")
    if found is None:
        raise BuildError("jupyter-book is not installed: pip install 'jupyter-book<2'")
    return found


STALE_TAG = "stale-results"  # the warning cell `mark_stale_chapters` puts on a chapter page


def mark_stale_chapters(book_dir: Path) -> list[str]:
    """Open every chapter page whose results file is stale in this checkout (msgcore.chapters) with a warning that
    says why, in the build's copy of the notebook (the committed notebook keeps its outputs as they ran). Returns
    the chapters marked."""
    import nbformat

    from msgcore.chapters import CHAPTERS
    from msgcore.scoreboard import stale
    from msgcore.verdicts import load_json

    marked = []
    for name, notebook in find_chapters(book_dir).items():
        results = notebook.parent / RESULTS_FOLDER / f"{name}.json"
        if name not in CHAPTERS or not results.is_file():
            continue
        data = load_json(results)
        reasons = stale(name, data)
        nb = nbformat.read(notebook, as_version=4)
        kept = [c for c in nb.cells if STALE_TAG not in c.metadata.get("tags", [])]
        if not reasons and len(kept) == len(nb.cells):
            continue
        nb.cells = kept
        if reasons:
            text = (f"```{{admonition}} These results are stale\n:class: danger\nThe outputs on this page come from "
                    f"a `{data.get('scale')}` run at commit {data.get('commit')}. Since then: {'; '.join(reasons)}. "
                    f"They wait for a re-run: until then they do not speak for the code shown beside them.\n```")
            nb.cells.insert(1, nbformat.v4.new_markdown_cell(text, metadata={"tags": [STALE_TAG]}))
            marked.append(name)
        with atomic_write(notebook, "w", encoding="utf-8") as f:
            nbformat.write(nb, f)
    return marked


def build_book(book_dir: Path) -> Path:
    """`jupyter-book build <book_dir> --all -W --keep-going` (stale chapters marked first); returns the HTML
    index, raises on failure."""
    for name in mark_stale_chapters(book_dir):
        print(f"{name}: its results are stale; its page says so", flush=True)
    cmd = [jupyter_book_executable(), "build", str(book_dir), "--all", "-W", "--keep-going"]
    print("$ " + " ".join(cmd), flush=True)
    code = subprocess.run(cmd).returncode
    if code != 0:
        raise BuildError(f"jupyter-book build failed with exit status {code}; the warnings are printed above")
    html = book_dir / "_build" / "html"
    check_wrapping(html)
    check_offline_math(html)
    return html / "index.html"


def check_wrapping(html: Path) -> None:
    """The built book wraps long output lines: its pages link the book's stylesheet, which holds the rule."""
    css = html / STATIC / "custom.css"
    index = (html / "index.html").read_text(encoding="utf-8") if (html / "index.html").is_file() else ""
    pages = [p for p in html.rglob("*.html") if p.name != "index.html" and "_static" not in p.parts]
    linked = any("custom.css" in p.read_text(encoding="utf-8") for p in pages[:3]) or "custom.css" in index
    if not css.is_file() or WRAP_RULE not in css.read_text(encoding="utf-8") or not linked:
        raise BuildError(f"the built book does not wrap long output lines: {css} with '{WRAP_RULE}', linked from "
                         f"its pages, is missing")


def check_offline_math(html: Path) -> None:
    """The built book renders its equations offline: every page that loads MathJax loads the copy served with
    the book, and the copy is there."""
    sources = {p.name: re.findall(r'<script[^>]*src="([^"]*mathjax[^"]*)"', p.read_text(encoding="utf-8"), re.I)
               for p in html.rglob("*.html") if "_static" not in p.parts}
    remote = sorted(name for name, srcs in sources.items() if any(LOCAL_MATHJAX not in src for src in srcs))
    if remote or (any(sources.values()) and not (html / LOCAL_MATHJAX).is_file()):
        raise BuildError(f"the built book loads MathJax from the network ({', '.join(remote) or 'no local copy'}): "
                         f"install sphinx-mathjax-offline (requirements.txt), which serves {LOCAL_MATHJAX}")


# ----------------------------------------------------------------------------- entry points

def check_gpu_results(chapters: dict[str, Path], device: str, replace: bool) -> None:
    """Refuse, before any work, an --in-place execution on a CPU of a chapter whose committed notebook was executed
    on a GPU (its metadata says so): a GPU's evidence is never silently replaced by a CPU's."""
    import nbformat

    if replace or resolve_device(device).type != "cpu":
        return
    for name, path in chapters.items():
        cost = nbformat.read(path, as_version=4).metadata.get("msgcore", {}).get("cost", {})
        if cost.get("device type") == "cuda":
            raise BookError(f"{name} was executed on a GPU ({cost.get('device')}); a CPU execution would replace it: "
                            f"pass --replace-gpu-results to do so")


def run_book(root: Path = REPO_ROOT, chapters: Sequence[str] | None = None, scale: str | None = None, *,
             out: Path | None = None, in_place: bool = False, device: str = "auto", seed: int = 0,
             timeout: float | None = None, build: bool = False, replace_gpu_results: bool = False) -> RunReport:
    """Execute the chosen chapters of the book at `root` into a run directory; see the module docstring."""
    root = Path(root).resolve()
    scale = scale or default_scale()
    check_options(scale, in_place)
    selected = select_chapters(find_chapters(root), chapters)
    if in_place:
        check_gpu_results(selected, device, replace_gpu_results)
    absolute_data_mirror()
    run_dir = make_run_dir(root, scale, out)
    print(f"run directory: {run_dir}", flush=True)
    report = RunReport(run_dir, run_chapters(root, run_dir, selected, scale, in_place=in_place,
                                             device=device, seed=seed, timeout=timeout))
    print("\n" + format_summary(report.results), flush=True)
    if report.ok and build:
        report.html_index = build_book(run_dir)
        print(f"HTML book: {report.html_index}", flush=True)
    print(f"run directory: {run_dir}", flush=True)
    return report


LIVE_CHECK_CHAPTER = "ch00_transformer_baseline"  # re-executed at `small` by the main command on a CPU


def gpu_visible() -> bool:
    import torch

    return torch.cuda.is_available()


def build_committed_book(root: Path, out: Path | None = None) -> Path:
    """The HTML book of the committed outputs (the real runs): built in a copy, runs/committed-<time>."""
    run_dir = make_run_dir(root, "committed", out)
    print(f"building the book from the committed notebooks in {run_dir}", flush=True)
    return build_book(run_dir)


def reproduce_hint(chapters: Sequence[str]) -> str:
    return ("to reproduce any chapter at any scale: python -m msgcore.book run --scale smoke|small|full "
            f"--chapter NAME [--build]  (chapters: {', '.join(chapters)})")


def main_job(root: Path = REPO_ROOT, *, device: str = "auto", seed: int = 0, timeout: float | None = None,
             gpu: bool | None = None) -> int:
    """README's main command. With a GPU: every chapter at `full`, then the book from that run. Without one:
    the book from the committed outputs, then chapter 0 re-executed at `small` into a run directory as a live
    check. Prints where both are and how to reproduce any chapter; returns the exit status."""
    root = Path(root).resolve()
    chapters = find_chapters(root)
    if gpu_visible() if gpu is None else gpu:
        report = run_book(root, None, "full", device=device, seed=seed, timeout=timeout, build=True)
        print(reproduce_hint(list(chapters)), flush=True)
        return 0 if report.ok else 1
    html = build_committed_book(root)
    live = LIVE_CHECK_CHAPTER if LIVE_CHECK_CHAPTER in chapters else next(iter(chapters))
    print(f"no GPU: re-executing {live} at small scale as a live check", flush=True)
    report = run_book(root, [live], "small", device=device, seed=seed, timeout=timeout)
    print(f"\nthe book (committed outputs of the real runs): {html}\n"
          f"live check ({live} at small, {'ok' if report.ok else 'FAILED'}): {report.run_dir}\n"
          f"{live_check_note(report)}\n{reproduce_hint(list(chapters))}", flush=True)
    return 0 if report.ok else 1


def live_check_note(report: RunReport) -> str:
    """What the live check exercised: training, or only the notebook against runs the cache already held."""
    reused = sum(len(r.reused) for r in report.results)
    if not reused:
        return "it trained every run it needed on this machine"
    return (f"it reused {reused} runs from the run cache (trained nothing it found there): it checked the notebook, "
            f"decoding and scoring on this machine; MSGCORE_RUNS=off python -m msgcore.book main also trains them")


def default_root() -> Path:
    """The current directory when it holds a _toc.yml, else the checkout this module lives in."""
    return Path.cwd() if (Path.cwd() / "_toc.yml").is_file() else REPO_ROOT


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m msgcore.book", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="execute chapter notebooks (and optionally build the book)")
    run.add_argument("--scale", choices=SCALES, help="default: full when a GPU is visible, else smoke")
    run.add_argument("--chapter", nargs="+", metavar="NAME", help="chapters to run (default: all in _toc.yml)")
    run.add_argument("--in-place", action="store_true", help="replace the committed notebooks (small/full only)")
    run.add_argument("--out", type=Path, metavar="DIR", help="run directory (default: runs/<scale>-<YYYYmmdd-HHMMSS>)")
    run.add_argument("--build", action="store_true", help="then run jupyter-book build <run dir> -W")
    run.add_argument("--device", default="auto", help="passed to the notebooks (default: auto)")
    run.add_argument("--seed", type=int, default=0, help="passed to the notebooks (default: 0)")
    run.add_argument("--timeout", type=float, metavar="SECONDS", help="per-cell time limit (default: none)")
    run.add_argument("--root", type=Path, default=None, metavar="DIR", help="book root (default: . if it has _toc.yml)")
    run.add_argument("--replace-gpu-results", action="store_true",
                     help="with --in-place on a CPU, replace chapters that were executed on a GPU")
    add_cap_options(run)
    job = commands.add_parser("main", help="README's main command: with a GPU every chapter at full and the book; "
                                           "without one the book of the committed outputs and chapter 0 at small")
    job.add_argument("--device", default="auto", help="passed to the notebooks (default: auto)")
    job.add_argument("--seed", type=int, default=0, help="passed to the notebooks (default: 0)")
    job.add_argument("--timeout", type=float, metavar="SECONDS", help="per-cell time limit (default: none)")
    job.add_argument("--root", type=Path, default=None, metavar="DIR", help="book root (default: . if it has _toc.yml)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns 0 on success, 1 on a failed chapter or build, 2 on a bad request."""
    args = parse_args(argv)
    try:
        check_device(args.device)  # before any chapter starts: a bad device or seed fails every one of them
        check_seed(args.seed)
        if args.command == "main":
            return main_job(args.root or default_root(), device=args.device, seed=args.seed, timeout=args.timeout)
        if args.in_place and (args.dry_run or args.max_updates):
            raise BookError("a capped run (--dry-run, --max-updates) checks the code; it never replaces the "
                            "committed notebooks (drop --in-place)")
        apply_cap_options(args)  # the notebooks' kernels inherit the caps (msgcore.dryrun)
        report = run_book(args.root or default_root(), args.chapter, args.scale, out=args.out,
                          in_place=args.in_place, device=args.device, seed=args.seed,
                          timeout=args.timeout, build=args.build, replace_gpu_results=args.replace_gpu_results)
    except BuildError as e:
        print(f"msgcore.book: error: {e}", file=sys.stderr)
        return 1
    except MsgcoreError as e:  # BookError, and a device or seed the notebooks could not use
        print(f"msgcore.book: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk while copying the sources, say: one line, no traceback
        print(f"msgcore.book: error: {os_error_line(e)}", file=sys.stderr)
        return 2
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
