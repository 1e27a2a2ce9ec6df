"""Conformal factuality: the claim threshold under which a refined answer holds no false claim.

After Mohri & Hashimoto, "Language Models with Conformal Factuality Guarantees"
(ICML 2024). Refinement (``--refine remove``) drops the claims whose confidence
is below a threshold ``t`` and keeps those at or above it. This module picks
``t`` on labelled dev answers so that a refined answer contains no false claim.

Each dev answer ``i`` gets one score, ``r_i``: the highest confidence among its
false claims (``-inf`` when it has none). A threshold removes every false claim
of answer ``i`` exactly when ``t > r_i``, so the share of answers still holding
a false claim at ``t`` is the share with ``r_i ≥ t``. Both rules below take an
order statistic of the ``n`` dev scores, ``r_(k)`` (the ``k``-th smallest), and
return the next float above it (never below 0), so every dev answer with
``r_i ≤ r_(k)`` is cleaned; they differ in ``k``:

- ``conformal`` (split conformal prediction, a marginal guarantee): with
  ``k = ⌈(n + 1)(1 − α)⌉``, a fresh answer's score is at most ``r_(k)`` with
  probability at least ``k / (n + 1) ≥ 1 − α`` over the draw of dev *and* test
  (ties only help). So P(the refined test answer holds no false claim) ≥ 1 − α.
  When ``k > n`` (``n < (1 − α) / α``) no dev score is high enough and the rule
  refuses, saying how many dev answers it needs.
- ``risk`` (risk control at level δ, as :func:`candor.serve.thresholds.risk_control`
  does for questions): with probability at least 1 − δ over the draw of dev,
  the share of test answers still holding a false claim is at most α. The
  number of dev answers holding a false claim at ``t`` is Binomial(n, R(t)),
  and ``t`` is the smallest threshold whose count ``f`` passes the exact
  Clopper–Pearson test of "R(t) > α" at level δ
  (:func:`candor.serve.thresholds.binomial_pvalue` ≤ δ). That count falls as
  ``t`` rises, so the largest passing count ``f*`` gives ``k = n − f*``, and
  scanning every threshold from the top (fixed-sequence testing) stops at the
  same place; a monotone loss makes the scan over all thresholds valid (the
  risk-controlling prediction sets of Bates et al., 2021). With fewer dev
  answers than :func:`candor.serve.thresholds.min_evidence` even ``f = 0`` cannot
  pass and the rule refuses with that number.

*Assumption*: the dev answers and the served answers are exchangeable: the same
model, template and claim method, answers split as served (the ``sentence``
decomposer), questions from one distribution, labels given without regard to
the confidences. Serving leaves an answer of one claim as generated, so the
guarantee covers answers of more than one claim and dev answers of one claim are
left out. A claim without a label (a failure mode of docs/claims.md "Labels",
or unlabelled) counts as false: the guarantee then says the refined answer holds
no claim that is not known to be right, which implies no false claim.

A :class:`FactualityGuarantee` records the rule, α, δ, the dev size and the
assumption; it is saved in the honest folder (``honest.json``'s ``factuality``)
and travels in the ``confidence`` object of every refined answer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from candor.serve import thresholds as th
from candor.util.errors import CandorError

RULES = ("conformal", "risk")
ASSUMPTION = (
    "dev and served answers are exchangeable (same model, template and claim method, answers split as served, "
    "questions from one distribution); covers answers of more than one claim; an unlabelled claim counted false"
)
_TOLERANCE = 1e-9  # (n + 1)(1 − α) computed in floats: 10 × 0.9 must give rank 9, not 10


@dataclass(frozen=True, kw_only=True)
class FactualityGuarantee:
    """A claim threshold tuned on dev answers, and the guarantee it carries (see the module docstring).

    ``dev_without_false`` and ``dev_claims_kept`` are what the threshold gave on
    the dev answers it was tuned on (the share of refined answers with no false
    claim, the share of claims kept); ``rank`` is ``k``, the order statistic.
    """

    method: str  # the claim estimator whose confidences were tuned on
    alpha: float
    rule: str
    delta: float | None  # risk only: the guarantee holds with probability ≥ 1 − δ over the dev draw
    threshold: float
    n_dev: int  # dev answers of more than one claim
    rank: int
    dev_without_false: float
    dev_claims_kept: float
    assumption: str = ASSUMPTION
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise CandorError(f"unknown factuality rule {self.rule!r}; known: {', '.join(RULES)}")
        check_alpha(self.alpha)
        if (self.rule == "risk") != (self.delta is not None):
            raise CandorError("a factuality guarantee has a delta exactly when its rule is risk")
        if math.isnan(self.threshold) or not 0.0 <= self.threshold <= th.ABSTAIN_ALL:
            raise CandorError(f"a claim threshold must be in [0, 1], got {self.threshold}")

    @property
    def statement(self) -> str:
        """The guarantee in one sentence."""
        scope = "a refined answer of more than one claim"
        if self.rule == "risk":
            return (
                f"with probability ≥ {1 - self.delta:.3g} over the {self.n_dev} dev answers, at most "  # type: ignore[operator]
                f"{self.alpha:.3g} of refined answers (of more than one claim) hold a false claim "
                "(risk control, Clopper–Pearson)"
            )
        return (
            f"{scope} holds no false claim with probability ≥ {1 - self.alpha:.3g} "
            f"(split conformal on {self.n_dev} dev answers, marginal over dev and test)"
        )

    def describe(self) -> dict[str, Any]:
        """What a refined answer's ``confidence`` object carries (``factuality``)."""
        return {
            "guarantee": self.statement,
            "rule": self.rule,
            "alpha": self.alpha,
            "delta": self.delta,
            "n_dev": self.n_dev,
            "claim_threshold": self.threshold,
            "assumption": self.assumption,
        }

    def matches(self, method: str, alpha: float) -> bool:
        return self.method == method and math.isclose(self.alpha, alpha, rel_tol=0.0, abs_tol=1e-12)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FactualityGuarantee:
        try:
            return cls(**d)
        except TypeError as exc:
            raise CandorError(f"not a saved factuality guarantee: {exc}") from None


# ---------------------------------------------------------------- the statistics


def check_alpha(alpha: float) -> None:
    if not 0.0 < alpha < 1.0:
        raise CandorError(
            f"alpha (the tolerated share of refined answers with a false claim) must be in (0, 1), got {alpha}"
        )


def conformal_rank(n: int, alpha: float) -> int:
    """``k = ⌈(n + 1)(1 − α)⌉``; refused (with the dev size needed) when it exceeds ``n``."""
    check_alpha(alpha)
    k = max(0, math.ceil((n + 1) * (1.0 - alpha) - _TOLERANCE))
    if k > n:
        raise CandorError(
            f"{n} dev answers are too few for split conformal at alpha={alpha:g}: it needs at least "
            f"{needed_dev(alpha)} (⌈(n + 1)(1 − alpha)⌉ ≤ n)"
        )
    return k


def needed_dev(alpha: float, delta: float | None = None) -> int:
    """The fewest dev answers with which the rule (``conformal`` when ``delta`` is None, else ``risk``) can tune."""
    if delta is not None:
        return th.min_evidence(alpha, delta)
    n = max(1, math.ceil((1.0 - alpha) / alpha - _TOLERANCE) - 1)
    while math.ceil((n + 1) * (1.0 - alpha) - _TOLERANCE) > n:
        n += 1
    return n


def risk_rank(n: int, alpha: float, delta: float) -> int:
    """``k = n − f*``, ``f*`` the most dev answers with a false claim that still certify "rate ≤ α" at level δ."""
    check_alpha(alpha)
    if not 0.0 < delta < 1.0:
        raise CandorError(f"delta must be in (0, 1), got {delta}")
    if th.binomial_pvalue(0, n, alpha) > delta:
        raise CandorError(
            f"{n} dev answers are too few for risk control at alpha={alpha:g}, delta={delta:g}: it needs at least "
            f"{th.min_evidence(alpha, delta)} (even none with a false claim could not certify the rate)"
        )
    from scipy.stats import binom  # lazy, as thresholds.py imports it

    f = int(binom.ppf(delta, n, alpha))  # the smallest count whose p-value reaches δ: the answer is it or one below
    while f > 0 and th.binomial_pvalue(f, n, alpha) > delta:
        f -= 1
    while f < n and th.binomial_pvalue(f + 1, n, alpha) <= delta:
        f += 1
    return n - f


def rank_for(n: int, alpha: float, delta: float | None = None) -> int:
    """The order statistic each rule takes: ``conformal`` (``delta`` None) or ``risk``."""
    return conformal_rank(n, alpha) if delta is None else risk_rank(n, alpha, delta)


def threshold_at_rank(scores: ArrayLike, rank: int) -> np.ndarray:
    """Just above the ``rank``-th smallest score along the last axis (0 for rank 0); one threshold per row.

    Vectorized: ``scores`` of shape ``(..., n)`` give thresholds of shape ``(...)``.
    """
    r = np.asarray(scores, dtype=float)
    if rank <= 0:
        return np.zeros(r.shape[:-1])
    q = np.sort(r, axis=-1)[..., rank - 1]
    return np.maximum(np.nextafter(q, np.inf), 0.0)


def worst_false(values: ArrayLike, false: ArrayLike, answer: ArrayLike, n_answers: int) -> np.ndarray:
    """Per answer, ``r_i``: the highest confidence among its false claims, ``-inf`` when it has none.

    ``values``, ``false`` (bool) and ``answer`` (the index of each claim's answer, 0 … n_answers − 1) are
    per claim.
    """
    v = np.asarray(values, dtype=float)
    bad = np.asarray(false, dtype=bool)
    a = np.asarray(answer, dtype=int)
    r = np.full(n_answers, -np.inf)
    np.maximum.at(r, a[bad], v[bad])
    return r


@dataclass(frozen=True)
class LabelledClaims:
    """The labelled claims of answers of more than one claim (dev or test), grouped by answer."""

    values: np.ndarray  # per claim: its confidence
    false: np.ndarray  # per claim: not labelled right (wrong, unlabelled or a failure mode)
    answer: np.ndarray  # per claim: the index of its answer
    n_answers: int
    counts: dict[str, int]  # answers of one claim left out, unlabelled claims counted false

    def scores(self) -> np.ndarray:
        return worst_false(self.values, self.false, self.answer, self.n_answers)


def labelled_claims(rows: Iterable[Mapping[str, Any]], method: str) -> LabelledClaims:
    """The rows of ``claim_confidences.jsonl`` (``candor claims``) as :class:`LabelledClaims` for ``method``.

    A row is one claim: ``answer`` (its answer's id), ``correct`` (1, 0 or None), ``failure`` and
    ``confidence[method]``. Answers of one claim are left out (serving leaves them unrefined).
    """
    by_answer: dict[str, list[tuple[float, bool, bool]]] = {}
    for i, row in enumerate(rows):
        conf = row.get("confidence") or {}
        if method not in conf:
            raise CandorError(
                f"claim row {i + 1} ({row.get('id')}) has no {method!r} confidence; known: {sorted(conf)}"
            )
        value = conf[method]
        if value is None or not math.isfinite(float(value)) or not 0.0 <= float(value) <= 1.0:
            raise CandorError(
                f"claim row {i + 1} ({row.get('id')}): a {method} confidence must be in [0, 1], got {value}"
            )
        if row.get("answer") is None:
            raise CandorError(f"claim row {i + 1} ({row.get('id')}) names no answer (its 'answer' id)")
        labelled = row.get("correct") in (0, 1) and row.get("failure") is None
        right = labelled and row.get("correct") == 1
        by_answer.setdefault(str(row.get("answer")), []).append((float(value), not right, not labelled))
    kept = [claims for claims in by_answer.values() if len(claims) > 1]
    return LabelledClaims(
        values=np.array([c[0] for claims in kept for c in claims], dtype=float),
        false=np.array([c[1] for claims in kept for c in claims], dtype=bool),
        answer=np.array([k for k, claims in enumerate(kept) for _ in claims], dtype=int),
        n_answers=len(kept),
        counts={
            "one_claim_answers": len(by_answer) - len(kept),
            "unlabelled_claims_counted_false": sum(c[2] for claims in kept for c in claims),
        },
    )


def refined_outcome(claims: LabelledClaims, threshold: float) -> tuple[int, float]:
    """At ``threshold``: how many of the answers hold no false claim once refined, and the share of claims kept."""
    without_false = int(np.sum(claims.scores() < threshold))
    return without_false, float(np.mean(claims.values >= threshold)) if claims.values.size else 0.0


def tune(claims: LabelledClaims, method: str, alpha: float, delta: float | None = None) -> FactualityGuarantee:
    """The claim threshold for ``alpha`` on ``claims`` (``conformal``, or ``risk`` at level ``delta``)."""
    n = claims.n_answers
    if n == 0:
        raise CandorError("tuning a claim threshold needs dev answers of more than one claim; none was given")
    rank = rank_for(n, alpha, delta)
    threshold = float(threshold_at_rank(claims.scores(), rank))
    without_false, kept = refined_outcome(claims, threshold)
    return FactualityGuarantee(
        method=method,
        alpha=float(alpha),
        rule="conformal" if delta is None else "risk",
        delta=None if delta is None else float(delta),
        threshold=threshold,
        n_dev=n,
        rank=rank,
        dev_without_false=without_false / n,
        dev_claims_kept=kept,
        extra={**claims.counts, "claims": int(claims.values.size), "false_claims": int(claims.false.sum())},
    )


# ---------------------------------------------------------------- a folder's guarantees


def tuned_at(guarantees: Sequence[FactualityGuarantee], method: str, alpha: float) -> FactualityGuarantee:
    """The guarantee tuned for ``method`` at ``alpha``; refused, naming those there are, when there is none."""
    for g in guarantees:
        if g.matches(method, alpha):
            return g
    there = ", ".join(f"{g.method} at alpha={g.alpha:g}" for g in guarantees) or "none"
    raise CandorError(
        f"the honest folder has no factuality guarantee for {method} at alpha={alpha:g} (tuned: {there}); "
        "tune one with `candor claims-tune`"
    )


def with_guarantee(
    guarantees: Sequence[FactualityGuarantee], new: FactualityGuarantee
) -> tuple[FactualityGuarantee, ...]:
    """``guarantees`` with ``new`` added, replacing one tuned for the same method and alpha."""
    return (*(g for g in guarantees if not g.matches(new.method, new.alpha)), new)
