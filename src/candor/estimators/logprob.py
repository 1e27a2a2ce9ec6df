"""Estimators from the greedy answer's token log-probs: ``prob``, ``n-prob``, ``min-prob`` (§4.2).

They read ``record.greedy.logprobs`` only, so they need no model. A record
without per-token log-probs (an empty answer, or a HonestyBench import with
no ``greedy_logprobs``) has no defined value: it raises :class:`CandorError`
naming the record, rather than inventing a number. A sequence total
(``greedy_cumulative_logprobs``) is never used: it cannot give a mean or a
minimum, so all three refuse alike.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from candor.annotation.records import Record
from candor.backends.base import LOGPROBS, Backend
from candor.estimators.base import ESTIMATORS, Estimator
from candor.util.errors import CandorError


def greedy_logprobs(record: Record) -> np.ndarray:
    """The greedy answer's token log-probs, checked to be present and finite."""
    lps = np.asarray(record.greedy.logprobs, dtype=float)
    if lps.size == 0:
        raise CandorError(
            f"record {record.id!r}: the greedy answer {record.greedy.text!r} has no per-token log-probs "
            "(e.g. a HonestyBench line without greedy_logprobs); prob, n-prob and min-prob need them "
            "and are not computed from a sequence total"
        )
    if not np.isfinite(lps).all():
        raise CandorError(f"record {record.id!r}: the greedy answer has non-finite token log-probs")
    # Log-probs are ≤ 0; a tiny positive value is round-off from the engine.
    return np.minimum(lps, 0.0)


class _LogprobEstimator(Estimator):
    level = "question"
    requires = frozenset({LOGPROBS})

    def _estimate(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        return np.array([self.reduce(greedy_logprobs(r)) for r in records])

    def reduce(self, logprobs: np.ndarray) -> float:
        raise NotImplementedError


@ESTIMATORS.register("prob")
class SequenceProb(_LogprobEstimator):
    """exp(sum of the greedy answer's token log-probs): the answer's probability."""

    name = "prob"

    def reduce(self, logprobs: np.ndarray) -> float:
        return float(np.exp(logprobs.sum()))


@ESTIMATORS.register("n-prob")
class NormalizedProb(_LogprobEstimator):
    """exp(mean token log-prob): the geometric mean of the token probabilities."""

    name = "n-prob"

    def reduce(self, logprobs: np.ndarray) -> float:
        return float(np.exp(logprobs.mean()))


@ESTIMATORS.register("min-prob")
class MinTokenProb(_LogprobEstimator):
    """The smallest token probability in the greedy answer."""

    name = "min-prob"

    def reduce(self, logprobs: np.ndarray) -> float:
        return float(np.exp(logprobs.min()))
