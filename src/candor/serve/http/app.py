"""The OpenAI-compatible service around a :class:`~candor.serve.HonestModel` (``candor serve``).

- ``POST /v1/chat/completions`` and ``POST /v1/completions``: OpenAI request and
  response shapes, plain or streamed (``stream: true``: server-sent chunks,
  ``data: [DONE]``). A chat request is a conversation: its last user message
  is the question, asked after the system message and earlier turns, all
  rendered by the model's QA template (``conversations="refuse"``: one user
  message only). Each completion prompt is a question asked alone. Each choice
  carries a ``confidence`` object; an abstained choice has ``finish_reason:
  "stop"`` (OpenAI's own value; ``confidence.abstained`` says it abstained) and
  the refusal text, never the withheld answer: as the content with
  ``abstain_as="text"`` (the default, which every client shows), in OpenAI's
  ``refusal`` field (``message.refusal``, ``delta.refusal``) with ``"refusal"``
  (:mod:`candor.serve.http.responses`). An answer-level source's stream is
  buffered until its decision (``stream="live"``: tokens as they come,
  withdrawn by the refusal). Each choice's last chunk carries its confidence.
- ``POST /v1/responses``: the OpenAI Responses API, plain or streamed (its
  events, :mod:`candor.serve.http.responses_api`): ``instructions`` and
  ``input`` are the conversation, the answer an ``output_text`` part, an
  abstention the API's ``refusal`` part (or the refusal text, as above), the
  ``confidence`` on the response. Nothing is stored: ``previous_response_id``,
  ``store: true`` and tools are 400 ``unsupported``.
- Every answer has the ``x-candor-confidence``, ``x-candor-abstained``,
  ``x-candor-abstained-choices`` and ``x-candor-model-version`` headers (a
  stream only the last: its headers leave before the decision).
- ``GET /health`` (alive), ``GET /ready``, ``GET /metrics``, ``GET /v1/models``,
  ``GET /v1/models/{id}``; request ids, the access log, CORS and protocol-level
  errors are :mod:`candor.serve.http.operations`, the metrics :mod:`candor.serve.http.prometheus_metrics`.
- ``GET /`` the playground page (:mod:`candor.serve.http.playground`).
- ``POST /v1/feedback`` (labels on served answers, kept in :mod:`candor.annotation.served_store`)
  and ``POST /admin/reload`` (and ``SIGHUP``; the operator key): :mod:`candor.serve.http.operator_routes`.
- Limits (body size, body-read time, question length, ``n``, ``max_tokens``: the
  model's context) answer 4xx in the OpenAI error shape (:mod:`candor.serve.http.request_checks`);
  a full queue answers 503; with an API key set, a request without the right
  ``Authorization: Bearer`` key answers 401 (the scheme is case-insensitive). Bodies
  are parsed strictly: ``"n": true`` or ``"max_tokens": "10"`` answer 400 naming the
  field, never coerced.
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
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse

from candor.annotation.served_store import ServedStore
from candor.serve.agent_turns import AgentTurn
from candor.serve.answering import Ask, Cancelled, ContextLengthExceeded, HonestAnswer
from candor.serve.batching import Admission
from candor.serve.deployment import Deployment
from candor.serve.http.agent_requests import agent_turn_of
from candor.serve.http.api_docs import install_docs
from candor.serve.http.operations import Lifecycle, install_operations
from candor.serve.http.operator_routes import FeedbackDesk, install_operator_routes, reload_on_sighup
from candor.serve.http.playground import playground_html
from candor.serve.http.prometheus_metrics import ServeMetrics
from candor.serve.http.record_log import RecordLog
from candor.serve.http.request_checks import (
    APIError,
    History,
    authorize,
    conversation_of,
    parse_body,
    read_body,
)
from candor.serve.http.responses import (
    CHAT,
    COMPLETION,
    Endpoint,
    answer_headers,
    choice_of,
    confidence_object,
    refusal_as_text,
    response_head,
    stream_headers,
    tool_calls_of,
    usage_of,
)
from candor.serve.http.responses_api import ResponseEvents, ResponseShell, response_body
from candor.serve.http.schemas import ChatRequest, CompletionRequest, ResponsesRequest, error_body
from candor.serve.http.service import Generation, Service
from candor.serve.http.settings import ServeSettings, store_url
from candor.serve.http.streaming import DONE, RequestListener, TextDelta, sse
from candor.serve.model import HonestModel
from candor.util.errors import CandorError, UpstreamError

logger = logging.getLogger(__name__)


def create_app(
    model: HonestModel, settings: ServeSettings | None = None, deployment: Deployment | None = None
) -> FastAPI:
    """The FastAPI app; run it with uvicorn (``candor serve`` does).

    ``deployment`` holds the operator's options that shape answers; they are put on ``model`` here
    and on every model a reload loads (:class:`~candor.serve.deployment.Deployment`).
    """
    settings = settings or ServeSettings()
    metrics, lifecycle = ServeMetrics(), Lifecycle()
    admission = Admission(settings.queue_size)
    service = Service(
        model,
        admission,
        metrics,
        lifecycle,
        lambda m: m.open_engine(settings.max_batch, settings.batch_wait_ms),
        deployment,
    )
    url = store_url(settings)
    store = ServedStore(url, settings.retention, export=settings.log_records) if url is not None else None
    log = RecordLog(store, settings.store_timeout_s) if store is not None else None
    feedback = FeedbackDesk(log, metrics)
    if log is not None:  # a store that does not answer: /ready 503, questions refused before any work (record_log)
        lifecycle.conditions.append(log.unready_because)
        metrics.watch_store(lambda: log.available)
    service.on_swap += [lambda generation: metrics.observe_model(generation.version), feedback.follow]

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        service.open()
        reload_on_sighup(service, settings)
        lifecycle.mark_started()
        store_watch = asyncio.create_task(feedback.watch())  # the audit poll, and the store's health probe
        yield
        store_watch.cancel()
        lifecycle.begin_draining()
        await asyncio.to_thread(service.close_now)
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
        return {
            "status": "ok",
            "model": settings.model_id,
            "in_flight": admission.in_flight,
            "admitted": admission.admitted,
        }

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        authorize(request, settings)
        return {"object": "list", "data": [_model_card(settings)]}

    @app.get("/v1/models/{model_id:path}")
    async def model_card(model_id: str, request: Request) -> dict[str, Any]:
        authorize(request, settings)
        if model_id != settings.model_id:
            raise APIError(
                404,
                f"the model {model_id!r} does not exist; this server serves {settings.model_id!r}",
                "invalid_request_error",
                "model",
                "model_not_found",
            )
        return _model_card(settings)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        authorize(request, settings)
        raw = await read_body(request, settings.max_body_bytes, settings.body_timeout_s)
        # Admitted once its body is here, to the generation that answers it wholly, whatever reloads meanwhile.
        with service.admitted() as generation:
            body = parse_body(raw, ChatRequest, settings, generation.model, request.headers.get("content-type"))
            turn = agent_turn_of(body, settings)
            questions: list[Asked] = [turn if turn is not None else conversation_of(body, settings)]
            return await _serve(request, questions, body, settings, generation, service, CHAT, log)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        authorize(request, settings)
        raw = await read_body(request, settings.max_body_bytes, settings.body_timeout_s)
        with service.admitted() as generation:
            body = parse_body(raw, CompletionRequest, settings, generation.model, request.headers.get("content-type"))
            questions = body.questions()
            if not 1 <= len(questions) <= settings.max_prompts:
                raise APIError(
                    400,
                    f"prompt must hold 1 to {settings.max_prompts} strings",
                    "invalid_request_error",
                    "prompt",
                    "invalid_value",
                )
            asked: list[Asked] = [((), q) for q in questions]
            return await _serve(request, asked, body, settings, generation, service, COMPLETION, log)

    @app.post("/v1/responses")
    async def responses(request: Request) -> Any:
        authorize(request, settings)
        raw = await read_body(request, settings.max_body_bytes, settings.body_timeout_s)
        with service.admitted() as generation:
            body = parse_body(raw, ResponsesRequest, settings, generation.model, request.headers.get("content-type"))
            turn = agent_turn_of(body, settings)
            question = turn if turn is not None else conversation_of(body, settings)
            return await _respond(request, question, body, settings, generation, service, log)

    install_operator_routes(app, service, settings, feedback)

    if settings.docs:
        install_docs(app, lambda request: authorize(request, settings))
    return app


def _model_card(settings: ServeSettings) -> dict[str, Any]:
    return {"id": settings.model_id, "object": "model", "created": 0, "owned_by": "candor"}


# What one ask of a request is: a question after its conversation, or an agent's turn.
Asked = tuple[History, str] | AgentTurn


def _asks(
    questions: list[Asked],
    body: Any,
    model: HonestModel,
    loop: asyncio.AbstractEventLoop,
    events: asyncio.Queue[tuple[Any, ...]] | None,
    streams_tokens: bool,
) -> list[Ask]:
    """Every question checked, templated and counted before anything is queued: a bad one is this request's 400."""
    reply = body.reply()
    param = body.text_param
    asks = []
    for j, asked in enumerate(questions):
        try:
            if isinstance(asked, AgentTurn):
                prompted = model.prepare_agent(asked, reply.max_new_tokens)
            else:
                prompted = model.prepare(asked[1], reply.max_new_tokens, asked[0])
        except ContextLengthExceeded as exc:
            raise APIError(400, str(exc), "invalid_request_error", param, "context_length_exceeded") from None
        except CandorError as exc:
            raise APIError(400, str(exc), "invalid_request_error", param, "invalid_value") from None
        # An agent turn's output is shown whole once decided (a call is never half sent).
        streams = streams_tokens and prompted.agent is None
        asks.append(Ask(prompted, reply, RequestListener(loop, events, j, streams)))
    return asks


def _cancel(asks: Sequence[Ask], futures: Sequence[asyncio.Future[Any]]) -> None:
    for ask in asks:
        ask.listener.cancel()  # type: ignore[union-attr]
    for f in futures:
        f.cancel()


async def _serve(
    request: Request,
    questions: list[Asked],
    body: Any,
    settings: ServeSettings,
    generation: Generation,
    service: Service,
    endpoint: Endpoint,
    log: RecordLog | None,
) -> Any:
    model = generation.model
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple[Any, ...]] | None = asyncio.Queue() if body.stream else None
    # A question-level source decides before generating, so its tokens stream as they come; an
    # answer-level source's are held until its decision unless the server streams live.
    # With claims served, the text may be refined after generating: never streamed before that.
    live = (settings.stream == "live" or model.source.before_generation) and model.claims is None
    asks = _asks(questions, body, model, loop, events, streams_tokens=live)
    if log is not None:
        log.require_available()  # a store that does not answer could not keep the answer: 503 before any work
    futures = service.start(asks, generation)
    metrics: ServeMetrics = request.app.state.metrics
    if body.stream:
        for ask, f in zip(asks, futures, strict=True):
            f.add_done_callback(lambda _, ask=ask: ask.listener.done())  # type: ignore[union-attr,misc]
        stream = _stream(asks, futures, events, body, settings, model, endpoint, log, metrics)  # type: ignore[arg-type]
        return StreamingResponse(stream, media_type="text/event-stream", headers=stream_headers(generation.version))
    answers = await _wait(request, asks, futures)
    metrics.observe_first_token()  # a plain response's first token reaches the client with the whole answer
    metrics.observe_answers(answers)
    head = response_head(endpoint.object, endpoint.prefix, settings)
    for j, (ask, per_q) in enumerate(zip(asks, answers, strict=True)):
        await _log(log, ask, per_q, model, head["id"], range(j * body.n, (j + 1) * body.n))
    pairs = enumerate(zip(asks, answers, strict=True))
    choices = [
        choice_of(endpoint, j * body.n + i, a, ask, body, settings)
        for j, (ask, per_q) in pairs
        for i, a in enumerate(per_q)
    ]
    headers = answer_headers([a for per_q in answers for a in per_q], generation.version)
    return JSONResponse({**head, "choices": choices, "usage": usage_of(asks, answers)}, headers=headers)


async def _respond(
    request: Request,
    question: Asked,
    body: ResponsesRequest,
    settings: ServeSettings,
    generation: Generation,
    service: Service,
    log: RecordLog | None,
) -> Any:
    """``POST /v1/responses``: one question, one output message (plain, or the API's streamed events)."""
    model = generation.model
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple[Any, ...]] | None = asyncio.Queue() if body.stream else None
    # Tokens stream only once decided (a question-level source); an answer-level source's are held until its
    # decision whatever --stream says, since a Responses message cannot take back its text.
    live = model.source.before_generation and model.claims is None
    asks = _asks([question], body, model, loop, events, streams_tokens=live)
    if log is not None:
        log.require_available()
    futures = service.start(asks, generation)
    metrics: ServeMetrics = request.app.state.metrics
    shell = ResponseShell(body=body, settings=settings, agent=asks[0].prompted.agent)
    if body.stream:
        futures[0].add_done_callback(lambda _: asks[0].listener.done())  # type: ignore[union-attr]
        stream = _stream_response(asks[0], futures[0], events, shell, model, log, metrics)  # type: ignore[arg-type]
        return StreamingResponse(stream, media_type="text/event-stream", headers=stream_headers(generation.version))
    answers = await _wait(request, asks, futures)
    metrics.observe_first_token()
    metrics.observe_answers(answers)
    await _log(log, asks[0], answers[0], model, shell.id, range(1))
    answer = answers[0][0]
    content = response_body(shell, answer, confidence_object(answer, asks[0]), usage_of(asks, answers))
    return JSONResponse(content, headers=answer_headers(answers[0], generation.version))


async def _stream_response(
    ask: Ask,
    future: asyncio.Future[Any],
    events: asyncio.Queue[tuple[Any, ...]],
    shell: ResponseShell,
    model: HonestModel,
    log: RecordLog | None,
    metrics: ServeMetrics,
) -> AsyncIterator[str]:
    """The Responses API's events; leaving early (a client that drops) cancels the work."""
    out = ResponseEvents(shell)
    delta = TextDelta(model.backend.decode, list(model.template.stop))
    try:
        for event in out.start():
            yield event
        while True:
            kind, _, *rest = await events.get()
            if kind == "token":
                text = delta.add(rest[1])
                if text:
                    metrics.observe_first_token()
                    for event in out.text(text):
                        yield event
            elif kind == "done":
                try:
                    answers = _outcome(future)
                    await _log(log, ask, answers, model, shell.id, range(1))  # a store that fails: an error event
                except APIError as exc:
                    for event in out.error(exc.body["error"]):
                        yield event
                    return
                metrics.observe_first_token()
                metrics.observe_answers([answers])
                answer = answers[0]
                rest_text = "" if answer.abstained else delta.finish(answer.answer or "")
                for event in out.finish(answer, confidence_object(answer, ask), rest_text, usage_of([ask], [answers])):
                    yield event
                return
    finally:
        if not future.done():
            _cancel([ask], [future])


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
    asks: list[Ask],
    futures: list[asyncio.Future[Any]],
    events: asyncio.Queue[tuple[Any, ...]],
    body: Any,
    settings: ServeSettings,
    model: HonestModel,
    endpoint: Endpoint,
    log: RecordLog | None,
    metrics: ServeMetrics,
) -> AsyncIterator[str]:
    """OpenAI chunks as server-sent events; leaving early (a client that drops) cancels the work."""
    head = response_head(endpoint.chunk_object, endpoint.prefix, settings)
    n = body.n
    stops = [*model.template.stop, *body.stops()]
    deltas = {k: TextDelta(model.backend.decode, stops) for k in range(len(asks) * n)}
    opened: set[int] = set()

    def chunk(
        k: int,
        text: str | None = None,
        finish: str | None = None,
        refusal: str | None = None,
        calls: list[dict[str, Any]] | None = None,
        **extra: Any,
    ) -> str:
        if endpoint.chat:
            delta: dict[str, Any] = {}
            if k not in opened:
                opened.add(k)
                delta = {"role": "assistant", "content": "" if refusal is None and calls is None else None}
            if text is not None:
                delta["content"] = text
            if refusal is not None:  # OpenAI's own field for a refusal, which the SDKs map
                delta["refusal"] = refusal
            if calls is not None:  # each call whole in one delta (index, id, type, name, arguments)
                delta["tool_calls"] = [{"index": i, **c} for i, c in enumerate(calls)]
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
                    yield chunk(j * n + i, confidence=confidence_object(rest[0], asks[j]))
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
                    await _log(log, asks[j], answers, model, head["id"], range(j * n, (j + 1) * n))
                except APIError as exc:  # a failed question, or a store that could not keep it: an error event
                    yield sse(exc.body)
                    continue
                metrics.observe_first_token()  # an abstention or an empty answer is the first (and last) chunk
                metrics.observe_answers([answers])
                for i, a in enumerate(answers):
                    k = j * n + i
                    confidence = confidence_object(a, asks[j])
                    if a.abstained and refusal_as_text(settings, asks[j]):
                        # The refusal text as the answer's text (never after streamed text: settings refuse live).
                        yield chunk(k, settings.refusal, "stop", confidence=confidence)
                        continue
                    if a.abstained:
                        # A chat client reads the refusal in ``delta.refusal``; a completion has only text.
                        # With ``stream="live"`` it withdraws text already streamed.
                        text = None if endpoint.chat or deltas[k].sent else settings.refusal
                        yield chunk(k, text, "stop", settings.refusal, confidence=confidence)
                        continue
                    calls = tool_calls_of(a)
                    if calls is not None and endpoint.chat:
                        yield chunk(k, calls=calls)
                        yield chunk(k, None, a.finish_reason, confidence=confidence)
                        continue
                    rest_text = deltas[k].finish(a.answer or "")
                    if rest_text:
                        yield chunk(k, rest_text)
                    yield chunk(k, None, a.finish_reason, confidence=confidence)
        options = body.stream_options or {}
        if options.get("include_usage"):
            ok = [not f.cancelled() and not f.exception() for f in futures]
            done = [(a, f.result()) for a, f, good in zip(asks, futures, ok, strict=True) if good]
            yield sse({**head, "choices": [], "usage": usage_of([a for a, _ in done], [r for _, r in done])})
        yield DONE
    finally:
        if not all(f.done() for f in futures):
            _cancel(asks, futures)


async def _log(
    log: RecordLog | None,
    ask: Ask,
    answers: list[HonestAnswer],
    model: HonestModel,
    response_id: str,
    indexes: Sequence[int],
) -> None:
    """Stored before the client has the response, so feedback on it finds it (on any replica of the store)."""
    if log is not None:
        describe = lambda a: confidence_object(a, ask)  # noqa: E731
        await log.call(log.write, ask, answers, model.provenance(), describe, response_id, indexes)
