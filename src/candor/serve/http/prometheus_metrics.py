"""The service's Prometheus metrics (``GET /metrics``), one registry per app.

Each app owns its :class:`ServeMetrics`, so several apps in one process (tests,
a benchmark) never share counts. The answering code reports events with one
call each (:meth:`ServeMetrics.observe_answer`, :meth:`ServeMetrics.observe_batch`,
:meth:`ServeMetrics.observe_first_token`); the operations middleware opens a
:meth:`ServeMetrics.request_scope` per HTTP request, which also keeps the
request's own tally (answers, abstentions) for the access log.

==========================================  =========  ======================  ============================
name                                        type       labels                  meaning
==========================================  =========  ======================  ============================
``candor_requests_total``                   counter    method, route, status   HTTP requests answered
``candor_request_duration_seconds``         histogram  route                   request latency
``candor_requests_in_flight``               gauge                              requests being served now
``candor_time_to_first_token_seconds``      histogram                          request start to first token
``candor_answers_total``                    counter                            choices returned
``candor_abstentions_total``                counter                            choices that abstained
``candor_confidence``                       histogram                          confidence of each choice
``candor_queue_depth``                      gauge                              questions in flight
``candor_batch_size``                       histogram                          questions answered together
``candor_model_info``                       gauge      version                 1 for the model answering now
``candor_reloads_total``                    counter    outcome                 reloads (ok, failed)
``candor_feedback_total``                   counter    correct, answered       labels received
``candor_feedback_accuracy``                gauge                              audited accuracy of answered
``candor_feedback_accuracy_lower``          gauge                              its anytime lower bound, δ
``candor_feedback_accuracy_upper``          gauge                              its anytime upper bound, δ
``candor_feedback_audited``                 gauge                              responses the audit counts
``candor_promised_accuracy``                gauge                              what the threshold promised
``candor_calibration_unconfirmed``          gauge                              1: lower bound below promise
``candor_calibration_drift``                gauge                              1: upper bound ≤ promise
``candor_promise_stated``                   gauge                              1: the threshold promises
``candor_store_available``                  gauge                              1: the store answers
==========================================  =========  ======================  ============================

The accuracy gauges count audit labels only (``label_source: "audit"``, one per response, on
answered choices; :mod:`candor.serve.audit_monitor`); they are NaN before the first, and follow
the current model version. ``candor_calibration_unconfirmed`` and ``_drift`` compare with a promise:
without one (no threshold, or one that states no accuracy: ``candor_promise_stated`` 0) they are NaN,
never 0, since no label can show a promise holds or fails that was never made. A scrape reads only
what the server holds (the audit is polled from the store in the background), so it never waits on
the database.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

if TYPE_CHECKING:
    from candor.serve.answering import HonestAnswer
    from candor.serve.audit_monitor import AuditReport

CONTENT_TYPE = CONTENT_TYPE_LATEST
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
CONFIDENCE_BUCKETS = tuple(i / 10 for i in range(11))  # raw estimator scores below 0 fall in le="0.0"
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


NO_PROMISE = "NaN before the first audit label, and always while the threshold states no promise (nothing to check)."
AUDIT_LABELS = (
    'Counts only audit labels (label_source "audit": a uniform sample of served responses), '
    "the first label of an answered choice per response, of the current model version."
)
FEEDBACK_GAUGES = {
    "feedback_accuracy": f"Accuracy of answered questions in the audit. {AUDIT_LABELS}",
    "feedback_accuracy_lower": (
        f"Anytime-valid lower bound of the audited accuracy at level delta (a betting confidence sequence). "
        f"{AUDIT_LABELS}"
    ),
    "feedback_accuracy_upper": (
        f"Anytime-valid upper bound of the audited accuracy at level delta (a betting confidence sequence). "
        f"{AUDIT_LABELS}"
    ),
    "feedback_audited": f"Responses the audit counts. {AUDIT_LABELS}",
    "promised_accuracy": "The accuracy of answered questions the threshold promised when it was tuned.",
    "calibration_unconfirmed": (
        f"1 while the anytime lower bound is below the promise (the audit does not show it holds). {AUDIT_LABELS} "
        f"{NO_PROMISE}"
    ),
    "calibration_drift": (
        "1 once the anytime upper bound is at or below the promise: the audit shows, at level delta "
        "(valid at every scrape), that answered accuracy fell below it; stays on for the version. "
        f"{AUDIT_LABELS} {NO_PROMISE}"
    ),
}
PROMISE_STATED = (
    "1 when the current model's threshold states a promised accuracy of answered questions (risk or accuracy "
    "rule, or the dev accuracy it was tuned on) for the audit to check; 0 without a threshold or a promise: "
    "then the drift alarm cannot fire and its gauges are NaN."
)


def _read_or_nan(report: AuditReport | None, read: Callable[[AuditReport], float | None]) -> float:
    value = None if report is None else read(report)
    return float("nan") if value is None else float(value)


@dataclass
class RequestTally:
    """What one HTTP request did, for its access-log line."""

    started: float  # time.monotonic() at arrival
    answers: int = 0
    abstained: int = 0
    first_token_seen: bool = False

    def elapsed(self) -> float:
        return time.monotonic() - self.started


# The request being served in this task (asyncio copies it into the route's context).
_current_request: ContextVar[RequestTally | None] = ContextVar("candor_current_request", default=None)


class ServeMetrics:
    """The counters, gauges and histograms of one app, in their own ``CollectorRegistry``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry
        self.requests = Counter(
            "candor_requests",
            "HTTP requests answered, by method, route and status.",
            ["method", "route", "status"],
            registry=reg,
        )
        self.latency = Histogram(
            "candor_request_duration_seconds",
            "Request latency, arrival to last byte.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.in_flight = Gauge(
            "candor_requests_in_flight", "Requests being served now (a scrape counts itself).", registry=reg
        )
        self.first_token = Histogram(
            "candor_time_to_first_token_seconds",
            "Request arrival to its first generated token reaching the client.",
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.answers = Counter("candor_answers", "Choices returned, answered or abstained.", registry=reg)
        self.abstentions = Counter("candor_abstentions", "Choices that abstained.", registry=reg)
        self.confidence = Histogram(
            "candor_confidence", "The confidence of each returned choice.", buckets=CONFIDENCE_BUCKETS, registry=reg
        )
        self.queue_depth = Gauge("candor_queue_depth", "Questions in flight (being answered or waiting).", registry=reg)
        self.batch_size = Histogram(
            "candor_batch_size",
            "Questions in flight when a question is admitted (itself included): the batch it joins.",
            buckets=BATCH_BUCKETS,
            registry=reg,
        )
        self.model_info = Gauge(
            "candor_model_info", "1 for the honest-model version answering now.", ["version"], registry=reg
        )
        self.reloads = Counter("candor_reloads", "Model reloads, by outcome.", ["outcome"], registry=reg)
        self.feedback = Counter(
            "candor_feedback", "Labels received on served answers.", ["correct", "answered"], registry=reg
        )
        self.feedback_gauges = {
            name: Gauge(f"candor_{name}", text, registry=reg) for name, text in FEEDBACK_GAUGES.items()
        }
        self.promise_stated = Gauge("candor_promise_stated", PROMISE_STATED, registry=reg)
        self.store_available: Gauge | None = None  # registered by watch_store (absent without a store)

    # ------------------------------------------------------------ events

    def watch_queue(self, depth: Callable[[], float]) -> None:
        """Read the queue depth from ``depth()`` at each scrape."""
        self.queue_depth.set_function(depth)

    def observe_answer(self, answer: HonestAnswer) -> None:
        """One returned choice: its confidence, and whether it abstained."""
        self.answers.inc()
        self.confidence.observe(answer.confidence)
        if answer.abstained:
            self.abstentions.inc()
        tally = _current_request.get()
        if tally is not None:
            tally.answers += 1
            tally.abstained += int(answer.abstained)

    def observe_answers(self, answers: Iterable[Iterable[HonestAnswer]]) -> None:
        """Every choice of a response (one list per question)."""
        for per_question in answers:
            for answer in per_question:
                self.observe_answer(answer)

    def observe_model(self, version: str) -> None:
        """The model answering from now on (at start and after each reload)."""
        self.model_info.clear()
        self.model_info.labels(version=version).set(1)

    def observe_reload(self, ok: bool) -> None:
        self.reloads.labels(outcome="ok" if ok else "failed").inc()

    def observe_feedback(self, correct: bool, answered: bool) -> None:
        self.feedback.labels(correct=str(bool(correct)).lower(), answered=str(bool(answered)).lower()).inc()

    def watch_feedback(self, report: Callable[[], AuditReport | None]) -> None:
        """Read the audited accuracy and its alarms from ``report()`` at each scrape (NaN while it is None)."""
        readers: dict[str, Callable[[AuditReport], float | None]] = {
            "feedback_accuracy": lambda r: r.accuracy,
            "feedback_accuracy_lower": lambda r: r.lower,
            "feedback_accuracy_upper": lambda r: r.upper,
            "feedback_audited": lambda r: r.labelled,
            "promised_accuracy": lambda r: r.promised,
            "calibration_unconfirmed": lambda r: None if r.promised is None else float(r.unconfirmed),
            "calibration_drift": lambda r: None if r.promised is None else float(r.drift),
        }
        for name, read in readers.items():
            self.feedback_gauges[name].set_function(lambda read=read: _read_or_nan(report(), read))

    def observe_promise(self, promised: float | None) -> None:
        """Whether the model answering from now on states a promise for the audit to check."""
        self.promise_stated.set(0.0 if promised is None else 1.0)

    def watch_store(self, available: Callable[[], bool]) -> None:
        """Read whether the store answers from ``available()`` at each scrape (it reads a flag, never the store)."""
        if self.store_available is None:
            self.store_available = Gauge(
                "candor_store_available",
                "1 while the store of served answers answers; 0 while it does not (then /ready is 503 and "
                "questions are refused before any work).",
                registry=self.registry,
            )
        self.store_available.set_function(lambda: float(available()))

    def observe_batch(self, size: int) -> None:
        """A question admitted while ``size`` questions (itself included) are being answered."""
        self.batch_size.observe(size)

    def observe_first_token(self, seconds: float | None = None) -> None:
        """The first token reached the client; by default timed from the current request's arrival.

        Counted once per request, so a stream may call it for every chunk.
        """
        tally = _current_request.get()
        if tally is not None:
            if tally.first_token_seen:
                return
            tally.first_token_seen = True
        if seconds is None:
            if tally is None:
                return  # outside a request there is no arrival to time from
            seconds = tally.elapsed()
        self.first_token.observe(seconds)

    # ------------------------------------------------------------ requests

    @contextlib.contextmanager
    def request_scope(self) -> Iterator[RequestTally]:
        """Around one HTTP request: counts it in flight and makes its tally current."""
        tally = RequestTally(time.monotonic())
        token = _current_request.set(tally)
        self.in_flight.inc()
        try:
            yield tally
        finally:
            self.in_flight.dec()
            _current_request.reset(token)

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method=method, route=route, status=str(status)).inc()
        self.latency.labels(route=route).observe(seconds)

    def render(self) -> bytes:
        """The Prometheus text exposition of this app's metrics."""
        return generate_latest(self.registry)
