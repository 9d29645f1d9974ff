"""Small helpers shared by every module: errors, devices, seeds, atomic files, provenance."""
from __future__ import annotations

import contextlib
import os
import platform
import random
import subprocess
import tempfile
from pathlib import Path

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


def resolve_device(name: str = "auto") -> torch.device:
    """'auto' picks CUDA when visible, else CPU; any other string is passed to torch.device."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise MsgcoreError(f"device {name!r} was asked for but no CUDA GPU is visible; use device='cpu' or 'auto'")
    return device


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (all devices)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w", **kwargs):
    """Open a temporary file beside `path`; rename it over `path` only if the block succeeds.

    An exception (or a kill) inside the block never leaves a file at `path` that looks complete.
    """
    path = Path(path)
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
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


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
    if path.is_dir():
        raise MsgcoreError(f"{what} {path} is a folder; give a file name")
    if path.exists() and not may_write(path):
        raise MsgcoreError(f"{what} {path} is read-only")
    check_writable_dir(path.parent if str(path.parent) else Path("."), f"the folder of {what}")


def git_commit(default: str = "unknown") -> str:
    """The git commit of the msgcore checkout (with '+dirty' when it has uncommitted changes)."""
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
