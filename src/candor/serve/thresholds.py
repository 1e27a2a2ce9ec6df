"""Selective answering: pick the confidence threshold below which a model abstains.

A question is answered when its confidence is at least the threshold ``t``.
Every rule here looks at a dev split only (confidences and greedy-answer
correctness) and returns a :class:`Threshold` that records the rule, its
target and what it achieved on dev (accuracy of the answered questions and
coverage, the fraction answered).

- :func:`for_accuracy`: the lowest threshold whose answered dev accuracy
  reaches a minimum (the most coverage for that accuracy).
- :func:`for_coverage`: the highest threshold that still answers at least a
  target fraction of dev questions.
- :func:`risk_control`: a finite-sample guarantee, Learn-then-Test style
  (Angelopoulos et al., 2021). With probability at least 1 − δ over the draw
  of the dev split, the error rate of answered questions at the chosen
  threshold, P(wrong | confidence ≥ t), is at most α.

  *Assumption*: dev and test questions are exchangeable (i.i.d. draws from one
  distribution, confidences from the same fixed model). A shift between dev
  and deployment questions voids the guarantee.

  How: for each threshold λ of a grid fixed in advance (1.0 down to 0.0),
  the answered dev questions' errors, given how many were answered, are a
  Binomial(n_λ, R(λ)) count, so ``binom.cdf(errors, n_λ, α)`` is a valid
  p-value for the null "R(λ) > α" (the exact Clopper–Pearson test). Testing
  from the most to the least conservative λ and stopping at the first
  p-value above δ (fixed-sequence testing) controls the family-wise error at
  δ, so the lowest λ rejected is safe with probability 1 − δ.

  Grid values that answer too few dev questions to be rejected even with no
  error at all (n_λ < log δ / log(1 − α)) carry no evidence and are passed
  over rather than ending the scan; otherwise a fine grid would stop at its
  first, nearly empty, value. That choice reads the dev confidences, never
  their labels, but strictly it conditions on them, so the guarantee is
  exact only up to that; the simulation in ``tests/test_serve_thresholds.py``
  checks it empirically.

  *Several starts* (``starts``, :data:`SPLIT_STARTS`): one sequence that starts at the most confident answers ends
  at once when they are wrong, whatever the rest shows. With a weak model and few labels that is the usual case
  (``candor adapt`` at 100 labels on the embedded 135M model: the most confident held-out answer was wrong in every
  run, so no α up to 0.99 was certified). With ``starts = (f_1, …, f_K)`` the scan runs K fixed sequences down the
  same grid, the k-th from the first λ that answers at least ⌈f_k·n⌉ dev questions, each at level δ/K, and the
  threshold is the lowest λ any of them rejected. Each sequence controls its family-wise error at δ/K, so by the
  union bound all of them together wrongly reject some λ with probability at most δ: the guarantee is the same.
  The starts are fractions fixed in advance and placed by the confidences alone (never the labels), with the same
  caveat as the passing-over above; the simulation checks the several-start scan too.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from candor.util.errors import CandorError

logger = logging.getLogger(__name__)

# Above every confidence in [0, 1]: the threshold that abstains on everything.
ABSTAIN_ALL = math.nextafter(1.0, 2.0)

# The default fixed grid for risk control, most conservative first.
DEFAULT_GRID = np.round(np.linspace(1.0, 0.0, 1001), 6)

RULES = ("fixed", "accuracy", "coverage", "risk")

# Where risk control's fixed sequences start, as fractions of the dev questions answered: the most confident ones,
# half of them, and all of them; each sequence at δ/3 (module docstring, "several starts").
SPLIT_STARTS = (0.0, 0.5, 1.0)


@dataclass(frozen=True)
class Threshold:
    """An abstention threshold and what it gave on the dev split it was chosen on.

    ``expected_accuracy`` is the dev accuracy of answered questions (None when
    none were answered or no dev split was used) and ``expected_coverage``
    the fraction of dev questions answered.
    """

    value: float
    rule: str = "fixed"
    target: float | None = None
    expected_accuracy: float | None = None
    expected_coverage: float | None = None
    n_dev: int = 0
    delta: float | None = None  # risk control only: 1 − δ is the guarantee's probability
    assumption: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.value, bool) or not isinstance(self.value, (int, float)):
            raise CandorError(f"a threshold is a number in [0, 1], got a {type(self.value).__name__}")
        if not isinstance(self.rule, str) or self.rule not in RULES:
            raise CandorError(f"unknown threshold rule {self.rule!r}; known: {', '.join(RULES)}")
        if not (0.0 <= self.value <= ABSTAIN_ALL) or math.isnan(self.value):
            raise CandorError(f"a threshold must be in [0, 1], got {self.value}")

    def abstains(self, confidence: float) -> bool:
        return confidence < self.value

    @property
    def promised_accuracy(self) -> float | None:
        """The accuracy of answered questions this threshold stands for: 1 − α under risk control, the
        target of the ``accuracy`` rule, else what dev showed (None when it showed nothing)."""
        if self.rule == "risk" and self.target is not None:
            return 1.0 - self.target
        if self.rule == "accuracy" and self.target is not None:
            return self.target
        return self.expected_accuracy

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Threshold:
        try:
            return cls(**d)
        except TypeError as exc:
            raise CandorError(f"not a saved threshold: {exc}") from None


def selective_curve(confidence: ArrayLike, correct: ArrayLike) -> dict[str, np.ndarray]:
    """Accuracy of answered questions and coverage at every distinct confidence, highest first.

    ``threshold[i]`` answers the questions with confidence ≥ it; ties are
    answered together, so the curve has one point per distinct value.
    """
    conf, y = _check(confidence, correct)
    order = np.argsort(-conf, kind="stable")
    conf, y = conf[order], y[order]
    answered = np.arange(1, conf.size + 1)
    hits = np.cumsum(y)
    # The last index of each run of equal confidences: answering t answers all ties.
    last = np.flatnonzero(np.r_[conf[1:] != conf[:-1], True])
    return {
        "threshold": conf[last],
        "coverage": answered[last] / conf.size,
        "accuracy": hits[last] / answered[last],
        "answered": answered[last],
        "errors": answered[last] - hits[last],
    }


def accuracy_and_coverage(confidence: ArrayLike, correct: ArrayLike, threshold: float) -> tuple[float | None, float]:
    """(accuracy of answered, coverage) at ``threshold``; accuracy is None when nothing is answered."""
    conf, y = _check(confidence, correct)
    answered = conf >= threshold
    coverage = float(answered.mean())
    accuracy = float(y[answered].mean()) if answered.any() else None
    return accuracy, coverage


def fixed(value: float, confidence: ArrayLike | None = None, correct: ArrayLike | None = None) -> Threshold:
    """A threshold given by hand; with dev data its expected accuracy and coverage are filled in."""
    if confidence is None or correct is None:
        return Threshold(value=float(value))
    acc, cov = accuracy_and_coverage(confidence, correct, value)
    return Threshold(
        float(value),
        rule="fixed",
        target=None,
        expected_accuracy=acc,
        expected_coverage=cov,
        n_dev=int(np.size(confidence)),
    )


def for_accuracy(confidence: ArrayLike, correct: ArrayLike, min_accuracy: float) -> Threshold:
    """The lowest threshold whose answered dev accuracy is at least ``min_accuracy``."""
    _check_fraction(min_accuracy, "min_accuracy")
    curve = selective_curve(confidence, correct)
    ok = np.flatnonzero(curve["accuracy"] >= min_accuracy - 1e-12)
    n = int(np.size(confidence))
    if ok.size == 0:
        logger.warning("no threshold reaches answered accuracy %.3f on dev; abstaining on everything", min_accuracy)
        return Threshold(
            ABSTAIN_ALL, rule="accuracy", target=min_accuracy, expected_accuracy=None, expected_coverage=0.0, n_dev=n
        )
    i = int(ok[-1])  # the lowest qualifying threshold answers the most
    return Threshold(
        float(curve["threshold"][i]),
        rule="accuracy",
        target=min_accuracy,
        expected_accuracy=float(curve["accuracy"][i]),
        expected_coverage=float(curve["coverage"][i]),
        n_dev=n,
    )


def for_coverage(confidence: ArrayLike, correct: ArrayLike, coverage: float) -> Threshold:
    """The highest threshold that answers at least ``coverage`` of dev questions."""
    _check_fraction(coverage, "coverage")
    curve = selective_curve(confidence, correct)
    n = int(np.size(confidence))
    if coverage == 0.0:
        return Threshold(
            ABSTAIN_ALL, rule="coverage", target=0.0, expected_accuracy=None, expected_coverage=0.0, n_dev=n
        )
    i = int(np.flatnonzero(curve["coverage"] >= coverage - 1e-12)[0])
    return Threshold(
        float(curve["threshold"][i]),
        rule="coverage",
        target=coverage,
        expected_accuracy=float(curve["accuracy"][i]),
        expected_coverage=float(curve["coverage"][i]),
        n_dev=n,
    )


def binomial_pvalue(errors: int, answered: int, alpha: float) -> float:
    """P(Binomial(answered, α) ≤ errors): small when the error rate is convincingly below α."""
    if answered == 0:
        return 1.0
    if alpha >= 1.0:
        return 0.0  # an error rate of at most 1 always holds: nothing to reject
    from scipy.stats import binom  # lazy: scipy.stats costs seconds to import, and only tuning needs it

    return float(binom.cdf(errors, answered, alpha))


def clopper_pearson(successes: int, trials: int, level: float = 0.95) -> list[float]:
    """The two-sided exact (Clopper–Pearson) interval of a binomial proportion, ``[low, high]``."""
    if trials <= 0 or not 0 <= successes <= trials:
        raise CandorError(f"a binomial interval needs 0 ≤ successes ≤ trials and trials > 0, got {successes}/{trials}")
    from scipy.stats import beta  # lazy, as binomial_pvalue imports binom

    tail = (1 - level) / 2
    low = 0.0 if successes == 0 else float(beta.ppf(tail, successes, trials - successes + 1))
    high = 1.0 if successes == trials else float(beta.ppf(1 - tail, successes + 1, trials - successes))
    return [low, high]


def min_evidence(alpha: float, delta: float) -> int:
    """The fewest answered questions with which zero errors can reject "error > α" at level δ."""
    if alpha >= 1.0:
        return 1
    if alpha <= 0.0:
        return 1 << 62  # an error rate of exactly 0 can never be certified from a sample
    return max(1, math.ceil(math.log(delta) / math.log1p(-alpha) - 1e-12))


def risk_control(
    confidence: ArrayLike,
    correct: ArrayLike,
    alpha: float,
    delta: float = 0.1,
    grid: ArrayLike | None = None,
    starts: Sequence[float] = (0.0,),
) -> Threshold:
    """A threshold whose answered-question error is ≤ α with probability ≥ 1 − δ (see the module docstring).

    ``starts``: where the fixed sequences start, as fractions of the dev questions answered (one sequence from the
    most confident answers by default; :data:`SPLIT_STARTS` for three, each at δ/3).
    """
    _check_fraction(alpha, "alpha")
    if not 0.0 < delta < 1.0:
        raise CandorError(f"delta must be in (0, 1), got {delta}")
    if not starts or any(not 0.0 <= f <= 1.0 for f in starts):
        raise CandorError(f"risk control's starts are fractions in [0, 1], at least one, got {list(starts)}")
    conf, y = _check(confidence, correct)
    lambdas = DEFAULT_GRID if grid is None else np.sort(np.asarray(grid, dtype=float))[::-1]
    level = delta / len(starts)
    min_answered = min_evidence(alpha, level)
    order = np.argsort(conf, kind="stable")
    below = np.searchsorted(conf[order], lambdas, side="left")  # dev questions under each λ (abstained on)
    answered = conf.size - below
    errors = answered - (int(y.sum()) - np.concatenate([[0], np.cumsum(y[order])])[below])
    pvalues: dict[tuple[int, int], float] = {}  # the sequences share the grid: each (answered, errors) once
    chosen, tested, won = ABSTAIN_ALL, 0, None
    for start in starts:
        first = max(min_answered, math.ceil(start * conf.size - 1e-9))
        lam, n_tested = _fixed_sequence(lambdas, answered, errors, first, alpha, level, pvalues)
        tested += n_tested
        if lam < chosen:
            chosen, won = lam, start
    extra: dict[str, Any] = {"tested": tested, "min_answered": min_answered}
    if len(starts) > 1:
        extra.update(starts=list(starts), level_each=level, chosen_by_start=won)
    assumption = "dev and test questions are exchangeable (i.i.d. from one distribution)"
    if chosen == ABSTAIN_ALL:
        logger.warning(
            "risk control: no threshold certifies error ≤ %.3f at δ=%.3f; abstaining on everything", alpha, delta
        )
        return Threshold(
            ABSTAIN_ALL,
            rule="risk",
            target=alpha,
            expected_accuracy=None,
            expected_coverage=0.0,
            n_dev=int(conf.size),
            delta=delta,
            assumption=assumption,
            extra=extra,
        )
    acc, cov = accuracy_and_coverage(conf, y, chosen)
    return Threshold(
        chosen,
        rule="risk",
        target=alpha,
        expected_accuracy=acc,
        expected_coverage=cov,
        n_dev=int(conf.size),
        delta=delta,
        assumption=assumption,
        extra=extra,
    )


def _fixed_sequence(
    lambdas: np.ndarray,
    answered: np.ndarray,
    errors: np.ndarray,
    first: int,
    alpha: float,
    level: float,
    pvalues: dict[tuple[int, int], float],
) -> tuple[float, int]:
    """One fixed sequence down the grid from the first λ answering at least ``first`` dev questions, stopping at the
    first p-value above ``level``: (the lowest λ rejected, or :data:`ABSTAIN_ALL`; how many λ were tested)."""
    chosen, tested = ABSTAIN_ALL, 0
    for lam, n_answered, n_errors in zip(lambdas, answered, errors, strict=True):
        if n_answered < first:
            continue  # cannot be rejected whatever the labels, or before this sequence's start
        tested += 1
        key = (int(n_answered), int(n_errors))
        if key not in pvalues:
            pvalues[key] = binomial_pvalue(key[1], key[0], alpha)
        if pvalues[key] > level:
            break
        chosen = float(lam)
    return chosen, tested


RULE_FUNCTIONS = {"accuracy": for_accuracy, "coverage": for_coverage}


def choose(confidence: ArrayLike, correct: ArrayLike, rule: str, target: float, delta: float = 0.1) -> Threshold:
    """One entry point by rule name: ``accuracy`` / ``coverage`` take the target, ``risk`` takes α and δ."""
    if rule == "risk":
        return risk_control(confidence, correct, alpha=target, delta=delta)
    if rule == "fixed":
        return fixed(target, confidence, correct)
    try:
        fn = RULE_FUNCTIONS[rule]
    except KeyError:
        raise CandorError(f"unknown threshold rule {rule!r}; known: {', '.join(RULES)}") from None
    return fn(confidence, correct, target)


def _check(confidence: ArrayLike, correct: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    conf = np.asarray(confidence, dtype=float).ravel()
    y = np.asarray(correct, dtype=float).ravel()
    if conf.size == 0:
        raise CandorError("choosing a threshold needs at least one dev question")
    if conf.shape != y.shape:
        raise CandorError(f"got {conf.size} confidences but {y.size} correctness labels")
    if not np.isfinite(conf).all() or conf.min() < 0 or conf.max() > 1:
        raise CandorError("confidences must be finite and in [0, 1]")
    if not np.isin(y, (0.0, 1.0)).all():
        raise CandorError("correctness labels must be 0 or 1")
    return conf, y


def _check_fraction(x: float, name: str) -> None:
    if not 0.0 <= x <= 1.0:
        raise CandorError(f"{name} must be in [0, 1], got {x}")
