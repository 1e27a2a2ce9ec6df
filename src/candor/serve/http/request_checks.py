"""A request checked before any work: the key, the body (size, time, JSON), its fields and limits, the conversation.

Everything here answers in the OpenAI error shape (:class:`APIError`), so a bad
request is its own 4xx and never reaches the engine.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import re
from typing import Any

from fastapi import Request
from pydantic import BaseModel, ValidationError

from candor.serve.answering import check_text
from candor.serve.http.schemas import UNSUPPORTED_WHY, ChatRequest, CompletionRequest, ResponsesRequest, error_body
from candor.serve.http.settings import UNKNOWN_CONTEXT_MAX_TOKENS, ServeSettings
from candor.serve.model import HonestModel
from candor.util.errors import CandorError

MAX_STOPS = 4  # as the OpenAI API


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.body = status, error_body(message, type_, param, code)


OPERATOR, CLIENT = "operator", "client"  # who a request comes from: the operator key, or a client of the service


def _bearer(request: Request) -> str | None:
    scheme, _, given = request.headers.get("authorization", "").strip().partition(" ")
    # The scheme is case-insensitive (RFC 9110 §11.1): "bearer KEY" is as good as "Bearer KEY".
    return given.strip() if scheme.lower() == "bearer" else None


def _same_key(given: str | None, key: str) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), key.encode())


def authorize(request: Request, settings: ServeSettings) -> None:
    """The inference key (none set: every request passes); 401 otherwise."""
    if settings.api_key is None:
        return
    if not _same_key(_bearer(request), settings.api_key):
        raise APIError(
            401,
            "invalid or missing API key (send Authorization: Bearer <key>)",
            "authentication_error",
            None,
            "invalid_api_key",
        )


def caller_role(request: Request, settings: ServeSettings) -> str:
    """:data:`OPERATOR` for the operator key, else :data:`CLIENT` once the inference key passes (401 if not)."""
    if settings.admin_key is not None and _same_key(_bearer(request), settings.admin_key):
        return OPERATOR
    authorize(request, settings)
    return CLIENT


def authorize_operator(request: Request, settings: ServeSettings) -> None:
    """The operator key, or 403: the operator routes are off without one, and the inference key is not it."""
    if settings.admin_key is None:
        raise APIError(
            403,
            "the operator routes are off: start candor serve with an operator key in $CANDOR_ADMIN_KEY "
            "(or the variable --admin-key-env names) to turn them on",
            "permission_error",
            None,
            "operator_routes_off",
        )
    if caller_role(request, settings) != OPERATOR:
        raise APIError(
            403,
            "this route needs the operator key (Authorization: Bearer <operator key>), not the inference key",
            "permission_error",
            None,
            "operator_key_required",
        )


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed ``limit`` (before it is all read).

    A client that has not sent the whole body within ``timeout_s`` is answered 408, so half-sent
    bodies cannot hold connections open.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(
            413, f"request body is larger than {limit} bytes", "invalid_request_error", None, "request_too_large"
        )
    chunks, size = [], 0
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise APIError(
                        413,
                        f"request body is larger than {limit} bytes",
                        "invalid_request_error",
                        None,
                        "request_too_large",
                    )
                chunks.append(chunk)
    except TimeoutError:
        raise APIError(
            408,
            f"the request body was not received within {timeout_s:g} s",
            "invalid_request_error",
            None,
            "request_timeout",
        ) from None
    return b"".join(chunks)


# The charsets a JSON body may declare (RFC 8259 bodies are UTF-8; some clients say latin-1 and mean it).
CHARSETS = {"utf-8": "utf-8", "utf8": "utf-8", "us-ascii": "ascii", "ascii": "ascii"}
CHARSETS |= dict.fromkeys(("latin-1", "latin1", "iso-8859-1", "iso8859-1", "l1"), "latin-1")


def declared_charset(content_type: str | None) -> str | None:
    """The codec of a ``Content-Type``'s ``charset`` parameter; None without one; 400 for one candor does not read."""
    for part in (content_type or "").split(";")[1:]:
        name, _, value = part.partition("=")
        if name.strip().lower() == "charset":
            charset = value.strip().strip('"').lower()
            if charset not in CHARSETS:
                raise APIError(
                    400,
                    f"charset {charset[:40]!r} is not supported: send UTF-8 (or declare latin-1 or us-ascii)",
                    "invalid_request_error",
                    None,
                    "unsupported_charset",
                )
            return CHARSETS[charset]
    return None


def json_body(raw: bytes, content_type: str | None = None) -> Any:
    """The parsed body (decoded by the ``charset`` its ``content_type`` declares; else UTF-8, as JSON says); what
    JSON itself refuses, or Python cannot hold, is a 400 naming why."""
    charset = declared_charset(content_type)
    try:
        return json.loads(raw.decode(charset) if charset is not None else raw)
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError, and integers beyond Python's digit limit
        message = f"the body is not valid JSON: {exc}"
    except RecursionError:
        message = "the body is not valid JSON here: it nests too deeply"
    raise APIError(400, message, "invalid_request_error", None, "invalid_json")


def parse_body(
    raw: bytes, schema: type[BaseModel], settings: ServeSettings, model: HonestModel, content_type: str | None = None
) -> Any:
    """A request body (as :func:`read_body` read it) parsed by ``schema`` and checked against ``model``'s limits."""
    data = json_body(raw, content_type)  # decoded by the charset the request declares
    if not isinstance(data, dict):
        raise APIError(400, "the body must be a JSON object", "invalid_request_error", None, "invalid_json")
    try:
        body = schema.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"] if not is_union_tag(p)) or None
        raise APIError(400, f"{param}: {first['msg']}", "invalid_request_error", param, "invalid_value") from None
    check_limits(body, settings, model)
    return body


Body = ChatRequest | CompletionRequest | ResponsesRequest


# The member of a union pydantic names in an error's location (``input.str``, ``input.list[InputItem]``): not a field.
UNION_TAG = re.compile(r"str|int|float|bool|none|dict|list|.*\[.*\]")


def is_union_tag(part: str | int) -> bool:
    return isinstance(part, str) and UNION_TAG.fullmatch(part) is not None


def check_limits(body: Body, settings: ServeSettings, model: HonestModel) -> None:
    for name in body.unsupported():
        if name in (body.model_extra or {}):
            message = (
                f"{name} is not a field candor knows: it is refused rather than silently ignored "
                "(docs/serving.md lists the fields, and those accepted as no-ops)"
            )
            raise APIError(400, message[:400], "invalid_request_error", name[:100], "unknown_parameter")
        why = UNSUPPORTED_WHY.get(name)
        message = f"{name} is not supported by candor" + (f": {why}" if why else "")
        raise APIError(400, message, "invalid_request_error", name, "unsupported")
    if body.model != settings.model_id:
        raise APIError(
            404,
            f"the model {body.model!r} does not exist; this server serves {settings.model_id!r}",
            "invalid_request_error",
            "model",
            "model_not_found",
        )
    if not 1 <= body.n <= settings.max_n:
        raise APIError(400, f"n must be between 1 and {settings.max_n}", "invalid_request_error", "n", "invalid_value")
    stops = body.stops()
    try:
        for stop in stops:
            check_text(stop, "a stop string")
    except CandorError as exc:
        raise APIError(400, str(exc), "invalid_request_error", "stop", "invalid_value") from None
    if len(stops) > MAX_STOPS or any(not s or len(s) > 64 for s in stops):
        raise APIError(
            400,
            f"stop takes at most {MAX_STOPS} non-empty strings of up to 64 characters",
            "invalid_request_error",
            "stop",
            "invalid_value",
        )
    cap = body.token_cap()
    limit = max_tokens_limit(settings, model)
    if cap is not None and not 1 <= cap <= limit:
        raise APIError(
            400,
            f"{body.cap_param} must be between 1 and {limit}",
            "invalid_request_error",
            body.cap_param,
            "invalid_value",
        )
    if body.stream and body.top_logprobs_wanted() is not None:
        raise APIError(
            400,
            "logprobs are not streamed: ask for them without stream",
            "invalid_request_error",
            "logprobs",
            "unsupported",
        )
    if body.top_logprobs_wanted() is not None and model.claims is not None and model.claims.policy.refine is not None:
        raise APIError(
            400,
            "logprobs are not returned when the server refines answers by claims (--refine): "
            "the generated tokens hold the text of refined claims",
            "invalid_request_error",
            "logprobs",
            "unsupported",
        )
    param = body.text_param
    if sum(len(t) for t in body.texts()) > settings.max_question_chars:
        raise APIError(
            400,
            f"the {param} are longer than {settings.max_question_chars} characters in all",
            "invalid_request_error",
            param,
            "context_length_exceeded",
        )


def max_tokens_limit(settings: ServeSettings, model: HonestModel) -> int:
    """The largest ``max_tokens`` a request may ask for: the setting, else the model's context."""
    if settings.max_tokens is not None:
        return settings.max_tokens
    return model.context_length or max(UNKNOWN_CONTEXT_MAX_TOKENS, model.decoding.max_new_tokens)


History = tuple[tuple[str, str], ...]


def conversation_of(body: ChatRequest | ResponsesRequest, settings: ServeSettings) -> tuple[History, str]:
    """``(earlier turns, question)``; with ``conversations="refuse"``, one user message or a 400."""
    param = body.text_param
    try:
        history, question = body.history_and_question()
    except ValueError as exc:
        raise APIError(400, str(exc), "invalid_request_error", param, "unsupported") from None
    if history and settings.conversations == "refuse":
        raise APIError(
            400,
            "this server answers one question per request (--conversations refuse): send exactly "
            f"one user message and no system prompt (got roles {[role for role, _ in history] + ['user']})",
            "invalid_request_error",
            param,
            "unsupported",
        )
    if not question.strip():
        raise APIError(
            400,
            "the question is empty (the last user message has no text)",
            "invalid_request_error",
            param,
            "invalid_value",
        )
    return history, question
