"""Threshold rules on hand-computed cases, and a simulation of the risk-control guarantee."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binom

from candor.serve import thresholds as th
from candor.util.errors import CandorError

# Five dev questions, sorted by confidence: answered accuracy at each cut is
#   t=0.9 → 1/1, t=0.8 → 2/2, t=0.6 → 2/3, t=0.4 → 3/4, t=0.2 → 3/5.
CONF = [0.4, 0.9, 0.2, 0.8, 0.6]
CORRECT = [1, 1, 0, 1, 0]


def test_selective_curve_by_hand():
    curve = th.selective_curve(CONF, CORRECT)
    np.testing.assert_allclose(curve["threshold"], [0.9, 0.8, 0.6, 0.4, 0.2])
    np.testing.assert_allclose(curve["coverage"], [0.2, 0.4, 0.6, 0.8, 1.0])
    np.testing.assert_allclose(curve["accuracy"], [1.0, 1.0, 2 / 3, 0.75, 0.6])


def test_ties_are_answered_together():
    curve = th.selective_curve([0.5, 0.5, 0.9], [1, 0, 1])
    np.testing.assert_allclose(curve["threshold"], [0.9, 0.5])
    np.testing.assert_allclose(curve["coverage"], [1 / 3, 1.0])
    np.testing.assert_allclose(curve["accuracy"], [1.0, 2 / 3])


def test_for_accuracy_takes_the_lowest_qualifying_threshold():
    t = th.for_accuracy(CONF, CORRECT, 0.7)
    # 0.75 at t=0.4 qualifies and answers more than t=0.8; t=0.2 gives 0.6.
    assert t.value == 0.4 and t.expected_accuracy == 0.75 and t.expected_coverage == 0.8
    assert th.for_accuracy(CONF, CORRECT, 1.0).value == 0.8
    assert th.for_accuracy(CONF, CORRECT, 0.5).value == 0.2


def test_for_accuracy_out_of_reach_abstains_on_everything():
    t = th.for_accuracy([0.3, 0.7], [0, 0], 0.5)
    assert t.value > 1.0 and t.expected_coverage == 0.0 and t.expected_accuracy is None
    assert t.abstains(1.0)


def test_for_coverage_by_hand():
    t = th.for_coverage(CONF, CORRECT, 0.5)  # 3 of 5 is the least coverage ≥ 0.5
    assert t.value == 0.6 and t.expected_coverage == 0.6
    assert t.expected_accuracy == pytest.approx(2 / 3)
    assert th.for_coverage(CONF, CORRECT, 1.0).value == 0.2
    assert th.for_coverage(CONF, CORRECT, 0.0).expected_coverage == 0.0


def test_risk_control_by_hand():
    # 20 answered at conf 0.9, all correct; 20 at 0.5, half wrong. α = 0.2, δ = 0.1:
    # λ ∈ (0.5, 0.9]: p = 0.8^20 ≈ 0.0115 ≤ 0.1, rejected; λ ≤ 0.5: 10 errors of 40, p = cdf(10; 40, 0.2) > 0.1.
    conf = [0.9] * 20 + [0.5] * 20
    correct = [1] * 20 + [1, 0] * 10
    assert th.binomial_pvalue(0, 20, 0.2) == pytest.approx(0.8**20)
    assert th.binomial_pvalue(10, 40, 0.2) == pytest.approx(binom.cdf(10, 40, 0.2))
    assert binom.cdf(10, 40, 0.2) > 0.1
    t = th.risk_control(conf, correct, alpha=0.2, delta=0.1, grid=[0.9, 0.7, 0.5, 0.3])
    assert t.value == 0.7 and t.expected_accuracy == 1.0 and t.expected_coverage == 0.5
    assert t.rule == "risk" and t.delta == 0.1 and "exchangeable" in t.assumption


def test_risk_control_stops_at_the_first_failure():
    # Fixed-sequence testing: the failure at 0.8 ends the scan, although 0.6 on its own would pass.
    conf = [0.9] * 30 + [0.8] * 30 + [0.6] * 1000
    correct = [1] * 30 + [0] * 30 + [1] * 1000
    # 0.9: 0 errors of 30, p = 0.9^30 ≈ 0.042; 0.8: 30 of 60, p ≈ 1; 0.6: 30 of 1060, p ≈ 0.
    assert th.binomial_pvalue(30, 1060, 0.1) < 1e-6
    t = th.risk_control(conf, correct, alpha=0.1, delta=0.1, grid=[0.9, 0.8, 0.6])
    assert t.value == 0.9 and t.expected_coverage == pytest.approx(30 / 1060)


def test_risk_control_with_too_little_evidence_abstains():
    t = th.risk_control([0.9, 0.8], [1, 1], alpha=0.05, delta=0.05)
    assert t.value > 1.0 and t.expected_coverage == 0.0


def _calibrated_draw(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    conf = rng.uniform(size=n)
    return conf, (rng.uniform(size=n) < conf).astype(int)


def _true_risk(lam: float) -> float:
    # conf ~ U(0, 1), P(correct | c) = c, so P(wrong | c ≥ λ) = E[1 − c | c ≥ λ] = (1 − λ) / 2.
    return (1.0 - min(lam, 1.0)) / 2.0


def _simulated(seed: int, rule, alpha: float, trials: int) -> tuple[int, int]:
    """``(violations, answered)``: of ``trials`` calibrated draws of 300, those whose ``rule(conf, y)`` has a true
    risk above ``alpha``, and those it answers some of."""
    rng = np.random.default_rng(seed)
    violations = answered = 0
    for _ in range(trials):
        conf, y = _calibrated_draw(rng, 300)
        t = rule(conf, y)
        violations += _true_risk(t.value) > alpha
        answered += t.expected_coverage > 0
    return violations, answered


GRID = np.linspace(1.0, 0.0, 201)


def test_risk_control_guarantee_holds_in_simulation():
    alpha, delta, trials = 0.15, 0.1, 400
    violations, _ = _simulated(
        0, lambda conf, y: th.risk_control(conf, y, alpha=alpha, delta=delta, grid=GRID), alpha, trials
    )
    # Naive: the lowest threshold whose dev error is ≤ α, no correction.
    naive_violations, _ = _simulated(0, lambda conf, y: th.for_accuracy(conf, y, 1 - alpha), alpha, trials)
    # Binomial slack: with a true rate of δ, 400 trials exceed 0.1 + 0.045 rarely (≈2 sd).
    assert violations / trials <= delta + 0.045
    # The same check fails for the uncorrected rule, so the test can tell them apart.
    assert naive_violations / trials > 0.3


def test_one_wrong_most_confident_answer_no_longer_ends_every_scan():
    """Issue 64: ``candor adapt`` at 100 labels certified no α up to 0.99 on any domain, because its one sequence
    starts at the most confident held-out answer, and one wrong answer there is never rejected. Three sequences
    (from the top, from half answered, from all answered; each at δ/3) keep the guarantee and certify here."""
    # 50 held-out answers of a weak model, most confident first: that one is wrong, 12 of the top 25 are right.
    conf = np.linspace(0.99, 0.01, 50)
    correct = np.array([0] + [1, 0] * 10 + [0, 1, 1, 0] + [0] * 22 + [1, 1, 1])
    assert correct.size == 50 and correct[:25].sum() == 12
    one = th.risk_control(conf, correct, alpha=0.8, delta=0.1)
    assert one.value > 1.0  # the top 2 hold 1 error: p = 1 − 0.8² = 0.36 > δ, and the scan ends there
    three = th.risk_control(conf, correct, alpha=0.8, delta=0.1, starts=th.SPLIT_STARTS)
    # The sequence from half answered passes its start (13 errors of 25) and goes on down to 34 answered:
    # each step's p-value is at most δ/3, the 35th answer's is not. The one from all 50 fails at once.
    errors = np.cumsum(1 - correct)
    assert all(binom.cdf(errors[n - 1], n, 0.8) <= 0.1 / 3 for n in range(25, 35))
    assert binom.cdf(errors[34], 35, 0.8) > 0.1 / 3 and binom.cdf(errors[49], 50, 0.8) > 0.1 / 3
    assert three.expected_coverage == 0.68 and three.extra["chosen_by_start"] == 0.5
    assert three.extra["level_each"] == pytest.approx(0.1 / 3) and three.extra["min_answered"] == 3
    with pytest.raises(CandorError, match="starts are fractions"):
        th.risk_control(conf, correct, alpha=0.8, starts=(0.0, 1.5))


def test_the_guarantee_of_several_starts_holds_in_simulation():
    alpha, delta, trials = 0.15, 0.1, 400
    violations, answered = _simulated(
        2,
        lambda conf, y: th.risk_control(conf, y, alpha=alpha, delta=delta, grid=GRID, starts=th.SPLIT_STARTS),
        alpha,
        trials,
    )
    assert violations / trials <= delta + 0.045
    # Not passed by abstaining: it certifies in over a third of the draws (each sequence at δ/3 needs 21 answered
    # with no error at the top, where one sequence at δ needs 15, so it certifies less often here than one start).
    assert answered / trials > 0.35


def test_the_guarantee_is_not_vacuous():
    rng = np.random.default_rng(1)
    conf, y = _calibrated_draw(rng, 2000)
    t = th.risk_control(conf, y, alpha=0.15, delta=0.1)
    # The exact cut is λ = 0.7; with 2000 dev questions the certified one is close and answers a real share.
    assert 0.7 <= t.value < 0.8
    assert t.expected_coverage > 0.2


def test_round_trip_and_bad_input():
    t = th.for_coverage(CONF, CORRECT, 0.5)
    assert th.Threshold.from_dict(t.to_dict()) == t
    with pytest.raises(CandorError, match="0 or 1"):
        th.for_accuracy([0.5], [2], 0.5)
    with pytest.raises(CandorError, match=r"\[0, 1\]"):
        th.for_accuracy([1.5], [1], 0.5)
    with pytest.raises(CandorError, match="unknown threshold rule"):
        th.choose(CONF, CORRECT, "best", 0.5)
    with pytest.raises(CandorError, match="2 correctness"):
        th.for_coverage([0.1], [1, 0], 0.5)


def test_min_evidence_by_hand():
    # 0.85^14 ≈ 0.103 > 0.1 but 0.85^15 ≈ 0.087 ≤ 0.1
    assert th.min_evidence(0.15, 0.1) == 15
    assert th.min_evidence(0.2, 0.1) == 11  # 0.8^10 ≈ 0.107, 0.8^11 ≈ 0.086


def test_risk_control_with_alpha_one_answers_everything_even_when_the_top_answer_is_wrong():
    """Issue 23, defect 12: an error rate ≤ 1 always holds, so α = 1 never abstains."""
    t = th.risk_control([0.9, 0.5, 0.2], [0, 1, 1], alpha=1.0, delta=0.1, grid=[0.9, 0.5, 0.2, 0.0])
    assert t.value == 0.0 and t.expected_coverage == 1.0
    assert th.binomial_pvalue(3, 3, 1.0) == 0.0
