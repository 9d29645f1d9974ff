"""Floors: the scores a generation system must beat before any claim about it means something.

A claim whose system does not clear its floors is "not decided: below floor" (`msgcore.verdicts`). The floors a
chapter can name:

- **copying the input**: the source sentence (or, for APE, the machine translation: "do-nothing") as the output;
- **the best constant output**: one sentence, chosen on the dev set among its own references, output for every
  test sentence (a caption corpus has a "typical caption" that already scores a few BLEU);
- **the untrained start**: the model before training, decoded like the trained one (each chapter decodes its own).

Every score is sacreBLEU's (`msgcore.metrics.corpus_score`), cased and detokenized, as every table of the book.
"""
from __future__ import annotations

from msgcore.metrics import corpus_score, make_metric
from msgcore.utils import MsgcoreError

LOWER_IS_BETTER = {"ter"}
CONSTANT_CANDIDATES = 300  # dev references tried as the constant output (the first N, in corpus order)


def copy_input(sources: list[str], references: list[str], metric: str = "bleu", **options) -> float:
    """The score of outputting each source unchanged (do-nothing for APE, where the source is the MT output);
    `options` go to sacrebleu's metric (e.g. lowercase=True)."""
    return corpus_score(metric.lower(), list(sources), list(references), **options).score


def best_constant(dev_references: list[str], test_references: list[str], metric: str = "bleu",
                  candidates: int = CONSTANT_CANDIDATES, **options) -> tuple[str, float]:
    """(sentence, test score): the dev reference that scores best on the dev set when output for every dev
    sentence, then output for every test sentence. The choice never sees the test set."""
    if not dev_references or not test_references:
        raise MsgcoreError("the best constant output needs dev and test references, not an empty list")
    metric = metric.lower()
    sign = -1 if metric in LOWER_IS_BETTER else 1
    dev = list(dev_references)
    pool = list(dict.fromkeys(dev[:candidates]))  # unique, in corpus order: deterministic
    scorer = make_metric(metric, references=[dev], **options)  # the dev references' statistics, extracted once
    best = max(pool, key=lambda text: sign * scorer.corpus_score([text] * len(dev), None).score)
    return best, corpus_score(metric, [best] * len(test_references), list(test_references), **options).score
