"""The verdict protocol against adversarial evidence: every way a weak result could pass for a verdict."""
import json

import pytest

from msgcore import verdicts as V
from msgcore.verdicts import Claim, RunRecord, System

CONVERGED = RunRecord(((1000, 30.0), (2000, 33.0), (3000, 33.1), (4000, 33.2)), 4000, False)
STILL_RISING = RunRecord(((1000, 20.0), (2000, 26.0), (3000, 30.0), (4000, 34.0)), 4000, False)


def system(name, scores, runs=None, updates=4000, test_set="test", metric="BLEU"):
    runs = [CONVERGED] * len(scores) if runs is None else runs
    return System(name, {test_set: {metric: list(scores)}}, runs, updates)


def floor(name, score):
    return System(name, {"test": {"BLEU": [score]}})  # untrained: no runs, no budget


def better(**kw):
    return Claim(**{"id": "c", "claim": "A beats B", "paper": "+1.3", "kind": "better", "system": "A",
                    "baseline": "B", "metric": "BLEU", "test_set": "test", "paper_delta": 1.3, **kw})


def judge(claim, *systems):
    return V.judge(claim, {s.name: s for s in systems})


# ---- the adversarial cases --------------------------------------------------------------------------------------

def test_one_seed_is_never_reproduced_whatever_its_p_value():
    v = judge(better(), system("A", [40.0]), system("B", [30.0]))  # +10 BLEU: a paired test would say p = 0.001
    assert v.verdict == V.INDICATIVE and "1 seed" in v.reason and "leans towards" in v.reason


def test_two_seeds_are_still_indicative():
    assert judge(better(), system("A", [40, 41]), system("B", [30, 31])).verdict == V.INDICATIVE


def test_a_large_loss_is_never_parity():
    parity = better(kind="parity", margin=1.0, claim="A is no worse than B")
    far_worse = judge(parity, system("A", [25.0, 24.6, 25.4]), system("B", [30.0, 30.0, 30.0]))  # -5 BLEU
    assert far_worse.verdict == V.NOT_REPRODUCED
    noisy = judge(parity, system("A", [22.0, 31.0, 27.0]), system("B", [30.0, 30.0, 30.0]))  # -3.3, not significant
    assert noisy.verdict == V.INCONCLUSIVE  # non-significance is never parity
    close = judge(parity, system("A", [29.9, 30.1, 30.0]), system("B", [30.0, 30.0, 30.0]))
    assert close.verdict == V.REPRODUCED


def test_empty_evidence_is_an_error_not_a_verdict():
    with pytest.raises(V.ProtocolError, match="empty"):
        judge(better(), system("A", []), system("B", [30.0]))
    with pytest.raises(V.ProtocolError, match="empty"):
        V.mean_interval([])
    with pytest.raises(V.ProtocolError, match="no claims"):
        V.judge_all([], {})


def test_a_run_at_its_cap_while_improving_decides_nothing():
    v = judge(better(), system("A", [35, 35.2, 35.1], runs=[STILL_RISING] * 3), system("B", [30, 30.1, 29.9]))
    assert v.verdict == V.NOT_DECIDED and v.reason.startswith("under-trained: A seed 0: dev +4.00")
    assert not v.converged


def test_unequal_budgets_decide_nothing_unless_both_converged():
    a = system("A", [35, 35.2, 35.1], runs=[STILL_RISING] * 3, updates=4000)
    b = system("B", [30, 30.1, 29.9], runs=[STILL_RISING] * 3, updates=3000)
    v = judge(better(), a, b)
    assert v.verdict == V.NOT_DECIDED and v.reason.startswith("unequal budgets") and not v.equal_budget
    both_converged = judge(better(), system("A", [35, 35.2, 35.1], updates=4000),
                           system("B", [30, 30.1, 29.9], updates=3000))
    assert both_converged.equal_budget and both_converged.verdict == V.REPRODUCED


def test_a_trained_system_without_a_dev_curve_cannot_claim_convergence():
    v = judge(better(), system("A", [35, 35.2, 35.1], runs=[]), system("B", [30, 30.1, 29.9]))
    assert v.verdict == V.NOT_DECIDED and "no dev curve" in v.reason


def test_a_system_at_or_below_its_floor_decides_nothing():
    claim = better(floors=("constant output", "copy"))
    v = judge(claim, system("A", [3.0, 2.8, 2.6]), system("B", [0.5, 0.4, 0.6]), floor("constant output", 3.86),
              floor("copy", 0.46))
    assert v.verdict == V.NOT_DECIDED and v.reason == "below floor: A 2.80 vs constant output 3.86"
    assert not v.floors_cleared
    at_floor = judge(claim, system("A", [3.86] * 3), system("B", [0.5] * 3), floor("constant output", 3.86),
                     floor("copy", 0.46))
    assert at_floor.verdict == V.NOT_DECIDED  # "at or below"


def test_a_missing_floor_is_an_error():
    with pytest.raises(V.ProtocolError, match="floor"):
        judge(better(floors=("copy",)), system("A", [3, 3, 3]), system("B", [1, 1, 1]))


def test_a_threshold_straddled_by_the_interval_is_inconclusive():
    claim = Claim("speed", "NAT is about 10x faster", "10.04x", "threshold", "NAT", "speed-up", "test", threshold=10.0)
    speed = lambda values: system("NAT", values, runs=[], updates=None, metric="speed-up")
    straddling = judge(claim, speed([9.0, 10.5, 11.0]))  # mean 10.17: the point estimate alone would pass
    assert straddling.verdict == V.INCONCLUSIVE and "straddles 10" in straddling.reason
    point_above = judge(claim, speed([10.3, 10.4, 10.5]))
    assert point_above.verdict == V.REPRODUCED
    below = judge(claim, speed([9.5, 9.6, 9.7]))
    assert below.verdict == V.NOT_REPRODUCED


def test_identical_outputs_give_delta_0_and_p_1():
    refs = ["the cat sat on the mat", "a dog runs"]
    hyps = ["the cat sat on a mat", "a dog walks"]
    assert V.paired_bootstrap(refs, hyps, list(hyps)) == (0.0, 1.0)


# ---- what a verdict needs, and what it says ---------------------------------------------------------------------

def test_three_converged_seeds_with_a_clear_gain_are_reproduced():
    v = judge(better(), system("A", [31.4, 31.2, 31.6]), system("B", [30.0, 30.1, 29.9]))
    assert v.verdict == V.REPRODUCED and v.seeds == {"A": 3, "B": 3} and v.converged and v.floors_cleared
    assert v.ours == "A 31.40 ± 0.20 vs B 30.00 ± 0.10 BLEU (3 seeds)" and "+1.40" in v.reason


def test_the_other_way_or_inside_the_smallest_effect_is_not_reproduced():
    other_way = judge(better(), system("A", [28.0, 28.2, 27.9]), system("B", [30.0, 30.1, 29.9]))
    assert other_way.verdict == V.NOT_REPRODUCED and "other way" in other_way.reason
    tiny = judge(better(), system("A", [30.05, 30.15, 29.95]), system("B", [30.0, 30.1, 29.9]))  # m = 0.65
    assert tiny.verdict == V.NOT_REPRODUCED and "smallest effect" in tiny.reason
    wide = judge(better(), system("A", [29.0, 32.0, 31.0]), system("B", [30.0, 30.1, 29.9]))
    assert wide.verdict == V.INCONCLUSIVE


def test_lower_is_better_metrics_flip_the_direction():
    ter = better(metric="TER", higher_is_better=False, paper_delta=-0.8)
    a = System("A", {"test": {"TER": [20.0, 20.2, 19.8]}}, [CONVERGED] * 3, 4000)
    b = System("B", {"test": {"TER": [22.0, 22.1, 21.9]}}, [CONVERGED] * 3, 4000)
    assert V.judge(ter, {"A": a, "B": b}).verdict == V.REPRODUCED
    assert V.judge(ter, {"A": b, "B": a}).verdict == V.NOT_REPRODUCED


def test_a_multi_source_system_below_its_single_source_baseline_blocks_until_explained():
    claim = better(single_source=("chapter 0 De→En",))
    args = (system("A", [31.4, 31.2, 31.6]), system("B", [30.0, 30.1, 29.9]), floor("chapter 0 De→En", 39.2))
    v = judge(claim, *args)
    assert v.verdict == V.NOT_DECIDED and "single-source baseline" in v.reason and "39.20" in v.reason
    explained = better(single_source=("chapter 0 De→En",), coherence_note="a tiny model, 0.4 epochs")
    assert judge(explained, *args).verdict == V.REPRODUCED


def test_a_claim_without_evidence_is_not_run_with_its_cost():
    claim = better(cost=V.cpu_hours(6, 20_000, 0.35))
    v = judge(claim, system("B", [30, 30, 30]))
    assert v.verdict == V.NOT_RUN and "A" in v.reason and "about 11.7 CPU-hours (6 runs × 20,000 updates" in v.reason


def test_malformed_declarations_are_refused():
    with pytest.raises(V.ProtocolError, match="baseline"):
        better(baseline="")
    with pytest.raises(V.ProtocolError, match="margin"):
        better(kind="parity")
    with pytest.raises(V.ProtocolError, match="threshold"):
        better(kind="threshold")
    with pytest.raises(V.ProtocolError, match="unknown kind"):
        better(kind="roughly")
    with pytest.raises(V.ProtocolError, match="repeat"):
        V.judge_all([better(), better()], {})


def test_convergence_from_a_trainers_log():
    rows = [{"kind": "train", "step": s} for s in range(0, 1001, 100)]
    valid = lambda curve: [{"kind": "valid", "step": s, "valid_bleu": b} for s, b in curve]
    stopped = V.run_record(rows[:7] + valid([(200, 10), (400, 20), (600, 19), (600, 19)]), patience=2)
    assert stopped.early_stopped and stopped.converged() == (True, "")
    rising = V.run_record(rows + valid([(250, 10), (500, 20), (750, 25), (1000, 30)]), patience=0)
    assert not rising.early_stopped and rising.converged() == (False, "dev +5.00 over updates 750–1000")
    flat = V.run_record(rows + valid([(250, 10), (500, 20), (750, 25), (1000, 25.1)]), patience=0)
    assert flat.converged()[0] and flat.best_step == 1000
    one = V.run_record(rows + valid([(1000, 30)]), patience=0)
    assert not one.converged()[0] and "too few validations" in one.converged()[1]


def test_the_machine_readable_scoreboard(tmp_path):
    claims = [better(), better(id="d", kind="parity", margin=0.5)]
    systems = {"A": system("A", [31.4, 31.2, 31.6]), "B": system("B", [30.0, 30.1, 29.9])}
    verdicts = V.judge_all(claims, systems)
    path = V.write_results(tmp_path / "results" / "ch.json", "ch", "small", "abc123", verdicts, systems)
    data = json.loads(path.read_text())
    assert {"chapter", "scale", "commit", "claims", "systems"} <= set(data)
    assert set(data["claims"][0]) >= {"id", "claim", "paper", "ours", "verdict", "reason", "seeds", "converged",
                                      "equal_budget", "floors_cleared"}
    assert data["systems"][0] == {"name": "A", "scores": {"test": {"BLEU": [31.4, 31.2, 31.6]}}, "updates": 4000}
    assert all(c["verdict"] in V.VERDICTS for c in data["claims"])
    table = V.reason_counts(verdicts + [judge(better(), system("A", [35] * 3, runs=[STILL_RISING] * 3),
                                              system("B", [30] * 3))])
    assert list(table["verdict"]) == ["reproduced", "not decided"] and list(table["claims"]) == [2, 1]
    assert table.loc[1, "reason"] == "under-trained"
    assert list(V.scoreboard(verdicts)["verdict"]) == ["reproduced", "reproduced"]
    assert list(V.declarations(claims)["compares"]) == ["A vs B", "A vs B"]


# ---- gates, floors, system builders -----------------------------------------------------------------------------

def test_a_failed_gate_blocks_the_claims_that_rest_on_it_and_only_those():
    gates = [V.Gate("teacher BLEU", 20.0, 33.0), V.Gate("distillation", 30.0, 25.0)]
    systems = {s.name: s for s in (system("A", [40, 41, 42]), system("B", [30, 31, 32]))}
    blocked, free = V.judge_all([better(id="x", gates=("teacher BLEU", "distillation")),
                                 better(id="y", gates=("distillation",))], systems, gates)
    assert blocked.verdict == V.NOT_DECIDED and blocked.reason == "gate failed: teacher BLEU"
    assert free.verdict == V.REPRODUCED


def test_a_claim_naming_an_unmeasured_gate_is_an_error():
    with pytest.raises(V.ProtocolError, match="no gate named 'teacher'"):
        judge(better(gates=("teacher",)), system("A", [40, 41, 42]), system("B", [30, 31, 32]))


def test_a_below_gate_target_is_a_pass_for_lower_is_better_gates():
    assert V.Gate("repeats", 0.05, 0.10, higher_is_better=False).passed
    assert not V.Gate("repeats", 0.15, 0.10, higher_is_better=False).passed


def test_trained_system_reads_convergence_and_budget_from_trainer_histories():
    rising = [{"kind": "valid", "step": s, "valid_bleu": b} for s, b in ((100, 10.0), (200, 15.0), (300, 20.0))]
    flat = [{"kind": "valid", "step": s, "valid_bleu": b} for s, b in ((100, 10.0), (200, 20.0), (300, 20.1))]
    s = V.trained_system("A", {"test": {"BLEU": [20.0, 21.0]}}, [rising, flat], patience=0)
    assert s.updates == 300 and [r.converged()[0] for r in s.runs] == [False, True]
    assert V.trained_system("A", {}, [flat], patience=0, updates=450).updates == 450
    floor = V.floor_system("copy input", "test", "BLEU", 2.5)
    assert floor.runs == [] and floor.updates is None and floor.values("test", "BLEU") == [2.5]


def test_best_constant_is_chosen_on_dev_and_scored_on_test():
    from msgcore import floors

    dev = ["a man rides a horse .", "a man rides a bike .", "two dogs play in the snow ."]
    test = ["two dogs play in the park .", "two dogs run in the snow ."]
    text, score = floors.best_constant(dev, test)
    assert text in dev[:2]  # the "typical" dev sentence, never a test sentence
    assert score == pytest.approx(floors.copy_input([text] * 2, test))
    ter_text, _ = floors.best_constant(dev, test, metric="TER")
    assert ter_text in dev
    with pytest.raises(Exception, match="empty"):
        floors.best_constant([], test)


def test_a_floor_as_the_baseline_is_compared_with_every_seed():
    do_nothing = floor("do-nothing", 20.0)  # one score, never trained: no budget to compare, no seeds to pair
    claim = better(baseline="do-nothing", paper_delta=None)
    v = judge(claim, system("A", [22.0, 23.0, 22.5]), do_nothing)
    assert v.verdict == V.REPRODUCED and v.equal_budget and "over 3 seeds" in v.reason
    assert judge(claim, system("A", [22.0]), do_nothing).verdict == V.INDICATIVE
    lower = better(baseline="do-nothing", paper_delta=None, metric="TER", higher_is_better=False)
    ter = [System("A", {"test": {"TER": [18.0, 18.1, 18.2]}}, [CONVERGED] * 3, 4000),
           System("do-nothing", {"test": {"TER": [19.5]}})]
    assert judge(lower, *ter).verdict == V.REPRODUCED


def test_an_indicative_parity_claim_leans_by_its_margin_not_by_zero():
    claim = better(kind="parity", margin=1.0, paper_delta=None)
    assert "leans towards" in judge(claim, system("A", [39.5]), system("B", [40.0])).reason  # −0.5 is inside −1
    assert "leans against" in judge(claim, system("A", [38.5]), system("B", [40.0])).reason


def test_seeds_pair_k_with_k_on_the_seeds_both_systems_have():
    v = judge(better(), system("A", [40.0, 41.0, 42.0, 43.0]), system("B", [30.0, 31.0, 32.0]))
    assert v.verdict == V.REPRODUCED and "over 3 seeds" in v.reason and v.seeds == {"A": 4, "B": 3}
    assert judge(better(), system("A", [40.0, 41.0, 42.0]), system("B", [30.0])).verdict == V.INDICATIVE


def test_declarations_write_a_lower_is_better_threshold_as_at_most():
    at_most = Claim("k", "peaks near K", "K = 5", "threshold", "A", "gap", "dev", higher_is_better=False, threshold=1.0)
    at_least = Claim("s", "10x faster", "10.04x", "threshold", "A", "speed-up", "test", threshold=10.04)
    assert list(V.declarations([at_most, at_least])["compares"]) == ["A ≤ 1", "A ≥ 10.04"]


def test_the_runs_table_shows_each_runs_end_its_best_update_and_why_it_did_not_converge():
    rising = RunRecord(((100, 10.0), (200, 12.0), (300, 13.0), (400, 14.0)), 400, False)
    stopped = RunRecord(((100, 10.0), (200, 12.0), (300, 11.9)), 300, True)
    systems = {"A": System("A", {"t": {"BLEU": [14.0, 12.0]}}, [rising, stopped], 400),
               "copy": V.floor_system("copy", "t", "BLEU", 1.0)}
    table = V.runs_table(systems)
    assert table.to_dict("records") == [
        {"system": "A", "run (seed)": 1, "updates": 400, "best dev at update": 400,
         "converged": "no: dev +1.00 over updates 300–400"},
        {"system": "A", "run (seed)": 2, "updates": 300, "best dev at update": 200, "converged": "yes"}]
    assert list(V.runs_table({"copy": systems["copy"]}).columns) == ["system", "run (seed)", "updates",
                                                                     "best dev at update", "converged"]



def test_tables_write_counts_as_integers_small_rates_with_significant_digits_and_gaps_as_a_dash():
    import pandas as pd

    frame = pd.DataFrame({"updates": [1000.0, 250.0], "lr": [5e-4, 1e-3], "BLEU": [38.391, None],
                          "note": ["a", None]})
    text = {column: [V.number_formatter(frame[column])(v) for v in frame[column]] for column in frame}
    assert text["updates"] == ["1,000", "250"]
    assert text["lr"] == ["0.0005", "0.001"]
    assert text["BLEU"] == ["38.39", "–"]
    assert text["note"] == ["a", "–"]


def test_numpy_numbers_are_numbers_to_the_table_formatter():
    import numpy as np
    import pandas as pd

    column = pd.Series([np.int64(3), np.int64(1200)])
    assert [V.number_formatter(column)(v) for v in column] == ["3", "1,200"]
    assert V.number_formatter(pd.Series([np.bool_(True)]))(np.bool_(True)) == "True"
