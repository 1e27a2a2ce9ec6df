"""The OpenAI-compatible service around a :class:`~candor.serve.HonestModel` (``candor serve``).

- ``POST /v1/chat/completions`` and ``POST /v1/completions``: OpenAI request and
  response shapes, plain or streamed (``stream: true``: server-sent chunks,
  ``data: [DONE]``). A chat request is a conversation: its last user message
  is the question, asked after the system message and earlier turns, all
  rendered by the model's QA template (``conversations="refuse"``: one user
  message only). Each completion prompt is a question asked alone. Each choice
  carries a ``confidence`` object; an abstained choice has ``finish_reason:
  "abstained"`` and the refusal text in OpenAI's ``refusal`` field
  (``message.refusal``, ``delta.refusal``; a completion's ``text``), never
  the withheld answer. An answer-level source's stream is buffered until its
  decision (``stream="live"``: tokens as they come, withdrawn by the refusal).
- ``GET /health`` (alive), ``GET /ready``, ``GET /metrics``, ``GET /v1/models``,
  ``GET /v1/models/{id}``; request ids, the access log, CORS and protocol-level
  errors are :mod:`candor.serve.operations`, the metrics :mod:`candor.serve.prometheus_metrics`.
- ``GET /`` the playground page (:mod:`candor.serve.playground`).
- Limits (body size, body-read time, question length, ``n``, ``max_tokens``: the
  model's context) answer 4xx in the OpenAI error shape; a full queue answers 503; with an API key set, a request
  without the right ``Authorization: Bearer`` key answers 401 (the scheme is
  case-insensitive). Bodies are parsed strictly: ``"n": true`` or
  ``"max_tokens": "10"`` answer 400 naming the field, never coerced.
- Every question is checked, templated and counted in tokens before any work
  (a bad one is its own request's 400); a request's questions are then
  admitted together (or 503, with nothing started) and each runs as its own
  flow on the engine (:mod:`candor.serve.batching`): the backend's live decode
  loop, where a question joins the running batch at the next step, or
  micro-batches of ``generate`` for a backend without one. A failure stays with
  its own request; a client that leaves cancels its queued and running work.

The confidence is the method's own (:meth:`HonestModel.answer_asks`): the
request's ``temperature``, ``top_p``, ``max_tokens``, ``stop``, ``seed`` and
``n`` shape the returned text only, and ``scores_returned_text`` says when that
text is not the answer the confidence was computed for.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from pydantic import BaseModel, ValidationError

from candor.backends.base import LiveEngine
from candor.serve.answering import Ask, Cancelled, ContextLengthExceeded, HonestAnswer, Reply, check_text
from candor.serve.api_docs import install_docs
from candor.serve.batching import Admission, QueueFull
from candor.serve.model import DEFAULT_REFUSAL, HonestModel
from candor.serve.operations import Lifecycle, install_operations
from candor.serve.playground import playground_html
from candor.serve.prometheus_metrics import ServeMetrics
from candor.serve.record_log import RecordLog
from candor.serve.schemas import ChatRequest, CompletionRequest, error_body
from candor.serve.streaming import DONE, RequestListener, TextDelta, sse
from candor.util.errors import CandorError, UpstreamError

logger = logging.getLogger(__name__)


MAX_STOPS = 4  # as the OpenAI API


@dataclass(frozen=True)
class ServeSettings:
    """Limits and behaviour of the service; the defaults suit the embedded CPU model."""

    model_id: str = "candor"
    api_key: str | None = None
    refusal: str = DEFAULT_REFUSAL
    max_body_bytes: int = 256 * 1024
    max_question_chars: int = 32_000  # all of a request's messages (or prompts); tokens are bounded by the context
    max_n: int = 4
    max_tokens: int | None = None  # a request's max_tokens at most; None: bounded by the model's context alone
    max_prompts: int = 16  # prompts in one /v1/completions request
    queue_size: int = 64  # questions in flight (answering or waiting) before 503
    max_batch: int = 16  # questions decoded together (1 turns batching off)
    batch_wait_ms: float = 5.0
    cors_origins: tuple[str, ...] = ()  # browser origins allowed by CORS; none: no CORS headers
    log_prompts: bool = False  # the access log carries each request's messages or prompt
    log_records: Path | None = None  # append served answers as candor records (JSONL)
    conversations: str = "accept"  # "refuse": a chat request must hold exactly one user message
    stream: str = "buffered"  # "live": an answer-level source streams tokens before its decision
    docs: bool = False  # /docs and /openapi.json, behind the key
    body_timeout_s: float = 10.0  # a body not fully sent in this time answers 408

    def __post_init__(self) -> None:
        for name, allowed in (("conversations", CONVERSATION_MODES), ("stream", STREAM_MODES)):
            if getattr(self, name) not in allowed:
                raise CandorError(f"--{name} must be one of {', '.join(allowed)}; got {getattr(self, name)!r}")


CONVERSATION_MODES = ("accept", "refuse")
STREAM_MODES = ("buffered", "live")
# A request's max_tokens cap where the backend does not say its context (an OpenAI-compatible server).
UNKNOWN_CONTEXT_MAX_TOKENS = 4096


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.body = status, error_body(message, type_, param, code)


def create_app(model: HonestModel, settings: ServeSettings | None = None) -> FastAPI:
    """The FastAPI app; run it with uvicorn (``candor serve`` does)."""
    settings = settings or ServeSettings()
    metrics, lifecycle = ServeMetrics(), Lifecycle()
    admission = Admission(settings.queue_size)
    service = Service(model, admission, metrics, lifecycle)
    log = RecordLog(settings.log_records) if settings.log_records is not None else None

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        service.engine = model.open_engine(settings.max_batch, settings.batch_wait_ms)
        lifecycle.mark_started()
        yield
        lifecycle.begin_draining()
        await asyncio.to_thread(service.engine.close)
        if log is not None:
            log.close()

    # The generated API docs are off unless asked for, and then behind the key and without a CDN.
    app = FastAPI(title="candor", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.service, app.state.admission = service, admission
    app.state.metrics, app.state.lifecycle = metrics, lifecycle
    metrics.watch_queue(lambda: admission.in_flight)
    install_operations(app, metrics, lifecycle, cors_origins=settings.cors_origins, log_prompts=settings.log_prompts)
    app.state.record_log = log

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body, status_code=exc.status)

    @app.exception_handler(CandorError)
    async def _user_error(_: Request, exc: CandorError) -> JSONResponse:
        return JSONResponse(error_body(str(exc), "invalid_request_error"), status_code=400)

    @app.exception_handler(UpstreamError)
    async def _upstream_error(_: Request, exc: UpstreamError) -> JSONResponse:
        return JSONResponse(error_body(str(exc), "server_error"), status_code=502)

    @app.get("/", include_in_schema=False)
    async def playground() -> HTMLResponse:
        return HTMLResponse(playground_html())

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": settings.model_id, "in_flight": admission.in_flight,
                "admitted": admission.admitted}  # fmt: skip

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        _authorize(request, settings)
        return {"object": "list", "data": [_model_card(settings)]}

    @app.get("/v1/models/{model_id:path}")
    async def model_card(model_id: str, request: Request) -> dict[str, Any]:
        _authorize(request, settings)
        if model_id != settings.model_id:
            raise APIError(404, f"the model {model_id!r} does not exist; this server serves {settings.model_id!r}",
                           "invalid_request_error", "model", "model_not_found")  # fmt: skip
        return _model_card(settings)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        _authorize(request, settings)
        body = await _parse(request, ChatRequest, settings, model)
        return await _serve(request, [_conversation(body, settings)], body, settings, model, service, CHAT, log)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        _authorize(request, settings)
        body = await _parse(request, CompletionRequest, settings, model)
        questions = body.questions()
        if not 1 <= len(questions) <= settings.max_prompts:
            raise APIError(400, f"prompt must hold 1 to {settings.max_prompts} strings", "invalid_request_error",
                           "prompt", "invalid_value")  # fmt: skip
        return await _serve(request, [((), q) for q in questions], body, settings, model, service, COMPLETION, log)

    if settings.docs:
        install_docs(app, lambda request: _authorize(request, settings))
    return app


def _model_card(settings: ServeSettings) -> dict[str, Any]:
    return {"id": settings.model_id, "object": "model", "created": 0, "owned_by": "candor"}


def _authorize(request: Request, settings: ServeSettings) -> None:
    if settings.api_key is None:
        return
    scheme, _, given = request.headers.get("authorization", "").strip().partition(" ")
    # The scheme is case-insensitive (RFC 9110 §11.1): "bearer KEY" is as good as "Bearer KEY".
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), settings.api_key.encode()):
        raise APIError(401, "invalid or missing API key (send Authorization: Bearer <key>)",
                       "authentication_error", None, "invalid_api_key")  # fmt: skip


async def _read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed ``limit`` (before it is all read).

    A client that has not sent the whole body within ``timeout_s`` is answered 408, so half-sent
    bodies cannot hold connections open.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"request body is larger than {limit} bytes", "invalid_request_error", None,
                       "request_too_large")  # fmt: skip
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise APIError(413, f"request body is larger than {limit} bytes", "invalid_request_error", None,
                                   "request_too_large")  # fmt: skip
                chunks.append(chunk)
    except TimeoutError:
        raise APIError(408, f"the request body was not received within {timeout_s:g} s", "invalid_request_error",
                       None, "request_timeout") from None  # fmt: skip
    return b"".join(chunks)


def _json_body(raw: bytes) -> Any:
    """The parsed body; what JSON itself refuses, or Python cannot hold, is a 400 naming why."""
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError, and integers beyond Python's digit limit
        message = f"the body is not valid JSON: {exc}"
    except RecursionError:
        message = "the body is not valid JSON here: it nests too deeply"
    raise APIError(400, message, "invalid_request_error", None, "invalid_json")


async def _parse(request: Request, schema: type[BaseModel], settings: ServeSettings, model: HonestModel) -> Any:
    raw = await _read_body(request, settings.max_body_bytes, settings.body_timeout_s)
    data = _json_body(raw)
    if not isinstance(data, dict):
        raise APIError(400, "the body must be a JSON object", "invalid_request_error", None, "invalid_json")
    try:
        body = schema.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise APIError(400, f"{param}: {first['msg']}", "invalid_request_error", param, "invalid_value") from None
    _check_limits(body, settings, model)
    return body


def _check_limits(body: ChatRequest | CompletionRequest, settings: ServeSettings, model: HonestModel) -> None:
    for name in body.unsupported():
        raise APIError(400, f"{name} is not supported by candor", "invalid_request_error", name, "unsupported")
    if body.model != settings.model_id:
        raise APIError(404, f"the model {body.model!r} does not exist; this server serves {settings.model_id!r}",
                       "invalid_request_error", "model", "model_not_found")  # fmt: skip
    if not 1 <= body.n <= settings.max_n:
        raise APIError(400, f"n must be between 1 and {settings.max_n}", "invalid_request_error", "n", "invalid_value")
    stops = body.stops()
    try:
        for stop in stops:
            check_text(stop, "a stop string")
    except CandorError as exc:
        raise APIError(400, str(exc), "invalid_request_error", "stop", "invalid_value") from None
    if len(stops) > MAX_STOPS or any(not s or len(s) > 64 for s in stops):
        raise APIError(400, f"stop takes at most {MAX_STOPS} non-empty strings of up to 64 characters",
                       "invalid_request_error", "stop", "invalid_value")  # fmt: skip
    cap = body.token_cap()
    limit = max_tokens_limit(settings, model)
    if cap is not None and not 1 <= cap <= limit:
        raise APIError(400, f"max_tokens must be between 1 and {limit}", "invalid_request_error",
                       "max_tokens", "invalid_value")  # fmt: skip
    if body.stream and body.top_logprobs_wanted() is not None:
        raise APIError(400, "logprobs are not streamed: ask for them without stream", "invalid_request_error",
                       "logprobs", "unsupported")  # fmt: skip
    param = "messages" if isinstance(body, ChatRequest) else "prompt"
    texts = [m.text() for m in body.messages] if isinstance(body, ChatRequest) else body.questions()
    if sum(len(t) for t in texts) > settings.max_question_chars:
        raise APIError(400, f"the {param} are longer than {settings.max_question_chars} characters in all",
                       "invalid_request_error", param, "context_length_exceeded")  # fmt: skip


def max_tokens_limit(settings: ServeSettings, model: HonestModel) -> int:
    """The largest ``max_tokens`` a request may ask for: the setting, else the model's context."""
    if settings.max_tokens is not None:
        return settings.max_tokens
    return model.context_length or max(UNKNOWN_CONTEXT_MAX_TOKENS, model.decoding.max_new_tokens)


History = tuple[tuple[str, str], ...]


def _conversation(body: ChatRequest, settings: ServeSettings) -> tuple[History, str]:
    """``(earlier turns, question)``; with ``conversations="refuse"``, one user message or a 400."""
    try:
        history, question = body.conversation()
    except ValueError as exc:
        raise APIError(400, str(exc), "invalid_request_error", "messages", "unsupported") from None
    if history and settings.conversations == "refuse":
        raise APIError(400, "this server answers one question per request (--conversations refuse): send exactly "
                       "one user message (got roles "
                       f"{[m.role for m in body.messages]})", "invalid_request_error", "messages",
                       "unsupported")  # fmt: skip
    if not question.strip():
        raise APIError(400, "the question is empty (the last user message has no text)", "invalid_request_error",
                       "messages", "invalid_value")  # fmt: skip
    return history, question


@dataclass(frozen=True)
class Endpoint:
    """How one endpoint shapes its choices (chat messages or completion texts)."""

    object: str
    chunk_object: str
    prefix: str
    chat: bool


CHAT = Endpoint("chat.completion", "chat.completion.chunk", "chatcmpl", True)
COMPLETION = Endpoint("text_completion", "text_completion", "cmpl", False)


def _asks(
    questions: list[tuple[History, str]], body: Any, model: HonestModel, loop: asyncio.AbstractEventLoop,
    events: asyncio.Queue[tuple[Any, ...]] | None, streams_tokens: bool,
) -> list[Ask]:  # fmt: skip
    """Every question checked, templated and counted before anything is queued: a bad one is this request's 400."""
    reply = Reply(n=body.n, max_new_tokens=body.token_cap(), temperature=body.temperature, top_p=body.top_p,
                  stop=body.stops(), seed=body.seed)  # fmt: skip
    param = "prompt" if isinstance(body, CompletionRequest) else "messages"
    asks = []
    for j, (history, q) in enumerate(questions):
        try:
            prompted = model.prepare(q, reply.max_new_tokens, history)
        except ContextLengthExceeded as exc:
            raise APIError(400, str(exc), "invalid_request_error", param, "context_length_exceeded") from None
        except CandorError as exc:
            raise APIError(400, str(exc), "invalid_request_error", param, "invalid_value") from None
        asks.append(Ask(prompted, reply, RequestListener(loop, events, j, streams_tokens)))
    return asks


class Service:
    """The running engine and the admission of questions to it: one flow (an asyncio task) per question."""

    def __init__(self, model: HonestModel, admission: Admission, metrics: ServeMetrics, lifecycle: Lifecycle) -> None:
        self.model = model
        self.admission = admission
        self.metrics = metrics
        self.lifecycle = lifecycle
        self.engine: LiveEngine | None = None  # opened when the app starts

    def start(self, asks: list[Ask]) -> list[asyncio.Future[Any]]:
        """Admit every ask (or 503 with nothing started) and start each one's flow."""
        if self.engine is None:
            raise APIError(503, "the server is not started", "server_error", None, "not_ready")
        if self.lifecycle.draining:
            raise APIError(503, "the server is draining (shutting down); retry on another instance", "server_error",
                           None, "draining")  # fmt: skip
        try:
            self.admission.admit(len(asks))
        except QueueFull as exc:
            raise APIError(503, f"the server is busy ({exc}); retry later", "server_error", None,
                           "queue_full") from None  # fmt: skip
        for _ in asks:  # each question is answered together with those in flight (itself included)
            self.metrics.observe_batch(self.admission.in_flight)
        tasks = [asyncio.ensure_future(self._flow(ask, self.engine)) for ask in asks]
        for task in tasks:
            task.add_done_callback(lambda _: self.admission.release())
        return tasks  # type: ignore[return-value]

    async def _flow(self, ask: Ask, engine: LiveEngine) -> list[HonestAnswer]:
        try:
            return await self.model.answer_one(ask, engine)
        except (CandorError, Cancelled, asyncio.CancelledError):
            raise
        except Exception:
            logger.exception("answering failed")
            raise


def _cancel(asks: Sequence[Ask], futures: Sequence[asyncio.Future[Any]]) -> None:
    for ask in asks:
        ask.listener.cancel()  # type: ignore[union-attr]
    for f in futures:
        f.cancel()


async def _serve(
    request: Request, questions: list[tuple[History, str]], body: Any, settings: ServeSettings, model: HonestModel,
    service: Service, endpoint: Endpoint, log: RecordLog | None,
) -> Any:  # fmt: skip
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple[Any, ...]] | None = asyncio.Queue() if body.stream else None
    # A question-level source decides before generating, so its tokens stream as they come; an
    # answer-level source's are held until its decision unless the server streams live.
    live = settings.stream == "live" or model.source.before_generation
    asks = _asks(questions, body, model, loop, events, streams_tokens=live)
    futures = service.start(asks)
    metrics: ServeMetrics = request.app.state.metrics
    if body.stream:
        for ask, f in zip(asks, futures, strict=True):
            f.add_done_callback(lambda _, ask=ask: ask.listener.done())  # type: ignore[union-attr,misc]
        stream = _stream(asks, futures, events, body, settings, model, endpoint, log, metrics)  # type: ignore[arg-type]
        return StreamingResponse(stream, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    answers = await _wait(request, asks, futures)
    metrics.observe_first_token()  # a plain response's first token reaches the client with the whole answer
    metrics.observe_answers(answers)
    head = _head(endpoint.object, endpoint.prefix, settings)
    for j, (ask, per_q) in enumerate(zip(asks, answers, strict=True)):
        _log(log, ask, per_q, model, head["id"], range(j * body.n, (j + 1) * body.n))
    pairs = enumerate(zip(asks, answers, strict=True))
    choices = [_choice(endpoint, j * body.n + i, a, ask, body, settings, model)
               for j, (ask, per_q) in pairs for i, a in enumerate(per_q)]  # fmt: skip
    return {**head, "choices": choices, "usage": _usage(asks, answers)}


async def _wait(request: Request, asks: list[Ask], futures: list[asyncio.Future[Any]]) -> list[list[HonestAnswer]]:
    """The answers; a client that disconnects meanwhile cancels its work (checked every quarter second)."""
    pending = set(futures)
    while pending:
        _, pending = await asyncio.wait(pending, timeout=0.25)
        if pending and await request.is_disconnected():
            _cancel(asks, futures)
            raise APIError(499, "the client closed the request", "invalid_request_error", None, "client_closed")
    return [_outcome(f) for f in futures]


def _outcome(future: asyncio.Future[Any]) -> list[HonestAnswer]:
    if future.cancelled():
        raise APIError(499, "the request was cancelled", "invalid_request_error", None, "client_closed")
    exc = future.exception()
    if exc is None:
        return future.result()  # type: ignore[no-any-return]
    if isinstance(exc, UpstreamError):  # the engine or classify server behind candor failed, not the request
        raise APIError(502, str(exc), "server_error", None, "upstream_error")
    if isinstance(exc, CandorError):
        raise APIError(400, str(exc), "invalid_request_error", None, "invalid_value")
    if isinstance(exc, Cancelled):
        raise APIError(499, "the request was cancelled", "invalid_request_error", None, "client_closed")
    raise exc


async def _stream(
    asks: list[Ask], futures: list[asyncio.Future[Any]], events: asyncio.Queue[tuple[Any, ...]], body: Any,
    settings: ServeSettings, model: HonestModel, endpoint: Endpoint, log: RecordLog | None, metrics: ServeMetrics,
) -> AsyncIterator[str]:  # fmt: skip
    """OpenAI chunks as server-sent events; leaving early (a client that drops) cancels the work."""
    head = _head(endpoint.chunk_object, endpoint.prefix, settings)
    n = body.n
    stops = [*model.template.stop, *body.stops()]
    deltas = {k: TextDelta(model.backend.decode, stops) for k in range(len(asks) * n)}
    opened: set[int] = set()

    def chunk(k: int, text: str | None = None, finish: str | None = None, refusal: str | None = None,
              **extra: Any) -> str:  # fmt: skip
        if endpoint.chat:
            delta: dict[str, Any] = {}
            if k not in opened:
                opened.add(k)
                delta = {"role": "assistant", "content": "" if refusal is None else None}
            if text is not None:
                delta["content"] = text
            if refusal is not None:  # OpenAI's own field for a refusal, which the SDKs map
                delta["refusal"] = refusal
            choice = {"index": k, "delta": delta, "finish_reason": finish, "logprobs": None, **extra}
        else:
            choice = {"index": k, "text": text or "", "finish_reason": finish, "logprobs": None, **extra}
            if refusal is not None:
                choice["refusal"] = refusal
        return sse({**head, "choices": [choice]})

    try:
        if not model.source.before_generation:
            for k in deltas:
                yield chunk(k)
        left = len(asks)
        while left:
            kind, j, *rest = await events.get()
            if kind == "decided" and not rest[0].abstained:
                metrics.observe_first_token()
                for i in range(n):
                    yield chunk(j * n + i, confidence=_confidence(rest[0], model, asks[j]))
            elif kind == "token":
                k = j * n + rest[0]
                text = deltas[k].add(rest[1])
                if text:
                    metrics.observe_first_token()  # counted once per request
                    yield chunk(k, text)
            elif kind == "done":
                left -= 1
                try:
                    answers = _outcome(futures[j])
                except APIError as exc:
                    yield sse(exc.body)
                    continue
                _log(log, asks[j], answers, model, head["id"], range(j * n, (j + 1) * n))
                metrics.observe_first_token()  # an abstention or an empty answer is the first (and last) chunk
                metrics.observe_answers([answers])
                for i, a in enumerate(answers):
                    k = j * n + i
                    confidence = _confidence(a, model, asks[j])
                    if a.abstained:
                        # A chat client reads the refusal in ``delta.refusal``; a completion has only text.
                        # With ``stream="live"`` it withdraws text already streamed.
                        text = None if endpoint.chat or deltas[k].sent else settings.refusal
                        yield chunk(k, text, "abstained", settings.refusal, confidence=confidence)
                        continue
                    rest_text = deltas[k].finish(a.answer or "")
                    if rest_text:
                        yield chunk(k, rest_text)
                    yield chunk(k, None, a.finish_reason, confidence=confidence)
        options = body.stream_options or {}
        if options.get("include_usage"):
            ok = [not f.cancelled() and not f.exception() for f in futures]
            done = [(a, f.result()) for a, f, good in zip(asks, futures, ok, strict=True) if good]
            yield sse({**head, "choices": [], "usage": _usage([a for a, _ in done], [r for _, r in done])})
        yield DONE
    finally:
        if not all(f.done() for f in futures):
            _cancel(asks, futures)


def _log(
    log: RecordLog | None, ask: Ask, answers: list[HonestAnswer], model: HonestModel, response_id: str,
    indexes: Sequence[int],
) -> None:  # fmt: skip
    if log is not None:
        log.write(ask, answers, model.provenance(), lambda a: _confidence(a, model, ask), response_id, indexes)


def _head(obj: str, prefix: str, settings: ServeSettings) -> dict[str, Any]:
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": obj, "created": int(time.time()),
            "model": settings.model_id}  # fmt: skip


def _choice(endpoint: Endpoint, index: int, a: HonestAnswer, ask: Ask, body: Any, settings: ServeSettings,
            model: HonestModel) -> dict[str, Any]:  # fmt: skip
    logprobs = _logprobs(a, body, endpoint)
    confidence = _confidence(a, model, ask)
    if endpoint.chat:
        # An abstention is OpenAI's refusal: no content, the refusal text in ``message.refusal``.
        message = ({"role": "assistant", "content": None, "refusal": settings.refusal} if a.abstained
                   else {"role": "assistant", "content": a.answer or "", "refusal": None})  # fmt: skip
        return {"index": index, "message": message, "finish_reason": a.finish_reason, "logprobs": logprobs,
                "confidence": confidence}  # fmt: skip
    text = settings.refusal if a.abstained else (a.answer or "")
    out = {"index": index, "text": text, "finish_reason": a.finish_reason, "logprobs": logprobs,
           "confidence": confidence}  # fmt: skip
    if a.abstained:
        out["refusal"] = settings.refusal
    return out


def _logprobs(a: HonestAnswer, body: Any, endpoint: Endpoint) -> dict[str, Any] | None:
    """The returned tokens' log-probs in the endpoint's OpenAI shape, when asked for."""
    top = body.top_logprobs_wanted()
    if top is None or a.completion is None or a.abstained:
        return None
    c = a.completion
    alts = c.top_logprobs or [{} for _ in c.tokens]
    if endpoint.chat:

        def entry(tok: str, lp: float) -> dict[str, Any]:
            return {"token": tok, "logprob": lp, "bytes": list(tok.encode("utf-8", "replace"))}

        content = [{**entry(t, lp), "top_logprobs": [entry(x, v) for x, v in list(alt.items())[:top]]}
                   for t, lp, alt in zip(c.tokens, c.logprobs, alts, strict=True)]  # fmt: skip
        return {"content": content}
    offsets, at = [], 0
    for t in c.tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": list(c.tokens), "token_logprobs": list(c.logprobs),
            "top_logprobs": [dict(list(alt.items())[:top]) for alt in alts], "text_offset": offsets}  # fmt: skip


def _confidence(answer: HonestAnswer, model: HonestModel, ask: Ask) -> dict[str, Any]:
    t = model.threshold
    shape = ask.prompted.shape
    calibration = model.calibration(shape) if answer.calibrated else {"calibrated": False, "calibrated_on": None}
    return {
        "value": answer.confidence,
        "method": answer.method,
        **calibration,
        # What the value was computed on: the question alone, or the question after the earlier messages.
        "computed_on": {"shape": shape, "earlier_messages": len(ask.prompted.history)},
        "model_version": model.version,
        "threshold": answer.threshold,
        "abstained": answer.abstained,
        "expected_accuracy": None if t is None else t.expected_accuracy,
        "expected_coverage": None if t is None else t.expected_coverage,
        "reason": answer.reason,
        # False: the text was decoded with the request's parameters, the value is the greedy answer's (§4.1)
        "scores_returned_text": answer.scores_returned_text,
    }


def _usage(asks: Sequence[Ask], answers: Sequence[list[HonestAnswer]]) -> dict[str, int]:
    """The engine's own counts: the templated prompt once per question, each distinct returned text once."""
    prompt = completion = 0
    for ask, per_q in zip(asks, answers, strict=False):
        prompt += max((a.prompt_tokens for a in per_q), default=0) or ask.prompted.prompt_tokens or 0
        seen: set[int] = set()
        for a in per_q:
            # An answer-level abstention's answer was generated (and scored), though not returned.
            made = a.completion if a.completion is not None else (a.record.greedy if a.record is not None else None)
            if made is not None and id(made) not in seen:
                seen.add(id(made))
                completion += a.completion_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
