"""Small helpers shared by every module: errors, devices, seeds, atomic files, provenance."""
from __future__ import annotations

import contextlib
import errno
import os
import platform
import random
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np
import torch


class MsgcoreError(Exception):
    """Base class for the clear, one-line errors msgcore raises on bad input."""


class DataError(MsgcoreError):
    """Bad or missing data: mismatched files, empty lines, unknown language, bad split, bad checksum."""


class CheckpointError(MsgcoreError):
    """A checkpoint that is missing, truncated, corrupt or from an incompatible model."""


class TrainingError(MsgcoreError):
    """Training cannot go on, e.g. a NaN or inf loss."""


DEVICE_HINT = "use auto, cpu, cuda or cuda:N"


def check_device(name: str) -> str:
    """`name` when it is a device msgcore can train and decode on here; one clear line otherwise.

    'auto', 'cpu', 'cuda' and 'cuda:N' (N below the number of visible GPUs) pass; 'meta' (no data), 'mps' without
    Apple's backend, an index beyond the visible GPUs and anything torch cannot parse are refused up front."""
    if name == "auto":
        return name
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError, TypeError):
        raise MsgcoreError(f"{name!r} is not a device; {DEVICE_HINT}") from None
    if device.type == "cpu":
        return name
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not count:
            raise MsgcoreError(f"device {name!r} was asked for but no CUDA GPU is visible; use cpu or auto")
        if device.index is not None and device.index >= count:
            raise MsgcoreError(f"device {name!r} does not exist: {count} CUDA GPU(s) are visible (cuda:0 to "
                               f"cuda:{count - 1})")
        return name
    if device.type == "mps" and torch.backends.mps.is_available():
        return name
    if device.type == "mps":
        raise MsgcoreError(f"device {name!r} needs Apple's MPS backend, which this machine lacks; {DEVICE_HINT}")
    raise MsgcoreError(f"device {name!r} cannot train or translate ({device.type} is not supported); {DEVICE_HINT}")


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' picks CUDA when visible, else CPU; any other name must pass `check_device`."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(check_device(name))


SEED_MAX = 2 ** 32 - 1  # NumPy's seeds are 32-bit: the range every seeded generator accepts


def check_seed(seed: int) -> int:
    if not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        raise MsgcoreError(f"seed {seed!r} is out of range (a whole number from 0 to {SEED_MAX})")
    return seed


def keep_freed_memory() -> bool:
    """Make this process's allocator keep the memory it frees, for the next tensor of the same size (glibc only;
    False elsewhere, where nothing changes).

    glibc serves a block above its mmap threshold (at most 32 MB) with a fresh mapping and unmaps it when freed,
    so every large tensor (a training step's (N, V) logits and their gradient: 65 MB at 4,096 tokens and V =
    8,000) is zero-filled page by page by the kernel again at each step. On 2 CPU threads that made converting
    one such tensor from bf16 to fp32 take 36 ms instead of 5. With mmap off and trimming off, freed blocks stay
    in the heap: the process keeps its peak memory, and the step stops paying for page faults.
    """
    import ctypes
    import ctypes.util

    if platform.system() != "Linux":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    m_trim_threshold, m_mmap_max = -1, -4  # <malloc.h>
    return bool(mallopt(m_mmap_max, 0)) and bool(mallopt(m_trim_threshold, 2 ** 31 - 1))


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def is_stream(path: Path) -> bool:
    """True when `path` is not a regular file (nor a new path) to replace: a path under /dev or /proc
    (/dev/stdout, /dev/null, /proc/self/fd/1), or a character device, pipe or socket anywhere (a FIFO).
    Renaming a temporary file over such a path would replace the device node, the link or the pipe."""
    if Path(os.path.abspath(path)).parts[1:2] in (("dev",), ("proc",)):
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", **kwargs):
    """Open a temporary file beside `path`; rename it over `path` only if the block succeeds.

    An exception (or a kill) inside the block never leaves a file at `path` that looks complete. A symbolic
    link stays a link: its target is replaced. A device, pipe or socket (`is_stream`) is written directly,
    since it cannot be replaced atomically and must not be replaced at all.
    """
    path = Path(path)
    if is_stream(path):
        with open(path, mode, **kwargs) as f:
            yield f
        return
    path = Path(os.path.realpath(path)) if path.is_symlink() else path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    os.chmod(tmp, 0o666 & ~current_umask())  # mkstemp makes 0600; an output file gets the usual mode
    try:
        with open(tmp, mode, **kwargs) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as error:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(error, OSError) and not error.filename:
            error.filename = str(path)  # a failed write() names no file: name the one being written
        raise


def remove_temporaries(folder: Path, names) -> list[Path]:
    """Delete the `.NAME.*.tmp` files `atomic_write` left for each of `names` in `folder` (a write killed
    mid-way). Call it only while holding the folder (its lock), so that no live write loses its file."""
    removed = []
    for name in names:
        for tmp in Path(folder).glob(f".{name}.*.tmp"):
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
                removed.append(tmp)
    return removed


WRITE_ERRORS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
                errno.EROFS: "the file system is read-only"}


def os_error_line(error: OSError) -> str:
    """An OSError as one line for a user: "cannot write PATH: no space left on device"."""
    if error.errno in WRITE_ERRORS:
        return f"cannot write {error.filename2 or error.filename or 'a file'}: {WRITE_ERRORS[error.errno]}"
    reason = (error.strerror or str(error) or type(error).__name__).lower()
    return f"cannot use {error.filename}: {reason}" if error.filename else f"I/O error: {reason}"


@contextlib.contextmanager
def pid_lock(lock: Path, busy: Callable[[int], None], purpose: str):
    """Hold `lock`, a file holding our pid, for the block. While a live process holds it, `busy(pid)` is called:
    it raises to refuse, or returns to try again (after waiting). A lock whose process is gone is taken over."""
    lock = Path(lock)
    if lock.is_dir() or lock.is_symlink():
        raise MsgcoreError(f"{lock} is a {'folder' if lock.is_dir() else 'link'}, not a lock file; remove it to "
                           f"{purpose}")
    lock.parent.mkdir(parents=True, exist_ok=True)
    while True:
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            break
        except FileExistsError:
            holder = lock_holder(lock)
            if holder is None:
                with contextlib.suppress(FileNotFoundError):
                    lock.unlink()  # stale: its process is gone
            else:
                busy(holder)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()}\n")
    except OSError as error:  # a full disk: no half-written lock stays behind, and the error names the file
        lock.unlink(missing_ok=True)
        error.filename = error.filename or str(lock)
        raise
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()


def lock_holder(lock: Path) -> int | None:
    """The live process whose pid `lock` holds, or None when the lock is stale (process gone, or unreadable)."""
    try:
        pid = int(lock.read_text().strip() or "0")
    except (OSError, ValueError):
        return None
    if pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, another user's
    with contextlib.suppress(OSError, IndexError):
        if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return None  # a zombie: it has ended, its parent has not reaped it yet
    return pid


def current_umask() -> int:
    """The process's umask (read by setting it and putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def may_write(path: Path) -> bool:
    """True when `path` may be written: the OS allows it and its mode has a write bit (root included)."""
    return os.access(path, os.W_OK) and bool(path.stat().st_mode & 0o222)


def nearest_existing(path: Path) -> Path:
    """`path` itself, or its closest ancestor that exists."""
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_writable_dir(path: str | os.PathLike, what: str) -> None:
    """Refuse a folder that is a file, is read-only, or cannot be created (one line naming `what`)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise MsgcoreError(f"{what} {path} is a file, not a folder")
    existing = nearest_existing(path)
    if not existing.is_dir():
        raise MsgcoreError(f"{what} {path} cannot be created: {existing} is a file, not a folder")
    if not may_write(existing):
        raise MsgcoreError(f"{what} {path} is read-only" if existing == path.absolute()
                           else f"{what} {path} cannot be created: {existing} is read-only")


def check_writable_file(path: str | os.PathLike, what: str) -> None:
    """Refuse an output file path that is a folder, read-only, or in a folder that cannot be written."""
    path = Path(path)
    if is_stream(path):  # /dev/stdout, a FIFO: written in place
        if not os.path.exists(path):
            raise MsgcoreError(f"{what} {path} does not exist (a path under /dev or /proc must name a device)")
        return
    if path.is_dir():
        raise MsgcoreError(f"{what} {path} is a folder; give a file name")
    if path.exists() and not may_write(path):
        raise MsgcoreError(f"{what} {path} is read-only")
    check_writable_dir(path.parent if str(path.parent) else Path("."), f"the folder of {what}")


def git_commit(default: str = "unknown") -> str:
    """The git commit of the msgcore checkout (with '+dirty' when it has uncommitted changes); `$MSGCORE_COMMIT`
    when it is set (a copy of the checkout travels to a GPU box without its .git: msgcore.offline sets it there)."""
    if os.environ.get("MSGCORE_COMMIT"):
        return os.environ["MSGCORE_COMMIT"]
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                             text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "msgcore"], cwd=root,
                               capture_output=True, text=True).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return default


def device_name(device: torch.device) -> str:
    """A human-readable device description for provenance cells."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def provenance(scale: str, device: torch.device, seed: int, wall_time_s: float | None = None,
               commit: str | None = None) -> dict:
    """What a chapter's provenance cell prints: versions, commit, device, scale, seed and wall time.

    Pass the `commit` read when the run started, so later edits do not mark the run dirty.
    """
    import sacrebleu
    import sentencepiece

    from msgcore import __version__

    info = {
        "msgcore": __version__,
        "git commit": commit or git_commit(),
        "torch": torch.__version__,
        "sacrebleu": sacrebleu.__version__,
        "sentencepiece": sentencepiece.__version__,
        "python": platform.python_version(),
        "device": device_name(device),
        "scale": scale,
        "seed": seed,
    }
    if wall_time_s is not None:
        info["wall time"] = f"{wall_time_s / 60:.1f} min"
    return info
