"""Numerics versions: which training numbers a chapter's results were computed under, per model family.

The run cache keys a run by msgcore's code, so a refactor that moves no number retrains nothing and leaves the book's
results (book/results/*.json) standing. A change that does move a model's training numbers must make those results
stale: each model family has a version here, a chapter records the versions of the families it trains in its
results, and `changed` says which of them moved since.

    versions("trice")                            -> {"core": 3, "trice": 1}
    changed({"core": 3, "trice": 1}, ["trice"])  -> []                            (current)
    changed({"core": 3}, ["trice"])              -> ["trice numerics not recorded (now 1)"]
"""
from __future__ import annotations

from typing import Iterable

from msgcore.runcache import RESULTS_VERSION
from msgcore.utils import MsgcoreError

# Bump a family's version when its model's training numbers change: its golden test (tests/test_golden_numerics.py,
# a tiny run's losses pinned per version) then fails; pin the new losses under the new version. Chapters record these
# versions in their results, so a bump marks the results computed under the old numbers as stale.
FAMILIES: dict[str, int] = {
    "core": RESULTS_VERSION,  # the shared Transformer core, trainer, layers, generation (bumped in msgcore.runcache)
    "trice": 1,  # msgcore/models/trice.py
    "mixrep": 1,  # msgcore/models/mixrep.py
    "marge": 1,  # msgcore/models/marge.py
    "postech_ape": 1,  # msgcore/models/postech_ape.py
    "coverage_nat": 1,  # msgcore/models/coverage_nat.py
}


def versions(*families: str) -> dict[str, int]:
    """The current versions of `families`, "core" always included (first)."""
    unknown = [name for name in families if name not in FAMILIES]
    if unknown:
        raise MsgcoreError(f"unknown numerics family {', '.join(map(repr, unknown))}; known: {', '.join(FAMILIES)}")
    return {name: FAMILIES[name] for name in ("core", *families)}


def changed(recorded: dict | None, families: Iterable[str]) -> list[str]:
    """One line per family (and "core") whose version differs from the one `recorded` in a results file, e.g.
    "trice numerics 1 → 2"; ["numerics not recorded"] when nothing was recorded; [] when the results are current."""
    if not recorded:
        return ["numerics not recorded"]
    lines = []
    for name, version in versions(*families).items():
        if name not in recorded:
            lines.append(f"{name} numerics not recorded (now {version})")
        elif recorded[name] != version:
            lines.append(f"{name} numerics {recorded[name]} → {version}")
    return lines
