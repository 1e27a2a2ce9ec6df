"""The OpenAI-compatible service around a :class:`~candor.serve.HonestModel` (``candor serve``).

- ``POST /v1/chat/completions`` and ``POST /v1/completions``: OpenAI request and
  response shapes. The last user message (or each prompt) is the question; it
  is rendered with the model's QA template. Each choice carries a
  ``confidence`` object; an abstained choice has ``finish_reason:
  "abstained"`` and the refusal text as its content.
- ``GET /health``, ``GET /v1/models``; ``GET /`` the playground page (:mod:`candor.serve.playground`).
- Limits (body size, question length, ``n``, ``max_tokens``) answer 4xx in the
  OpenAI error shape; a full queue answers 503; with an API key set, a request
  without the right ``Authorization: Bearer`` key answers 401.
- Concurrent requests are gathered by a :class:`MicroBatcher` into one
  backend call.

Decoding defaults to greedy (temperature 0), the answer the confidence was
calibrated for, and ``n`` > 1 then repeats it; ``temperature > 0`` samples
``n`` answers, each scored on its own by an answer-level source.
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
from dataclasses import dataclass, replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ValidationError

from candor.serve.batching import MicroBatcher, QueueFull
from candor.serve.model import DEFAULT_REFUSAL, Decoding, HonestAnswer, HonestModel
from candor.serve.playground import playground_html
from candor.serve.schemas import ChatRequest, CompletionRequest, error_body
from candor.util.errors import CandorError

logger = logging.getLogger(__name__)


MAX_STOPS = 4  # as the OpenAI API


@dataclass(frozen=True)
class ServeSettings:
    """Limits and behaviour of the service; the defaults suit the embedded CPU model."""

    model_id: str = "candor"
    api_key: str | None = None
    refusal: str = DEFAULT_REFUSAL
    max_body_bytes: int = 64 * 1024
    max_question_chars: int = 4000
    max_n: int = 4
    max_tokens: int = 256
    max_prompts: int = 16  # prompts in one /v1/completions request
    queue_size: int = 64
    max_batch: int = 16
    batch_wait_ms: float = 5.0


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.body = status, error_body(message, type_, param, code)


@dataclass(frozen=True)
class Work:
    """One question to answer: the unit the micro-batcher gathers."""

    question: str
    n: int
    decoding: Decoding
    stop: tuple[str, ...]


def run_batch(model: HonestModel, works: Sequence[Work]) -> list[list[HonestAnswer]]:
    """Answer gathered work; questions with the same decoding share one backend call."""
    groups: dict[tuple[int, Decoding, tuple[str, ...]], list[int]] = {}
    for i, w in enumerate(works):
        groups.setdefault((w.n, w.decoding, w.stop), []).append(i)
    out: list[list[HonestAnswer]] = [[] for _ in works]
    for (n, decoding, stop), idx in groups.items():
        answers = model.answer_batch([works[i].question for i in idx], n=n, decoding=decoding, stop=stop)
        for i, a in zip(idx, answers, strict=True):
            out[i] = a
    return out


def create_app(model: HonestModel, settings: ServeSettings | None = None) -> FastAPI:
    """The FastAPI app; run it with uvicorn (``candor serve`` does)."""
    settings = settings or ServeSettings()
    batcher = MicroBatcher(
        lambda works: run_batch(model, works),
        max_batch=settings.max_batch,
        max_wait_ms=settings.batch_wait_ms,
        queue_size=settings.queue_size,
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(title="candor", lifespan=lifespan)
    app.state.batcher = batcher

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return JSONResponse(exc.body, status_code=exc.status)

    @app.exception_handler(CandorError)
    async def _user_error(_: Request, exc: CandorError) -> JSONResponse:
        return JSONResponse(error_body(str(exc), "invalid_request_error"), status_code=400)

    @app.exception_handler(Exception)
    async def _internal_error(_: Request, exc: Exception) -> JSONResponse:
        logger.exception("request failed")
        return JSONResponse(error_body(f"internal error: {type(exc).__name__}", "server_error"), status_code=500)

    @app.get("/", include_in_schema=False)
    async def playground() -> HTMLResponse:
        return HTMLResponse(playground_html())

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": settings.model_id, "waiting": batcher.waiting, "batches": batcher.batches}

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        _authorize(request, settings)
        return {"object": "list", "data": [{"id": settings.model_id, "object": "model", "created": 0,
                                            "owned_by": "candor"}]}  # fmt: skip

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        _authorize(request, settings)
        body = await _parse(request, ChatRequest, settings)
        answers = await _answer(batcher, [body.question()], body, settings, model)
        choices = [
            {"index": i, "message": {"role": "assistant", "content": _text(a, settings)},
             "finish_reason": a.finish_reason, "logprobs": None, "confidence": _confidence(a, model)}
            for i, a in enumerate(answers[0])
        ]  # fmt: skip
        return _response("chat.completion", "chatcmpl", choices, [body.question()], answers, settings, model)

    @app.post("/v1/completions")
    async def completions(request: Request) -> dict[str, Any]:
        _authorize(request, settings)
        body = await _parse(request, CompletionRequest, settings)
        questions = body.questions()
        if not 1 <= len(questions) <= settings.max_prompts:
            raise APIError(400, f"prompt must hold 1 to {settings.max_prompts} strings", "invalid_request_error",
                           "prompt")  # fmt: skip
        answers = await _answer(batcher, questions, body, settings, model)
        choices = [
            {"index": j * body.n + i, "text": _text(a, settings), "finish_reason": a.finish_reason,
             "logprobs": None, "confidence": _confidence(a, model)}
            for j, per_q in enumerate(answers) for i, a in enumerate(per_q)
        ]  # fmt: skip
        return _response("text_completion", "cmpl", choices, questions, answers, settings, model)

    return app


def _authorize(request: Request, settings: ServeSettings) -> None:
    if settings.api_key is None:
        return
    given = request.headers.get("authorization", "")
    expected = f"Bearer {settings.api_key}"
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise APIError(401, "invalid or missing API key (send Authorization: Bearer <key>)",
                       "authentication_error", None, "invalid_api_key")  # fmt: skip


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed ``limit`` (before it is all read)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"request body is larger than {limit} bytes", "invalid_request_error", None,
                       "request_too_large")  # fmt: skip
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"request body is larger than {limit} bytes", "invalid_request_error", None,
                           "request_too_large")  # fmt: skip
        chunks.append(chunk)
    return b"".join(chunks)


async def _parse(request: Request, schema: type[BaseModel], settings: ServeSettings) -> Any:
    raw = await _read_body(request, settings.max_body_bytes)
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        message = f"the body is not valid JSON: {exc}"
        raise APIError(400, message, "invalid_request_error", None, "invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, "the body must be a JSON object", "invalid_request_error", None, "invalid_json")
    try:
        body = schema.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise APIError(422, f"{param}: {first['msg']}", "invalid_request_error", param, "invalid_value") from None
    _check_limits(body, settings)
    return body


def _check_limits(body: ChatRequest | CompletionRequest, settings: ServeSettings) -> None:
    if body.stream:
        raise APIError(400, "streaming is not supported", "invalid_request_error", "stream", "unsupported")
    if body.model != settings.model_id:
        raise APIError(404, f"the model {body.model!r} does not exist; this server serves {settings.model_id!r}",
                       "invalid_request_error", "model", "model_not_found")  # fmt: skip
    if not 1 <= body.n <= settings.max_n:
        raise APIError(400, f"n must be between 1 and {settings.max_n}", "invalid_request_error", "n", "invalid_value")
    stops = body.stops()
    if len(stops) > MAX_STOPS or any(not s or len(s) > 64 for s in stops):
        raise APIError(400, f"stop takes at most {MAX_STOPS} non-empty strings of up to 64 characters",
                       "invalid_request_error", "stop", "invalid_value")  # fmt: skip
    cap = body.token_cap()
    if cap is not None and not 1 <= cap <= settings.max_tokens:
        raise APIError(400, f"max_tokens must be between 1 and {settings.max_tokens}", "invalid_request_error",
                       "max_tokens", "invalid_value")  # fmt: skip
    questions = [body.question()] if isinstance(body, ChatRequest) else body.questions()
    for q in questions:
        if not q.strip():
            raise APIError(400, "the question is empty (no user message text)", "invalid_request_error",
                           "messages" if isinstance(body, ChatRequest) else "prompt", "invalid_value")  # fmt: skip
        if len(q) > settings.max_question_chars:
            raise APIError(400, f"the question is longer than {settings.max_question_chars} characters",
                           "invalid_request_error", "messages" if isinstance(body, ChatRequest) else "prompt",
                           "context_length_exceeded")  # fmt: skip


async def _answer(
    batcher: MicroBatcher, questions: list[str], body: Any, settings: ServeSettings, model: HonestModel
) -> list[list[HonestAnswer]]:
    cap = body.token_cap()
    decoding = replace(model.decoding, temperature=body.temperature, top_p=body.top_p,
                       max_new_tokens=cap if cap is not None else model.decoding.max_new_tokens)  # fmt: skip
    works = [Work(q, body.n, decoding, body.stops()) for q in questions]
    try:
        return [await batcher.submit(w) for w in works] if len(works) == 1 else await _gather(batcher, works)
    except QueueFull as exc:
        raise APIError(503, f"the server is busy ({exc}); retry later", "server_error", None,
                       "queue_full") from None  # fmt: skip


async def _gather(batcher: MicroBatcher, works: list[Work]) -> list[list[HonestAnswer]]:
    return list(await asyncio.gather(*(batcher.submit(w) for w in works)))


def _text(answer: HonestAnswer, settings: ServeSettings) -> str:
    return settings.refusal if answer.abstained else (answer.answer or "")


def _confidence(answer: HonestAnswer, model: HonestModel) -> dict[str, Any]:
    t = model.threshold
    return {
        "value": answer.confidence,
        "method": answer.method,
        "calibrated": answer.calibrated,
        "threshold": answer.threshold,
        "abstained": answer.abstained,
        "expected_accuracy": None if t is None else t.expected_accuracy,
        "expected_coverage": None if t is None else t.expected_coverage,
        "reason": answer.reason,
    }


def _response(
    obj: str, prefix: str, choices: list[dict[str, Any]], questions: list[str],
    answers: list[list[HonestAnswer]], settings: ServeSettings, model: HonestModel,
) -> dict[str, Any]:  # fmt: skip
    completion = sum(a.completion_tokens for per_q in answers for a in per_q)
    prompt = sum(len(model.backend.tokenize(q)) for q in questions)  # the question's tokens, without the template
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": obj,
        "created": int(time.time()),
        "model": settings.model_id,
        "choices": choices,
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    }
