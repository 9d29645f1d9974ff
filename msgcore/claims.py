"""Judging a paper's claims: baseline gates, verdict rules and the claims scoreboard every chapter prints.

The rules, shared by every chapter so that a verdict means the same thing everywhere:

1. **No verdict on a system that did not train.** A claim names the gates it rests on (e.g. "the AT teacher
   reaches 33 BLEU"); if any of them failed, the verdict is "no verdict" with the failed gate named.
2. **A claim's threshold is the paper's own.** "About 10x faster" is judged against 10x, not 5x.
3. **A difference smaller than the seed-to-seed spread is inconclusive**, whatever a paired test on one run says.
4. Otherwise a comparison is **reproduced** when every run (seed) shows the claimed direction with paired-bootstrap
   p < alpha, **not reproduced** when every run is significantly the other way, and **inconclusive** in between.
   A claim of parity ("no worse than") is reproduced when no run is significantly worse (`judge_no_worse`).
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, NO_VERDICT = "reproduced", "not reproduced", "inconclusive", "no verdict"


@dataclass
class Gate:
    """A sanity check a claim rests on: `value` must reach `target`."""

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


@dataclass
class Claim:
    """One row of a claims scoreboard."""

    claim: str  # the paper's claim, in words
    paper: str  # the paper's own figure, quoted (e.g. "TRICE 41.5 vs DualBART 40.2 on test14, +1.3")
    ours: str  # the evidence we measured
    verdict: str  # one of REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, or "no verdict: ..."


def failed_gates(gates) -> str:
    """'' when every gate passed, else the verdict that names the failed ones."""
    failed = [g.name for g in gates if not g.passed]
    return f"{NO_VERDICT}: gate failed ({'; '.join(failed)})" if failed else ""


def seed_spread(*systems) -> float:
    """The largest seed-to-seed standard deviation among `systems` (each a list of per-seed scores; 0 for one seed)."""
    return max((statistics.stdev(s) for s in systems if len(s) > 1), default=0.0)


def judge_paired(deltas, p_values, higher_is_better: bool = True, alpha: float = 0.05, spread: float = 0.0,
                 gates=()) -> str:
    """Verdict on "system beats baseline" from per-run (delta, paired-bootstrap p) pairs; rules 1, 3 and 4."""
    deltas, p_values = list(deltas), list(p_values)
    if len(deltas) != len(p_values) or not deltas:
        raise ValueError("judge_paired needs one p-value per delta, and at least one run")
    if blocked := failed_gates(gates):
        return blocked
    if abs(statistics.mean(deltas)) < spread:
        return INCONCLUSIVE
    sign = 1 if higher_is_better else -1
    if all(sign * d > 0 and p < alpha for d, p in zip(deltas, p_values)):
        return REPRODUCED
    if all(sign * d < 0 and p < alpha for d, p in zip(deltas, p_values)):
        return NOT_REPRODUCED
    return INCONCLUSIVE


def judge_no_worse(deltas, p_values, alpha: float = 0.05, gates=()) -> str:
    """Verdict on "system is on par with (no worse than) baseline" from per-run (delta, p) pairs: reproduced when
    no run is significantly worse, not reproduced when every run is, inconclusive in between; rule 1."""
    deltas, p_values = list(deltas), list(p_values)
    if len(deltas) != len(p_values) or not deltas:
        raise ValueError("judge_no_worse needs one p-value per delta, and at least one run")
    if blocked := failed_gates(gates):
        return blocked
    worse = [d < 0 and p < alpha for d, p in zip(deltas, p_values)]
    return NOT_REPRODUCED if all(worse) else INCONCLUSIVE if any(worse) else REPRODUCED


def judge_threshold(value: float, threshold: float, higher_is_better: bool = True, gates=()) -> str:
    """Verdict on a claim with a number of its own ("10x faster", "under 5% repeats"); rules 1 and 2."""
    if blocked := failed_gates(gates):
        return blocked
    met = value >= threshold if higher_is_better else value <= threshold
    return REPRODUCED if met else NOT_REPRODUCED


def judge_all(holds: list[bool], gates=(), spread_ok: bool = True) -> str:
    """Verdict on a claim checked once per run ("fewer repeats on every seed"): reproduced when it holds on every
    run and the difference exceeds the seed spread (`spread_ok`), not reproduced when it holds on none."""
    if blocked := failed_gates(gates):
        return blocked
    if holds and all(holds) and spread_ok:
        return REPRODUCED
    if not any(holds):
        return NOT_REPRODUCED
    return INCONCLUSIVE


def paired_evidence(deltas, p_values, unit: str = "") -> str:
    """"+1.30 (p=0.001); +0.90 (p=0.020)": per-run deltas and p-values, as a scoreboard's evidence."""
    return "; ".join(f"{d:+.2f}{unit} (p={p:.3f})" for d, p in zip(deltas, p_values))


def verdict_counts(claims) -> dict[str, int]:
    """How many claims got each verdict ("no verdict: ..." counted together)."""
    counts = {REPRODUCED: 0, NOT_REPRODUCED: 0, INCONCLUSIVE: 0, NO_VERDICT: 0}
    for c in claims:
        v = c.verdict if isinstance(c, Claim) else c["verdict"]
        counts[NO_VERDICT if v.startswith(NO_VERDICT) else v] += 1
    return counts


def scoreboard(claims):
    """The claims as a pandas DataFrame, one row each (render it with `show_table`)."""
    import pandas as pd

    return pd.DataFrame([asdict(c) if isinstance(c, Claim) else c for c in claims])


def gate_table(gates):
    import pandas as pd

    return pd.DataFrame([g.row() for g in gates])


def show_table(frame, index: bool = False):
    """Display a table in full: no truncated cells, no meaningless index (a styled HTML table)."""
    from IPython.display import display

    styler = frame.style.set_properties(**{"text-align": "left", "white-space": "pre-wrap"})
    if not index:
        styler = styler.hide(axis="index")
    display(styler.format(precision=2))
