"""The verdict protocol against adversarial evidence: every way a weak result could pass for a verdict, each input
that once got "reproduced" and now gets the right answer or a one-line refusal."""
import json

import numpy as np
import pytest

from msgcore import verdicts as V
from msgcore.verdicts import Claim, Gate, Measure, RunRecord, Stage, System

SAMPLES = 200
SHARED = np.random.default_rng(0).normal(0, 1, SAMPLES)  # a test-set resampling effect every system shares


def stage(curve=((1000, 30.0), (2000, 33.0), (3000, 33.1), (4000, 33.2)), updates=4000, noise=0.1,
          tokens=(400_000, 380_000), name="training", **kw):
    return Stage(name, tuple(curve), updates, *tokens, dev_noise=noise, **kw)


CONVERGED = stage()
STILL_RISING = stage(((1000, 20.0), (2000, 26.0), (3000, 30.0), (4000, 34.0)))


def system(name, scores, runs=None, test="test", metric="BLEU", sentences=100, own_noise=0.0, stages=None):
    """A trained system; `scores` a list (seeds 0..n-1) or a dict seed -> score; replicates move with the shared
    resampling effect (paired: no test noise in a delta) plus `own_noise` of their own."""
    scores = dict(enumerate(scores)) if isinstance(scores, (list, tuple)) else dict(scores)
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    replicates = {k: list(v + 0.5 * SHARED + own_noise * rng.normal(0, 1, SAMPLES)) for k, v in scores.items()}
    measure = Measure(scores, sentences, "BLEU|nrefs:1|tok:13a", replicates if sentences else {})
    if runs is None:
        runs = seeded(stages or (CONVERGED,), scores)
    return System(name, {test: {metric: measure}}, tuple(runs))


def seeded(stages, seeds):
    """One run per seed: the same stages with each seed's own small wobble of its dev curve (a real seed's run is
    never another's copy)."""
    return [RunRecord(k, tuple(V.Stage(**{**V.asdict_shallow(s), "dev_curve": tuple((step, v + k / 1000)
                                                                                     for step, v in s.dev_curve)})
                               for s in stages)) for k in seeds]


def floor(name, score, sentences=100):
    return V.floor_system(name, "test", "BLEU", score, sentences, "BLEU|nrefs:1|tok:13a",
                          list(score + 0.5 * SHARED) if sentences else ())


def better(**kw):
    return Claim(**{"id": "c", "claim": "A beats B", "paper": "+1.3", "kind": "better", "system": "A",
                    "baseline": "B", "metric": "BLEU", "test_set": "test", "paper_delta": 1.3,
                    "paper_baseline": 30.0, **kw})


def judge(claim, *systems, gates=()):
    return V.judge(claim, {s.name: s for s in systems}, gates)


A_GAIN = [31.4, 31.2, 31.6]
B_BASE = [30.0, 30.1, 29.9]


# ---- hole 1: seeds are paired by id, never by position -----------------------------------------------------------

def test_seeds_pair_by_id_whatever_order_they_are_listed_in():
    a = system("A", {0: 31.4, 1: 31.2, 2: 31.6})
    in_order = judge(better(), a, system("B", {0: 30.0, 1: 30.1, 2: 29.9}))
    shuffled = judge(better(), a, system("B", {2: 29.9, 0: 30.0, 1: 30.1}))
    assert in_order.verdict == shuffled.verdict == V.REPRODUCED and in_order.interval == shuffled.interval
    assert in_order.seeds == {"A": [0, 1, 2], "B": [0, 1, 2]}


def test_unpaired_seeds_are_refused():
    with pytest.raises(V.ProtocolError, match="seeds are not paired: A has \\[0, 1, 2\\], B \\[0, 1, 3\\]"):
        judge(better(), system("A", A_GAIN), system("B", {0: 30.0, 1: 30.1, 3: 29.9}))


def test_one_run_copied_under_three_seed_ids_is_refused():
    with pytest.raises(V.ProtocolError, match="seeds 0 and 1 are the same run"):
        system("A", [31.4, 31.4, 31.4], runs=[RunRecord(k, (CONVERGED,)) for k in range(3)])
    with pytest.raises(V.ProtocolError, match="seed 0 has two runs"):
        system("A", [31.4, 31.2], runs=[RunRecord(0, (CONVERGED,)), RunRecord(0, (STILL_RISING,))])


def test_runs_whose_dev_curves_never_move_are_not_taken_for_copies():
    """A capped dry run's seeds can log the same flat curve (BLEU 0 at every validation) and the same budgets."""
    flat = V.Stage("training", ((100, 0.0), (200, 0.0), (300, 0.0)), 300, 3000, 2700, False)
    assert not RunRecord(0, (flat,)).same_training(RunRecord(1, (flat,)))
    system("A", [0.0, 0.0], runs=[RunRecord(0, (flat,)), RunRecord(1, (flat,))])  # accepted


def test_a_seed_given_twice_in_a_results_file_is_refused(tmp_path):
    path = tmp_path / "r.json"
    path.write_text('{"scores": {"0": 31.4, "0": 35.0}}')
    with pytest.raises(V.ProtocolError, match="'0' is given twice"):
        V.load_json(path)


def test_scores_without_seed_ids_are_refused():
    with pytest.raises(V.ProtocolError, match="seed ids are integers"):
        Measure({"first": 31.4})
    with pytest.raises(V.ProtocolError, match="seed ids are integers"):
        Measure({"1.5": 31.4})
    with pytest.raises(V.ProtocolError, match="seed -1 is the seed id of floors"):
        system("A", {-1: 31.4}, runs=[])


# ---- hole 2: a trained baseline without runs is no floor ---------------------------------------------------------

def test_a_trained_baseline_declared_without_runs_is_no_evidence():
    v = judge(better(), system("A", A_GAIN), system("B", B_BASE, runs=[]))
    assert v.verdict == V.NOT_DECIDED and v.reason.startswith("no evidence: B has no training run for seeds 0, 1, 2")
    with pytest.raises(V.ProtocolError, match="seeds are not paired"):
        judge(better(), system("A", A_GAIN), system("B", [30.0]))  # nor is it broadcast to every seed


def test_only_a_declared_floor_has_one_score_for_every_seed():
    v = judge(better(baseline="do-nothing", paper_delta=None), system("A", [22.0, 23.0, 22.5]),
              floor("do-nothing", 20.0))
    assert v.verdict == V.REPRODUCED and "over 3 seeds" in v.reason
    with pytest.raises(V.ProtocolError, match="a floor is never trained"):
        System("fake floor", {"test": {"BLEU": Measure({0: 20.0})}}, floor=True)


# ---- holes 3 and 4: floors on both sides, and a baseline that is the floor -------------------------------------

def test_a_baseline_below_a_floor_cannot_be_beaten():
    claim = better(floors=("constant output",), paper_delta=None)
    v = judge(claim, system("A", [5.0, 5.1, 4.9]), system("B", [2.0, 2.1, 1.9]), floor("constant output", 3.86))
    assert v.verdict == V.NOT_DECIDED and v.reason == "below floor: B 2.00 vs constant output 3.86"
    assert not v.floors_cleared


def test_a_system_at_or_below_its_floor_decides_nothing():
    claim = better(floors=("constant output", "copy"))
    args = (system("B", B_BASE), floor("constant output", 3.86), floor("copy", 0.46))
    assert judge(claim, system("A", [3.0, 2.8, 2.6]), *args).reason.startswith("below floor: A 2.80 vs constant")
    assert judge(claim, system("A", [3.86] * 3), *args).verdict == V.NOT_DECIDED  # "at or below"


def test_a_system_below_the_floor_that_is_its_baseline_is_judged_by_its_interval():
    claim = better(baseline="do-nothing", floors=("do-nothing",), metric="TER", higher_is_better=False,
                   paper_delta=-0.73, paper_baseline=16.84)
    ter = system("APE", [20.9, 21.0, 21.1], metric="TER")
    v = V.judge(Claim(**{**V.asdict_shallow(claim), "system": "APE"}),
                {"APE": ter, "do-nothing": V.floor_system("do-nothing", "test", "TER", 19.5, 100, "BLEU|nrefs:1|tok:13a",
                                                          list(19.5 + 0.5 * SHARED))})
    assert v.verdict == V.NOT_REPRODUCED and "the other way" in v.reason


# ---- hole 5: budgets in updates and tokens, per seed -----------------------------------------------------------

def test_budgets_compare_updates_and_tokens_seed_by_seed():
    rising_a = seeded((STILL_RISING,), range(3))
    more_tokens = seeded((stage(STILL_RISING.dev_curve, tokens=(800_000, 760_000)),), range(3))
    v = judge(better(), system("A", A_GAIN, runs=rising_a), system("B", B_BASE, runs=more_tokens))
    assert not v.equal_budget and "budgets differ (seed 0: source tokens 400,000 vs 800,000)" in v.reason
    untracked = seeded((stage(STILL_RISING.dev_curve, tokens=(None, None)),), range(3))
    assert not judge(better(), system("A", A_GAIN, runs=rising_a), system("B", B_BASE, runs=untracked)).equal_budget
    same = judge(better(), system("A", A_GAIN), system("B", B_BASE))
    assert same.equal_budget


# ---- hole 6: convergence that cannot be fooled, stage by stage -------------------------------------------------

@pytest.mark.parametrize("curve, updates, early, patience, why", [
    (((100, 10.0), (200, 12.0), (300, 12.1)), 1000, False, 0, "3 validations"),
    (((100, 10.0), (200, 12.0), (300, 12.1), (400, 12.15)), 1000, False, 0, "no validation in its last quarter"),
    (((250, 10.0), (500, 12.0), (750, 14.0), (1000, 13.9)), 1000, True, 1, "patience 1"),
    (((250, 30.0), (500, 29.0), (750, 28.0), (1000, 27.0)), 1000, False, 0, "best dev score is its first"),
])
def test_convergence_that_used_to_be_fooled(curve, updates, early, patience, why):
    ok, reason = stage(curve, updates, early_stopped=early, patience=patience).converged()
    assert not ok and why in reason


def test_the_tolerance_is_the_claims_relative_effect_in_the_stages_own_metric_and_the_dev_set_must_resolve_it():
    gaining = stage(((250, 20.0), (500, 24.0), (750, 26.0), (1000, 26.3)), 1000, noise=0.2)  # +0.3 at a level of 26
    assert gaining.tolerance(0.015) == pytest.approx(0.3945) and gaining.converged(0.015) == (True, "")
    assert gaining.converged() == (False, "dev +0.30 over updates 750–1,000 (tolerance 0.26)")  # 1%: the default
    noisy = stage(((250, 20.0), (500, 24.0), (750, 26.0), (1000, 26.1)), 1000, noise=1.5)
    assert noisy.converged(0.02) == (False, "the dev set cannot resolve 0.52 (its noise is ±1.50)")
    assert not stage(noise=None).converged()[0]
    ter = stage(((250, 30.0), (500, 26.0), (750, 25.0), (1000, 24.9)), 1000, noise=0.1, higher_is_better=False)
    assert ter.tolerance(0.01) == pytest.approx(0.249) and ter.converged() == (True, "")  # TER falls: its gain is 0.1
    # the same runs, two claims: a large paper effect tolerates what a small one does not (m / baseline, bounded)
    runs = seeded((gaining,), range(3))
    large = judge(better(paper_delta=2.6, paper_baseline=30.0), system("A", A_GAIN, runs=runs),
                  system("B", B_BASE, runs=runs))
    small = judge(better(paper_delta=0.6, paper_baseline=30.0), system("A", A_GAIN, runs=runs),
                  system("B", B_BASE, runs=runs))
    assert large.converged and not small.converged and small.reason.startswith("under-trained")
    assert V.convergence_share(0.0, 30.0) == V.DEFAULT_SHARE and V.convergence_share(5.0, 10.0) == 0.02


def test_every_stage_must_converge_and_a_fixed_length_stage_is_judged_by_its_length():
    fixed = stage(((100, 33.0), (200, 33.9), (300, 34.1)), 300, name="phase 2", fixed_length=300)
    assert fixed.converged() == (True, "")
    assert not stage(((100, 33.0),), 100, fixed_length=300).converged()[0]
    first_rising = RunRecord(0, (stage(STILL_RISING.dev_curve, name="pre-training"), fixed))
    assert first_rising.converged() == (False, "pre-training: dev +4.00 over updates 3,000–4,000 (tolerance 0.34)")
    assert RunRecord(0, (stage(name="phase 1"), fixed)).converged() == (True, "")


def test_a_run_at_its_cap_while_improving_decides_nothing():
    v = judge(better(), system("A", [35, 35.2, 35.1], stages=(STILL_RISING,)),
              system("B", B_BASE))
    assert v.verdict == V.NOT_DECIDED and v.reason.startswith("under-trained: A seed 0: training: dev +4.00")
    assert not v.converged


def test_a_stage_from_a_trainers_log():
    rows = [{"kind": "train", "step": s, "source_tokens": 10 * s, "target_tokens": 9 * s} for s in range(0, 1001, 100)]
    valid = lambda curve: [{"kind": "valid", "step": s, "valid_bleu": b, "valid_noise": 0.1 * i,
                            "source_tokens": 10 * s, "target_tokens": 9 * s} for i, (s, b) in enumerate(curve)]
    stopped = V.stage_from_history("ft", rows[:9] + valid([(200, 10), (400, 20), (600, 19), (800, 19)]), patience=2)
    assert stopped.early_stopped and stopped.converged(0.02) == (True, "")  # noise 0.25 < 2% of 20
    assert (stopped.updates, stopped.source_tokens, stopped.target_tokens) == (800, 8000, 7200)
    assert stopped.dev_noise == pytest.approx(0.25)  # the median over the second half of its validations
    rising = V.stage_from_history("ft", rows + valid([(250, 10), (500, 20), (750, 25), (1000, 30)]), patience=0)
    assert not rising.early_stopped and rising.converged() == (False, "dev +5.00 over updates 750–1,000 "
                                                                      "(tolerance 0.30)")  # 1% of 30


# ---- hole 7: a coherence note explains the baselines it names, and only those ----------------------------------

def test_a_coherence_note_lifts_the_check_only_for_the_baseline_it_names():
    singles = (floor("De→En", 39.2), floor("Fr→En", 35.0))
    note = better(single_source=("De→En", "Fr→En"), coherence_notes=(("De→En", "a tiny model, 0.4 epochs"),))
    assert judge(note, system("A", A_GAIN), system("B", B_BASE), *singles).reason.endswith(
        "A 31.40 vs Fr→En 35.00 (the chapter must explain it)")
    both = better(single_source=("De→En", "Fr→En"), coherence_notes=(("De→En", "tiny"), ("Fr→En", "tiny")))
    assert judge(both, system("A", A_GAIN), system("B", B_BASE), *singles).verdict == V.REPRODUCED
    with pytest.raises(V.ProtocolError, match="not one of its single-source baselines"):
        better(single_source=("De→En",), coherence_notes=(("En→De", "tiny"),))
    with pytest.raises(V.ProtocolError, match="empty"):
        better(single_source=("De→En",), coherence_notes=(("De→En", " "),))


# ---- hole 8: a floor or a score from another test set or metric ------------------------------------------------

def test_a_floor_scored_on_another_test_set_or_metric_is_refused():
    claim = better(floors=("copy",))
    with pytest.raises(V.ProtocolError, match="copy is scored on 1000 sentences"):
        judge(claim, system("A", A_GAIN), system("B", B_BASE), floor("copy", 3.0, sentences=1000))
    lowercased = V.floor_system("copy", "test", "BLEU", 3.0, 100, "BLEU|lc:yes", list(3.0 + SHARED))
    with pytest.raises(V.ProtocolError, match="copy's BLEU \\(BLEU\\|lc:yes\\) is not A's"):
        judge(claim, system("A", A_GAIN), system("B", B_BASE), lowercased)


def test_an_anchor_in_another_metric_is_refused_when_declared():
    with pytest.raises(V.ProtocolError, match="no verdict compares two metrics"):
        Claim("anchor", "reaches 36.5", "36.52 torchtext BLEU", "threshold", "A", "BLEU", "test", threshold=36.52,
              paper_metric="torchtext BLEU on spaCy tokens")


def test_a_missing_floor_is_an_error():
    with pytest.raises(V.ProtocolError, match="floor"):
        judge(better(floors=("copy",)), system("A", A_GAIN), system("B", B_BASE))


# ---- hole 9: the interval includes the test set's noise --------------------------------------------------------

def test_the_interval_combines_the_seeds_with_the_test_sets_noise():
    tight = judge(better(paper_delta=0.4), system("A", [31.0, 31.05, 30.95]), system("B", [30.0, 30.05, 29.95]))
    assert tight.verdict == V.REPRODUCED and tight.test_noise == pytest.approx(0.0, abs=1e-9)
    noisy = judge(better(paper_delta=0.4), system("A", [31.0, 31.05, 30.95], own_noise=4.0),
                  system("B", [30.0, 30.05, 29.95], own_noise=4.0))
    assert noisy.verdict == V.INCONCLUSIVE and noisy.test_noise > 1.0 and "test-set noise ±" in noisy.reason
    low, high = noisy.interval[1:]
    assert low < 0 < high


def test_a_score_over_test_sentences_carries_its_replicates():
    with pytest.raises(V.ProtocolError, match="bootstrap replicates for every seed"):
        Measure({0: 31.0, 1: 31.2}, 100, "BLEU", {0: [31.0] * 10})
    assert Measure({0: 5.0}).replicates == {}  # not a sample of sentences (a speed-up): seeds only


def test_replicates_from_the_shared_draws_are_paired(tmp_path):
    refs = [f"sentence number {i} about a cat" for i in range(60)]
    a = {0: [r.replace("cat", "dog") if i % 3 else r for i, r in enumerate(refs)]}
    b = {0: [r.replace("cat", "dog") if i % 2 else r for i, r in enumerate(refs)]}
    ma, mb = V.text_measure("bleu", a, refs), V.text_measure("bleu", b, refs)
    assert ma.sentences == 60 and len(ma.replicates[0]) == 200 and ma.signature.startswith("nrefs:1")
    same = V.text_measure("bleu", a, refs)
    assert same.replicates == ma.replicates  # the same draws every time
    diff = V.difference_measure(ma, mb)
    assert diff.scores[0] == pytest.approx(ma.scores[0] - mb.scores[0])


# ---- calibration: the smallest effect at our level, and its own outcome -----------------------------------------

def test_the_smallest_effect_is_scaled_to_our_level():
    # TRICE's T8: the paper +9.5 (23.0 vs 13.5); ours 3.75 on a 7.71 baseline: m = 4.75 * 7.71 / 13.5 = 2.71
    claim = better(paper_delta=9.5, paper_baseline=13.5)
    v = judge(claim, system("A", [11.36, 11.46, 11.56]), system("B", [7.61, 7.71, 7.81]))
    assert v.smallest_effect == pytest.approx(4.75 * 7.71 / 13.5)
    assert v.verdict == V.REPRODUCED and "half the paper's +9.5 at our level (× 7.71 / 13.5)" in v.reason


def test_smaller_than_the_papers_effect_in_its_direction_is_its_own_outcome():
    v = judge(better(paper_delta=4.0, paper_baseline=30.0), system("A", [30.5, 30.55, 30.45]), system("B", B_BASE))
    assert v.verdict == V.SMALLER and "the paper's direction, smaller than m" in v.reason
    none = judge(better(paper_delta=4.0, paper_baseline=30.0), system("A", [30.1, 29.9, 30.0]), system("B", B_BASE))
    assert none.verdict == V.NOT_REPRODUCED and "no effect of the paper's size" in none.reason


def test_a_declared_margin_needs_its_reason_and_a_paper_delta_its_baseline():
    with pytest.raises(V.ProtocolError, match="paper_baseline"):
        better(paper_baseline=None)
    with pytest.raises(V.ProtocolError, match="one-line reason"):
        better(margin=0.5)
    with pytest.raises(V.ProtocolError, match="points away from the claim"):
        better(paper_delta=-1.3)
    declared = better(margin=0.5, margin_reason="the paper's own En→De cell, +0.48")
    assert declared.smallest_effect(30.0) == (0.5, "m = 0.5, declared: the paper's own En→De cell, +0.48")
    with pytest.raises(V.ProtocolError, match="min_seeds 1"):
        better(min_seeds=1)


# ---- gates: the paper's figure beside each, none stricter than the paper's systems -----------------------------

def test_a_gate_stricter_than_the_papers_own_systems_is_refused():
    paper = "NAT-Base at 0.684 × its teacher (Table II, En→De)"
    with pytest.raises(V.ProtocolError, match="stricter than the paper's own systems"):
        Gate("NAT ≥ k × teacher", 0.76, 0.75, paper, paper_value=0.684)
    assert Gate("NAT ≥ k × teacher", 0.76, 0.68, paper, paper_value=0.684).passed
    with pytest.raises(V.ProtocolError, match="the paper's own figure"):
        Gate("teacher BLEU", 38.0, 33.0, "")
    assert V.gate_table([Gate("g", 1.0, 0.5, "none: a sanity check")]).to_dict("records") == [
        {"gate": "g", "ours": 1.0, "target": "≥ 0.5", "paper": "none: a sanity check", "passed": "yes"}]


def test_a_failed_gate_blocks_the_claims_that_rest_on_it_and_only_those():
    gates = [Gate("teacher BLEU", 20.0, 33.0, "none"), Gate("distillation", 30.0, 25.0, "none")]
    systems = {s.name: s for s in (system("A", [40, 41, 42]), system("B", [30, 31, 32]))}
    blocked, free = V.judge_all([better(id="x", gates=("teacher BLEU", "distillation")),
                                 better(id="y", gates=("distillation",))], systems, gates)
    assert blocked.verdict == V.NOT_DECIDED and blocked.reason == "gate failed: teacher BLEU"
    assert free.verdict == V.REPRODUCED and [g["name"] for g in free.gates] == ["distillation"]
    with pytest.raises(V.ProtocolError, match="no gate named 'teacher'"):
        judge(better(gates=("teacher",)), *systems.values())


# ---- the equal-budget statement: never a verdict ---------------------------------------------------------------

def test_unconverged_runs_at_equal_budgets_say_who_learns_faster_and_nothing_more():
    a = seeded((stage(((1000, 22.0), (2000, 28.0), (3000, 31.0), (4000, 35.0)), schedule="lr 1e-3"),), range(3))
    b = seeded((stage(((1000, 20.0), (2000, 26.0), (3000, 30.0), (4000, 33.0)), schedule="lr 1e-3"),), range(3))
    v = judge(better(), system("A", A_GAIN, runs=a), system("B", B_BASE, runs=b))
    assert v.verdict == V.NOT_DECIDED and v.reason.startswith("under-trained")
    assert v.statement.startswith("within 4,000 updates of the last stage: A ahead on dev (+2.00) at 2,000, "
                                  "A ahead on dev (+2.00) at 4,000")
    assert "not reproduced" not in v.statement and "Not a verdict" in v.statement
    other_schedule = [RunRecord(k, (stage(r.last.dev_curve, schedule="lr 5e-4"),)) for k, r in enumerate(b)]
    assert judge(better(), system("A", A_GAIN, runs=a), system("B", B_BASE, runs=other_schedule)).statement == ""
    assert list(V.statements([v])["id"]) == ["c"] and V.statements([]).empty


def test_the_statement_reads_dev_in_the_dev_metrics_direction_and_skips_one_set_of_runs_read_twice():
    """A lower-is-better claim (repeats %) whose runs validate on dev BLEU: ahead on dev means higher dev BLEU.
    Two readings of the same runs (long vs short sentences) have no learning speed to compare."""
    a = seeded((stage(((1000, 22.0), (2000, 28.0), (3000, 31.0), (4000, 35.0)), schedule="lr 1e-3"),), range(3))
    b = seeded((stage(((1000, 20.0), (2000, 26.0), (3000, 30.0), (4000, 33.0)), schedule="lr 1e-3"),), range(3))
    fewer = better(higher_is_better=False, metric="repeats %", paper_metric="repeats %", paper_delta=-1.3)
    v = judge(fewer, system("A", [10.0, 10.2, 9.9], runs=a, metric="repeats %"),
              system("B", [12.0, 12.1, 11.8], runs=b, metric="repeats %"))
    assert "A ahead on dev (+2.00) at 2,000" in v.statement
    same = judge(fewer, system("A", [10.0, 10.2, 9.9], runs=a, metric="repeats %"),
                 system("B", [12.0, 12.1, 11.8], runs=a, metric="repeats %"))
    assert same.statement == ""


# ---- what a verdict needs, and what it says ---------------------------------------------------------------------

def test_three_converged_seeds_with_a_clear_gain_are_reproduced():
    v = judge(better(), system("A", A_GAIN), system("B", B_BASE))
    assert v.verdict == V.REPRODUCED and v.converged and v.floors_cleared and v.leans == "towards the claim"
    assert v.ours == "A 31.40 ± 0.20 vs B 30.00 ± 0.10 BLEU (3 seeds)" and "+1.40" in v.reason


def test_one_or_two_seeds_are_never_more_than_indicative():
    v = judge(better(), system("A", [40.0]), system("B", [30.0]))  # +10 BLEU: a paired test would say p = 0.001
    assert v.verdict == V.INDICATIVE and "1 seed" in v.reason and "leans towards" in v.reason
    assert judge(better(), system("A", [40, 41]), system("B", [30, 31])).verdict == V.INDICATIVE


def test_a_parity_margin_can_be_the_papers_own_gap_at_our_level():
    claim = better(kind="parity", paper_delta=-1.2, paper_baseline=29.6)  # mBART 29.6 vs MARGE 28.4 in the paper
    assert claim.smallest_effect(3.0) == (pytest.approx(1.2 * 3.0 / 29.6),
                                          "m = 0.12: the paper's own gap -1.2 at our level (× 3.00 / 29.6)")
    with pytest.raises(V.ProtocolError, match="parity claim declares a positive margin"):
        better(kind="parity", paper_delta=None)


def test_a_large_loss_is_never_parity():
    parity = better(kind="parity", margin=1.0, margin_reason="the paper's own margin", paper_delta=None)
    assert judge(parity, system("A", [25.0, 24.6, 25.4]), system("B", [30.0, 30.01, 29.99])).verdict == \
        V.NOT_REPRODUCED
    assert judge(parity, system("A", [22.0, 31.0, 27.0]), system("B", [30.0, 30.01, 29.99])).verdict == \
        V.INCONCLUSIVE  # non-significance is never parity
    assert judge(parity, system("A", [29.9, 30.1, 30.0]), system("B", [30.0, 30.01, 29.99])).verdict == V.REPRODUCED
    assert "leans towards" in judge(parity, system("A", [39.5]), system("B", [40.0])).reason  # −0.5 is inside −1


def test_lower_is_better_metrics_flip_the_direction():
    ter = better(metric="TER", higher_is_better=False, paper_delta=-0.8, paper_baseline=18.26)
    a, b = system("A", [20.0, 20.2, 19.8], metric="TER"), system("B", [22.0, 22.1, 21.9], metric="TER")
    assert V.judge(ter, {"A": a, "B": b}).verdict == V.REPRODUCED
    assert V.judge(ter, {"A": b, "B": a}).verdict == V.NOT_REPRODUCED


def test_a_threshold_straddled_by_the_interval_is_inconclusive():
    claim = Claim("speed", "NAT is about 10x faster", "10.04x", "threshold", "NAT", "speed-up", "test", threshold=10.0)
    speed = lambda values: system("NAT", values, metric="speed-up", sentences=0)
    assert judge(claim, speed([9.0, 10.5, 11.0])).verdict == V.INCONCLUSIVE  # mean 10.17 alone would pass
    assert judge(claim, speed([10.3, 10.4, 10.5])).verdict == V.REPRODUCED
    assert judge(claim, speed([9.5, 9.6, 9.7])).verdict == V.NOT_REPRODUCED
    assert "seeds only" in judge(claim, speed([10.3, 10.4, 10.5])).reason


def test_a_claim_without_evidence_is_not_run_with_its_cost():
    v = judge(better(cost=V.cpu_hours(6, 20_000, 0.35)), system("B", B_BASE))
    assert v.verdict == V.NOT_RUN and "(A)" in v.reason and "about 11.7 CPU-hours (6 runs × 20,000 updates" in v.reason


def test_malformed_declarations_are_refused():
    for kw, match in ((dict(baseline=""), "baseline"), (dict(kind="parity", paper_delta=None), "margin"),
                      (dict(kind="threshold"), "threshold"), (dict(kind="roughly"), "unknown kind"),
                      (dict(baseline="A"), "its own baseline")):
        with pytest.raises(V.ProtocolError, match=match):
            better(**kw)
    with pytest.raises(V.ProtocolError, match="repeat"):
        V.judge_all([better(), better()], {})
    with pytest.raises(V.ProtocolError, match="no claims"):
        V.judge_all([], {})
    with pytest.raises(V.ProtocolError, match="filed under the name 'B'"):
        V.judge_all([better()], {"B": system("A", A_GAIN)})
    with pytest.raises(V.ProtocolError, match="empty"):
        Measure({})


# ---- results files: the whole evidence, re-judged without retraining --------------------------------------------

def test_a_results_file_holds_the_evidence_and_is_rejudged_to_the_same_verdicts(tmp_path):
    gates = [Gate("teacher", 38.0, 33.0, "none: a sanity check of ours")]
    claims = [better(gates=("teacher",), floors=("copy",)),
              better(id="d", kind="parity", margin=0.5, margin_reason="stated", paper_delta=None)]
    systems = {s.name: s for s in (system("A", A_GAIN), system("B", B_BASE), floor("copy", 2.0))}
    judged = V.judge_all(claims, systems, gates)
    path = V.write_results(tmp_path / "results" / "ch.json", "ch", "small", "abc123", judged, systems,
                           identity={"numerics": {"core": 3}, "recipe": "r1"})
    data = V.load_json(path)
    assert data["protocol"] == V.PROTOCOL_VERSION and data["numerics"] == {"core": 3} and data["recipe"] == "r1"
    again = V.rejudge(data)
    assert [(v.verdict, v.reason, v.interval) for v in again] == [(v.verdict, v.reason, v.interval) for v in judged]
    legacy = {"chapter": "old", "claims": [], "systems": []}
    with pytest.raises(V.ProtocolError, match="only a re-run"):
        V.rejudge(legacy)


def test_the_tables():
    verdicts = V.judge_all([better(), better(id="d")], {s.name: s for s in (system("A", A_GAIN), system("B", B_BASE))})
    rising = judge(better(), system("A", [35] * 3, stages=(STILL_RISING,)), system("B", B_BASE))
    table = V.reason_counts(verdicts + [rising])
    assert list(table["verdict"]) == ["reproduced", "not decided"] and list(table["claims"]) == [2, 1]
    assert table.loc[1, "reason"] == "under-trained"
    assert list(V.scoreboard(verdicts)["ours points"]) == ["towards the claim"] * 2
    assert list(V.declarations([better()])["smallest effect m"]) == ["½ × +1.3 × ours / 30"]
    runs = V.runs_table({"A": system("A", [14.0], runs=[RunRecord(0, (STILL_RISING,))]), "copy": floor("copy", 1.0)})
    assert runs.to_dict("records") == [{"system": "A", "seed": 0, "stage": "training", "updates": 4000,
                                        "target tokens": 380_000, "best dev at update": 4000, "dev noise": 0.1,
                                        "converged": "no: dev +4.00 over updates 3,000–4,000 (tolerance 0.34)"}]


def test_identical_outputs_give_delta_0_and_p_1():
    refs = ["the cat sat on the mat", "a dog runs"]
    hyps = ["the cat sat on a mat", "a dog walks"]
    assert V.paired_bootstrap(refs, hyps, list(hyps)) == (0.0, 1.0)


def test_best_constant_is_chosen_on_dev_and_scored_on_test():
    from msgcore import floors

    dev = ["a man rides a horse .", "a man rides a bike .", "two dogs play in the snow ."]
    test = ["two dogs play in the park .", "two dogs run in the snow ."]
    text, score = floors.best_constant(dev, test)
    assert text in dev[:2]  # the "typical" dev sentence, never a test sentence
    assert score == pytest.approx(floors.copy_input([text] * 2, test))
    with pytest.raises(Exception, match="empty"):
        floors.best_constant([], test)


@pytest.mark.parametrize("metric,options", [("bleu", {}), ("bleu", {"lowercase": True}),
                                            ("ter", {"case_sensitive": True})])
def test_best_constant_scores_each_candidate_as_a_plain_corpus_score_would(metric, options):
    from msgcore import floors
    from msgcore.metrics import corpus_score

    dev = ["A man rides a horse .", "a man rides a bike .", "Two dogs play in the snow .", "a dog runs .",
           "A man rides a horse in the snow ."]
    sign = -1 if metric == "ter" else 1
    expected = max(dict.fromkeys(dev), key=lambda t: sign * corpus_score(metric, [t] * 5, dev, **options).score)
    text, score = floors.best_constant(dev, dev[:2], metric, **options)  # the references' statistics are cached
    assert text == expected
    assert score == corpus_score(metric, [expected] * 2, dev[:2], **options).score


def test_tables_write_counts_as_integers_small_rates_with_significant_digits_and_gaps_as_a_dash():
    import pandas as pd

    frame = pd.DataFrame({"updates": [1000.0, 250.0], "lr": [5e-4, 1e-3], "BLEU": [38.391, None],
                          "note": ["a", None]})
    text = {column: [V.number_formatter(frame[column])(v) for v in frame[column]] for column in frame}
    assert text == {"updates": ["1,000", "250"], "lr": ["0.0005", "0.001"], "BLEU": ["38.39", "–"], "note": ["a", "–"]}
    assert V.number_formatter(pd.Series(["`<sep>`"]))("`<sep>`") == "<code>&lt;sep&gt;</code>"
    column = pd.Series([np.int64(3), np.int64(1200)])
    assert [V.number_formatter(column)(v) for v in column] == ["3", "1,200"]
    assert V.number_formatter(pd.Series([np.bool_(True)]))(np.bool_(True)) == "True"
