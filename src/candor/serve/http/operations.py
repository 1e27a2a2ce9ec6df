"""Operating the service: request ids, the access log, metrics, readiness, protocol-level errors, CORS.

:func:`install_operations` wires these into an app built by
:func:`candor.serve.http.app.create_app`:

- every response carries ``x-request-id``: the client's own when it is safe
  (at most 128 characters of ``A-Z a-z 0-9 . _ : -``), a fresh one otherwise;
- one JSON access-log line per request on the ``candor.serve.access`` logger
  (request id, method, path, status, latency, answers and abstentions; the
  request's messages or prompt only with ``log_prompts``);
- a ``POST`` whose ``Content-Type`` is not JSON is refused with 415 before any
  work (a web page can send ``text/plain`` cross-origin without a preflight);
- a 503 carries ``Retry-After``; 404, 405 and validation errors answer in the
  OpenAI error shape (validation errors with 400, as OpenAI does);
- ``GET /ready`` (200 once started, 503 before, while draining and while a condition says so, such as a
  store that does not answer) and
  ``GET /metrics`` (Prometheus text, :mod:`candor.serve.http.prometheus_metrics`);
- CORS only for the origins given (none: no CORS headers at all).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import Match, Router
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from candor.serve.http.prometheus_metrics import CONTENT_TYPE, RequestTally, ServeMetrics
from candor.serve.http.responses import CANDOR_HEADERS
from candor.serve.http.schemas import error_body
from candor.util.errors import CandorError

logger = logging.getLogger(__name__)
access_logger = logging.getLogger("candor.serve.access")

REQUEST_ID_HEADER = "x-request-id"
SAFE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
RETRY_AFTER_SECONDS = 1
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
LOGGED_PROMPT_BYTES = 64 * 1024  # --log-prompts keeps at most this much of a body
ORIGIN = re.compile(r"https?://[^/\s]+")


class Lifecycle:
    """Whether the service takes traffic: ready once started, not ready while draining."""

    def __init__(self) -> None:
        self.started = False
        self.draining = False
        # Each says why the server cannot take traffic now (a store that does not answer), or None: /ready asks them.
        self.conditions: list[Callable[[], str | None]] = []

    def unready_because(self) -> str | None:
        """Why a started server cannot take traffic now (the first condition that says so), or None."""
        return next((why for why in (check() for check in self.conditions) if why is not None), None)

    @property
    def ready(self) -> bool:
        return self.started and not self.draining

    def mark_started(self) -> None:
        self.started = True

    def begin_draining(self) -> None:
        if not self.draining:
            logger.info("draining: finishing in-flight requests, accepting no new ones")
        self.draining = True


def install_operations(
    app: FastAPI,
    metrics: ServeMetrics,
    lifecycle: Lifecycle,
    *,
    cors_origins: Sequence[str] = (),
    log_prompts: bool = False,
) -> None:
    """Add the middleware, error handlers and operational endpoints to ``app``."""
    check_cors_origins(cors_origins)
    app.add_exception_handler(HTTPException, http_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, validation_error)  # type: ignore[arg-type]

    @app.get("/ready")
    async def ready() -> JSONResponse:
        if lifecycle.ready:
            why = lifecycle.unready_because()
            if why is None:
                return JSONResponse({"status": "ready"})
            return JSONResponse(error_body(why, "server_error", None, "unavailable"), status_code=503)
        state = "draining" if lifecycle.draining else "starting"
        return JSONResponse(error_body(f"the server is {state}", "server_error", None, state), status_code=503)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    if cors_origins:  # added before the operations middleware, so it runs inside it
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["*"],
            expose_headers=[REQUEST_ID_HEADER, *CANDOR_HEADERS],  # a browser app may read the confidence headers
        )
    app.add_middleware(OperationsMiddleware, metrics=metrics, router=app.router, log_prompts=log_prompts)


def check_cors_origins(origins: Sequence[str]) -> None:
    """Each origin is ``*`` or ``scheme://host[:port]`` (no path), as browsers send it."""
    for origin in origins:
        if origin != "*" and not ORIGIN.fullmatch(origin):
            raise CandorError(
                f"--cors-origin {origin!r} is not an origin: give scheme://host[:port], e.g. "
                "https://example.org (no path or trailing slash), or *"
            )


def send_access_log_to(stream: Any) -> None:
    """Write the access log to ``stream`` as bare JSON lines (one per request), apart from other logging."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    access_logger.addHandler(handler)
    access_logger.setLevel(logging.INFO)
    access_logger.propagate = False


# ---------------------------------------------------------------- error handlers


async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """404, 405 and other protocol errors in the OpenAI shape (FastAPI would answer ``{"detail"}``)."""
    where = f"{request.method} {request.url.path}"
    if exc.status_code == 404:
        body = error_body(f"no such endpoint: {where}", "invalid_request_error", None, "unknown_url")
    elif exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        body = error_body(
            f"method not allowed: {where} (allowed: {allowed})", "invalid_request_error", None, "method_not_allowed"
        )
    else:
        kind = "server_error" if exc.status_code >= 500 else "invalid_request_error"
        body = error_body(str(exc.detail), kind)
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    """A path or query parameter of the wrong type: 400 naming it, as OpenAI answers (not FastAPI's 422)."""
    first = exc.errors()[0]
    param = ".".join(str(p) for p in first["loc"][1:]) or None  # loc starts with "path", "query" or "body"
    return JSONResponse(
        error_body(f"{param}: {first['msg']}", "invalid_request_error", param, "invalid_value"), status_code=400
    )


# ---------------------------------------------------------------- middleware


def request_id_from(headers: Headers) -> str:
    """The client's ``x-request-id`` when it is safe to echo and log; a fresh one otherwise."""
    given = headers.get(REQUEST_ID_HEADER)
    if given is not None and SAFE_REQUEST_ID.fullmatch(given):
        return given
    return uuid.uuid4().hex


def is_json(content_type: str | None) -> bool:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def route_label(router: Router, scope: Scope) -> str:
    """The route's path template (bounded label values); ``unmatched`` for any other path."""
    for route in router.routes:
        match, _ = route.matches(scope)
        if match is not Match.NONE:
            return str(getattr(route, "path", "unmatched"))
    return "unmatched"


class OperationsMiddleware:
    """Request id, metrics, access log, the JSON content-type guard and ``Retry-After`` (pure ASGI,
    so streaming responses and disconnect detection pass through untouched)."""

    def __init__(self, app: ASGIApp, *, metrics: ServeMetrics, router: Router, log_prompts: bool = False) -> None:
        self.app = app
        self.metrics = metrics
        self.router = router
        self.log_prompts = log_prompts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        with self.metrics.request_scope() as tally:
            exchange = Exchange(request_id_from(headers), scope, tally, self, send)
            try:
                if scope["method"] in BODY_METHODS and not is_json(headers.get("content-type")):
                    await unsupported_media_type(headers.get("content-type"))(scope, receive, exchange.send)
                else:
                    await self.app(scope, exchange.keep_body(receive) if self.log_prompts else receive, exchange.send)
            except Exception as exc:  # the last safety net: a 500 that still carries the request id
                if exchange.status is not None:
                    raise
                logger.exception("request %s failed", exchange.request_id)
                await JSONResponse(
                    error_body(f"internal error: {type(exc).__name__}", "server_error"), status_code=500
                )(scope, receive, exchange.send)
            except asyncio.CancelledError:  # the request was cancelled (a client that went away)
                exchange.cancelled = True
                raise
            finally:
                exchange.finish()  # when no complete response went out (an error, a dropped client)

    def account(self, exchange: Exchange) -> None:
        """Count the request and write its access-log line."""
        scope, tally = exchange.scope, exchange.tally
        seconds, status = tally.elapsed(), exchange.final_status()
        self.metrics.observe_request(scope["method"], route_label(self.router, scope), status, seconds)
        line: dict[str, Any] = {
            "request_id": exchange.request_id,
            "method": scope["method"],
            "path": scope["path"],
            "status": status,
            "latency_ms": round(seconds * 1000, 3),
            "answers": tally.answers,
            "abstained": tally.abstained,
        }
        if not exchange.complete:
            line["incomplete"] = True  # the response was cut off (an error or a cancel mid-way)
        if self.log_prompts:
            line["prompt"] = logged_prompt(bytes(exchange.body))
        access_logger.info(json.dumps(line, ensure_ascii=False))


class Exchange:
    """One request and its response as the middleware sees them."""

    def __init__(
        self, request_id: str, scope: Scope, tally: RequestTally, owner: OperationsMiddleware, send: Send
    ) -> None:
        self.request_id, self.scope, self.tally, self.owner = request_id, scope, tally, owner
        self.downstream = send
        self.status: int | None = None  # set when the response starts
        self.body = bytearray()  # the request body, kept only for --log-prompts
        self.complete = False  # the last body byte went out
        self.cancelled = False
        self.finished = False

    def final_status(self) -> int:
        """The status sent; 499 (client closed request) or 500 when the response never started."""
        if self.status is not None:
            return self.status
        return 499 if self.cancelled else 500

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            out = MutableHeaders(scope=message)
            out[REQUEST_ID_HEADER] = self.request_id
            if self.status == 503 and "retry-after" not in out:
                out["Retry-After"] = str(RETRY_AFTER_SECONDS)
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.complete = True
            self.finish()  # before the last byte leaves, so a client that saw the response sees it counted
        await self.downstream(message)

    def keep_body(self, receive: Receive) -> Receive:
        async def receive_and_keep() -> Message:
            message = await receive()
            if message["type"] == "http.request" and len(self.body) < LOGGED_PROMPT_BYTES:
                self.body.extend(message.get("body", b"")[: LOGGED_PROMPT_BYTES - len(self.body)])
            return message

        return receive_and_keep

    def finish(self) -> None:
        if not self.finished:
            self.finished = True
            self.owner.account(self)


def unsupported_media_type(content_type: str | None) -> JSONResponse:
    message = f"Content-Type must be application/json, not {content_type or 'missing'}"
    return JSONResponse(error_body(message, "invalid_request_error", None, "unsupported_media_type"), status_code=415)


def logged_prompt(body: bytes) -> Any:
    """The messages or prompt of a request body (``--log-prompts``), or the raw text when it is not JSON."""
    try:
        data = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return body.decode("utf-8", "replace")
    if not isinstance(data, dict):
        return data
    return data.get("messages", data.get("prompt"))
