"""Run a chapter's training as a plain script, filling the run cache, e.g. on a GPU machine without Jupyter:

    python -m msgcore.experiments ch00 ch05 --scale full --pack runs/cache-full.tar
    python -m msgcore.experiments --unpack runs/cache-full.tar        # then execute the notebooks against it
    python -m msgcore.experiments ch05 --scale full --device cpu --dry-run   # every loop capped (msgcore.dryrun)
    python -m msgcore.experiments ch05 --scale small --part 1/3   # the second of 3 processes: its share of the seeds

A chapter's notebook asks the cache for the same runs, so it then executes in minutes (on a CPU too). With
`--part i/N`, N processes started together share a chapter's runs: chapters 0, 3 and 5 by seed (process i takes
every N-th seed, process 0 the runs of one seed only, such as ablations; chapter 3 a seed's whole chain, then process
0 makes the full pass), chapters 1, 2 and 4 by run (process i takes every N-th of the chapter's `share_jobs`, then
process 0 makes the full pass). A run that several need (a teacher, a
distillation, a stage-1 model) is trained by the first to ask and awaited by the others (msgcore.runcache's lock).
"""
from __future__ import annotations

import argparse
import importlib
import inspect
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from msgcore import distributed, runcache
from msgcore.options import OneLineParser, add_cap_options, apply_cap_options, device_option, seed_option
from msgcore.utils import MsgcoreError, atomic_write, check_writable_dir, check_writable_file, os_error_line, \
    resolve_device, seed_everything

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


def part_option(text: str) -> tuple[int, int]:
    """"i/N" with 0 <= i < N, for --part."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not i/N (e.g. 0/3)") from None
    if not 0 <= i < n:
        raise argparse.ArgumentTypeError(f"{text!r}: i must be in 0..N-1")
    return i, n


def call_chapter(name: str, fn, scale: str, device, out: Path, seed: int, part: tuple[int, int]):
    """Train a chapter's runs (its share of them, with --part)."""
    if part != (0, 1):
        if "part" not in inspect.signature(fn).parameters:
            raise MsgcoreError(f"chapter {name} trains in one process: --part is not supported for it yet")
        return fn(scale, device, out, seed=seed, part=part)
    return fn(scale, device, out, seed=seed)


def pack(archive: Path) -> None:
    """Write the finished, verified cache entries into `archive` (a tar file), whole or not at all."""
    root = runcache.cache_root()
    if root is None or not root.is_dir():
        raise MsgcoreError("the run cache is off or empty: nothing to pack")
    with atomic_write(archive, "wb") as f, tarfile.open(fileobj=f, mode="w") as tar:
        for entry in sorted(root.iterdir()):
            if entry.is_dir() and not entry.name.startswith(".") and runcache.finished(entry) is not None:
                tar.add(entry, arcname=entry.name)  # only finished, verified entries travel
    print(f"packed {root} into {archive}")


def archive_members(archive: Path) -> list[tarfile.TarInfo]:
    """The members of a packed cache, each checked before anything is written: a plain file or folder inside
    one cache entry. Absolute paths, `..`, links and devices are refused, as is anything tarfile cannot read."""
    try:
        with tarfile.open(archive) as tar:
            members = tar.getmembers()
    except (tarfile.TarError, EOFError, OSError) as error:
        raise MsgcoreError(f"--unpack {archive} is not a readable tar archive ({type(error).__name__}: "
                           f"{str(error).splitlines()[0] if str(error) else 'truncated'})") from None
    for member in members:
        parts = Path(member.name).parts
        kind = "a link" if member.issym() or member.islnk() else None if member.isfile() or member.isdir() \
            else "a device or special file"
        if member.name.startswith(("/", "\\")) or Path(member.name).is_absolute():
            raise MsgcoreError(f"--unpack {archive} refused: {member.name!r} is an absolute path")
        if ".." in parts or not parts:
            raise MsgcoreError(f"--unpack {archive} refused: {member.name!r} leaves the run cache")
        if kind:
            raise MsgcoreError(f"--unpack {archive} refused: {member.name!r} is {kind}; a packed cache holds only "
                               f"files and folders")
        if parts[0].startswith("."):
            raise MsgcoreError(f"--unpack {archive} refused: {member.name!r} is not a run cache entry's file")
    return members


def unpack(archive: Path) -> None:
    """Unpack a packed cache into the run cache: checked whole first, extracted into a staging folder, each
    entry verified against its checksums, then moved into place (entries already there are kept)."""
    root = runcache.cache_root()
    if root is None:
        raise MsgcoreError("the run cache is off (MSGCORE_RUNS=off): nowhere to unpack")
    if root.exists() and not root.is_dir():
        raise MsgcoreError(f"the run cache MSGCORE_RUNS={root} is a file, not a folder")
    if not archive.is_file():
        raise MsgcoreError(f"no such archive: {archive}")
    check_writable_dir(root, "the run cache (MSGCORE_RUNS)")
    members = archive_members(archive)
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=root, prefix=".unpack-"))
    try:
        try:
            with tarfile.open(archive) as tar:
                tar.extractall(staging, members=members, filter="data")
        except (tarfile.TarError, EOFError) as error:
            raise MsgcoreError(f"--unpack {archive} is damaged ({type(error).__name__}: {error}); "
                               f"nothing was unpacked") from None
        entries = sorted(staging.iterdir())
        bad = [entry.name for entry in entries if runcache.verified(entry)[0] is None]
        if bad:
            raise MsgcoreError(f"--unpack {archive}: {len(bad)} entr{'y' if len(bad) == 1 else 'ies'} fail their "
                               f"checksums ({', '.join(bad[:3])}); nothing was unpacked")
        added = [entry for entry in entries if not (root / entry.name).exists()]
        for entry in added:
            entry.rename(root / entry.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    print(f"unpacked {archive} into {root}: {len(added)} new entries, {len(entries) - len(added)} already there")


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m msgcore.experiments", description=__doc__.splitlines()[0],
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("chapters", nargs="*", help=f"chapters to train: {', '.join(CHAPTERS)}")
    parser.add_argument("--scale", choices=["smoke", "small", "full"], default="full")
    parser.add_argument("--device", type=device_option, default="auto", help="auto, cpu, cuda or cuda:N")
    parser.add_argument("--seed", type=seed_option, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/script"), help="folder for the runs' pointers")
    parser.add_argument("--pack", type=Path, help="afterwards, pack the finished cache entries into this tar file")
    parser.add_argument("--unpack", type=Path, help="unpack a packed cache into the run cache, then exit")
    parser.add_argument("--part", type=part_option, default=(0, 1), metavar="i/N",
                        help="train the i-th of N shares of the chapters' seeds (N processes side by side)")
    add_cap_options(parser)
    args = parser.parse_or_exit_code(argv)
    if isinstance(args, int):
        return args
    try:
        if args.pack:
            check_writable_file(args.pack, "--pack")  # before hours of training, not after
        if args.unpack:
            unpack(args.unpack)
            return 0
        if distributed.launched():
            raise MsgcoreError("python -m msgcore.experiments runs in one process: under torchrun every process "
                               "would train every run of the chapter and race on the run cache. Run it without "
                               "torchrun; data-parallel training of one model is `torchrun -m msgcore train`")
        functions = [(name, chapter_function(name)) for name in args.chapters]  # refuse bad names before any work
        apply_cap_options(args)
        device = resolve_device(args.device)
        for name, fn in functions:
            start = time.perf_counter()
            seed_everything(args.seed)
            call_chapter(name, fn, args.scale, device, args.out / f"{name}-{args.scale}", args.seed, args.part)
            print(f"{name}: {(time.perf_counter() - start) / 60:.1f} min ({len(runcache.REUSED)} runs reused so far)")
        if args.pack:
            pack(args.pack)
    except MsgcoreError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except OSError as error:  # a full disk while packing or unpacking, say
        print(f"error: {os_error_line(error)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
