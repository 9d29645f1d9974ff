"""Metric wrappers: they agree with sacrebleu, carry signatures, and refuse misaligned input."""
import pytest
import sacrebleu

from msgcore.metrics import corpus_score, paired_test, score_all
from msgcore.utils import MsgcoreError

REFS = ["the cat sat on the mat .", "a dog runs in the park .", "two men play football on the grass ."]
HYPS = ["the cat sat on a mat .", "a dog is running in the park .", "two men play soccer on grass ."]


def test_scores_equal_sacrebleu():
    scores = score_all(HYPS, REFS)
    assert scores["bleu"].score == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score)
    assert scores["chrf"].score == pytest.approx(sacrebleu.corpus_chrf(HYPS, [REFS]).score)
    assert scores["ter"].score == pytest.approx(sacrebleu.corpus_ter(HYPS, [REFS]).score)
    assert scores["bleu"].signature.startswith("nrefs:1|case:mixed|eff:no|tok:13a")


def test_perfect_output_scores_100_and_lowercase_option():
    assert corpus_score("bleu", REFS, REFS).score == pytest.approx(100)
    upper = [r.upper() for r in REFS]
    assert corpus_score("bleu", upper, REFS, lowercase=True).score == pytest.approx(100)
    assert corpus_score("bleu", upper, REFS).score < 10


def test_bootstrap_interval_is_reported():
    score = corpus_score("bleu", HYPS * 10, REFS * 10, n_bootstrap=200)
    assert score.ci is not None and score.ci > 0
    assert "bs:200" in score.signature and "±" in str(score)


def test_paired_test_flags_the_better_system():
    refs = REFS * 20
    _, results = paired_test(refs, {"baseline": ["x y z"] * len(refs), "system": HYPS * 20},
                             metrics=("bleu",), n_samples=200)
    baseline, system = results["BLEU"]
    assert system.score > baseline.score and system.p_value < 0.05


def test_misaligned_and_unknown_metric_refused():
    with pytest.raises(MsgcoreError, match="2 hypotheses but 3 references"):
        corpus_score("bleu", HYPS[:2], REFS)
    with pytest.raises(MsgcoreError, match="unknown metric 'meteor'"):
        corpus_score("meteor", HYPS, REFS)
