"""Run a chapter's training as a plain script, filling the run cache, e.g. on a GPU machine without Jupyter:

    python -m msgcore.experiments ch00 ch05 --scale full --pack runs/cache-full.tar
    python -m msgcore.experiments --unpack runs/cache-full.tar        # then execute the notebooks against it

A chapter's notebook asks the cache for the same runs, so it then executes in minutes (on a CPU too).
"""
from __future__ import annotations

import argparse
import importlib
import sys
import tarfile
import time
from pathlib import Path

from msgcore import runcache
from msgcore.utils import MsgcoreError, resolve_device, seed_everything

# chapter -> (module, function(scale_name, device, out_dir, seed)) that trains every run the chapter needs
CHAPTERS = {
    "ch00": ("msgcore.experiments", "train_baselines"),
    "ch01": ("msgcore.experiments.trice", "run_chapter"),
    "ch02": ("msgcore.experiments.mixrep", "run_chapter"),
    "ch03": ("msgcore.experiments.marge", "run_chapter"),
    "ch04": ("msgcore.experiments.postech_ape", "run_chapter"),
    "ch05": ("msgcore.experiments.coverage_nat", "run_chapter"),
}


def chapter_function(name: str):
    if name not in CHAPTERS:
        raise MsgcoreError(f"unknown chapter {name!r}; choose from {', '.join(CHAPTERS)}")
    module, function = CHAPTERS[name]
    fn = getattr(importlib.import_module(module), function, None)
    if fn is None:
        raise MsgcoreError(f"chapter {name} has no script entry point yet ({module}.{function})")
    return fn


def pack(archive: Path) -> None:
    root = runcache.cache_root()
    if root is None or not root.is_dir():
        raise MsgcoreError("the run cache is off or empty: nothing to pack")
    with tarfile.open(archive, "w") as tar:
        for entry in sorted(root.iterdir()):
            if runcache.finished(entry) is not None:  # only finished, verified entries travel
                tar.add(entry, arcname=entry.name)
    print(f"packed {root} into {archive}")


def unpack(archive: Path) -> None:
    root = runcache.cache_root()
    if root is None:
        raise MsgcoreError("the run cache is off (MSGCORE_RUNS=off): nowhere to unpack")
    if not archive.is_file():
        raise MsgcoreError(f"no such archive: {archive}")
    root.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        tar.extractall(root, filter="data")
    print(f"unpacked {archive} into {root}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m msgcore.experiments", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("chapters", nargs="*", help=f"chapters to train: {', '.join(CHAPTERS)}")
    parser.add_argument("--scale", choices=["smoke", "small", "full"], default="full")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/script"), help="folder for the runs' pointers")
    parser.add_argument("--pack", type=Path, help="afterwards, pack the finished cache entries into this tar file")
    parser.add_argument("--unpack", type=Path, help="unpack a packed cache into the run cache, then exit")
    args = parser.parse_args(argv)
    try:
        if args.unpack:
            unpack(args.unpack)
            return 0
        functions = [(name, chapter_function(name)) for name in args.chapters]  # refuse bad names before any work
        device = resolve_device(args.device)
        for name, fn in functions:
            start = time.perf_counter()
            seed_everything(args.seed)
            fn(args.scale, device, args.out / f"{name}-{args.scale}", seed=args.seed)
            print(f"{name}: {(time.perf_counter() - start) / 60:.1f} min ({len(runcache.REUSED)} runs reused so far)")
        if args.pack:
            pack(args.pack)
    except MsgcoreError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
