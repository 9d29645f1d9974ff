"""The verdict protocol: every claim of the book is declared as data before its runs, and judged by one set of rules.

A chapter declares its claims (`Claim`) and the sanity checks they rest on (`Gate`), trains its systems, and hands
the protocol each system's evidence (`System`): per test set and metric a `Measure` (per seed id the score, and the
score on each shared bootstrap resampling of the test sentences), and per seed a `RunRecord` (every training stage's
dev curve, dev noise, updates and tokens). `judge` applies the rules, the same in every chapter:

1. **Not run** when the claim's system or its baseline has no score: the claim says what deciding it would cost.
2. **Like for like.** Every system a claim names is scored on the same number of test sentences under the same
   metric signature (a floor from another test set, a score in another metric: refused). A claim whose paper figure
   is in another metric than ours is refused when it is declared.
3. **Gates.** A claim names the sanity checks it rests on; a failed one gives "not decided: gate failed". Every
   gate prints the paper's own figure beside it, and none may be stricter than the paper's own systems.
4. **Evidence.** A trained system has a training run for each seed it is scored on. A system without runs is a
   floor only when declared as one (`floor_system`); anything else is "not decided: no evidence".
5. **Seeds pair by id.** A comparison pairs seed k of the system with seed k of its baseline. Seed sets that differ,
   a seed given twice, or one run filed under two seed ids are refused (`ProtocolError`).
6. **Converged, every stage.** A stage the paper runs for a fixed length is judged by that length. Any other stage
   needs at least `MIN_VALIDATIONS` validations, a best score after its first one, a dev set whose noise (the
   trainer's paired bootstrap of the dev score) is below the tolerance, and then either early stopping with
   patience of at least `MIN_PATIENCE`, or a validation in its last quarter of updates and a gain below the tolerance
   over that quarter. The tolerance is in the stage's own dev metric (BLEU, TER, P@1 ...): the claim's relative
   smallest effect (m ÷ our baseline's level, below) times the stage's best dev score, that share bounded to
   `SHARE_BOUNDS`, and `DEFAULT_SHARE` of it for a claim with no smallest effect. Otherwise: "not decided:
   under-trained".
7. **Floors, both sides.** The system and its baseline must each beat every floor (copying the input, the best
   constant output, do-nothing, the untrained start); a baseline that is itself a floor is judged by the interval.
8. **Coherence.** A multi-source system below one of its single-source baselines is "not decided" unless the
   chapter explains that baseline by name (`Claim.coherence_notes`); the others are still checked.
9. **Seeds decide.** Fewer than `MIN_SEEDS` paired seeds gives "indicative" at most: printed, never counted.
10. **Intervals decide.** The 95% interval of the mean per-seed delta combines the spread over seeds with the
    test-set noise (the same delta on each shared resampling of the test sentences, `msgcore.metrics`), under
    Student's t over the seeds. m, the smallest effect of interest, is half the paper's own delta scaled to our
    level (× our baseline ÷ the paper's), or declared per claim with a one-line reason.
    - "better": reproduced when the interval lies above 0 and reaches m; "smaller effect" when it lies above 0 and
      inside m (the paper's direction, certainly smaller than its effect); not reproduced when it lies below 0, or
      inside ±m; inconclusive otherwise.
    - "parity": reproduced only when the interval lies above −m (the declared margin); not reproduced below −m.
      Non-significance is never parity.
    - "threshold" ("about 10× faster" is 10×): the interval must clear the paper's own number.

Runs that have not converged decide nothing. When they trained on equal budgets, with the same schedule, on enough
seeds and above their floors, the verdict also carries a statement of how fast each system learns within that
budget (`Verdict.statement`): printed apart, never counted, never "not reproduced".

`write_results` stores the claims, their gates and every system's whole evidence in `book/results/<notebook>.json`,
so that `rejudge` can apply a later version of these rules without any retraining.
"""
from __future__ import annotations

import html
import json
import math
import numbers
import re
import statistics
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from msgcore.utils import MsgcoreError, atomic_write

REPRODUCED, SMALLER, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "smaller effect", "not reproduced", "inconclusive"
INDICATIVE, NOT_DECIDED, NOT_RUN = "indicative", "not decided", "not run"
VERDICTS = (REPRODUCED, SMALLER, NOT_REPRODUCED, INCONCLUSIVE, INDICATIVE, NOT_DECIDED, NOT_RUN)
DECIDED = (REPRODUCED, SMALLER, NOT_REPRODUCED, INCONCLUSIVE)  # the verdicts that count
KINDS = ("better", "parity", "threshold")
PROTOCOL_VERSION = 2  # bump when these rules change: results judged under another version are re-judged (`rejudge`)
MIN_SEEDS = 3  # paired seeds per comparison, for any verdict beyond "indicative"
MIN_VALIDATIONS = 4  # validations a stage needs to show a plateau
MIN_PATIENCE = 2  # validations without improvement before early stopping counts (one dip is noise)
DEFAULT_SHARE = 0.01  # a stage may still gain 1% of its dev level over its last quarter (0.3 at BLEU 30) when the
SHARE_BOUNDS = (0.005, 0.02)  # claim has no smallest effect; else the claim's own relative m, within these bounds
BUDGET_TOLERANCE = 0.02  # relative: two runs' updates or tokens within this share are the same budget
FLOOR = -1  # the seed id of a floor's one score (a floor is never trained, so it has no seeds)
LEVEL = 0.95  # every interval's coverage
# Student's t quantile t_{0.975, df} for df = 1..30; the normal quantile beyond (a table: the book needs no SciPy)
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


class ProtocolError(MsgcoreError):
    """A claim or evidence the protocol refuses to judge: a malformed declaration, unpaired or duplicated seeds,
    scores that are not like for like."""


def finite(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ProtocolError(f"{what} must be a finite number, not {value!r}")
    return float(value)


# ---- declarations ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Claim:
    """One claim of a paper, declared before its runs."""

    id: str  # short and stable, e.g. "T3-main"
    claim: str  # the paper's claim in words
    paper: str  # the paper's own figure, quoted (e.g. "TRICE 41.5 vs DualBART 40.2 on test14, +1.3")
    kind: str  # "better" (system beats baseline), "parity" (no worse than baseline), "threshold" (a number)
    system: str  # the system the claim is about
    metric: str  # e.g. "BLEU", "TER", "speed-up"
    test_set: str  # e.g. "test_2016_flickr"
    baseline: str = ""  # the compared system ("better" and "parity")
    higher_is_better: bool = True  # False for TER, repeats, latency
    paper_delta: float | None = None  # the paper's own difference, system − baseline, in its metric
    paper_baseline: float | None = None  # the paper's own score of the baseline: scales m to our level
    margin: float | None = None  # m declared in our units: the smallest effect ("better"), the parity margin
    margin_reason: str = ""  # one line: why this m (required with `margin`)
    threshold: float | None = None  # "threshold": the paper's number, e.g. 10.0 for "about 10x"
    paper_metric: str = ""  # the metric of the paper's figure, when the chapter records it: it must be `metric`
    floors: tuple[str, ...] = ()  # floors both compared systems must beat: copy, constant, do-nothing, untrained
    single_source: tuple[str, ...] = ()  # single-source baselines a multi-source system must not fall below
    coherence_notes: tuple[tuple[str, str], ...] = ()  # (single-source baseline, why the system may sit below it)
    min_seeds: int = MIN_SEEDS
    cost: str = ""  # what deciding it would take when not run here, from measured throughput
    gates: tuple[str, ...] = ()  # names of the `Gate`s the claim rests on

    def __post_init__(self) -> None:
        for check in (self.check_kind, self.check_effect, self.check_names):
            problem = check()
            if problem:
                raise ProtocolError(f"claim {self.id}: {problem}")

    def check_kind(self) -> str:
        if self.kind not in KINDS:
            return f"unknown kind {self.kind!r}; use one of {', '.join(KINDS)}"
        if self.kind in ("better", "parity") and not self.baseline:
            return f"a {self.kind!r} claim names its baseline"
        if self.kind == "threshold" and self.threshold is None:
            return "a threshold claim declares the paper's threshold"
        if self.min_seeds < MIN_SEEDS:
            return f"min_seeds {self.min_seeds} is below the protocol's {MIN_SEEDS}"
        if self.paper_metric and self.paper_metric != self.metric:
            return (f"the paper's figure is in {self.paper_metric}, ours in {self.metric}: no verdict compares two "
                    f"metrics (score ours in the paper's metric, or drop the claim)")
        return ""

    def check_effect(self) -> str:
        if self.margin is not None and (finite(self.margin, f"claim {self.id}'s margin") < 0 or
                                        not self.margin_reason.strip() or "\n" in self.margin_reason):
            return "a declared margin is non-negative and carries a one-line reason (margin_reason)"
        if self.kind == "parity" and not self.margin and not (self.paper_delta and self.paper_baseline):
            return "a parity claim declares a positive margin (with its reason), or the paper's own gap and baseline"
        if self.kind == "better" and self.paper_delta is not None:
            sign = 1 if self.higher_is_better else -1
            if sign * self.paper_delta < 0:
                return f"the paper's delta {self.paper_delta:+g} points away from the claim"
            if self.margin is None and not self.paper_baseline:
                return "a paper delta needs the paper's baseline score (paper_baseline) to be scaled to our level, " \
                       "or a declared margin with its reason"
        return ""

    def check_names(self) -> str:
        if self.baseline and self.baseline == self.system:
            return "the system is its own baseline"
        if self.system in self.floors:
            return "the system is one of its own floors"
        unknown = [name for name, _ in self.coherence_notes if name not in self.single_source]
        if unknown:
            return f"a coherence note names {unknown[0]!r}, which is not one of its single-source baselines"
        if any(not note.strip() for _, note in self.coherence_notes):
            return "a coherence note is empty"
        return ""

    def smallest_effect(self, ours_baseline: float | None = None) -> tuple[float, str]:
        """(m, how it was set): the declared margin; else, at our level (× our baseline's mean ÷ the paper's
        baseline), half the paper's delta ("better") or the paper's own gap (the parity margin); else 0 (no effect
        is too small)."""
        if self.margin is not None:
            return self.margin, f"m = {self.margin:g}, declared: {self.margin_reason}"
        if self.paper_delta is None or self.kind == "threshold":
            return 0.0, ""
        ratio = abs(ours_baseline) / abs(self.paper_baseline) if ours_baseline is not None else 1.0
        share, what = (0.5, "half the paper's") if self.kind == "better" else (1.0, "the paper's own gap")
        m = abs(self.paper_delta) * share * ratio
        return m, (f"m = {m:.2f}: {what} {self.paper_delta:+g} at our level "
                   f"(× {abs(ours_baseline or 0):.2f} / {abs(self.paper_baseline):g})")

    def explained(self) -> dict[str, str]:
        return dict(self.coherence_notes)

    def systems(self) -> list[str]:
        return [self.system, *([self.baseline] if self.baseline else []), *self.floors, *self.single_source]


@dataclass
class Gate:
    """A sanity check claims rest on: `value` must reach `target` (e.g. "the AT teacher reaches 33 BLEU").

    `paper` gives the paper's own figure for the same check (or says why it has none), and `paper_value`, when the
    paper's own systems have one, is a bar the target may not exceed: no gate is stricter than the paper."""

    name: str  # what is checked, e.g. "De→En test2016 BLEU (beam 5)"
    value: float  # what we measured
    target: float  # the bar it must reach
    paper: str  # the paper's own figure for this check, or why there is none
    higher_is_better: bool = True  # False for e.g. a repeat ratio that must stay below the target
    paper_value: float | None = None  # the paper's own systems on this check: the target may not be stricter

    def __post_init__(self) -> None:
        self.value, self.target = finite(self.value, f"gate {self.name!r}'s value"), finite(self.target, "its target")
        if not self.paper.strip():
            raise ProtocolError(f"gate {self.name!r}: say the paper's own figure, or why it has none")
        if self.paper_value is not None:
            sign = 1 if self.higher_is_better else -1
            if sign * self.target > sign * finite(self.paper_value, "its paper value"):
                raise ProtocolError(f"gate {self.name!r} is stricter than the paper's own systems: target "
                                    f"{self.bar()}, the paper's {self.paper_value:g}")

    @property
    def passed(self) -> bool:
        return self.value >= self.target if self.higher_is_better else self.value <= self.target

    def bar(self) -> str:
        return f"{'≥' if self.higher_is_better else '≤'} {self.target:g}"

    def row(self) -> dict:
        return {"gate": self.name, "ours": round(self.value, 3), "target": self.bar(), "paper": self.paper,
                "passed": "yes" if self.passed else "NO"}


# ---- evidence -------------------------------------------------------------------------------------------------

@dataclass
class Measure:
    """One metric of one system on one test set: per seed id its score, and what exactly was scored."""

    scores: dict[int, float]  # seed id -> score (a floor: its one score under FLOOR)
    sentences: int = 0  # test sentences scored; 0 for a measure that is not a sample of them (a speed-up)
    signature: str = ""  # what exactly was measured: sacreBLEU's signature, or a plain description
    replicates: dict[int, list[float]] = field(default_factory=dict)  # seed id -> the score on each shared
    #                                          resampling of the test sentences (msgcore.metrics.bootstrap_draws)

    def __post_init__(self) -> None:
        if not self.scores:
            raise ProtocolError("an empty list of scores")
        self.scores = {seed_id(k): finite(v, f"the score of seed {k}") for k, v in self.scores.items()}
        self.replicates = {seed_id(k): [float(x) for x in v] for k, v in self.replicates.items()}
        if self.sentences and set(self.replicates) != set(self.scores):
            raise ProtocolError(f"a score over {self.sentences} test sentences carries its bootstrap replicates for "
                                f"every seed (seeds {sorted(self.scores)}, replicates {sorted(self.replicates)})")
        if not self.sentences and self.replicates:
            raise ProtocolError("replicates without the number of test sentences they resample")
        if len({len(v) for v in self.replicates.values()}) > 1:
            raise ProtocolError("replicate lists of different lengths: they come from different resamplings")

    def values(self) -> list[float]:
        return [self.scores[k] for k in sorted(self.scores)]


def seed_id(key) -> int:
    """A seed id from a dict key (JSON stores them as strings)."""
    try:
        value = int(key)
    except (TypeError, ValueError):
        raise ProtocolError(f"seed ids are integers, not {key!r}") from None
    if str(key).strip() != str(value):
        raise ProtocolError(f"seed ids are integers, not {key!r}")
    return value


@dataclass(frozen=True)
class Stage:
    """One training stage of one run as the protocol sees it (pre-training, phase 1, fine-tuning ...)."""

    name: str  # e.g. "phase 1"
    dev_curve: tuple[tuple[int, float], ...]  # (update within the stage, dev score) at each validation, in order
    updates: int  # updates the stage made
    source_tokens: int | None = None  # real source tokens it trained on (None: not recorded)
    target_tokens: int | None = None  # real target tokens it trained on
    early_stopped: bool = False  # early stopping ended it (patience ran out)
    patience: int = 0  # validations without improvement that stop it
    dev_noise: float | None = None  # the dev score's paired bootstrap standard error late in the stage
    fixed_length: int | None = None  # the paper runs this stage for a fixed number of updates: judged by it
    higher_is_better: bool = True  # the dev metric's direction (False for TER)
    schedule: str = ""  # its recipe (learning-rate schedule, batch): budget statements compare it

    @property
    def best_step(self) -> int:
        sign = 1 if self.higher_is_better else -1
        return max(self.dev_curve, key=lambda point: sign * point[1])[0] if self.dev_curve else -1

    def last_quarter_gain(self) -> float | None:
        """How much the best dev score improved over the last quarter of updates (None: no validation before it)."""
        sign = 1 if self.higher_is_better else -1
        cut = 0.75 * self.updates
        before = [sign * score for step, score in self.dev_curve if step <= cut]
        if not before:
            return None
        return max(sign * score for _, score in self.dev_curve) - max(before)

    def tolerance(self, share: float = DEFAULT_SHARE) -> float:
        """How much the stage may still gain over its last quarter: `share` of its best dev score's level."""
        sign = 1 if self.higher_is_better else -1
        best = max((sign * score for _, score in self.dev_curve), default=0.0)
        return share * abs(best)

    def converged(self, share: float = DEFAULT_SHARE) -> tuple[bool, str]:
        """(converged, why not): rule 6 of the module docstring, at a tolerance of `share` of the dev level."""
        if self.fixed_length is not None:
            ok = self.updates >= self.fixed_length
            return ok, "" if ok else f"stopped at {self.updates} of its fixed {self.fixed_length} updates"
        curve = self.dev_curve
        if len(curve) < MIN_VALIDATIONS:
            return False, f"{len(curve)} validation{'s' * (len(curve) != 1)} (a plateau needs {MIN_VALIDATIONS})"
        if self.best_step == curve[0][0]:
            return False, "its best dev score is its first validation (it never improved)"
        if self.dev_noise is None:
            return False, "no dev-noise estimate recorded"
        tolerance = self.tolerance(share)
        if self.dev_noise > tolerance:
            return False, f"the dev set cannot resolve {tolerance:.2f} (its noise is ±{self.dev_noise:.2f})"
        if self.early_stopped:
            if self.patience < MIN_PATIENCE:
                return False, f"early-stopped with patience {self.patience} (one dip is noise; {MIN_PATIENCE} needed)"
            return True, ""
        cut = int(0.75 * self.updates)
        if not any(step > cut for step, _ in curve):
            return False, f"no validation in its last quarter (after update {cut:,})"
        gain = self.last_quarter_gain()
        if gain is None or gain >= tolerance:
            return False, f"dev {gain:+.2f} over updates {cut:,}–{self.updates:,} (tolerance {tolerance:.2f})"
        return True, ""


@dataclass(frozen=True)
class RunRecord:
    """One seed's training of a system: its stages in order (a shared stage, e.g. pre-training, in each)."""

    seed: int
    stages: tuple[Stage, ...]

    def __post_init__(self) -> None:
        if not self.stages:
            raise ProtocolError(f"the run of seed {self.seed} records no training stage")
        object.__setattr__(self, "seed", seed_id(self.seed))
        if self.seed == FLOOR:
            raise ProtocolError(f"seed {FLOOR} is the seed id of floors, not of a run")

    @property
    def updates(self) -> int:
        return sum(s.updates for s in self.stages)

    @property
    def source_tokens(self) -> int | None:
        counts = [s.source_tokens for s in self.stages]
        return None if None in counts else sum(counts)

    @property
    def target_tokens(self) -> int | None:
        counts = [s.target_tokens for s in self.stages]
        return None if None in counts else sum(counts)

    @property
    def last(self) -> Stage:
        return self.stages[-1]

    def converged(self, share: float = DEFAULT_SHARE) -> tuple[bool, str]:
        """Converged when every stage is; else the first stage that is not, and why."""
        for stage in self.stages:
            ok, why = stage.converged(share)
            if not ok:
                return False, f"{stage.name}: {why}"
        return True, ""

    def same_training(self, other: RunRecord) -> bool:
        """True when two records hold the same training (a copy filed under another seed id). A dev curve that never
        moves (every validation the same score, as a capped dry run's) tells no run from another: not a copy."""
        return any(len({score for _, score in s.dev_curve}) >= 2 for s in self.stages) and self.stages == other.stages


@dataclass
class System:
    """A system's evidence: per test set and metric a `Measure`, and one training run per seed."""

    name: str
    measures: dict[str, dict[str, Measure]]  # test set -> metric -> Measure
    runs: tuple[RunRecord, ...] = ()  # one per seed; none for a floor
    floor: bool = False  # never trained: copying the input, a constant, do-nothing, the untrained start

    def __post_init__(self) -> None:
        self.runs = tuple(self.runs)
        seeds = [run.seed for run in self.runs]
        twice = sorted({s for s in seeds if seeds.count(s) > 1})
        if twice:
            raise ProtocolError(f"system {self.name}: seed {twice[0]} has two runs")
        for i, a in enumerate(self.runs):
            for b in self.runs[i + 1:]:
                if a.same_training(b):
                    raise ProtocolError(f"system {self.name}: seeds {a.seed} and {b.seed} are the same run")
        measures = [m for by_metric in self.measures.values() for m in by_metric.values()]
        if self.floor and (self.runs or any(set(m.scores) != {FLOOR} for m in measures)):
            raise ProtocolError(f"floor {self.name}: a floor is never trained: no runs, one score per metric")
        if not self.floor and any(FLOOR in m.scores for m in measures):
            raise ProtocolError(f"system {self.name}: seed {FLOOR} is the seed id of floors (floor_system)")

    def measure(self, test_set: str, metric: str) -> Measure | None:
        return self.measures.get(test_set, {}).get(metric)

    def values(self, test_set: str, metric: str) -> list[float] | None:
        """The scores in seed order (None: not scored there)."""
        measure = self.measure(test_set, metric)
        return None if measure is None else measure.values()

    def run(self, seed: int) -> RunRecord | None:
        return next((r for r in self.runs if r.seed == seed), None)

    @property
    def updates(self) -> int | None:
        """The most updates any seed's run made (None: never trained): what tables show as its budget."""
        return max((r.updates for r in self.runs), default=None)


def floor_system(name: str, test_set: str, metric: str, value: float, sentences: int = 0, signature: str = "",
                 replicates: Sequence[float] = ()) -> System:
    """A floor (copying the input, a constant output, do-nothing, the untrained start): one score, no training."""
    measure = Measure({FLOOR: value}, sentences, signature, {FLOOR: list(replicates)} if sentences else {})
    return System(name, {test_set: {metric: measure}}, floor=True)


def merged_floor(name: str, parts: Sequence[System]) -> System:
    """One floor from floors of the same name measured on several test sets or metrics."""
    measures: dict[str, dict[str, Measure]] = {}
    for part in parts:
        for test_set, by_metric in part.measures.items():
            measures.setdefault(test_set, {}).update(by_metric)
    return System(name, measures, floor=True)


def floor_from_outputs(name: str, test_set: str, label: str, metric: str, outputs: Sequence[str],
                       references: Sequence[str], **options) -> System:
    """A floor scored like the systems it bounds: `label` (e.g. "BLEU (lowercased)") is sacreBLEU's `metric`
    ("bleu", "chrf", "ter") with `options`, on the floor's outputs (the copied sources, the constant sentence)."""
    return System(name, {test_set: {label: text_measure(metric, {FLOOR: outputs}, references, **options)}},
                  floor=True)


def trained_system(name: str, measures: dict[str, dict[str, Measure]], runs: Sequence[RunRecord]) -> System:
    return System(name, measures, tuple(runs))


def schedule_of(train_cfg) -> str:
    """A stage's recipe in words, from a msgcore.trainer.TrainConfig: equal-budget statements compare it."""
    return (f"{train_cfg.schedule} lr {train_cfg.lr:g} (warmup {train_cfg.warmup_steps}), "
            f"{train_cfg.max_tokens} tokens × {train_cfg.update_freq}")


def text_measure(metric: str, outputs: Mapping[int, Sequence[str]], references: Sequence[str],
                 **options) -> Measure:
    """A sacreBLEU metric ("bleu", "chrf", "ter") of each seed's outputs, with its bootstrap replicates."""
    from msgcore.metrics import bootstrap_replicates, corpus_score

    scores, replicates, signature = {}, {}, ""
    for seed, hyps in outputs.items():
        score = corpus_score(metric, list(hyps), list(references), **options)
        scores[seed], signature = score.score, score.signature
        replicates[seed] = bootstrap_replicates(metric, list(hyps), list(references), **options)
    return Measure(scores, len(references), signature, replicates)


def statistics_measure(statistics_by_seed: Mapping[int, np.ndarray], score, signature: str) -> Measure:
    """A per-sentence metric of each seed's outputs from its per-sentence statistics (rows: sentences) and the
    function that turns summed statistics into the score (e.g. the repeat ratio: repeats / tokens)."""
    from msgcore.metrics import replicates_from_statistics

    sizes = {len(s) for s in statistics_by_seed.values()}
    if len(sizes) != 1:
        raise ProtocolError(f"{signature}: seeds scored on different numbers of sentences {sorted(sizes)}")
    scores = {seed: float(score(np.asarray(s, dtype=np.float64).sum(0))) for seed, s in statistics_by_seed.items()}
    replicates = {seed: replicates_from_statistics(s, score) for seed, s in statistics_by_seed.items()}
    return Measure(scores, sizes.pop(), signature, replicates)


def difference_measure(a: Measure, b: Measure, signature: str = "") -> Measure:
    """a − b seed by seed (and resampling by resampling): e.g. the repeats one system removes against another."""
    if set(a.scores) != set(b.scores) or a.sentences != b.sentences:
        raise ProtocolError("a difference of two measures needs the same seeds and the same test sentences")
    return Measure({k: a.scores[k] - b.scores[k] for k in a.scores}, a.sentences,
                   signature or f"difference of {a.signature or 'two scores'}",
                   {k: list(np.subtract(a.replicates[k], b.replicates[k])) for k in a.replicates})


def stage_from_history(name: str, history: list[dict], patience: int = 0, metric: str = "valid_bleu",
                       higher_is_better: bool = True, fixed_length: int | None = None, schedule: str = "") -> Stage:
    """A Stage from a Trainer's log rows: its dev curve, its updates and tokens, its dev noise (the median of the
    trainer's `valid_noise` over the second half of its validations), early stopped when the last `patience` (or
    more) validations came after the best one and the run ended there."""
    valid = [row for row in history if row.get("kind") == "valid" and metric in row]
    curve = tuple((int(row["step"]), float(row[metric])) for row in valid)
    updates = max((int(row["step"]) for row in history), default=0)
    counted = [row for row in history if "target_tokens" in row]
    end = max(counted, key=lambda row: row["step"]) if counted else {}
    noise = [row["valid_noise"] for row in valid[len(valid) // 2:] if row.get("valid_noise") is not None]
    stage = Stage(name, curve, updates, end.get("source_tokens"), end.get("target_tokens"), False, patience,
                  statistics.median(noise) if noise else None, fixed_length, higher_is_better, schedule)
    after_best = sum(1 for step, _ in curve if step > stage.best_step)
    stopped = bool(patience) and after_best >= patience and bool(curve) and curve[-1][0] == updates
    return Stage(**{**asdict_shallow(stage), "early_stopped": stopped})


def asdict_shallow(obj) -> dict:
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


# ---- intervals ------------------------------------------------------------------------------------------------

def t_quantile(df: int) -> float:
    return T_975[df - 1] if df <= len(T_975) else 1.96


def mean_interval(values, test_se: float = 0.0) -> tuple[float, float, float]:
    """(mean, low, high): the 95% interval of the mean of per-seed `values`, its standard error combining the spread
    over seeds with `test_se`, the test-set noise of that mean (Student's t over the seeds)."""
    values = [float(v) for v in values]
    if not values:
        raise ProtocolError("an interval needs at least one value, not an empty list")
    mean = statistics.fmean(values)
    if len(values) == 1:
        return mean, -math.inf, math.inf  # one seed says nothing about the spread over seeds
    se = math.sqrt(statistics.variance(values) / len(values) + test_se ** 2)
    half = t_quantile(len(values) - 1) * se
    return mean, mean - half, mean + half


def paired_bootstrap(references: list[str], baseline: list[str], system: list[str], metric: str = "bleu",
                     n_samples: int = 1000) -> tuple[float, float]:
    """(system − baseline, p): sacrebleu's paired bootstrap on one seed's outputs. Identical outputs: (0.0, 1.0)."""
    from msgcore.metrics import paired_test

    if list(system) == list(baseline):  # sacrebleu reports p = 0.001 for two identical outputs
        return 0.0, 1.0
    _, results = paired_test(references, {"baseline": baseline, "system": system}, metrics=(metric,),
                             n_samples=n_samples)
    base, other = next(value for key, value in results.items() if key != "System")
    return other.score - base.score, other.p_value


# ---- judging --------------------------------------------------------------------------------------------------

@dataclass
class Verdict:
    """The protocol's outcome for one claim, with everything a referee checks."""

    id: str
    claim: str
    paper: str
    ours: str  # the evidence in numbers
    verdict: str  # one of VERDICTS
    reason: str  # why, for every verdict but a clean "reproduced"
    seeds: dict[str, list[int]] = field(default_factory=dict)  # per compared system: the seed ids behind it
    converged: bool = False  # every stage of every run behind the claim converged
    equal_budget: bool = False  # every paired seed trained the same updates and tokens
    floors_cleared: bool = False  # both compared systems beat each of the claim's floors
    leans: str = ""  # which way our mean points ("towards the claim", "against the claim"), whatever the verdict
    smallest_effect: float | None = None  # m, at our level
    effect: str = ""  # how m was set, with the paper's figure
    interval: list[float] | None = None  # [mean, low, high] of the delta (the value, for a threshold), 95%
    test_noise: float | None = None  # the test-set part of the interval: the bootstrap standard error of the mean
    statement: str = ""  # how fast each system learns within an equal budget: never a verdict
    declaration: dict = field(default_factory=dict)  # the claim as declared
    gates: list[dict] = field(default_factory=list)  # the gates it rests on, as measured


@dataclass
class Evidence:
    """A claim's compared evidence, gathered once: the seeds paired, the per-seed deltas and their replicates."""

    claim: Claim
    found: dict[str, System]
    seeds: list[int]  # the paired seed ids
    samples: list[float]  # per seed: system − baseline (the system's value, for a threshold)
    replicate_means: np.ndarray | None  # per resampling: the mean over seeds of the same delta
    baseline_mean: float | None

    @property
    def compared(self) -> list[System]:
        names = [self.claim.system, *([self.claim.baseline] if self.claim.baseline else [])]
        return [self.found[name] for name in names]


def judge(claim: Claim, systems: dict[str, System], gates: Sequence[Gate] = ()) -> Verdict:
    """Apply the rules (module docstring) to one declared claim, the systems' evidence and the chapter's gates."""
    found = {name: systems[name] for name in claim.systems() if name in systems}
    rested = [g for g in gates if g.name in claim.gates]
    verdict = Verdict(claim.id, claim.claim, claim.paper, "", NOT_RUN, "", declaration=asdict(claim),
                      gates=[asdict(g) for g in rested])
    missing = [name for name in (claim.system, claim.baseline) if name and name not in found]
    missing += [name for name in (claim.system, claim.baseline) if name in found and
                found[name].measure(claim.test_set, claim.metric) is None]
    if missing:
        verdict.reason = f"not run at this scale ({', '.join(missing)})" + (f"; {claim.cost}" if claim.cost else "")
        return verdict
    check_like_for_like(claim, found)
    evidence = gather(claim, found)
    verdict.seeds = {s.name: sorted(s.measure(claim.test_set, claim.metric).scores) for s in evidence.compared}
    verdict.ours = evidence_text(claim, found)
    m, verdict.effect = claim.smallest_effect(evidence.baseline_mean)
    verdict.smallest_effect = m if claim.kind != "threshold" else None
    verdict.leans = lean(claim, evidence, m)
    blocked = failed_gates(claim, gates) or no_evidence(evidence)
    unconverged = [] if blocked else unconverged_runs(evidence, convergence_share(m, evidence.baseline_mean))
    verdict.converged = not blocked and not unconverged
    verdict.equal_budget = not blocked and not budget_differences(evidence)
    below = floor_problems(claim, found)
    verdict.floors_cleared = not below
    blocked = blocked or under_training(unconverged, budget_differences(evidence)) or \
        (f"below floor: {'; '.join(below)}" if below else "") or incoherence(claim, found)
    if blocked:
        verdict.verdict, verdict.reason = NOT_DECIDED, blocked
        if unconverged and not below and not failed_gates(claim, gates):
            verdict.statement = budget_statement(evidence, verdict.equal_budget)
        return verdict
    verdict.verdict, verdict.reason, verdict.interval, verdict.test_noise = interval_verdict(evidence, m, verdict.effect)
    return verdict


def check_like_for_like(claim: Claim, found: dict[str, System]) -> None:
    """Rule 2: every named system scored on the same number of sentences under the same signature."""
    measures = {}
    for name in claim.systems():
        if name not in found or found[name].measure(claim.test_set, claim.metric) is None:
            raise ProtocolError(f"claim {claim.id}: no {claim.metric} on {claim.test_set} for {name}, which the "
                                f"claim names as a floor or baseline")
        measures[name] = found[name].measure(claim.test_set, claim.metric)
    first_name, first = next(iter(measures.items()))
    for name, measure in measures.items():
        if measure.sentences != first.sentences:
            raise ProtocolError(f"claim {claim.id}: {name} is scored on {measure.sentences} sentences of "
                                f"{claim.test_set}, {first_name} on {first.sentences}: not the same test set")
        if measure.signature != first.signature:
            raise ProtocolError(f"claim {claim.id}: {name}'s {claim.metric} ({measure.signature or 'no signature'}) "
                                f"is not {first_name}'s ({first.signature or 'no signature'})")


def gather(claim: Claim, found: dict[str, System]) -> Evidence:
    """Rule 5: pair the seeds by id; the per-seed samples and, per resampling, their mean."""
    ours = found[claim.system].measure(claim.test_set, claim.metric)
    if found[claim.system].floor:
        raise ProtocolError(f"claim {claim.id}: the claim's system {claim.system} is a floor")
    if claim.kind == "threshold":
        seeds = sorted(ours.scores)
        samples = [ours.scores[k] for k in seeds]
        reps = [ours.replicates[k] for k in seeds] if ours.sentences else None
        return Evidence(claim, found, seeds, samples, mean_rows(reps), None)
    base_system = found[claim.baseline]
    base = base_system.measure(claim.test_set, claim.metric)
    if base_system.floor:
        seeds = sorted(ours.scores)
        pair = {k: FLOOR for k in seeds}
    else:
        if set(ours.scores) != set(base.scores):
            raise ProtocolError(f"claim {claim.id}: seeds are not paired: {claim.system} has {sorted(ours.scores)}, "
                                f"{claim.baseline} {sorted(base.scores)}")
        seeds = sorted(ours.scores)
        pair = {k: k for k in seeds}
    samples = [ours.scores[k] - base.scores[pair[k]] for k in seeds]
    reps = [np.subtract(ours.replicates[k], base.replicates[pair[k]]) for k in seeds] if ours.sentences else None
    return Evidence(claim, found, seeds, samples, mean_rows(reps), statistics.fmean(base.scores.values()))


def mean_rows(rows) -> np.ndarray | None:
    return None if rows is None else np.mean(np.asarray(rows, dtype=np.float64), axis=0)


def lean(claim: Claim, evidence: Evidence, m: float) -> str:
    """Which way our mean points, whatever the verdict: "towards the claim" or "against the claim"."""
    mean = statistics.fmean(evidence.samples)
    sign = 1 if claim.higher_is_better else -1
    bar = {"threshold": claim.threshold or 0.0, "parity": -sign * m}.get(claim.kind, 0.0)
    return "towards the claim" if sign * (mean - bar) > 0 else "against the claim"


def failed_gates(claim: Claim, gates: Sequence[Gate]) -> str:
    """"gate failed: ..." when a gate the claim names did not pass, else ''; an unknown gate name is an error."""
    by_name = {gate.name: gate for gate in gates}
    unknown = [name for name in claim.gates if name not in by_name]
    if unknown:
        raise ProtocolError(f"claim {claim.id}: no gate named {unknown[0]!r} was measured")
    failed = [name for name in claim.gates if not by_name[name].passed]
    return f"gate failed: {'; '.join(failed)}" if failed else ""


def no_evidence(evidence: Evidence) -> str:
    """Rule 4: a compared system that is not a floor needs a training run for each of its paired seeds."""
    for system in evidence.compared:
        if system.floor:
            continue
        lacking = [k for k in evidence.seeds if system.run(k) is None]
        if lacking:
            seeds = ", ".join(map(str, lacking))
            return f"no evidence: {system.name} has no training run for seed{'s' * (len(lacking) > 1)} {seeds}"
    return ""


def convergence_share(m: float, baseline_mean: float | None) -> float:
    """The share of a stage's dev level it may still gain (rule 6): the claim's relative smallest effect, m ÷ our
    baseline's level, within SHARE_BOUNDS; DEFAULT_SHARE when the claim has no smallest effect."""
    if not m or not baseline_mean:
        return DEFAULT_SHARE
    low, high = SHARE_BOUNDS
    return min(max(m / abs(baseline_mean), low), high)


def unconverged_runs(evidence: Evidence, share: float) -> list[tuple[str, int, str]]:
    """Rule 6: (system, seed, why) for each paired run with a stage that did not converge."""
    out = []
    for system in evidence.compared:
        for k in ([] if system.floor else evidence.seeds):
            ok, why = system.run(k).converged(share)
            if not ok:
                out.append((system.name, k, why))
    return out


def budget_differences(evidence: Evidence) -> list[str]:
    """Per paired seed, how the compared systems' updates, source tokens and target tokens differ (beyond
    BUDGET_TOLERANCE, or not recorded); empty when the budgets are equal."""
    trained = [s for s in evidence.compared if not s.floor]
    if len(trained) < 2:
        return []
    a, b = trained
    out = []
    for k in evidence.seeds:
        ra, rb = a.run(k), b.run(k)
        if ra is None or rb is None:
            return [f"seed {k}: no run"]
        for what in ("updates", "source_tokens", "target_tokens"):
            x, y = getattr(ra, what), getattr(rb, what)
            if x is None or y is None:
                out.append(f"seed {k}: {what.replace('_', ' ')} not recorded")
            elif abs(x - y) > BUDGET_TOLERANCE * max(x, y, 1):
                out.append(f"seed {k}: {what.replace('_', ' ')} {x:,} vs {y:,}")
    return out


def under_training(unconverged: list, budgets: list[str]) -> str:
    if not unconverged:
        return ""
    name, k, why = unconverged[0]
    more = f" (and {len(unconverged) - 1} more runs)" if len(unconverged) > 1 else ""
    unequal = f"; budgets differ ({budgets[0]})" if budgets else ""
    return f"under-trained: {name} seed {k}: {why}{more}{unequal}"


def floor_problems(claim: Claim, found: dict[str, System]) -> list[str]:
    """Rule 7: each compared system (a baseline that is itself a floor excepted) at or below one of the floors."""
    sign = 1 if claim.higher_is_better else -1
    compared = [n for n in (claim.system, claim.baseline) if n and not found[n].floor]
    out = []
    for name in compared:
        ours = statistics.fmean(found[name].values(claim.test_set, claim.metric))
        for floor in claim.floors:
            if floor == claim.baseline:
                continue
            theirs = found[floor].values(claim.test_set, claim.metric)[0]
            if sign * ours <= sign * theirs:
                out.append(f"{name} {ours:.2f} vs {floor} {theirs:.2f}")
    return out


def incoherence(claim: Claim, found: dict[str, System]) -> str:
    """Rule 8: the single-source baselines the system falls below that the chapter has not explained."""
    sign, explained = (1 if claim.higher_is_better else -1), claim.explained()
    ours = statistics.fmean(found[claim.system].values(claim.test_set, claim.metric))
    below = []
    for name in claim.single_source:
        theirs = statistics.fmean(found[name].values(claim.test_set, claim.metric))
        if sign * ours < sign * theirs and name not in explained:
            below.append(f"{claim.system} {ours:.2f} vs {name} {theirs:.2f}")
    if not below:
        return ""
    return f"below its own single-source baseline: {'; '.join(below)} (the chapter must explain it)"


def interval_verdict(evidence: Evidence, m: float, effect: str) -> tuple[str, str, list[float] | None,
                                                                           float | None]:
    """Rules 9 and 10: (verdict, reason, [mean, low, high], test-set standard error)."""
    claim, n = evidence.claim, len(evidence.seeds)
    test_se = float(np.std(evidence.replicate_means, ddof=1)) if evidence.replicate_means is not None else None
    mean, low, high = mean_interval(evidence.samples, test_se or 0.0)
    shown = [mean, low, high] if n > 1 else [mean, None, None]
    noise = f", test-set noise ±{test_se:.2f}" if test_se is not None else ", seeds only (not a sample of sentences)"
    text = f"{'mean' if claim.kind == 'threshold' else 'delta'} {mean:+.2f}, 95% CI [{low:+.2f}, {high:+.2f}] " \
           f"over {n} seeds{noise}"
    if n < claim.min_seeds:
        lean_ = lean(claim, evidence, m).replace("towards", "leans towards").replace("against", "leans against")
        return INDICATIVE, f"{n} seed{'s' * (n > 1)} (a verdict needs {claim.min_seeds}): {lean_}", shown, test_se
    sign = 1 if claim.higher_is_better else -1
    low_, high_ = sorted((sign * low, sign * high))  # on the claim's axis: positive is the claimed direction
    effect_text = f"; {effect}" if effect else ""
    if claim.kind == "threshold":
        target = sign * claim.threshold
        verdict = REPRODUCED if low_ >= target else NOT_REPRODUCED if high_ < target else INCONCLUSIVE
        word = {REPRODUCED: "clears", NOT_REPRODUCED: "below", INCONCLUSIVE: "straddles"}[verdict]
        return verdict, f"{text}: {word} {claim.threshold:g}", shown, test_se
    if claim.kind == "parity":
        verdict = REPRODUCED if low_ > -m else NOT_REPRODUCED if high_ < -m else INCONCLUSIVE
        word = {REPRODUCED: "above", NOT_REPRODUCED: "below", INCONCLUSIVE: "straddles"}[verdict]
        return verdict, f"{text}: {word} −{m:.2f}, the parity margin{effect_text}", shown, test_se
    if high_ < 0:
        return NOT_REPRODUCED, f"{text}: the other way{effect_text}", shown, test_se
    if m > 0 and -m < low_ and high_ < m:
        if low_ > 0:
            return SMALLER, f"{text}: the paper's direction, smaller than m{effect_text}", shown, test_se
        return NOT_REPRODUCED, f"{text}: inside ±{m:.2f}, no effect of the paper's size{effect_text}", shown, test_se
    if low_ > 0:
        return REPRODUCED, f"{text}{effect_text}", shown, test_se
    return INCONCLUSIVE, f"{text}{effect_text}", shown, test_se


def observed_interval(claim: Claim, systems: dict[str, System]) -> list[float] | None:
    """[mean, low, high]: the 95% interval of the claim's delta (its system's value, for a threshold) from whatever
    evidence there is, whatever the verdict: how far our runs point, for a reader, never a verdict. None when a
    compared system is missing or has one seed."""
    found = {name: systems[name] for name in (claim.system, claim.baseline) if name and name in systems}
    try:
        evidence = gather(claim, found)
    except (KeyError, AttributeError, ProtocolError):
        return None
    if len(evidence.seeds) < 2:
        return None
    test_se = float(np.std(evidence.replicate_means, ddof=1)) if evidence.replicate_means is not None else 0.0
    return list(mean_interval(evidence.samples, test_se))


def budget_statement(evidence: Evidence, equal_budget: bool) -> str:
    """How fast each system learns within an equal budget, when neither has converged: which is ahead on dev (in the
    dev metric's own direction, which may differ from the claim's) at half the last stage's budget and at all of it
    (per seed, then its mean), each system's final dev slope, and the test interval. Never a verdict: '' unless the
    budgets and schedules are equal and the seeds are enough, and '' when both sides' dev curves are the same (two
    readings of one set of runs: no learning speed to compare)."""
    claim, compared = evidence.claim, evidence.compared
    if claim.kind == "threshold" or any(s.floor for s in compared) or not equal_budget \
            or len(evidence.seeds) < claim.min_seeds:
        return ""
    runs = [[s.run(k) for k in evidence.seeds] for s in compared]
    if any(ra.last.schedule != rb.last.schedule or not ra.last.schedule for ra, rb in zip(*runs)):
        return ""
    if all(ra.last.dev_curve == rb.last.dev_curve for ra, rb in zip(*runs)):
        return ""
    budget = min(r.last.updates for r in runs[0])
    dev_sign = 1 if runs[0][0].last.higher_is_better else -1  # the dev metric's direction, not the claim's
    at = {}
    for point in (budget // 2, budget):
        deltas = [dev_at(ra.last, point) - dev_at(rb.last, point) for ra, rb in zip(*runs)]
        if any(math.isnan(d) for d in deltas):
            return ""
        at[point] = statistics.fmean(deltas)
    mean, low, high = mean_interval(evidence.samples, float(np.std(evidence.replicate_means, ddof=1))
                                    if evidence.replicate_means is not None else 0.0)
    ahead = lambda d: f"{claim.system if dev_sign * d > 0 else claim.baseline} ahead on dev ({d:+.2f})"
    slopes = ", ".join(f"{s.name} {statistics.fmean(dev_slope(r.last) for r in rs):+.2f}"
                       for s, rs in zip(compared, runs))
    return (f"within {budget:,} updates of the last stage: {ahead(at[budget // 2])} at {budget // 2:,}, "
            f"{ahead(at[budget])} at "
            f"{budget:,}; final dev slopes per 1,000 updates: {slopes}; test delta {mean:+.2f}, 95% CI "
            f"[{low:+.2f}, {high:+.2f}]. Not a verdict: the runs have not converged.")


def dev_at(stage: Stage, update: int) -> float:
    """The dev score of the last validation at or before `update` (nan: none)."""
    points = [score for step, score in stage.dev_curve if step <= update]
    return points[-1] if points else math.nan


def dev_slope(stage: Stage) -> float:
    """Dev points gained per 1,000 updates over the stage's last quarter (its last validation before the quarter
    to its last one)."""
    cut = 0.75 * stage.updates
    before = [(s, v) for s, v in stage.dev_curve if s <= cut] or stage.dev_curve[:1]
    (s0, v0), (s1, v1) = before[-1], stage.dev_curve[-1]
    return 1000 * (v1 - v0) / (s1 - s0) if s1 > s0 else 0.0


def evidence_text(claim: Claim, found: dict[str, System]) -> str:
    """"TRICE 41.2 ± 0.3 vs DualBART 40.1 ± 0.2 BLEU (3 seeds)": the figures behind a claim."""
    def figure(name: str) -> str:
        v = found[name].values(claim.test_set, claim.metric)
        return f"{name} {statistics.fmean(v):.2f}" + (f" ± {statistics.stdev(v):.2f}" if len(v) > 1 else "")
    names = [claim.system, *([claim.baseline] if claim.baseline else [])]
    seeds = len(found[claim.system].values(claim.test_set, claim.metric))
    return " vs ".join(figure(name) for name in names) + f" {claim.metric} ({seeds} seed{'s' * (seeds > 1)})"


def judge_all(claims: list[Claim], systems: dict[str, System], gates: Sequence[Gate] = ()) -> list[Verdict]:
    """Every declared claim, judged; refuses a claim list with repeated ids, and a systems dict whose keys are not
    its systems' names."""
    if not claims:
        raise ProtocolError("no claims to judge: a chapter declares its claims before its runs")
    ids = [c.id for c in claims]
    if len(set(ids)) != len(ids):
        raise ProtocolError(f"claim ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}")
    misfiled = [key for key, system in systems.items() if key != system.name]
    if misfiled:
        raise ProtocolError(f"system {systems[misfiled[0]].name!r} is filed under the name {misfiled[0]!r}")
    names = [g.name for g in gates]
    if len(set(names)) != len(names):
        raise ProtocolError(f"gate names repeat: {sorted({n for n in names if names.count(n) > 1})}")
    return [judge(claim, systems, gates) for claim in claims]


# ---- results files: the whole evidence, so that a later protocol can re-judge it -------------------------------

def system_dict(system: System) -> dict:
    """A System as plain data (`system_from_dict` reads it back)."""
    return {"name": system.name, "floor": system.floor, "updates": system.updates,
            "measures": {test: {metric: {"scores": {str(k): v for k, v in m.scores.items()},
                                         "sentences": m.sentences, "signature": m.signature,
                                         "replicates": {str(k): [round(x, 4) for x in v]
                                                        for k, v in m.replicates.items()}}
                                for metric, m in by_metric.items()}
                         for test, by_metric in system.measures.items()},
            "runs": [{"seed": r.seed, "stages": [asdict(s) for s in r.stages]} for r in system.runs]}


def system_from_dict(data: dict) -> System:
    try:
        measures = {test: {metric: Measure(m["scores"], m.get("sentences", 0), m.get("signature", ""),
                                           m.get("replicates", {}))
                           for metric, m in by_metric.items()}
                    for test, by_metric in data["measures"].items()}
        runs = tuple(RunRecord(seed_id(r["seed"]), tuple(stage_from_dict(s) for s in r["stages"]))
                     for r in data.get("runs", []))
        return System(data["name"], measures, runs, bool(data.get("floor", False)))
    except (KeyError, TypeError, AttributeError) as error:
        raise ProtocolError(f"a system in a results file is malformed ({type(error).__name__}: {error})") from None


def stage_from_dict(data: dict) -> Stage:
    known = {f.name for f in fields(Stage)}
    values = {k: v for k, v in data.items() if k in known}
    values["dev_curve"] = tuple((int(step), float(score)) for step, score in values.get("dev_curve", ()))
    return Stage(**values)


def claim_from_dict(data: dict) -> Claim:
    known = {f.name for f in fields(Claim)}
    values = {k: (tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) else v)
              for k, v in data.items() if k in known}
    return Claim(**values)


def results(chapter: str, scale: str, commit: str, verdicts: list[Verdict], systems: dict[str, System],
            identity: dict | None = None) -> dict:
    """The machine-readable scoreboard of one chapter (what `write_results` stores): the verdicts with their
    declarations and gates, every system's whole evidence, the protocol version and the chapter's identity (the
    numerics versions and recipe it was computed under, `msgcore.chapters.identity`)."""
    return {"chapter": chapter, "scale": scale, "commit": commit, "protocol": PROTOCOL_VERSION,
            **(identity or {}), "claims": [asdict(v) for v in verdicts],
            "systems": [system_dict(s) for s in systems.values()]}


def write_results(path: str | Path, chapter: str, scale: str, commit: str, verdicts: list[Verdict],
                  systems: dict[str, System], identity: dict | None = None) -> Path:
    """Write book/results/<notebook>.json atomically; returns its path."""
    path = Path(path)
    with atomic_write(path) as f:
        json.dump(results(chapter, scale, commit, verdicts, systems, identity), f, indent=1, ensure_ascii=False)
    return path


def load_json(path: str | Path) -> dict:
    """A results file, refusing repeated keys (a seed given twice would otherwise keep only its last score)."""
    def unique(pairs):
        keys = [k for k, _ in pairs]
        twice = sorted({k for k in keys if keys.count(k) > 1})
        if twice:
            raise ProtocolError(f"{path}: the key {twice[0]!r} is given twice")
        return dict(pairs)
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"), object_pairs_hook=unique)
    except (OSError, json.JSONDecodeError) as error:
        raise ProtocolError(f"{path}: not a readable results file ({error})") from None


def rejudge(data: dict) -> list[Verdict]:
    """The claims of a results file judged again under this version of the protocol, from the evidence the file
    holds: no retraining. A file written before results carried their evidence cannot be re-judged."""
    if data.get("protocol") is None:
        raise ProtocolError(f"{data.get('chapter', 'a chapter')}: its results predate the evidence records; only "
                            f"a re-run can judge it again")
    systems = {s.name: s for s in (system_from_dict(d) for d in data["systems"])}
    claims = [claim_from_dict(c["declaration"]) for c in data["claims"]]
    gates = {g["name"]: Gate(**g) for c in data["claims"] for g in c.get("gates", [])}
    return judge_all(claims, systems, list(gates.values()))


# ---- rendering ------------------------------------------------------------------------------------------------

def declarations(claims: list[Claim]):
    """The chapter's claims table, from the declarations alone (before any run)."""
    import pandas as pd

    def compares(c: Claim) -> str:
        if c.kind == "threshold":
            return f"{c.system} {'≥' if c.higher_is_better else '≤'} {c.threshold:g}"
        return " vs ".join([c.system, *([c.baseline] if c.baseline else [])])

    def effect(c: Claim) -> str:
        if c.margin is not None:
            return f"{c.margin:g} ({c.margin_reason})"
        if c.kind != "threshold" and c.paper_delta is not None:
            return f"{'½ × ' if c.kind == 'better' else ''}{c.paper_delta:+g} × ours / {c.paper_baseline:g}"
        return "–"
    return pd.DataFrame([{"id": c.id, "claim": c.claim, "paper": c.paper, "compares": compares(c),
                          "metric": f"{c.metric} on {c.test_set}", "smallest effect m": effect(c),
                          "floors": ", ".join(c.floors) or "–", "seeds needed": c.min_seeds} for c in claims])


def scoreboard(verdicts: list[Verdict]):
    """One row per claim: the paper's figure, ours, which way ours points, the verdict and its reason."""
    import pandas as pd

    return pd.DataFrame([{"id": v.id, "claim": v.claim, "paper": v.paper, "ours": v.ours or "–",
                          "ours points": v.leans or "–", "verdict": v.verdict, "reason": v.reason}
                         for v in verdicts])


def statements(verdicts: list[Verdict]):
    """The equal-budget statements (how fast each system learns within its budget), apart from the verdicts."""
    import pandas as pd

    return pd.DataFrame([{"id": v.id, "within an equal budget (not a verdict)": v.statement}
                         for v in verdicts if v.statement], columns=["id", "within an equal budget (not a verdict)"])


def reason_kind(verdict: Verdict) -> str:
    """The kind of reason a "not decided" verdict has (under-trained, below floor ...); '–' for the others."""
    if verdict.verdict != NOT_DECIDED:
        return "–"
    return verdict.reason.split(":")[0].split(" (")[0]


def reason_counts(verdicts: list[Verdict]):
    """How many claims got each verdict, and for "not decided" each reason's kind (under-trained, below floor...)."""
    import pandas as pd

    rows: dict[tuple[str, str], int] = {}
    for v in verdicts:
        rows[(v.verdict, reason_kind(v))] = rows.get((v.verdict, reason_kind(v)), 0) + 1
    order = {name: i for i, name in enumerate(VERDICTS)}
    return pd.DataFrame([{"verdict": verdict, "reason": reason, "claims": count}
                         for (verdict, reason), count in sorted(rows.items(), key=lambda r: (order[r[0][0]], r[0][1]))])


def runs_table(systems: dict[str, System], share: float = DEFAULT_SHARE):
    """Every stage of every trained run: its updates and tokens, its best dev update, its dev noise and whether it
    converged at a tolerance of `share` of its dev level (each claim judges at its own; the scoreboard's reasons say
    which)."""
    import pandas as pd

    rows = []
    for system in systems.values():
        for run in system.runs:
            for stage in run.stages:
                ok, why = stage.converged(share)
                rows.append({"system": system.name, "seed": run.seed, "stage": stage.name, "updates": stage.updates,
                             "target tokens": stage.target_tokens, "best dev at update": stage.best_step,
                             "dev noise": stage.dev_noise, "converged": "yes" if ok else f"no: {why}"})
    return pd.DataFrame(rows, columns=["system", "seed", "stage", "updates", "target tokens", "best dev at update",
                                       "dev noise", "converged"])


def gate_table(gates):
    import pandas as pd

    return pd.DataFrame([g.row() for g in gates], columns=["gate", "ours", "target", "paper", "passed"])


def show_table(frame, index: bool = False):
    """Display a table in full: no truncated cells, no meaningless index (a styled HTML table); numbers as
    `number_text` writes them, column by column."""
    from IPython.display import display

    styler = frame.style.set_properties(**{"text-align": "left", "white-space": "pre-wrap"})
    if not index:
        styler = styler.hide(axis="index")
    formats = {column: number_formatter(frame[column]) for column in frame.columns}
    display(styler.format(formats))


def number_formatter(column):
    """How a table column's numbers are written: a column of whole numbers as integers with thousands separators
    ("1,000", not "1000.00"), others with two decimals, a small non-zero one (|x| < 0.01, e.g. a learning rate)
    with three significant digits ("5e-04" stays "0.0005"), a missing one as "–"; anything else as HTML text
    (`cell_html`)."""
    def is_number(value) -> bool:
        return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))

    values = [v for v in column if is_number(v) and v == v]
    whole = bool(values) and all(float(v).is_integer() for v in values)

    def text(value):
        if not is_number(value):
            return "–" if value is None else cell_html(value)
        if value != value:
            return "–"
        if whole:
            return f"{int(value):,}"
        if value and abs(value) < 0.01:
            return f"{value:.3g}" if abs(value) >= 1e-4 else f"{value:.2e}"
        return f"{value:,.2f}"
    return text


def cell_html(value) -> str:
    """A table cell's text as HTML: escaped (a `<sep>` piece shows as written), with Markdown's code spans as
    <code>, never as literal backticks."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(str(value), quote=False))


def cpu_hours(runs: int, updates: int, seconds_per_update: float) -> str:
    """The cost line of a claim not run here, from measured throughput: "about 4.2 CPU-hours (6 runs × 2,500 ...)"."""
    hours = runs * updates * seconds_per_update / 3600
    return f"about {hours:.1f} CPU-hours ({runs} runs × {updates:,} updates at {seconds_per_update:.2f} s each)"
