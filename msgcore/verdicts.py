"""The verdict protocol: every claim of the book is declared as data before its runs, and judged by one set of rules.

A chapter declares its claims (`Claim`), trains its systems, collects each system's per-seed scores and training
runs (`System`, `RunRecord`), and calls `judge`. The rules, the same in every chapter:

1. **Not run** when the claim's system (or its baseline) has no scores: the claim says what deciding it would
   cost (`Claim.cost`, from measured throughput).
2. **Gates.** A claim names the sanity checks it rests on (`Gate`: "the teacher reaches 33 BLEU"); a failed one
   gives "not decided: gate failed".
3. **Converged, or no verdict.** A run is converged when early stopping ended it, or when its best dev score gained
   less than `CONVERGENCE_DELTA` over its last quarter of updates. Otherwise: "not decided: under-trained".
4. **Equal budgets.** Compared systems trained the same number of updates, or both converged.
5. **Floors.** A system at or below one of its floors (copying the input, the best constant output, do-nothing,
   the untrained start) is "not decided: below floor".
6. **Coherence.** A multi-source system below its own single-source baseline is "not decided" until the chapter
   explains it (`Claim.coherence_note`).
7. **Seeds decide.** Fewer than `MIN_SEEDS` seeds per system gives "indicative" at most: printed, never counted.
   A comparison pairs seed k of the system with seed k of its baseline, on the seeds both have; a floor as the
   baseline (do-nothing, copying the input: never trained) has one score, which every seed is compared with.
8. **Intervals decide.** The 95% interval of the mean per-seed delta (Student's t over seeds) decides:
   - a comparison ("better"): not reproduced when the interval lies entirely inside ±m, the smallest effect of
     interest (by default half the paper's own delta: an effect certainly smaller than that is not the paper's,
     even when it is certainly positive); else reproduced when it lies on the claimed side of 0, not reproduced
     when it lies on the other side, inconclusive otherwise;
   - parity ("no worse than"): reproduced only when the interval lies above −m, the declared margin; not
     reproduced when it lies below −m. Non-significance is never parity;
   - a threshold ("about 10× faster" is 10×): the interval must clear the paper's own number.

`scoreboard`, `reason_counts` and `write_results` render every chapter's verdicts the same way, and write the
machine-readable `book/results/<notebook>.json` that the book-wide overview is built from.
"""
from __future__ import annotations

import json
import math
import numbers
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from msgcore.utils import MsgcoreError, atomic_write

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
INDICATIVE, NOT_DECIDED, NOT_RUN = "indicative", "not decided", "not run"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, INDICATIVE, NOT_DECIDED, NOT_RUN)
KINDS = ("better", "parity", "threshold")
MIN_SEEDS = 3  # per system, for any verdict beyond "indicative"
CONVERGENCE_DELTA = 0.3  # BLEU/TER points: a run still gaining this much over its last quarter is under-trained
LEVEL = 0.95  # every interval's coverage
# Student's t quantile t_{0.975, df} for df = 1..30; the normal quantile beyond (a table: the book needs no SciPy)
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


class ProtocolError(MsgcoreError):
    """A claim or its evidence that the protocol cannot judge: a malformed declaration, an empty score list."""


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
    paper_delta: float | None = None  # the paper's own difference ("better": m defaults to half of it)
    margin: float | None = None  # m: the smallest effect of interest ("better"), the parity margin ("parity")
    threshold: float | None = None  # "threshold": the paper's number, e.g. 10.0 for "about 10x"
    floors: tuple[str, ...] = ()  # systems the claim's system must beat: copy, constant, do-nothing, untrained
    single_source: tuple[str, ...] = ()  # single-source baselines a multi-source system must not fall below
    coherence_note: str = ""  # the chapter's explanation when the system is below one of them (lifts the block)
    min_seeds: int = MIN_SEEDS
    cost: str = ""  # what deciding it would take when not run here, e.g. "about 14 CPU-hours (6 runs of 2.3 h)"
    gates: tuple[str, ...] = ()  # names of the `Gate`s the claim rests on (a failed one blocks the verdict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ProtocolError(f"claim {self.id}: unknown kind {self.kind!r}; use one of {', '.join(KINDS)}")
        if self.kind in ("better", "parity") and not self.baseline:
            raise ProtocolError(f"claim {self.id}: a {self.kind!r} claim names its baseline")
        if self.kind == "parity" and not (self.margin and self.margin > 0):
            raise ProtocolError(f"claim {self.id}: a parity claim declares a positive margin")
        if self.kind == "threshold" and self.threshold is None:
            raise ProtocolError(f"claim {self.id}: a threshold claim declares the paper's threshold")
        if self.min_seeds < 1:
            raise ProtocolError(f"claim {self.id}: min_seeds must be at least 1")

    @property
    def smallest_effect(self) -> float:
        """m: the declared margin, else half the paper's own delta, else 0 (no effect is too small)."""
        if self.margin is not None:
            return self.margin
        return abs(self.paper_delta) / 2 if self.paper_delta is not None else 0.0

    def systems(self) -> list[str]:
        return [self.system, *([self.baseline] if self.baseline else []), *self.floors, *self.single_source]


@dataclass
class Gate:
    """A sanity check claims rest on: `value` must reach `target` (e.g. "the AT teacher reaches 33 BLEU")."""

    name: str  # what is checked, e.g. "De→En test2016 BLEU (beam 5)"
    value: float  # what we measured
    target: float  # the bar it must reach
    higher_is_better: bool = True  # False for e.g. a repeat ratio that must stay below the target

    @property
    def passed(self) -> bool:
        return self.value >= self.target if self.higher_is_better else self.value <= self.target

    def row(self) -> dict:
        bar = f"≥ {self.target:g}" if self.higher_is_better else f"≤ {self.target:g}"
        return {"gate": self.name, "ours": round(self.value, 2), "target": bar,
                "passed": "yes" if self.passed else "NO"}


# ---- evidence -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunRecord:
    """One training run as the protocol sees it: its dev curve and how it ended."""

    dev_curve: tuple[tuple[int, float], ...]  # (update, dev score) at each validation, in order
    last_step: int  # the update it ended at
    early_stopped: bool  # early stopping ended it (patience ran out before the cap)
    higher_is_better: bool = True  # the dev metric's direction (False for TER)

    @property
    def best_step(self) -> int:
        sign = 1 if self.higher_is_better else -1
        return max(self.dev_curve, key=lambda point: sign * point[1])[0] if self.dev_curve else -1

    def last_quarter_gain(self) -> float | None:
        """How much the best dev score improved over the last quarter of updates (None: too few validations)."""
        sign = 1 if self.higher_is_better else -1
        cut = 0.75 * self.last_step
        before = [sign * score for step, score in self.dev_curve if step <= cut]
        if not before or len(self.dev_curve) < 2:
            return None
        return max(sign * score for _, score in self.dev_curve) - max(before)

    def converged(self, delta: float = CONVERGENCE_DELTA) -> tuple[bool, str]:
        """(converged, why not): early stopping, or a gain below `delta` over the last quarter of updates."""
        if self.early_stopped:
            return True, ""
        gain = self.last_quarter_gain()
        if gain is None:
            return False, f"too few validations to tell (ended at update {self.last_step})"
        if gain >= delta:
            return False, f"dev {gain:+.2f} over updates {int(0.75 * self.last_step)}–{self.last_step}"
        return True, ""


def run_record(history: list[dict], patience: int, metric: str = "valid_bleu",
               higher_is_better: bool = True) -> RunRecord:
    """A RunRecord from a Trainer's log rows: early stopped when the last `patience` validations (or more) came
    after the best one, and the run ended there."""
    curve = tuple((row["step"], row[metric]) for row in history if row["kind"] == "valid" and metric in row)
    last_step = max((row["step"] for row in history), default=0)
    record = RunRecord(curve, last_step, False, higher_is_better)
    after_best = sum(1 for step, _ in curve if step > record.best_step)
    stopped = bool(patience) and after_best >= patience and bool(curve) and curve[-1][0] == last_step
    return RunRecord(curve, last_step, stopped, higher_is_better)


@dataclass
class System:
    """A system's evidence: per test set and metric its per-seed scores, its training runs and their budget."""

    name: str
    scores: dict[str, dict[str, list[float]]]  # test set -> metric -> one score per seed, in seed order
    runs: list[RunRecord] = field(default_factory=list)  # one per seed; empty for a floor or an untrained system
    updates: int | None = None  # updates per seed, every stage summed (None: not trained)

    def values(self, test_set: str, metric: str) -> list[float] | None:
        values = self.scores.get(test_set, {}).get(metric)
        if values is not None and not len(values):
            raise ProtocolError(f"system {self.name}: an empty list of {metric} scores on {test_set}")
        return None if values is None else [float(v) for v in values]


def floor_system(name: str, test_set: str, metric: str, value: float) -> System:
    """A floor (copying the input, a constant output, do-nothing, the untrained start): one score, no training."""
    return System(name, {test_set: {metric: [float(value)]}})


def trained_system(name: str, scores: dict[str, dict[str, list[float]]], histories: list[list[dict]],
                   patience: int, updates: int | None = None, metric: str = "valid_bleu",
                   higher_is_better: bool = True) -> System:
    """A trained system: per-seed scores and one Trainer history per seed (its runs' dev curves); `updates`
    defaults to the most updates any seed's run made."""
    runs = [run_record(history, patience, metric, higher_is_better) for history in histories]
    return System(name, scores, runs, updates if updates is not None else max((r.last_step for r in runs), default=0))


# ---- intervals ------------------------------------------------------------------------------------------------

def t_quantile(df: int) -> float:
    return T_975[df - 1] if df <= len(T_975) else 1.96


def mean_interval(values) -> tuple[float, float, float]:
    """(mean, low, high): the 95% Student-t interval of the mean of `values` (a point when all are equal)."""
    values = [float(v) for v in values]
    if not values:
        raise ProtocolError("an interval needs at least one value, not an empty list")
    mean = statistics.fmean(values)
    if len(values) == 1:
        return mean, -math.inf, math.inf  # one value says nothing about its spread
    half = t_quantile(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
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
    reason: str  # why, for every verdict but a clean "reproduced"/"not reproduced"
    seeds: dict[str, int] = field(default_factory=dict)  # per system: seeds behind it
    converged: bool = False  # every run behind the claim converged
    equal_budget: bool = False  # equal updates, or every run converged
    floors_cleared: bool = False  # the system beats each of its floors


def judge(claim: Claim, systems: dict[str, System], gates=()) -> Verdict:
    """Apply the rules (module docstring) to one declared claim, the systems' evidence and the chapter's gates."""
    found = {name: systems[name] for name in claim.systems() if name in systems}
    main_names = [claim.system, *([claim.baseline] if claim.baseline else [])]
    values = {name: found[name].values(claim.test_set, claim.metric) for name in found}
    seeds = {name: len(v) for name, v in values.items() if v is not None}
    verdict = Verdict(claim.id, claim.claim, claim.paper, "", NOT_RUN, "", seeds)
    missing = [name for name in main_names if values.get(name) is None]
    if missing:
        verdict.reason = f"not run at this scale ({', '.join(missing)})" + (f"; {claim.cost}" if claim.cost else "")
        return verdict
    verdict.ours = evidence_text(claim, values)
    unconverged = unconverged_runs([found[name] for name in main_names], seeds)
    verdict.converged = not unconverged
    budgets = {found[name].updates for name in main_names if found[name].updates is not None}  # floors train not
    verdict.equal_budget = len(budgets) <= 1 or verdict.converged
    below = below_floors(claim, values)
    verdict.floors_cleared = not below
    blocked = failed_gates(claim, gates) or blocking_reason(claim, values, unconverged, verdict.equal_budget, below,
                                                           found)
    if blocked:
        verdict.verdict, verdict.reason = NOT_DECIDED, blocked
        return verdict
    floor_baseline = bool(claim.baseline) and found[claim.baseline].updates is None and not found[claim.baseline].runs
    verdict.verdict, verdict.reason = interval_verdict(claim, values, floor_baseline)
    return verdict


def failed_gates(claim: Claim, gates) -> str:
    """"gate failed: ..." when a gate the claim names did not pass, else ''; an unknown gate name is an error."""
    by_name = {gate.name: gate for gate in gates}
    unknown = [name for name in claim.gates if name not in by_name]
    if unknown:
        raise ProtocolError(f"claim {claim.id}: no gate named {unknown[0]!r} was measured")
    failed = [name for name in claim.gates if not by_name[name].passed]
    return f"gate failed: {'; '.join(failed)}" if failed else ""


def unconverged_runs(systems: list[System], seeds: dict[str, int]) -> list[tuple[str, int, str]]:
    """(system, seed, why) for each run that did not converge; a trained system without a dev curve per seed
    cannot show that it converged, and counts as not converged."""
    out = []
    for system in systems:
        if system.updates is not None and len(system.runs) < seeds.get(system.name, 0):
            out.append((system.name, len(system.runs), "no dev curve recorded for this seed"))
        out += [(system.name, k, why) for k, run in enumerate(system.runs) for ok, why in [run.converged()] if not ok]
    return out


def blocking_reason(claim: Claim, values: dict, unconverged: list, equal_budget: bool, below: list[str],
                    found: dict[str, System]) -> str:
    """Rules 3–6: the first reason the evidence cannot decide the claim, or ''."""
    if not equal_budget:
        budgets = ", ".join(f"{n} {found[n].updates}" for n in (claim.system, claim.baseline))
        return f"unequal budgets ({budgets} updates) and not both converged"
    if unconverged:
        name, k, why = unconverged[0]
        more = f" (and {len(unconverged) - 1} more runs)" if len(unconverged) > 1 else ""
        return f"under-trained: {name} seed {k}: {why}{more}"
    if below:
        return f"below floor: {'; '.join(below)}"
    incoherent = below_single_source(claim, values)
    if incoherent and not claim.coherence_note:
        return f"below its own single-source baseline: {'; '.join(incoherent)} (the chapter must explain it)"
    return ""


def below_floors(claim: Claim, values: dict) -> list[str]:
    """The floors the claim's system does not beat (its mean at or below the floor's mean)."""
    return worse_than(claim, values, claim.floors, strict=False)


def below_single_source(claim: Claim, values: dict) -> list[str]:
    return worse_than(claim, values, claim.single_source, strict=True)


def worse_than(claim: Claim, values: dict, others, strict: bool) -> list[str]:
    sign = 1 if claim.higher_is_better else -1
    ours = statistics.fmean(values[claim.system])
    out = []
    for name in others:
        if values.get(name) is None:
            raise ProtocolError(f"claim {claim.id}: no {claim.metric} on {claim.test_set} for {name}, "
                                f"which the claim names as a floor or baseline")
        theirs = statistics.fmean(values[name])
        if sign * ours < sign * theirs or (not strict and ours == theirs):
            out.append(f"{claim.system} {ours:.2f} vs {name} {theirs:.2f}")
    return out


def interval_verdict(claim: Claim, values: dict, floor_baseline: bool = False) -> tuple[str, str]:
    """Rules 7 and 8 on the per-seed values: (verdict, reason). A `floor_baseline` (copying the input, do-nothing:
    never trained) has one score, which every seed of the system is compared with."""
    ours = values[claim.system]
    if claim.kind == "threshold":
        samples, target = ours, claim.threshold
    else:
        base = values[claim.baseline]
        if len(base) == 1 and floor_baseline:  # one score, no seeds
            base = base * len(ours)
        samples, target = [a - b for a, b in zip(ours, base)], 0.0  # seed k with seed k, on the seeds both have
    compared = [claim.system, *([claim.baseline] if claim.baseline and not floor_baseline else [])]
    n = min(len(values[name]) for name in compared)
    mean, low, high = mean_interval(samples)
    sign = 1 if claim.higher_is_better else -1
    if sign < 0:
        mean, low, high = -mean, -high, -low  # work on the "better" axis: positive is the claimed direction
        target = -target if claim.kind == "threshold" else target
    interval = f"{'delta' if claim.kind != 'threshold' else 'mean'} {sign * mean:+.2f}, 95% CI " \
               f"[{min(sign * low, sign * high):+.2f}, {max(sign * low, sign * high):+.2f}] over {n} seeds"
    if n < claim.min_seeds:
        bar = -claim.smallest_effect if claim.kind == "parity" else target  # parity: the margin, not 0
        lean = "leans towards the claim" if mean > bar else "leans against the claim"
        return INDICATIVE, f"{n} seed{'s' if n > 1 else ''} (a verdict needs {claim.min_seeds}): {lean}"
    m = claim.smallest_effect
    if claim.kind == "better":
        if m > 0 and -m < low and high < m:  # certainly smaller than m: not the paper's effect, even if positive
            return NOT_REPRODUCED, f"{interval}: inside ±{m:.2f}, smaller than the smallest effect of interest"
        if low > 0:
            return REPRODUCED, interval
        if high < 0:
            return NOT_REPRODUCED, f"{interval}: the other way"
        return INCONCLUSIVE, interval
    if claim.kind == "parity":
        if low > -m:
            return REPRODUCED, f"{interval}: above −{m:.2f}, the parity margin"
        if high < -m:
            return NOT_REPRODUCED, f"{interval}: below −{m:.2f}, the parity margin"
        return INCONCLUSIVE, f"{interval}: straddles −{m:.2f}, the parity margin"
    if low >= target:
        return REPRODUCED, f"{interval}: clears {claim.threshold:g}"
    if high < target:
        return NOT_REPRODUCED, f"{interval}: below {claim.threshold:g}"
    return INCONCLUSIVE, f"{interval}: straddles {claim.threshold:g}"


def evidence_text(claim: Claim, values: dict) -> str:
    """"TRICE 41.2 ± 0.3 vs DualBART 40.1 ± 0.2 (3 seeds)": the figures behind a claim, as the scoreboard shows."""
    def figure(name: str) -> str:
        v = values[name]
        return f"{name} {statistics.fmean(v):.2f}" + (f" ± {statistics.stdev(v):.2f}" if len(v) > 1 else "")
    names = [claim.system, *([claim.baseline] if claim.baseline else [])]
    seeds = len(values[claim.system])
    return " vs ".join(figure(name) for name in names) + f" {claim.metric} ({seeds} seed{'s' if seeds > 1 else ''})"


def judge_all(claims: list[Claim], systems: dict[str, System], gates=()) -> list[Verdict]:
    """Every declared claim, judged; refuses a claim list with repeated ids."""
    if not claims:
        raise ProtocolError("no claims to judge: a chapter declares its claims before its runs")
    ids = [c.id for c in claims]
    if len(set(ids)) != len(ids):
        raise ProtocolError(f"claim ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}")
    return [judge(claim, systems, gates) for claim in claims]


# ---- rendering ------------------------------------------------------------------------------------------------

def declarations(claims: list[Claim]):
    """The chapter's claims table, from the declarations alone (before any run)."""
    import pandas as pd

    def compares(c: Claim) -> str:
        if c.kind == "threshold":
            return f"{c.system} {'≥' if c.higher_is_better else '≤'} {c.threshold:g}"
        return " vs ".join([c.system, *([c.baseline] if c.baseline else [])])
    return pd.DataFrame([{"id": c.id, "claim": c.claim, "paper": c.paper, "compares": compares(c),
                          "metric": f"{c.metric} on {c.test_set}", "floors": ", ".join(c.floors) or "–",
                          "seeds needed": c.min_seeds} for c in claims])


def scoreboard(verdicts: list[Verdict]):
    """One row per claim: the paper's figure, ours, the verdict and its reason (render with claims.show_table)."""
    import pandas as pd

    return pd.DataFrame([{"id": v.id, "claim": v.claim, "paper": v.paper, "ours": v.ours or "–",
                          "verdict": v.verdict, "reason": v.reason} for v in verdicts])


def reason_counts(verdicts: list[Verdict]):
    """How many claims got each verdict, and for "not decided" each reason's kind (under-trained, below floor...)."""
    import pandas as pd

    def kind(v: Verdict) -> str:
        if v.verdict == NOT_DECIDED:
            return v.reason.split(":")[0].split(" (")[0]
        return "–"
    rows = {}
    for v in verdicts:
        rows[(v.verdict, kind(v))] = rows.get((v.verdict, kind(v)), 0) + 1
    order = {name: i for i, name in enumerate(VERDICTS)}
    return pd.DataFrame([{"verdict": verdict, "reason": reason, "claims": count}
                         for (verdict, reason), count in sorted(rows.items(), key=lambda r: (order[r[0][0]], r[0][1]))])


def runs_table(systems: dict[str, System]):
    """Every trained run behind the chapter's systems: its updates, the update of its best dev score, and whether it
    converged (and if not, why): what rule 3 judged."""
    import pandas as pd

    rows = []
    for system in systems.values():
        for k, run in enumerate(system.runs):
            ok, why = run.converged()
            rows.append({"system": system.name, "run (seed)": k + 1, "updates": run.last_step,
                         "best dev at update": run.best_step, "converged": "yes" if ok else f"no: {why}"})
    return pd.DataFrame(rows, columns=["system", "run (seed)", "updates", "best dev at update", "converged"])


def gate_table(gates):
    import pandas as pd

    return pd.DataFrame([g.row() for g in gates])


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
    with three significant digits ("5e-04" stays "0.0005"), a missing one as "–"; anything else as it is."""
    def is_number(value) -> bool:
        return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))

    values = [v for v in column if is_number(v) and v == v]
    whole = bool(values) and all(float(v).is_integer() for v in values)

    def text(value):
        if not is_number(value):
            return "–" if value is None else str(value)
        if value != value:
            return "–"
        if whole:
            return f"{int(value):,}"
        if value and abs(value) < 0.01:
            return f"{value:.3g}" if abs(value) >= 1e-4 else f"{value:.2e}"
        return f"{value:,.2f}"
    return text


def results(chapter: str, scale: str, commit: str, verdicts: list[Verdict], systems: dict[str, System]) -> dict:
    """The machine-readable scoreboard of one chapter (what `write_results` stores)."""
    return {"chapter": chapter, "scale": scale, "commit": commit,
            "claims": [asdict(v) for v in verdicts],
            "systems": [{"name": s.name, "scores": s.scores, "updates": s.updates} for s in systems.values()]}


def write_results(path: str | Path, chapter: str, scale: str, commit: str, verdicts: list[Verdict],
                  systems: dict[str, System]) -> Path:
    """Write book/results/<notebook>.json atomically; returns its path."""
    path = Path(path)
    with atomic_write(path) as f:
        json.dump(results(chapter, scale, commit, verdicts, systems), f, indent=1, ensure_ascii=False)
    return path


def cpu_hours(runs: int, updates: int, seconds_per_update: float) -> str:
    """The cost line of a claim not run here, from measured throughput: "about 4.2 CPU-hours (6 runs × 2,500 ...)"."""
    hours = runs * updates * seconds_per_update / 3600
    return f"about {hours:.1f} CPU-hours ({runs} runs × {updates:,} updates at {seconds_per_update:.2f} s each)"
