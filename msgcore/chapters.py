"""The book's chapters as their results files know them: what each one's numbers depend on, so that a results file
can say whether it is still current.

A chapter's results (`book/results/<notebook>.json`, msgcore.verdicts) record its identity when they are written:
the numerics versions of the model families its runs train (msgcore.numerics) and a fingerprint of its recipe (the
chapter's scale and the foundation scales it trains on). `staleness` compares them with this checkout. A refactor
changes neither, so it leaves the evidence current; a change of numbers or of the recipe makes it stale, and so does
a results file judged under another version of the verdict protocol. Staleness never fails a build: the chapter
page, the scoreboard and README say it, and the chapter waits for its re-run.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from msgcore import numerics, runcache
from msgcore.utils import MsgcoreError
from msgcore.verdicts import PROTOCOL_VERSION


@dataclass(frozen=True)
class ChapterRecipe:
    families: tuple[str, ...]  # the model families whose numerics its runs depend on (msgcore.numerics)
    scales: Callable[[str], tuple]  # scale name -> every scale object that decides its runs


def _baseline(name: str) -> tuple:
    from msgcore.foundations.baselines import BASELINE_SCALES
    return (BASELINE_SCALES[name],)


def _baseline_chapter(name: str) -> tuple:
    from msgcore.foundations.baselines import BASELINE_SEEDS
    return *_baseline(name), ("training seeds", BASELINE_SEEDS[name])


def _trice(name: str) -> tuple:
    from msgcore.experiments.trice import TRICE_SCALES
    from msgcore.foundations.denoiser import DENOISER_SCALES
    return TRICE_SCALES[name], DENOISER_SCALES[name]


def _mixrep(name: str) -> tuple:
    from msgcore.experiments.mixrep import MIXREP_SCALES, chapter_recipe
    return MIXREP_SCALES[name], chapter_recipe(MIXREP_SCALES[name])


def _marge(name: str) -> tuple:
    from msgcore.experiments.marge import MARGE_SCALES
    from msgcore.foundations.denoiser import DENOISER_SCALES
    return MARGE_SCALES[name], DENOISER_SCALES[name], *_baseline(name)  # chapter 0's runs: the supervised reference


def _postech(name: str) -> tuple:
    from msgcore.experiments.postech_ape import POSTECH_SCALES
    from msgcore.foundations.denoiser import DENOISER_SCALES
    return POSTECH_SCALES[name], DENOISER_SCALES[name]


def _coverage_nat(name: str) -> tuple:
    from msgcore.experiments.coverage_nat import NAT_SCALES
    return NAT_SCALES[name], *_baseline(name)


CHAPTERS: dict[str, ChapterRecipe] = {
    "ch00_transformer_baseline": ChapterRecipe(("core",), _baseline_chapter),
    "ch01_trice": ChapterRecipe(("core", "trice"), _trice),
    "ch02_mixrep": ChapterRecipe(("core", "mixrep"), _mixrep),
    "ch03_marge": ChapterRecipe(("core", "marge"), _marge),
    "ch04_postech_ape": ChapterRecipe(("core", "trice", "postech_ape"), _postech),
    "ch05_coverage_nat": ChapterRecipe(("core", "coverage_nat"), _coverage_nat),
}


def chapter(stem: str) -> ChapterRecipe:
    if stem not in CHAPTERS:
        raise MsgcoreError(f"unknown chapter {stem!r}; the chapters are {', '.join(CHAPTERS)}")
    return CHAPTERS[stem]


def recipe_fingerprint(stem: str, scale: str) -> str:
    """A fingerprint of everything the chapter's recipe at `scale` sets (its scale objects, by value)."""
    try:
        scales = chapter(stem).scales(scale)
    except KeyError:
        raise MsgcoreError(f"chapter {stem} has no scale {scale!r}") from None
    return runcache.fingerprint(*scales)


def identity(stem: str, scale: str) -> dict:
    """What a chapter's results record about this checkout: its families' numerics versions and its recipe."""
    return {"numerics": numerics.versions(*chapter(stem).families), "recipe": recipe_fingerprint(stem, scale)}


def staleness(stem: str, data: dict) -> list[str]:
    """Why a chapter's results (as read from its file) are not current in this checkout; empty when they are."""
    if data.get("protocol") is None:
        return ["written before results carried their evidence and numerics: a re-run decides it again"]
    reasons = []
    if data["protocol"] != PROTOCOL_VERSION:
        reasons.append(f"judged under verdict protocol {data['protocol']}, now {PROTOCOL_VERSION}: re-judge it "
                       f"(python -m msgcore.scoreboard --rejudge)")
    reasons += numerics.changed(data.get("numerics"), chapter(stem).families)
    try:
        recipe = recipe_fingerprint(stem, data.get("scale", ""))
    except MsgcoreError:
        recipe = None
    if data.get("recipe") != recipe:
        reasons.append(f"its `{data.get('scale')}` recipe changed since")
    return reasons
