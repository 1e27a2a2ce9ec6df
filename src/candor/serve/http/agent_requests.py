"""The agent fields of a request, checked: ``tools``, ``tool_choice``, ``parallel_tool_calls``, structured output.

Chat completions and Responses follow one set of rules (docs/agents.md "What a request may hold"):

- ``tools``: function tools (chat ``{"type": "function", "function": {...}}``, Responses
  ``{"type": "function", "name", ...}``); anything else is 400 naming the tool.
- ``tool_choice``: ``"auto"`` (the default with tools), ``"none"``, ``"required"`` or one named
  function; ``"required"`` or a name without tools is 400.
- ``parallel_tool_calls``: a boolean (default true: several calls in one turn).
- ``response_format`` (chat) or ``text.format`` (Responses): ``text``, ``json_object``, or
  ``json_schema`` with a ``schema``.

A request whose tools may be called, that asks for a structured output, or whose history holds tool calls
or tool results is an :class:`~candor.serve.agent_turns.AgentTurn`; any other is a question.
"""

from __future__ import annotations

from typing import Any

from candor.serve.agent_turns import JSON_OBJECT, AgentTurn
from candor.serve.http.request_checks import APIError
from candor.serve.http.schemas import ChatRequest, ResponsesRequest
from candor.serve.http.settings import ServeSettings
from candor.tool_calls import Tool, ToolsError, tools_from_openai

CHOICES = ("auto", "none", "required")


def bad(message: str, param: str) -> APIError:
    return APIError(400, message, "invalid_request_error", param, "invalid_value")


def agent_turn_of(body: ChatRequest | ResponsesRequest, settings: ServeSettings) -> AgentTurn | None:
    """The request's agent turn, checked; None for a plain question (answered by the QA path)."""
    tools = _tools(body.tools)
    choice = _tool_choice(body.tool_choice, tools)
    parallel = _parallel(body.parallel_tool_calls)
    schema = _output_schema(body)
    calls = bool(tools) and choice != "none"
    if not calls and schema is None and not body.has_tool_turns():
        return None
    try:
        messages = body.turns()
    except ValueError as exc:
        raise APIError(400, str(exc), "invalid_request_error", body.text_param, "unsupported") from None
    if not any(m["role"] == "user" for m in messages):
        raise bad(f"{body.text_param}: there is no user message to answer", body.text_param)
    if len(messages) > 1 and settings.conversations == "refuse":
        raise APIError(
            400,
            "this server answers one question per request (--conversations refuse): send exactly one user "
            "message (tool results are a conversation)",
            "invalid_request_error",
            body.text_param,
            "unsupported",
        )
    return AgentTurn(
        messages=tuple(messages), tools=tuple(tools), tool_choice=choice, parallel=parallel, output_schema=schema
    )


def _tools(value: Any) -> list[Tool]:
    if value is None or value == []:
        return []
    if not isinstance(value, list):
        raise bad("tools must be a list of function tools", "tools")
    try:
        return tools_from_openai(value, "tools")
    except ToolsError as exc:
        raise bad(str(exc), exc.param) from None


def _tool_choice(value: Any, tools: list[Tool]) -> str:
    """``"auto"``, ``"none"``, ``"required"`` or the one function's name; the same rules on both endpoints."""
    if value is None:
        return "auto" if tools else "none"
    name = None
    if isinstance(value, str):
        if value not in CHOICES:
            raise bad(
                f"tool_choice must be one of {', '.join(CHOICES)} or a named function; got {value!r}", "tool_choice"
            )
        if value == "required" and not tools:
            raise bad("tool_choice 'required' needs tools to call", "tool_choice")
        return value
    if isinstance(value, dict) and value.get("type") == "function":
        function = value.get("function")
        name = function.get("name") if isinstance(function, dict) else value.get("name")
    if not isinstance(name, str):
        raise bad(
            'tool_choice must be "auto", "none", "required" or {"type": "function", "function": {"name": ...}}',
            "tool_choice",
        )
    if name not in {t.name for t in tools}:
        raise bad(f"tool_choice names {name!r}, which is not among the tools offered", "tool_choice")
    return name


def _parallel(value: Any) -> bool:
    if value is None:
        return True
    if not isinstance(value, bool):
        raise bad("parallel_tool_calls must be true or false", "parallel_tool_calls")
    return value


def _output_schema(body: ChatRequest | ResponsesRequest) -> dict[str, Any] | None:
    """A structured output's JSON Schema; None for text."""
    if isinstance(body, ChatRequest):
        return _format(body.response_format, "response_format", nested=True)
    text = body.text
    if text is None:
        return None
    if not isinstance(text, dict) or set(text) - {"format", "verbosity"}:
        raise bad("text takes format and verbosity", "text")
    return _format(text.get("format"), "text.format", nested=False)


def _format(value: Any, param: str, nested: bool) -> dict[str, Any] | None:
    """``{"type": "text"}`` → None; ``json_object`` → any object; ``json_schema`` → its schema.

    Chat nests the schema (``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``);
    Responses does not (``{"type": "json_schema", "name", "schema", "strict"}``).
    """
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return dict(JSON_OBJECT)
    if kind == "json_schema":
        spec = value.get("json_schema") if nested else value
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            where = f"{param}.json_schema.schema" if nested else f"{param}.schema"
            raise bad(f"{where}: a JSON Schema object is required", where)
        return schema
    raise bad(f"{param}.type must be text, json_object or json_schema; got {kind!r}", param)
