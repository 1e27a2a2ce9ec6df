"""Anytime-valid confidence sequences for the mean of a [0, 1]-valued stream, by betting.

After Waudby-Smith & Ramdas (2023), "Estimating means of bounded random variables by
betting" (JRSS B 86(1)): for a candidate mean ``m``, a gambler who starts with 1 and bets
``λ_t`` on each new observation ``x_t`` holds

    K⁺_t(m) = ∏_{i ≤ t} (1 + λ⁺_i(m) (x_i − m))     (wins when the mean is above m)
    K⁻_t(m) = ∏_{i ≤ t} (1 − λ⁻_i(m) (x_i − m))     (wins when the mean is below m)

With bets ``λ_i`` fixed before ``x_i`` is seen (*predictable*) and in ``[0, 1/m)``
(resp. ``[0, 1/(1 − m))``), ``K⁺(m)`` is a nonnegative supermartingale whenever every
observation's conditional mean is at most ``m`` (``K⁻(m)``: at least ``m``), so by
Ville's inequality it ever reaches ``1/δ`` with probability at most ``δ``: at every
number of looks, chosen in any way, not only at a sample size fixed in advance.

The bets are the paper's predictable plug-in ("predictable mixture") empirical-Bernstein
bets, truncated as in its hedged capital process::

    λ_t = sqrt(2 log(1/δ) / (σ̂²_{t−1} t log(1 + t)))
    λ⁺_t(m) = min(λ_t, c/m),   λ⁻_t(m) = min(λ_t, c/(1 − m)),   c = 1/2

with ``μ̂_t = (1/2 + Σ_{i≤t} x_i)/(t + 1)`` and ``σ̂²_t = (1/4 + Σ_{i≤t} (x_i − μ̂_i)²)/(t + 1)``
(``σ̂²_0 = 1/4``). Since ``λ_t`` does not depend on ``m``, ``K⁺_t(m)`` falls and ``K⁻_t(m)``
rises with ``m``: the rejected means are ``[0, lower)`` and ``(upper, 1]`` and the
confidence sequence is an interval. Its two sides are the hedged capital
``max(θK⁺, (1 − θ)K⁻)`` at ``θ = 1/2`` and level ``α = 2δ``: rejecting ``m`` when it reaches
``1/α`` is rejecting it when ``K⁺(m) ≥ 1/δ`` or ``K⁻(m) ≥ 1/δ``, so each bound alone is a
one-sided bound at level δ, and both hold together with probability at least 1 − 2δ.

Two forms of the same statistic:

- :func:`log_capital` and :func:`first_crossing`: one candidate mean, many streams at once
  (numpy, vectorized over runs), for simulations of the alarm;
- :class:`ConfidenceSequence`: one stream, updated one observation at a time, holding the
  capital of every mean on a grid (and of named *anchors*, e.g. a promised accuracy, exactly);
  its bounds are running intersections (a mean once rejected stays rejected).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Literal

import numpy as np

Side = Literal["above", "below"]  # evidence that the mean is above m (K⁺), or below m (K⁻)

TRUNCATION = 0.5  # c: a bet never stakes more than half of what the gambler could lose
PRIOR_MEAN, PRIOR_VARIANCE = 0.5, 0.25  # one fake observation regularizes μ̂ and σ̂² at the start
GRID_POINTS = 2001  # candidate means 0, 0.0005, ..., 1 of ConfidenceSequence


def plugin_bet(t: np.ndarray | int, variance_before: np.ndarray | float, delta: float) -> np.ndarray | float:
    """``λ_t`` (before truncation) from ``t`` (1-based) and ``σ̂²_{t−1}``; arrays broadcast."""
    return np.sqrt(2 * math.log(1 / delta) / (variance_before * t * np.log1p(t)))


def plugin_bets(x: np.ndarray, delta: float) -> np.ndarray:
    """The predictable bets ``λ_t`` of every observation along the last axis (``λ_t`` sees ``x[..., :t-1]`` only)."""
    x = np.asarray(x, dtype=float)
    t = np.arange(1, x.shape[-1] + 1)
    mean = (PRIOR_MEAN + np.cumsum(x, axis=-1)) / (t + 1)
    variance = (PRIOR_VARIANCE + np.cumsum((x - mean) ** 2, axis=-1)) / (t + 1)
    before = np.concatenate([np.full(x.shape[:-1] + (1,), PRIOR_VARIANCE), variance[..., :-1]], axis=-1)
    return plugin_bet(t, before, delta)


def truncated(bets: np.ndarray, m: np.ndarray | float, side: Side) -> np.ndarray:
    """``min(λ, c/m)`` (above) or ``min(λ, c/(1 − m))`` (below): the factor stays at least ``1 − c``."""
    with np.errstate(divide="ignore"):
        cap = TRUNCATION / (np.asarray(m, dtype=float) if side == "above" else 1 - np.asarray(m, dtype=float))
    return np.minimum(bets, cap)


def log_factor(x: np.ndarray | float, m: np.ndarray | float, bets: np.ndarray | float, side: Side) -> np.ndarray:
    """``log(1 ± λ(m)(x − m))``: the change of one gambler's log capital on one observation."""
    sign = 1.0 if side == "above" else -1.0
    return np.log1p(sign * truncated(np.asarray(bets, dtype=float), m, side) * (np.asarray(x) - m))


def log_capital(x: np.ndarray, m: float, delta: float, side: Side) -> np.ndarray:
    """``log K⁺_t(m)`` or ``log K⁻_t(m)`` after each observation along the last axis (shape of ``x``)."""
    x = np.asarray(x, dtype=float)
    return np.cumsum(log_factor(x, m, plugin_bets(x, delta), side), axis=-1)


def first_crossing(log_cap: np.ndarray, delta: float) -> np.ndarray:
    """The number of observations at which the capital first reached ``1/δ`` (0: never), per stream."""
    crossed = log_cap >= math.log(1 / delta)
    return np.where(crossed.any(axis=-1), crossed.argmax(axis=-1) + 1, 0)


class ConfidenceSequence:
    """One stream's lower and upper bounds, each at level δ, after every observation (not thread-safe).

    The capital of every mean on a grid of :data:`GRID_POINTS` (and of each anchor) is kept;
    a mean is rejected from the time its capital first reaches ``1/δ`` on. The reported bounds
    are grid points on the safe side: ``lower`` is the largest mean rejected as too low (0 when
    none), ``upper`` the smallest rejected as too high (1 when none), so the mean lies in
    ``[lower, upper]`` whenever it lies in the exact sequence. An anchor is decided exactly:
    :meth:`rejects_above` / :meth:`rejects_below`.
    """

    def __init__(self, delta: float, anchors: Iterable[float] = (), points: int = GRID_POINTS) -> None:
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        self.delta = delta
        self.grid = np.union1d(np.linspace(0.0, 1.0, points), np.asarray(list(anchors), dtype=float))
        if self.grid[0] < 0 or self.grid[-1] > 1:
            raise ValueError(f"anchors must be in [0, 1], got {sorted(anchors)}")
        self.count = 0
        self.total = 0.0
        self._squares = 0.0  # Σ (x_i − μ̂_i)²
        self._variance = PRIOR_VARIANCE  # σ̂²_t
        self._log_above = np.zeros_like(self.grid)
        self._log_below = np.zeros_like(self.grid)
        self._rejected_low = -1  # index of the largest mean ever rejected as too low
        self._rejected_high = len(self.grid)  # index of the smallest mean ever rejected as too high
        self._threshold = math.log(1 / delta)

    def update(self, x: float) -> None:
        """One more observation in [0, 1]."""
        if not 0.0 <= x <= 1.0:
            raise ValueError(f"observations must be in [0, 1], got {x}")
        t = self.count + 1
        bet = plugin_bet(t, self._variance, self.delta)
        self._log_above += log_factor(x, self.grid, bet, "above")
        self._log_below += log_factor(x, self.grid, bet, "below")
        self.count, self.total = t, self.total + x
        mean = (PRIOR_MEAN + self.total) / (t + 1)
        self._squares += (x - mean) ** 2
        self._variance = (PRIOR_VARIANCE + self._squares) / (t + 1)
        low = np.flatnonzero(self._log_above >= self._threshold)  # a prefix of the grid: K⁺ falls with m
        high = np.flatnonzero(self._log_below >= self._threshold)  # a suffix: K⁻ rises with m
        if low.size:
            self._rejected_low = max(self._rejected_low, int(low[-1]))
        if high.size:
            self._rejected_high = min(self._rejected_high, int(high[0]))

    def extend(self, xs: Sequence[float]) -> None:
        for x in xs:
            self.update(x)

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else math.nan

    @property
    def lower(self) -> float:
        return 0.0 if self._rejected_low < 0 else float(self.grid[self._rejected_low])

    @property
    def upper(self) -> float:
        return 1.0 if self._rejected_high >= len(self.grid) else float(self.grid[self._rejected_high])

    def rejects_below(self, m: float) -> bool:
        """Whether the observations showed, at level δ, that the mean is below ``m`` (exact for an anchor)."""
        return self.upper <= m

    def rejects_above(self, m: float) -> bool:
        """Whether the observations showed, at level δ, that the mean is above ``m`` (exact for an anchor)."""
        return self.lower >= m


def confidence_sequence(x: Sequence[float], delta: float, points: int = GRID_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """``(lower, upper)`` after each observation of one stream (the bounds of :class:`ConfidenceSequence`)."""
    sequence = ConfidenceSequence(delta, points=points)
    lower, upper = np.empty(len(x)), np.empty(len(x))
    for i, value in enumerate(x):
        sequence.update(float(value))
        lower[i], upper[i] = sequence.lower, sequence.upper
    return lower, upper
