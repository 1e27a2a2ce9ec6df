"""Labels on served answers, as they arrive (``POST /v1/feedback``): what the service remembers and reports.

What was served, and the bounded index feedback is checked against, live in the store
(:mod:`candor.annotation.served_store`). Here, bounded so that traffic cannot grow it without limit,
:class:`FeedbackTracker` keeps the latest label of each answered choice (the
later label wins) and reports the **observed accuracy of answered questions**
with its Clopper–Pearson bounds at 1 − δ against the accuracy the threshold
promised when it was tuned (:meth:`Threshold.promised_accuracy
<candor.serve.thresholds.Threshold.promised_accuracy>`).

Two alarms, both on ``/metrics``: ``candor_calibration_unconfirmed`` is on while
the lower bound is below the promise (the labels do not yet confirm it, which is
also the case with few labels), and ``candor_calibration_drift`` is on once the
upper bound is below it: the labels show, at level δ, that answered questions are
less accurate than promised. Neither is reported before :data:`MIN_LABELS` labels.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from scipy.stats import beta

REMEMBERED_LABELS = 100_000  # labelled answered choices the observed accuracy is computed over (the latest)
MIN_LABELS = 30  # labels of answered choices before the accuracy and its alarms are reported
DEFAULT_DELTA = 0.05  # the bounds' level when the threshold names none


@dataclass(frozen=True)
class AccuracyReport:
    """The observed accuracy of answered questions and its bounds, against the promise."""

    labelled: int
    accuracy: float
    lower: float
    upper: float
    promised: float | None

    @property
    def unconfirmed(self) -> bool:
        return self.promised is not None and self.lower < self.promised

    @property
    def drift(self) -> bool:
        return self.promised is not None and self.upper < self.promised


class FeedbackTracker:
    """The latest label of each answered choice, and the accuracy they show (thread-safe)."""

    def __init__(self, promised: float | None, delta: float | None, limit: int = REMEMBERED_LABELS) -> None:
        self.promised = promised
        self.delta = delta or DEFAULT_DELTA
        self._limit = limit
        self._labels: OrderedDict[tuple[str, int], bool] = OrderedDict()
        self._lock = threading.Lock()

    def observe(self, response_id: str, index: int, correct: bool) -> None:
        """A label of an answered choice; a later one for the same choice replaces it."""
        with self._lock:
            key = (response_id, index)
            self._labels[key] = bool(correct)
            self._labels.move_to_end(key)
            while len(self._labels) > self._limit:
                self._labels.popitem(last=False)

    def report(self) -> AccuracyReport | None:
        """None before :data:`MIN_LABELS` labels."""
        with self._lock:
            n, k = len(self._labels), sum(self._labels.values())
        if n < MIN_LABELS:
            return None
        lower, upper = clopper_pearson(k, n, self.delta)
        return AccuracyReport(labelled=n, accuracy=k / n, lower=lower, upper=upper, promised=self.promised)


def clopper_pearson(successes: int, trials: int, delta: float) -> tuple[float, float]:
    """One-sided exact bounds: each holds with probability at least 1 − ``delta``."""
    lower = 0.0 if successes == 0 else float(beta.ppf(delta, successes, trials - successes + 1))
    upper = 1.0 if successes == trials else float(beta.ppf(1 - delta, successes + 1, trials - successes))
    return lower, upper
