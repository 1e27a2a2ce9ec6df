"""The betting confidence sequence (candor.evaluation.confidence_sequence) against a plain-loop reference of the
paper's formula, and the properties a confidence sequence has: inside [0, 1], nested, shrinking, covering."""

from __future__ import annotations

import math

import numpy as np
import pytest

from candor.evaluation.confidence_sequence import (
    ConfidenceSequence,
    confidence_sequence,
    first_crossing,
    log_capital,
    plugin_bets,
)


def reference_wealth(x: list[float], m: float, delta: float, side: str) -> list[float]:
    """Waudby-Smith & Ramdas's capital of one gambler, one observation at a time, as the paper writes it."""
    wealth, total, squares, variance, out = 1.0, 0.0, 0.0, 0.25, []
    for t, xi in enumerate(x, start=1):
        bet = math.sqrt(2 * math.log(1 / delta) / (variance * t * math.log(1 + t)))  # uses x_1 .. x_{t-1} only
        if side == "above":
            bet = bet if m == 0 else min(bet, 0.5 / m)
            wealth *= 1 + bet * (xi - m)
        else:
            bet = bet if m == 1 else min(bet, 0.5 / (1 - m))
            wealth *= 1 - bet * (xi - m)
        total += xi
        mean = (0.5 + total) / (t + 1)
        squares += (xi - mean) ** 2
        variance = (0.25 + squares) / (t + 1)
        out.append(wealth)
    return out


def reference_bounds(x: list[float], delta: float, grid: np.ndarray) -> tuple[list[float], list[float]]:
    """Running-intersection bounds on ``grid`` by brute force: every grid mean's wealth, rejected at 1/δ."""
    above = np.array([reference_wealth(x, m, delta, "above") for m in grid])  # grid × time
    below = np.array([reference_wealth(x, m, delta, "below") for m in grid])
    lower, upper, low, high = [], [], 0.0, 1.0
    for t in range(len(x)):
        rejected_low = grid[above[:, t] >= 1 / delta]
        rejected_high = grid[below[:, t] >= 1 / delta]
        low = max([low, *rejected_low])
        high = min([high, *rejected_high])
        lower.append(low)
        upper.append(high)
    return lower, upper


def stream(p: float, n: int, seed: int) -> np.ndarray:
    return (np.random.default_rng(seed).random(n) < p).astype(float)


@pytest.mark.parametrize("side", ["above", "below"])
@pytest.mark.parametrize("m", [0.0, 0.3, 0.8, 1.0])
def test_the_vectorized_capital_is_the_papers_formula(side, m):
    rng = np.random.default_rng(7)
    runs = np.vstack([stream(0.75, 300, 1), rng.random(300), stream(0.3, 300, 2)])  # labels and reals in [0, 1]
    got = log_capital(runs, m, 0.05, side)
    for row, x in zip(got, runs, strict=True):
        with np.errstate(divide="ignore"):
            want = np.log(reference_wealth(list(x), m, 0.05, side))
        np.testing.assert_allclose(row, want, rtol=1e-9, atol=1e-9)


def test_bets_are_predictable():
    x = stream(0.6, 200, 3)
    changed = x.copy()
    changed[100:] = 1 - changed[100:]
    bets, other = plugin_bets(x, 0.05), plugin_bets(changed, 0.05)
    np.testing.assert_array_equal(bets[:101], other[:101])  # the bet on x_101 sees x_1..x_100 only
    assert not np.array_equal(bets[101:], other[101:])


def test_the_incremental_bounds_are_the_brute_force_ones():
    x = list(stream(0.7, 120, 4))
    lower, upper = confidence_sequence(x, 0.05, points=101)
    want_lower, want_upper = reference_bounds(x, 0.05, np.linspace(0, 1, 101))
    np.testing.assert_allclose(lower, want_lower)
    np.testing.assert_allclose(upper, want_upper)
    assert lower[-1] > 0.4 and upper[-1] < 0.95  # the check compared bounds that moved


def test_an_anchor_is_decided_at_the_label_its_capital_crosses():
    for seed in range(5):
        x = stream(0.68, 800, 10 + seed)
        sequence, first = ConfidenceSequence(0.05, anchors=[0.8]), 0
        for i, value in enumerate(x, start=1):
            sequence.update(value)
            if not first and sequence.rejects_below(0.8):
                first = i
        assert first == first_crossing(log_capital(x, 0.8, 0.05, "below"), 0.05) > 0


def test_bounds_are_in_the_unit_interval_nested_shrinking_and_hold_the_running_mean():
    for seed in range(20):
        x = stream(0.8, 2000, 100 + seed)
        lower, upper = confidence_sequence(x, 0.05)
        running = np.cumsum(x) / np.arange(1, len(x) + 1)
        assert (lower >= 0).all() and (upper <= 1).all()
        assert (np.diff(lower) >= 0).all() and (np.diff(upper) <= 0).all()  # a rejected mean stays rejected
        assert (lower <= running).all() and (running <= upper).all()
        width = upper - lower
        assert width[9] > width[99] > width[999] > width[1999]
        assert width[1999] < 0.1


def test_a_stream_of_ones_pushes_the_lower_bound_up_and_leaves_the_upper_at_one():
    lower, upper = confidence_sequence([1.0] * 200, 0.05)
    assert (upper == 1.0).all() and lower[0] == 0.0 and lower[-1] > 0.9 and lower[-1] < 1.0


def test_the_true_mean_stays_inside_at_every_look_in_all_but_about_2_delta_of_runs():
    x = (np.random.default_rng(5).random((1000, 2000)) < 0.3).astype(float)
    missed = (first_crossing(log_capital(x, 0.3, 0.05, "above"), 0.05) > 0) | (
        first_crossing(log_capital(x, 0.3, 0.05, "below"), 0.05) > 0
    )
    assert missed.mean() <= 0.1 + 3 * math.sqrt(0.1 * 0.9 / 1000)


def test_bad_levels_and_observations_are_refused():
    with pytest.raises(ValueError, match="delta"):
        ConfidenceSequence(1.0)
    with pytest.raises(ValueError, match="anchors"):
        ConfidenceSequence(0.05, anchors=[1.5])
    with pytest.raises(ValueError, match="observations"):
        ConfidenceSequence(0.05).update(1.2)
