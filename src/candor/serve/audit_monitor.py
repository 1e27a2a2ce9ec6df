"""The drift alarm: whether audit labels show, at level δ, that answered questions are less accurate than promised.

A threshold promises an accuracy of answered questions (:meth:`Threshold.promised_accuracy
<candor.serve.thresholds.Threshold.promised_accuracy>`). An operator checks the promise on a
uniformly drawn sample of served responses, labelled (``label_source: "audit"``; ``candor label
--audit`` draws the sample). :class:`AuditMonitor` keeps, per model version, an anytime-valid
confidence sequence for that accuracy (:class:`candor.evaluation.confidence_sequence.ConfidenceSequence`,
by betting), so the alarm may be looked at after every label, at every ``/metrics`` scrape, for
as long as the model serves, and still fires with probability at most δ while the accuracy is
at least the promise (even when it varies over time, as long as it never falls below the promise).

- **drift**: the upper bound is at or below the promise (the labels show, at level δ, that the
  accuracy fell below it); once on, it stays on for that version.
- **unconfirmed**: the lower bound is below the promise (the labels do not, or not yet, show the
  accuracy is above it; with few labels it always is).

Which labels count:

- only audit labels (labels on responses the operator chose, or users chose to flag, are not a
  uniform sample: their accuracy says nothing about all answered questions);
- only labels of **answered** choices (the promise is about answered questions);
- **one label per response**: the first audit label of an answered choice of the response counts;
  later labels of the same response (another choice, or a correction) do not change the sequence,
  since the choices of one response are not independent and a bet once settled stays settled.

:meth:`AuditMonitor.replay` feeds stored labels back in the order they were made (after a restart,
from the label store), which rebuilds exactly the state the process had.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from candor.evaluation.confidence_sequence import ConfidenceSequence

DEFAULT_DELTA = 0.05  # the alarm's level when the threshold names none
AUDIT_LABELS_PER_VERSION = 200_000  # labels counted per model version (later ones are not)
MONITORED_VERSIONS = 64  # model versions kept (the least recently used one goes first)


class AuditLabel(NamedTuple):
    """One audit label of an answered choice, as a store replays it."""

    version: str
    response_id: str
    correct: bool


@dataclass(frozen=True, kw_only=True)
class AuditReport:
    """The audit labels of one model version: their accuracy and its bounds, against the promise."""

    version: str
    labelled: int  # responses counted (one label each)
    accuracy: float
    lower: float  # at level delta: the accuracy is at least this
    upper: float  # at level delta: the accuracy is at most this
    promised: float | None
    delta: float

    @property
    def unconfirmed(self) -> bool:
        return self.promised is not None and self.lower < self.promised

    @property
    def drift(self) -> bool:
        return self.promised is not None and self.upper <= self.promised


@dataclass
class VersionAudit:
    """One version's counted responses, their labels in order, and the sequence over them."""

    promised: float | None
    delta: float
    responses: set[str] = field(default_factory=set)
    labels: bytearray = field(default_factory=bytearray)
    sequence: ConfidenceSequence | None = None

    def __post_init__(self) -> None:
        self.rebuild()

    def rebuild(self) -> None:
        """The sequence afresh from the labels (its anchor, the promise, is decided exactly)."""
        anchors = () if self.promised is None else (self.promised,)
        self.sequence = ConfidenceSequence(self.delta, anchors=anchors)
        for correct in self.labels:
            self.sequence.update(float(correct))


class AuditMonitor:
    """Audit labels per model version and the drift alarm they give (thread-safe)."""

    def __init__(
        self,
        default_delta: float = DEFAULT_DELTA,
        labels_per_version: int = AUDIT_LABELS_PER_VERSION,
        versions: int = MONITORED_VERSIONS,
    ) -> None:
        self.default_delta = default_delta
        self._labels_per_version = labels_per_version
        self._versions_kept = versions
        self._versions: OrderedDict[str, VersionAudit] = OrderedDict()
        self._lock = threading.Lock()

    def promise(self, version: str, promised: float | None, delta: float | None = None) -> None:
        """What ``version``'s threshold promised, at which level (labels seen before are counted again)."""
        if promised is not None and not 0.0 <= promised <= 1.0:
            raise ValueError(f"a promised accuracy is in [0, 1], got {promised}")
        delta = delta or self.default_delta
        with self._lock:
            audit = self._audit(version)
            if (audit.promised, audit.delta) != (promised, delta):
                audit.promised, audit.delta = promised, delta
                audit.rebuild()

    def observe(self, version: str, response_id: str, correct: bool) -> bool:
        """An audit label of an answered choice; whether it counted (the first of its response does)."""
        with self._lock:
            audit = self._audit(version)
            if response_id in audit.responses or len(audit.labels) >= self._labels_per_version:
                return False
            audit.responses.add(response_id)
            audit.labels.append(int(bool(correct)))
            audit.sequence.update(float(bool(correct)))
            return True

    def replay(self, labels: Iterable[AuditLabel | tuple[str, str, bool]]) -> int:
        """Stored audit labels of answered choices, in the order they were made; how many counted."""
        return sum(self.observe(*label) for label in labels)

    def report(self, version: str) -> AuditReport | None:
        """None before the version's first counted label."""
        with self._lock:
            audit = self._versions.get(version)
            if audit is None or not audit.labels:
                return None
            self._versions.move_to_end(version)
            sequence = audit.sequence
            return AuditReport(
                version=version,
                labelled=sequence.count,
                accuracy=sequence.mean,
                lower=sequence.lower,
                upper=sequence.upper,
                promised=audit.promised,
                delta=audit.delta,
            )

    def _audit(self, version: str) -> VersionAudit:
        """``version``'s state, made on first use (the caller holds the lock)."""
        audit = self._versions.get(version)
        if audit is None:
            audit = self._versions[version] = VersionAudit(promised=None, delta=self.default_delta)
            while len(self._versions) > self._versions_kept:
                self._versions.popitem(last=False)
        self._versions.move_to_end(version)
        return audit
