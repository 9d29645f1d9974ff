"""The verdict rules every chapter shares (msgcore.claims)."""
import pytest

from msgcore.claims import (INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Claim, Gate, judge_all, judge_paired,
                            judge_threshold, paired_evidence, scoreboard, seed_spread, verdict_counts)

converged = Gate("baseline BLEU", 34.0, 33.0)
broken = Gate("N_f = 3 trained (BLEU)", 1.0, 10.0)


def test_every_run_significant_in_the_claimed_direction_is_reproduced():
    assert judge_paired([1.3, 0.9, 1.1], [0.001, 0.02, 0.01]) == REPRODUCED
    assert judge_paired([-1.3, -0.9], [0.001, 0.02]) == NOT_REPRODUCED
    assert judge_paired([1.3, 0.2], [0.001, 0.40]) == INCONCLUSIVE
    assert judge_paired([1.3, -0.9], [0.001, 0.01]) == INCONCLUSIVE


def test_lower_is_better_flips_the_direction():
    assert judge_paired([-2.0], [0.001], higher_is_better=False) == REPRODUCED
    assert judge_paired([2.0], [0.001], higher_is_better=False) == NOT_REPRODUCED


def test_a_difference_below_the_seed_spread_is_inconclusive_whatever_the_p_values():
    assert judge_paired([0.7, 0.8, 0.6], [0.001] * 3, spread=1.0) == INCONCLUSIVE
    assert judge_paired([0.7, 0.8, 0.6], [0.001] * 3, spread=0.5) == REPRODUCED
    assert seed_spread([58.75, 58.3, 59.2], [58.03, 57.1, 59.0]) == pytest.approx(0.9501, abs=1e-3)
    assert seed_spread([1.0], [2.0]) == 0.0


def test_no_verdict_when_a_gate_failed():
    v = judge_paired([3.0], [0.001], gates=[converged, broken])
    assert v.startswith("no verdict") and "N_f = 3 trained" in v and "baseline BLEU" not in v
    assert judge_paired([3.0], [0.001], gates=[converged]) == REPRODUCED
    assert judge_threshold(12.0, 10.0, gates=[broken]).startswith("no verdict")
    assert judge_all([True, True], gates=[broken]).startswith("no verdict")


def test_threshold_is_the_papers_own():
    assert judge_threshold(5.9, 10.0) == NOT_REPRODUCED  # "about 10x faster" is not passed at 5.9x
    assert judge_threshold(10.4, 10.0) == REPRODUCED
    assert judge_threshold(3.0, 5.0, higher_is_better=False) == REPRODUCED


def test_per_run_claims():
    assert judge_all([True, True, True]) == REPRODUCED
    assert judge_all([True, True, True], spread_ok=False) == INCONCLUSIVE
    assert judge_all([True, False]) == INCONCLUSIVE
    assert judge_all([False, False]) == NOT_REPRODUCED


def test_gate_direction_and_row():
    repeats = Gate("repeated tokens %", 12.0, 15.0, higher_is_better=False)
    assert repeats.passed and not Gate("repeated tokens %", 16.0, 15.0, higher_is_better=False).passed
    assert repeats.row() == {"gate": "repeated tokens %", "ours": 12.0, "target": "≤ 15", "passed": "yes"}


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="one p-value per delta"):
        judge_paired([1.0, 2.0], [0.01])
    with pytest.raises(ValueError):
        judge_paired([], [])


def test_scoreboard_and_counts():
    claims = [Claim("a", "TRICE 41.5 vs DualBART 40.2, +1.3", paired_evidence([1.2], [0.001]), REPRODUCED),
              Claim("b", "-", "-", "no verdict: gate failed (x)"), Claim("c", "-", "-", INCONCLUSIVE)]
    assert claims[0].ours == "+1.20 (p=0.001)"
    assert verdict_counts(claims) == {REPRODUCED: 1, NOT_REPRODUCED: 0, INCONCLUSIVE: 1, "no verdict": 1}
    frame = scoreboard(claims)
    assert list(frame.columns) == ["claim", "paper", "ours", "verdict"] and len(frame) == 3


def test_a_parity_claim_fails_only_where_runs_are_significantly_worse():
    from msgcore.claims import judge_no_worse

    assert judge_no_worse([-0.2, 0.3], [0.40, 0.20]) == REPRODUCED  # small, non-significant differences
    assert judge_no_worse([1.5, 2.0], [0.001, 0.001]) == REPRODUCED  # better is not worse
    assert judge_no_worse([-1.5, 0.3], [0.001, 0.30]) == INCONCLUSIVE
    assert judge_no_worse([-1.5, -2.0], [0.001, 0.010]) == NOT_REPRODUCED
    assert judge_no_worse([0.1], [0.5], gates=[Gate("trained", 0.0, 1.0)]).startswith("no verdict")
    with pytest.raises(ValueError, match="one p-value per delta"):
        judge_no_worse([0.1, 0.2], [0.5])
