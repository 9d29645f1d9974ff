"""The run cache: each training run (and each costly artefact, e.g. distilled data) is computed once and reused.

A run is keyed by a fingerprint of everything that decides its result: the model's class, every configuration
field and its initial weights, every training-configuration field (seed included), the token ids of its training
and validation data, the precision and attention kernels, and the code (`code_fingerprint`: the shared core's,
the model's and the trainer's syntax, torch's version, RESULTS_VERSION). A finished run's folder under the cache
holds `best.pt`, `log.json` and `meta.json`; `meta.json` is written last, atomically, and carries the SHA-256 of
`best.pt` and the run's provenance (commit, torch, date, device, wall time), so an entry without it is unfinished
(its `last.pt` resumes the run) and an entry whose checkpoint no longer matches is corrupt (retrained, with a
warning). A process holds the entry's lock while it trains or reads it (`entry_lock`).

    cache root: $MSGCORE_RUNS, else ~/.cache/msgcore/runs      ($MSGCORE_RUNS=off disables the cache)

Chapter 5 reuses chapter 0's model as its teacher this way, and the later chapters reuse chapter 1's
denoising model: they ask for the same run, and get the cached one.
"""
from __future__ import annotations

import ast
import dataclasses
import hashlib
import importlib
import inspect
import io
import json
import os
import pickle
import shutil
import time
import warnings
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import torch

from msgcore import dryrun
from msgcore.utils import MsgcoreError, atomic_write, git_commit, pid_lock

RESULTS_VERSION = 3  # bump when training results change for a reason the code fingerprint cannot see (a dependency's
# behaviour, data handling outside msgcore); tests/test_golden_numerics.py pins a tiny run's losses per version
# The modules whose code decides every run's numbers; a model's own module and its trainer's join them per run.
NUMERICS_MODULES = ("msgcore.attention", "msgcore.batching", "msgcore.embeddings", "msgcore.generation",
                    "msgcore.layers", "msgcore.loss", "msgcore.metrics", "msgcore.model", "msgcore.tokenizer",
                    "msgcore.trainer")
REUSED: list[str] = []  # the names of the runs this process reused, in order
USED: dict[str, bool] = {}  # every entry this process reused (True) or built (False), in the order first used


def note_reused(name: str) -> None:
    """Remember a reused entry; also append it to $MSGCORE_REUSE_LOG (the book runner reads that file per chapter)."""
    REUSED.append(name)
    USED.setdefault(name, True)
    _append_name("MSGCORE_REUSE_LOG", name)


def _append_name(env: str, name: str) -> None:
    log = os.environ.get(env)
    if log:
        with open(log, "a") as f:
            f.write(name + "\n")


def cache_root() -> Path | None:
    """The cache folder, or None when `MSGCORE_RUNS=off`; under a dry run's caps (`msgcore.dryrun`) a subfolder."""
    root = os.environ.get("MSGCORE_RUNS", "")
    if root.lower() in ("off", "0", "none"):
        return None
    folder = Path(root) if root else Path.home() / ".cache" / "msgcore" / "runs"
    capped = dryrun.caps()
    return folder / capped.name if capped else folder  # capped runs keep to their own corner


def _feed(h, obj) -> None:
    """Hash `obj` into `h` by value: tensors by bytes, containers recursively, dataclasses by fields."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")  # reshape: 0-d too
    elif isinstance(obj, dict):
        h.update(b"D")
        for key in sorted(obj, key=str):
            _feed(h, str(key))
            _feed(h, obj[key])
    elif isinstance(obj, (list, tuple)):
        h.update(f"L{len(obj)}".encode())
        if obj and all(type(x) is int for x in obj):  # token ids: one fast update
            h.update(json.dumps(obj).encode())
        else:
            for x in obj:
                _feed(h, x)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        h.update(type(obj).__name__.encode())
        _feed(h, all_fields(obj))
    elif isinstance(obj, bytes):
        h.update(b"B" + obj)
    else:
        h.update(repr(obj).encode())


def all_fields(obj) -> dict:
    """Every field of a dataclass, defaults included: a changed default is another run."""
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def module_syntax(name: str) -> str:
    """The syntax of a module's code (`code_syntax`)."""
    return code_syntax(inspect.getsource(importlib.import_module(name)))


def code_syntax(source: str) -> str:
    """Source code's syntax tree without docstrings: comments and docstrings may change freely, code may not."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body and \
                isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and \
                isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree, annotate_fields=False, include_attributes=False)


def code_fingerprint(*classes: type) -> str:
    """The code that decides a run's numbers: NUMERICS_MODULES, the modules of `classes` and of their base classes
    within msgcore (a paper's model on the shared core, a trainer subclass), torch's version and RESULTS_VERSION."""
    modules = set(NUMERICS_MODULES) | {base.__module__ for cls in classes for base in cls.__mro__
                                       if base.__module__.split(".")[0] == "msgcore"}
    return fingerprint([(name, module_syntax(name)) for name in sorted(modules)], torch.__version__, RESULTS_VERSION)


def fingerprint(*objects) -> str:
    """A short, stable SHA-256 fingerprint of `objects` by value."""
    h = hashlib.sha256()
    for obj in objects:
        _feed(h, obj)
    return h.hexdigest()[:16]


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def entry_dir(kind: str, key: str) -> Path | None:
    root = cache_root()
    return None if root is None else root / f"{kind}-{key}"


def finished(entry: Path) -> dict | None:
    """The entry's meta.json when the entry is complete and its checkpoint verifies; None when unfinished.
    A corrupt entry is removed, with a warning, so that it is rebuilt."""
    meta, problem = verified(entry)
    if problem:
        warnings.warn(f"run cache entry {entry} is corrupt ({problem}); rebuilding it")
        shutil.rmtree(entry, ignore_errors=True)
    return meta


def verified(entry: Path) -> tuple[dict | None, str | None]:
    """(meta.json, None) for a complete entry whose files match their checksums; (None, None) for an unfinished
    one; (None, what is wrong) for a corrupt one."""
    meta_path = entry / "meta.json"
    if not meta_path.is_file():
        return None, None
    try:
        meta = json.loads(meta_path.read_text())
        for name, digest in meta["files"].items():
            if file_sha256(entry / name) != digest:
                raise ValueError(f"{name} does not match its checksum")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        return None, str(error) or type(error).__name__
    return meta, None


LOCK_POLL_S = 5.0  # how often a process waiting for another's run looks again


def entry_lock(entry: Path, poll_s: float = LOCK_POLL_S):
    """Hold `entry/.lock` while training or reading the entry. A second process asking for the same run waits
    until the first is done, then finds the run finished; a lock whose process died is taken over."""
    said = []

    def wait(pid: int) -> None:
        if pid == os.getpid():  # left by this process (a kernel interrupted mid-run): ours to take
            (entry / ".lock").unlink(missing_ok=True)
            return
        if not said:
            print(f"waiting for process {pid}, which is training the same run ({entry.name})", flush=True)
            said.append(pid)
        time.sleep(poll_s)
    return pid_lock(entry / ".lock", wait, f"train the run {entry.name}")


def begin(entry: Path) -> None:
    """Record the commit and the time at which a run or a build starts (`entry/started.json`): the commit that
    trains a run is the one it started at, even when the checkout moves while it trains. A resumed run keeps the
    record of its first start."""
    entry.mkdir(parents=True, exist_ok=True)
    if not (entry / "started.json").is_file():
        with atomic_write(entry / "started.json") as f:
            json.dump({"commit": git_commit(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}, f)


def started(entry: Path) -> dict:
    """What `begin` recorded, or {} for an entry begun before it existed (or unreadable)."""
    try:
        record = json.loads((entry / "started.json").read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def mark_finished(entry: Path, files: list[str], **info) -> dict:
    """Write meta.json (last, atomically): the checksums of `files`, the provenance of the run (the commit it
    started at, from `begin`, and the one it finished at where they differ; torch's version; the date) and `info`
    (wall time, device, ...). A CPU run also records its torch threads and the cores it could use, since a 2-core
    machine may train one run on both cores or two runs side by side on one each (`machine_share`)."""
    now = git_commit()
    commit = started(entry).get("commit", now)
    meta = {"files": {name: file_sha256(entry / name) for name in files}, "commit": commit,
            **({"finished at commit": now} if now != commit else {}),
            "torch": torch.__version__, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), **info,
            **({"cpu threads": torch.get_num_threads(), "cpu cores": usable_cores()}
               if info.get("device") == "cpu" else {})}
    with atomic_write(entry / "meta.json") as f:
        json.dump(meta, f, indent=1)
    USED.setdefault(entry.name, False)
    _append_name("MSGCORE_BUILT_LOG", entry.name)  # the book runner's record of what a chapter trained itself
    return meta


def usable_cores() -> int:
    """The CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def machine_share(meta: dict) -> float:
    """The share of its machine a finished entry used: threads / cores for a CPU run that trained on fewer threads
    than its machine has cores (so that another process could train beside it), else 1. A chapter's cold cost counts
    a run's minutes at this share (`msgcore.book.record_cost`)."""
    threads, cores = meta.get("cpu threads"), meta.get("cpu cores")
    if type(threads) is not int or type(cores) is not int or not 0 < threads < cores:  # bool, str, 0 -> a whole one
        return 1.0
    return threads / cores


def machine_shares(names: list[str]) -> dict[str, float]:
    """`machine_share` of each named entry (1 for one without a readable meta.json)."""
    root = cache_root()
    shares = {}
    for name in names:
        try:
            meta = json.loads((root / name / "meta.json").read_text()) if root else {}
        except (OSError, ValueError):
            meta = {}
        shares[name] = machine_share(meta if isinstance(meta, dict) else {})
    return shares


def provenance_rows(names: list[str] | None = None) -> list[dict]:
    """Who made each cache entry this process used (default: `USED`, in order): the commit that trained or built it,
    when, on what, in how many minutes, and whether this process reused it or built it. A chapter's provenance cell
    shows these rows, so a notebook executed against a warm cache still names the commits behind its numbers."""
    root = cache_root()
    rows = []
    for name in (USED if names is None else names):
        meta_path = root / name / "meta.json" if root else None
        meta = json.loads(meta_path.read_text()) if meta_path and meta_path.is_file() else {}
        wall, device = meta.get("wall_time_s"), meta.get("device", "?")
        if machine_share(meta) < 1:  # e.g. "cpu (1 of 2 cores)": another run may have trained beside it
            device = f"{device} ({meta['cpu threads']} of {meta['cpu cores']} cores)"
        rows.append({"entry": name, "here": "reused" if USED.get(name, True) else "trained now",
                     "trained at commit": meta.get("commit", "?"), "date": meta.get("date", "?"),
                     "device": device, "minutes": round(wall / 60, 1) if wall is not None else None})
    return rows


def artifact_entry(kind: str, key: dict) -> Path | None:
    """The cache folder of `cached_artifact(kind, key, ...)` (None when the cache is off): a long build keeps its
    resumable state there, in a `work/` folder that goes once the artefact is finished."""
    return entry_dir(kind, fingerprint(kind, key, code_fingerprint()))  # the generation code decides it too


def cached_artifact(kind: str, key: dict, build: Callable[[], object], safe_types: tuple[type, ...] = (),
                    training: Callable[[object], tuple[list[dict], float]] | None = None):
    """`build()`'s result, computed once per `key` and stored with torch.save (e.g. distilled targets).

    The result may hold tensors, plain data, EncodedCorpus and the dataclasses named in `safe_types`: the entry is
    read back with `weights_only=True`, so a cache received from elsewhere cannot run code.

    `training` marks an artefact that is a training run (one that records a curve as it trains, say): result ->
    (its log, its whole wall time in seconds, the earlier processes' of an interrupted build included). The entry
    then keeps that log beside the artefact (log.json, as a run's entry does) and that wall time in meta.json, so
    that provenance and the GPU estimates (msgcore.costs) count it as the training run it is."""
    entry = artifact_entry(kind, key)
    if entry is None:
        return build()
    with entry_lock(entry):  # a second process building the same artefact waits, then reads it
        meta = finished(entry)
        if meta is not None:
            note_reused(entry.name)
            value = load_artifact(entry / "artifact.pt", safe_types)
            if training and "log.json" not in meta["files"]:  # finished before its entry kept the log
                keep_training_log(entry, *training(value))
            return value
        begin(entry)
        start = time.perf_counter()
        value = build()
        wall = time.perf_counter() - start  # this process's part, when the build resumed an interrupted one
        buffer = io.BytesIO()
        torch.save(value, buffer)
        with atomic_write(entry / "artifact.pt", "wb") as f:
            f.write(buffer.getvalue())
        shutil.rmtree(entry / "work", ignore_errors=True)
        mark_finished(entry, ["artifact.pt"], kind=kind, wall_time_s=wall)
        if training:
            keep_training_log(entry, *training(value))
    return value


def keep_training_log(entry: Path, log: list[dict], wall_time_s: float) -> None:
    """Store a training artefact's log in its finished entry, and record the log's checksum and the run's whole
    wall time in the entry's meta.json (last, so that a kill in between leaves the entry to be completed again)."""
    with atomic_write(entry / "log.json") as f:
        json.dump(log, f, indent=1)
    meta = json.loads((entry / "meta.json").read_text())
    meta["files"]["log.json"] = file_sha256(entry / "log.json")
    meta["wall_time_s"] = wall_time_s
    with atomic_write(entry / "meta.json") as f:
        json.dump(meta, f, indent=1)


def load_artifact(path: Path, safe_types: tuple[type, ...] = ()):
    """Read an artefact written by `cached_artifact`, unpickling only tensors, plain data and `safe_types`."""
    from msgcore.batching import EncodedCorpus

    try:
        with torch.serialization.safe_globals([EncodedCorpus, *safe_types]):
            return torch.load(path, weights_only=True)
    except pickle.UnpicklingError as error:
        raise MsgcoreError(f"run cache artefact {path} holds objects that are not allowed ({str(error).splitlines()[0]}"
                           f"); refused, since loading it could run code. Delete {path.parent} to rebuild it") from None
