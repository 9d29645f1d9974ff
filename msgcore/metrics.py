"""Thin wrappers over sacrebleu (Post, 2018): BLEU, chrF, TER, signatures, bootstrap CIs, paired tests.

No metric is computed by hand here: every number comes from sacrebleu, and every table row can
carry sacrebleu's signature so readers know exactly what was measured.
"""
from __future__ import annotations

from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF, TER
from sacrebleu.significance import PairedTest

from msgcore.utils import MsgcoreError

METRICS = {"bleu": BLEU, "chrf": CHRF, "ter": TER}


@dataclass
class Score:
    metric: str  # "bleu", "chrf" or "ter"
    score: float  # corpus-level score
    ci: float | None  # half-width of the 95% bootstrap confidence interval, if asked for
    signature: str  # sacrebleu's reproducibility signature

    def __str__(self) -> str:
        ci = f" ± {self.ci:.2f}" if self.ci is not None else ""
        return f"{self.metric.upper()} {self.score:.2f}{ci}"


def make_metric(name: str, **options):
    if name not in METRICS:
        raise MsgcoreError(f"unknown metric {name!r}; choose from {sorted(METRICS)}")
    return METRICS[name](**options)


def check_lengths(hypotheses: list[str], references: list[str]) -> None:
    if len(hypotheses) != len(references):
        raise MsgcoreError(f"{len(hypotheses)} hypotheses but {len(references)} references; they must align")


def corpus_score(name: str, hypotheses: list[str], references: list[str], n_bootstrap: int = 0,
                 **options) -> Score:
    """One corpus-level score, e.g. corpus_score("bleu", hyps, refs, lowercase=True, tokenize="intl")."""
    check_lengths(hypotheses, references)
    metric = make_metric(name, **options)
    result = metric.corpus_score(hypotheses, [references], n_bootstrap=n_bootstrap or 1)
    ci = result._ci if n_bootstrap > 1 else None
    return Score(name, result.score, ci, str(metric.get_signature()))


def score_all(hypotheses: list[str], references: list[str], metrics=("bleu", "chrf", "ter"),
              n_bootstrap: int = 0) -> dict[str, Score]:
    """Several metrics at once: {"bleu": Score, ...}."""
    return {m: corpus_score(m, hypotheses, references, n_bootstrap) for m in metrics}


def paired_test(references: list[str], systems: dict[str, list[str]], metrics=("bleu", "chrf"),
                n_samples: int = 1000):
    """Paired bootstrap resampling (Koehn 2004) through sacrebleu; the FIRST system is the baseline.

    Returns sacrebleu's (signatures, results): results[metric] lists one Result per system with
    .score, .mean, .ci and .p_value (None for the baseline).
    """
    for hyps in systems.values():
        check_lengths(hyps, references)
    named = list(systems.items())
    return PairedTest(named, {m.upper(): make_metric(m) for m in metrics}, references=[references],
                      test_type="bs", n_samples=n_samples)()


def document_bleu(hypotheses: list[str], references: list[str], doc_ids: list[int]) -> float:
    """d-BLEU: BLEU over whole documents, each the concatenation of its sentences (Liu et al., 2020)."""
    check_lengths(hypotheses, references)
    docs_h: dict[int, list[str]] = {}
    docs_r: dict[int, list[str]] = {}
    for h, r, d in zip(hypotheses, references, doc_ids):
        docs_h.setdefault(d, []).append(h)
        docs_r.setdefault(d, []).append(r)
    order = sorted(docs_h)
    return corpus_score("bleu", [" ".join(docs_h[d]) for d in order], [" ".join(docs_r[d]) for d in order]).score
