"""What the operator of a deployment uses beside the answers: feedback on served answers, and reloading the model.

- ``POST /v1/feedback`` (behind the key): ``{"id": <response id>, "index": <choice>,
  "correct": true|false, "label_source": "feedback"}``. The label goes to the store
  (:class:`candor.annotation.served_store.ServedStore`, and its ``--log-records`` export), where
  ``candor label`` and ``candor adapt`` read it; an id no server of the store served
  (or that its bounded remembered-response index evicted) is 404.
  Audit labels (``"label_source": "audit"``) of answered choices, the first of each response,
  feed the drift alarm on ``/metrics`` (:mod:`candor.serve.audit_monitor`), for the model
  version that answered them, read from the store (so labels made by ``candor label --audit``,
  by another replica or before a restart count alike).
- ``POST /admin/reload`` (behind the key) and ``SIGHUP``: load the ``--honest`` folder
  again (or ``{"honest": DIR}``) and swap it in between requests
  (:meth:`candor.serve.http.service.Service.reload`).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request

from candor.annotation.served_labels import LABEL_SOURCE_FEEDBACK, check_label
from candor.serve.audit_monitor import AuditMonitor, AuditReport
from candor.serve.http.prometheus_metrics import ServeMetrics
from candor.serve.http.record_log import RecordLog
from candor.serve.http.request_checks import APIError, authorize, json_body, read_body
from candor.serve.http.service import Generation, Service
from candor.serve.http.settings import ServeSettings
from candor.util.errors import CandorError

logger = logging.getLogger(__name__)

AUDIT_SYNC_S = 1.0  # /metrics reads new audit labels from the store at most this often


class FeedbackDesk:
    """Takes labels: checks them against what was served, appends them to the log, counts them."""

    def __init__(self, log: RecordLog | None, metrics: ServeMetrics) -> None:
        self.log = log
        self.metrics = metrics
        self.monitor = AuditMonitor()  # audit labels of every version; /metrics shows the current one's
        self.version = ""
        self._audited_up_to = 0  # the store's labels up to this number are in the monitor
        self._synced_at = -float("inf")
        self._sync_lock = threading.Lock()
        self.metrics.watch_feedback(self.audit_report)

    def audit_report(self) -> AuditReport | None:
        """The current version's audit, with the store's audit labels read in first (at most once a second)."""
        self.sync_audit(min_interval_s=AUDIT_SYNC_S)
        return self.monitor.report(self.version)

    def sync_audit(self, min_interval_s: float = 0.0) -> int:
        """Feed the monitor the audit labels the store gained since the last look (any process's); how many."""
        if self.log is None:
            return 0
        with self._sync_lock:
            now = time.monotonic()
            if now - self._synced_at < min_interval_s:
                return 0
            self._synced_at = now
            rows = self.log.store.audit_labels_after(self._audited_up_to)
            if rows:
                self._audited_up_to = rows[-1][0]
            return self.monitor.replay((version, response_id, correct) for _, version, response_id, correct in rows)

    def follow(self, generation: Generation) -> None:
        """A new model answers from now on: ``/metrics`` shows its audit, against its own threshold's promise."""
        threshold = generation.model.threshold
        promised = None if threshold is None else threshold.promised_accuracy
        self.monitor.promise(generation.version, promised, None if threshold is None else threshold.delta)
        self.version = generation.version

    async def take(self, data: Any) -> dict[str, Any]:
        if self.log is None:
            raise APIError(
                400,
                "feedback needs a store of served answers: start candor serve with --store URL or --log-records FILE",
                "invalid_request_error",
                None,
                "feedback_unavailable",
            )
        if not isinstance(data, dict):
            raise APIError(400, "the body must be a JSON object", "invalid_request_error", None, "invalid_json")
        response_id, index, correct = data.get("id"), data.get("index", 0), data.get("correct")
        source = data.get("label_source", LABEL_SOURCE_FEEDBACK)
        try:
            check_label(response_id, index, correct, source)
        except ValueError as exc:
            raise APIError(400, str(exc), "invalid_request_error", None, "invalid_value") from None
        served = await asyncio.to_thread(self.log.find, response_id, index)
        if served is None:
            raise APIError(
                404,
                f"no served answer has id {response_id!r} and index {index} (the store remembers the "
                "most recent responses its servers served; label older ones with `candor label`)",
                "invalid_request_error",
                "id",
                "not_found",
            )
        await asyncio.to_thread(self.log.label, response_id, index, correct, source)
        self.metrics.observe_feedback(correct, served.answered)
        await asyncio.to_thread(self.sync_audit)  # an audit label counts from now (the store holds them all)
        return {
            "object": "feedback",
            "id": response_id,
            "index": index,
            "correct": correct,
            "label_source": source,
            "model_version": served.model_version,
        }


def install_operator_routes(app: FastAPI, service: Service, settings: ServeSettings, desk: FeedbackDesk) -> None:
    """``POST /v1/feedback`` and ``POST /admin/reload``, both behind the key."""

    @app.post("/v1/feedback")
    async def feedback(request: Request) -> dict[str, Any]:
        authorize(request, settings)
        raw = await read_body(request, settings.max_body_bytes, settings.body_timeout_s)
        return await desk.take(json_body(raw))

    @app.post("/admin/reload")
    async def reload(request: Request) -> dict[str, Any]:
        authorize(request, settings)
        raw = await read_body(request, settings.max_body_bytes, settings.body_timeout_s)
        data = json_body(raw) if raw.strip() else {}
        folder = data.get("honest") if isinstance(data, dict) else None
        generation = await reload_folder(service, settings, folder)
        return {"object": "reload", "model_version": generation.version, "method": generation.model.method}


async def reload_folder(service: Service, settings: ServeSettings, folder: str | None) -> Generation:
    """Reload ``folder`` (default: ``--honest``); a folder that cannot serve is a 400 and the old model stays."""
    target = Path(folder) if folder else settings.honest_folder
    if target is None:
        raise APIError(
            400,
            'nothing to reload: start candor serve with --honest DIR, or send {"honest": DIR}',
            "invalid_request_error",
            "honest",
            "invalid_value",
        )
    try:
        generation = await service.reload(target)
    except CandorError as exc:
        service.metrics.observe_reload(ok=False)
        raise APIError(
            400,
            f"the reload failed and the running model stays: {exc}",
            "invalid_request_error",
            "honest",
            "reload_failed",
        ) from None
    service.metrics.observe_reload(ok=True)
    return generation


def reload_on_sighup(service: Service, settings: ServeSettings) -> None:
    """``SIGHUP`` reloads ``--honest`` (only where signals can be handled: the main thread, on POSIX)."""
    if settings.honest_folder is None or threading.current_thread() is not threading.main_thread():
        return
    if not hasattr(signal, "SIGHUP"):
        return
    loop = asyncio.get_running_loop()

    def on_hangup() -> None:
        task = loop.create_task(reload_folder(service, settings, None))
        task.add_done_callback(_report_reload)

    loop.add_signal_handler(signal.SIGHUP, on_hangup)


def _report_reload(task: asyncio.Task[Generation]) -> None:
    exc = task.exception()
    if exc is not None:
        logger.error("SIGHUP reload failed; the running model stays: %s", exc)
