"""What the operator of a deployment uses beside the answers: feedback on served answers, and reloading the model.

Two keys (:mod:`candor.serve.http.request_checks`): the inference key of the
service's clients, and the operator key (``--admin-key-env``, ``$CANDOR_ADMIN_KEY``).
Without an operator key the operator routes are off (403).

- ``POST /v1/feedback``: ``{"id": <response id>, "index": <choice>, "correct": true|false}``.
  With the inference key it is end-user feedback: the server labels it
  ``label_source: "user"`` (a body naming another source is 403), and a choice the
  client saw as a refusal (abstained) cannot be labelled (400). With the operator key
  the body may name a trusted source (:data:`OPERATOR_SOURCES`, or ``judge:NAME``;
  default ``human``), on any choice. The label goes to the store
  (:class:`candor.annotation.served_store.ServedStore`, and its ``--log-records`` export), where
  ``candor label`` and ``candor adapt`` read it; an id no server of the store served
  (or that its bounded remembered-response index evicted) is 404 ``not_found``, one whose record
  retention deleted is 404 ``record_gone``. A client's feedback is one label per choice and key (the
  key hashed, :func:`label_author`): a repeat replaces the earlier one. Bad fields are 400 naming
  the field (``param``) before any store call; while the store does not answer, 503
  ``store_unavailable`` (:mod:`candor.serve.http.record_log`).
  Audit labels (``"label_source": "audit"``) of answered choices, the first of each response,
  feed the drift alarm on ``/metrics`` (:mod:`candor.serve.audit_monitor`), for the model
  version that answered them, read from the store every :data:`AUDIT_SYNC_S` in the background
  (so labels made by ``candor label --audit``, by another replica or before a restart count alike,
  and a scrape never waits on the database).
- ``POST /admin/reload`` (operator key) and ``SIGHUP``: load the ``--honest`` folder
  again (or ``{"honest": DIR}``, a folder inside ``--honest-root``) and swap it in
  between requests, with the deployment's options
  (:meth:`candor.serve.http.service.Service.reload`). A folder outside the root, or
  that cannot serve, is a 400 whose text names no file outside it, and the running
  model stays. A folder ``candor adapt`` marked kept (its adapted head was not shown
  to rank better on held-out labels: :mod:`candor.serve.promotion`) is a 409
  (``not_promotable``) unless the body says ``"force": true``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import signal
import threading
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request

from candor.annotation.served_labels import (
    LABEL_SOURCE_AUDIT,
    LABEL_SOURCE_HUMAN,
    LABEL_SOURCE_USER,
    LabelError,
    check_label,
    shown,
)
from candor.annotation.served_store import RecordGone
from candor.serve.audit_monitor import AuditMonitor, AuditReport
from candor.serve.honest_folder import read_config
from candor.serve.http.prometheus_metrics import ServeMetrics
from candor.serve.http.record_log import PROBE_INTERVAL_S, RecordLog, StoreUnavailable
from candor.serve.http.request_checks import (
    CLIENT,
    APIError,
    authorize_operator,
    caller_role,
    json_body,
    read_body,
)
from candor.serve.http.service import Generation, Service
from candor.serve.http.settings import ServeSettings
from candor.serve.promotion import NotPromotable, check_promotable
from candor.serve.root_guard import confine
from candor.util.errors import CandorError

logger = logging.getLogger(__name__)

AUDIT_SYNC_S = PROBE_INTERVAL_S  # the audit labels are read from the store this often (the store's probe)
OPERATOR_WHO = "operator"  # who an operator-key label is from (a client's: its key, hashed; KEY_WHO)
# The label sources the operator key may name (and ``judge:NAME``); a client's feedback is always LABEL_SOURCE_USER.
OPERATOR_SOURCES = (LABEL_SOURCE_HUMAN, LABEL_SOURCE_AUDIT, LABEL_SOURCE_USER)
JUDGE_PREFIX = "judge:"
RELOAD_FIELDS = ("honest", "force")  # force: reload a folder candor adapt marked kept


class FeedbackDesk:
    """Takes labels: checks them against what was served, appends them to the log, counts them."""

    def __init__(self, log: RecordLog | None, metrics: ServeMetrics) -> None:
        self.log = log
        self.metrics = metrics
        self.monitor = AuditMonitor()  # audit labels of every version; /metrics shows the current one's
        self.version = ""
        self._audited_up_to = 0  # the store's labels up to this number are in the monitor
        self._sync_lock = threading.Lock()
        self.metrics.watch_feedback(self.audit_report)

    def audit_report(self) -> AuditReport | None:
        """The current version's audit as last read from the store (never reads it: a scrape never waits on it)."""
        return self.monitor.report(self.version)

    def sync_audit(self) -> int:
        """Feed the monitor the audit labels the store gained since the last look (any process's); how many.

        Runs on the store's threads (:meth:`RecordLog.call`): every :data:`AUDIT_SYNC_S` from :meth:`watch`, and
        after each label this server takes. The store's audit labels commit in the order of their numbers, so the
        last number read is a safe watermark and every replica counts the same labels in the same order.
        """
        if self.log is None:
            return 0
        with self._sync_lock:
            rows = self.log.store.audit_labels_after(self._audited_up_to)
            if rows:
                self._audited_up_to = rows[-1][0]
            return self.monitor.replay((version, response_id, correct) for _, version, response_id, correct in rows)

    async def watch(self) -> None:
        """Poll the store's audit labels every :data:`AUDIT_SYNC_S`; the poll is also the store's health probe."""
        if self.log is not None:
            await self.log.watch(self.sync_audit, AUDIT_SYNC_S)

    def follow(self, generation: Generation) -> None:
        """A new model answers from now on: ``/metrics`` shows its audit, against its own threshold's promise."""
        threshold = generation.model.threshold
        promised = None if threshold is None else threshold.promised_accuracy
        if threshold is not None and promised is None:
            logger.warning(
                "model %s: its threshold (rule %r) states no promised accuracy, so audit labels have nothing to "
                "check: the drift gauges stay NaN (candor_promise_stated 0)",
                generation.version,
                threshold.rule,
            )
        self.metrics.observe_promise(promised)
        self.monitor.promise(generation.version, promised, None if threshold is None else threshold.delta)
        self.version = generation.version

    async def take(self, data: Any, role: str, who: str = "") -> dict[str, Any]:
        """Take one label from ``role`` (:data:`~candor.serve.http.request_checks.CLIENT` or ``OPERATOR``), sent
        by ``who`` (a client's key, hashed: one label per choice and key, a repeat replaces it)."""
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
        source = label_source_of(data, role)
        try:
            check_label(response_id, index, correct, source)
        except LabelError as exc:
            raise APIError(400, str(exc), "invalid_request_error", exc.field, "invalid_value") from None
        log = self.log
        log.require_available()
        served = await log.call(log.find, response_id, index)
        if served is None:
            raise APIError(
                404,
                f"no served answer has id {shown(response_id)} and index {index} (the store remembers the "
                "most recent responses its servers served; label older ones with `candor label`)",
                "invalid_request_error",
                "id",
                "not_found",
            )
        if role == CLIENT and not served.answered:
            raise APIError(
                400,
                f"the choice {index} of {shown(response_id)} abstained: the client saw the refusal, not an answer "
                "to label",
                "invalid_request_error",
                "index",
                "abstained",
            )
        try:
            await log.call(log.label, response_id, index, correct, source, who)
        except RecordGone as exc:
            raise APIError(404, str(exc), "invalid_request_error", "id", "record_gone") from None
        self.metrics.observe_feedback(correct, served.answered)
        if source == LABEL_SOURCE_AUDIT:  # an audit label counts from now (the store holds them all)
            with contextlib.suppress(StoreUnavailable):  # the label is stored: if this fails, the next poll counts it
                await log.call(self.sync_audit)
        return {
            "object": "feedback",
            "id": response_id,
            "index": index,
            "correct": correct,
            "label_source": source,
            "model_version": served.model_version,
        }


def label_author(request: Request, role: str) -> str:
    """Who a label is from: the operator, or a client's key (hashed; no key set: every client is one, ``key:``)."""
    if role != CLIENT:
        return OPERATOR_WHO
    key = request.headers.get("authorization", "").strip().partition(" ")[2].strip()
    return "key:" + hashlib.sha256(key.encode("utf-8", "replace")).hexdigest()[:16]


def label_source_of(data: dict[str, Any], role: str) -> str:
    """The label's source, set by the server from who sent it: a client's is ``user``; the operator may name one."""
    named = data.get("label_source")
    if role == CLIENT:
        if named is not None and named != LABEL_SOURCE_USER:
            raise APIError(
                403,
                f"label_source: feedback with the inference key is labelled {LABEL_SOURCE_USER!r} by the server; "
                "other sources need the operator key",
                "permission_error",
                "label_source",
                "operator_key_required",
            )
        return LABEL_SOURCE_USER
    if named is None:
        return LABEL_SOURCE_HUMAN
    if isinstance(named, str) and (
        named in OPERATOR_SOURCES or (named.startswith(JUDGE_PREFIX) and named[len(JUDGE_PREFIX) :].strip())
    ):
        return named
    raise APIError(
        400,
        f"label_source must be one of {', '.join(OPERATOR_SOURCES)} or {JUDGE_PREFIX}NAME, got {shown(named)}",
        "invalid_request_error",
        "label_source",
        "invalid_value",
    )


def install_operator_routes(app: FastAPI, service: Service, settings: ServeSettings, desk: FeedbackDesk) -> None:
    """``POST /v1/feedback`` (either key; the source follows it) and ``POST /admin/reload`` (the operator key)."""

    @app.post("/v1/feedback")
    async def feedback(request: Request) -> dict[str, Any]:
        role = caller_role(request, settings)
        raw = await read_body(request, settings.max_body_bytes, settings.body_timeout_s)
        data = json_body(raw, request.headers.get("content-type"))
        return await desk.take(data, role, label_author(request, role))

    @app.post("/admin/reload")
    async def reload(request: Request) -> dict[str, Any]:
        authorize_operator(request, settings)
        raw = await read_body(request, settings.max_body_bytes, settings.body_timeout_s)
        data = json_body(raw, request.headers.get("content-type")) if raw.strip() else {}
        if not isinstance(data, dict):
            raise APIError(400, "the body must be a JSON object", "invalid_request_error", None, "invalid_json")
        for name in data:
            if name not in RELOAD_FIELDS:
                raise APIError(
                    400,
                    f"{shown(name)}: unknown field (a reload takes only 'honest' and 'force')",
                    "invalid_request_error",
                    name[:64],
                    "unknown_field",
                )
        force = data.get("force", False)
        if not isinstance(force, bool):
            raise APIError(
                400,
                f"force: must be true or false, got {json_type(force)}",
                "invalid_request_error",
                "force",
                "invalid_value",
            )
        folder = data.get("honest")
        if folder is not None and (not isinstance(folder, str) or not folder.strip() or "\x00" in folder):
            raise APIError(
                400,
                f"honest: must be the name of a folder inside --honest-root, got {json_type(folder)}",
                "invalid_request_error",
                "honest",
                "invalid_value",
            )
        target = settings.honest_folder if folder is None else folder_in_root(folder, settings.honest_root)
        if target is not None and not force:
            await refuse_kept(target)
        generation = await reload_folder(service, settings, target)
        return {
            "object": "reload",
            "model_version": generation.version,
            "method": generation.model.method,
            "forced": force,
        }


async def refuse_kept(folder: Path) -> None:
    """A 409 for a folder ``candor adapt`` marked kept (:func:`candor.serve.promotion.check_promotable`)."""
    try:
        await asyncio.to_thread(check_promotable, folder)
    except NotPromotable as exc:
        raise APIError(
            409,
            f"the reload was refused and the running model stays: {exc}",
            "invalid_request_error",
            "honest",
            "not_promotable",
        ) from None


def json_type(value: Any) -> str:
    """How a wrong value is named back: its JSON type, or an empty string (never its content)."""
    if isinstance(value, str):
        return "an empty string" if not value.strip() else "a string holding a NUL"
    names = {bool: "a boolean", int: "a number", float: "a number", list: "an array", dict: "an object"}
    return names.get(type(value), "null")


def folder_in_root(given: str, root: Path | None) -> Path:
    """``given`` (relative to ``root``, or absolute) as a folder inside ``root``, symlinks followed; else a 400.

    Every refusal reads the same and names no file, so the answer tells nothing about what lies outside.
    """
    refused = APIError(
        400,
        "honest: not a folder inside --honest-root (name it by its path inside the root)",
        "invalid_request_error",
        "honest",
        "invalid_value",
    )
    if root is None:
        raise APIError(
            400,
            "honest: this server reloads only its --honest folder; start it with --honest-root DIR "
            "to reload other folders inside DIR",
            "invalid_request_error",
            "honest",
            "invalid_value",
        )
    try:
        base = root.resolve(strict=True)
        folder = (base / given).resolve()  # an absolute ``given`` stands alone
        inside = folder != base and folder.is_relative_to(base) and folder.is_dir()
    except (OSError, RuntimeError, ValueError):  # a symlink loop, a name the filesystem refuses
        raise refused from None
    if not inside:
        raise refused
    return folder


async def reload_folder(service: Service, settings: ServeSettings, target: Path | None) -> Generation:
    """Reload ``target`` (None: ``--honest``); a folder that cannot serve is a 400 and the old model stays."""
    if target is None:
        raise APIError(
            400,
            'nothing to reload: start candor serve with --honest DIR, or send {"honest": DIR}',
            "invalid_request_error",
            "honest",
            "invalid_value",
        )
    try:
        await asyncio.to_thread(confine_reload, target, settings, service.generation().model.backend.model_name)
        generation = await service.reload(target, batch_size=settings.max_batch)
    except CandorError as exc:
        service.metrics.observe_reload(ok=False)
        raise APIError(
            400,
            f"the reload failed and the running model stays: {public_text(str(exc), target, settings)}",
            "invalid_request_error",
            "honest",
            "reload_failed",
        ) from None
    except APIError:
        raise
    except Exception:  # weights that do not load, a generator that cannot start: the log says why
        logger.exception("reloading %s failed; the running model stays", target)
        service.metrics.observe_reload(ok=False)
        raise APIError(
            400,
            "the reload failed and the running model stays: the folder could not be loaded (the server's log says why)",
            "invalid_request_error",
            "honest",
            "reload_failed",
        ) from None
    service.metrics.observe_reload(ok=True)
    return generation


def confine_reload(target: Path, settings: ServeSettings, serving_model: str | None) -> None:
    """Refuse ``target`` unless what it holds and names stays inside ``--honest-root`` (:mod:`candor.serve.root_guard`).

    ``--honest`` itself, when it lies outside ``--honest-root``, is held inside the folder that holds it.
    """
    root = settings.honest_root
    if root is None or not target.resolve().is_relative_to(root.resolve()):
        root = target.resolve().parent
    confine(target, root, read_config, serving_model)


ERRNO = re.compile(r"\[Errno -?\d+\][^:()]*:?\s*")
# An absolute path left in an error once the root's and --honest's paths are named from the root: one outside them.
OUTSIDE_PATH = re.compile(r"(?<![\w.~-])~?/[^\s'\"(),:;]+")


def public_text(message: str, folder: Path, settings: ServeSettings) -> str:
    """A reload error as a client may read it: paths named from the root (or ``--honest``), no errno strings."""
    names: list[tuple[str, str]] = []
    if settings.honest_root is not None:
        with_root = settings.honest_root.resolve()
        if folder.is_relative_to(with_root):
            names.append((str(folder), str(folder.relative_to(with_root))))
        names += [(str(with_root), "--honest-root"), (str(settings.honest_root), "--honest-root")]
    if settings.honest_folder is not None:
        names += [(str(settings.honest_folder.resolve()), "--honest"), (str(settings.honest_folder), "--honest")]
    for path, name in sorted(names, key=lambda pair: -len(pair[0])):  # the longest first: a folder before its root
        message = message.replace(path, name)
    return OUTSIDE_PATH.sub("(a path outside --honest-root)", ERRNO.sub("", message))


def reload_on_sighup(service: Service, settings: ServeSettings) -> None:
    """``SIGHUP`` reloads ``--honest`` (only where signals can be handled: the main thread, on POSIX)."""
    if settings.honest_folder is None or threading.current_thread() is not threading.main_thread():
        return
    if not hasattr(signal, "SIGHUP"):
        return
    loop = asyncio.get_running_loop()

    def on_hangup() -> None:
        task = loop.create_task(reload_folder(service, settings, settings.honest_folder))
        task.add_done_callback(_report_reload)

    loop.add_signal_handler(signal.SIGHUP, on_hangup)


def _report_reload(task: asyncio.Task[Generation]) -> None:
    exc = task.exception()
    if exc is not None:
        logger.error("SIGHUP reload failed; the running model stays: %s", exc)
