"""Capped runs: every training loop stopped after a few updates and every data split cut to a few sentences, at a
recipe's own model sizes and settings. This is how the `full` recipes, written for a GPU, are proven on a CPU:

    python -m msgcore.experiments ch00 ch05 --scale full --device cpu --dry-run     # 2 updates, 24 sentences
    python -m msgcore.experiments ch01 --scale full --max-updates 50                # training capped, data whole
    python -m msgcore.book run --scale full --dry-run                               # the notebooks, capped

The caps live in the environment (`MSGCORE_MAX_UPDATES`, `MSGCORE_MAX_SENTENCES`), so that the notebooks a book run
starts inherit them. A capped run's numbers mean nothing: its runs go to their own corner of the run cache
(`runcache.cache_root`), so they never serve, nor are served by, an uncapped run.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from msgcore.utils import MsgcoreError

UPDATES_ENV, SENTENCES_ENV = "MSGCORE_MAX_UPDATES", "MSGCORE_MAX_SENTENCES"
DRY_RUN = (2, 24)  # --dry-run: updates per training loop, sentences per data split


@dataclass(frozen=True)
class Caps:
    updates: int = 0  # at most this many updates per training loop (0 = no cap)
    sentences: int = 0  # at most this many examples per data split as it is loaded (0 = no cap)

    def __bool__(self) -> bool:
        return bool(self.updates or self.sentences)

    @property
    def name(self) -> str:
        """A folder name for the run cache's corner of these caps."""
        return f"capped-u{self.updates}-s{self.sentences}"


def _count(env: str) -> int:
    text = os.environ.get(env, "").strip()
    if not text:
        return 0
    if not text.isdigit():
        raise MsgcoreError(f"{env}={text!r} is not a count; use a whole number (0 = no cap) or unset it")
    return int(text)


def caps() -> Caps:
    """The caps in force (both 0: none)."""
    return Caps(_count(UPDATES_ENV), _count(SENTENCES_ENV))


def set_caps(updates: int = 0, sentences: int = 0) -> None:
    """Put caps in force for this process and the processes it starts (0 removes a cap)."""
    for env, value in ((UPDATES_ENV, updates), (SENTENCES_ENV, sentences)):
        if value < 0:
            raise MsgcoreError(f"a cap cannot be negative ({env}={value})")
        if value:
            os.environ[env] = str(value)
        else:
            os.environ.pop(env, None)


def updates(max_steps: int) -> int:
    """A loop's update limit under the caps (`max_steps` 0 = unlimited becomes the cap)."""
    cap = caps().updates
    if not cap:
        return max_steps
    return min(max_steps, cap) if max_steps else cap


def sentences(count: int) -> int:
    """How many of `count` examples a capped split keeps."""
    cap = caps().sentences
    return min(count, cap) if cap else count


def train_config(cfg):
    """A TrainConfig under the caps: at most `updates` updates, logged and validated at least once, on at most
    `sentences` dev sentences. The caller's object is not changed."""
    from dataclasses import replace

    current = caps()
    if not current:
        return cfg
    steps = updates(cfg.max_steps)
    valid = cfg.valid_max_sentences
    if current.sentences:
        valid = min(valid, current.sentences) if valid else current.sentences
    return replace(cfg, max_steps=steps, validate_every=min(cfg.validate_every, steps) if cfg.validate_every else 0,
                   valid_max_sentences=valid, log_every=min(cfg.log_every, steps or cfg.log_every))  # a log row
