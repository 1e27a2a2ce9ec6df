"""The prompt that offers tools to a model: its chat template's own tool format, or candor's documented one.

A chat template that takes ``tools`` (transformers ``apply_chat_template(tools=...)``; Qwen, Llama 3.1,
Hermes…) renders them its own way. A template without tools (the embedded SmolLM2) gets
:data:`TOOL_PROMPT`: a system message listing each tool as one line of JSON and the reply format.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from candor.tool_calls.calls import Call, calls_to_json
from candor.tool_calls.tools import Tool, ToolsError
from candor.util.errors import CandorError

TOOL_PROMPT = (
    "You can call these tools (functions). Each line is one tool as JSON:\n"
    "{tools}\n"
    "\n"
    'To call a tool, reply with only a JSON object: {{"name": "<tool name>", "arguments": '
    '{{"<argument>": <value>, ...}}}}.\n'
    "To make several calls at once, reply with only a JSON list of such objects.\n"
    "{choice}"
)
"""The documented tool prompt (docs/serving.md): ``{tools}`` is one JSON line per tool, ``{choice}`` a
line from :data:`CHOICE_LINES`."""

CHOICE_LINES = {
    "auto": "If no tool helps, answer in plain text instead.",
    "required": "You must call at least one tool.",
}
TOOL_CHOICES = ("auto", "none", "required")


def _text(content: Any, where: str) -> str:
    """A message's content as text: a string, null, or OpenAI content parts (their text joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for index, part in enumerate(content):
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif isinstance(part, str):
                parts.append(part)
            else:
                raise CandorError(f"{where}.content.{index}: only text parts are supported")
        return "".join(parts)
    raise CandorError(f"{where}.content: must be a string, a list of text parts, or null")


def _calls_of(message: dict[str, Any], where: str) -> list[Call]:
    calls = []
    for index, item in enumerate(message.get("tool_calls") or []):
        body = item.get("function", item) if isinstance(item, dict) else None
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            raise CandorError(f"{where}.tool_calls.{index}.function.name: must be a string")
        arguments = body.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as error:
                raise CandorError(f"{where}.tool_calls.{index}.function.arguments: not JSON ({error.msg})") from None
        if not isinstance(arguments, dict):
            raise CandorError(f"{where}.tool_calls.{index}.function.arguments: must be a JSON object")
        calls.append(Call(name=body["name"], arguments=arguments))
    return calls


def _call_names(messages: Sequence[dict[str, Any]]) -> dict[str, str]:
    """tool_call_id → function name, from the assistant turns' tool_calls."""
    names = {}
    for message in messages:
        for item in message.get("tool_calls") or []:
            if isinstance(item, dict) and isinstance(item.get("id"), str):
                body = item.get("function", item)
                if isinstance(body, dict) and isinstance(body.get("name"), str):
                    names[item["id"]] = body["name"]
    return names


def _template_text(tokenizer: Any) -> str:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: transformers picks "tool_use" when tools are given
        template = template.get("tool_use") or template.get("default")
    if not isinstance(template, str) or not template:
        raise CandorError("the model has no chat template; tool calls need a chat model")
    return template


def template_takes_tools(tokenizer: Any) -> bool:
    """The chat template reads a ``tools`` variable (so it renders the tools its own way)."""
    import jinja2
    from jinja2 import meta

    try:
        parsed = jinja2.Environment().parse(_template_text(tokenizer))
    except jinja2.TemplateSyntaxError:
        return False
    return "tools" in meta.find_undeclared_variables(parsed)


def _offered(tools: Sequence[Tool], tool_choice: str | Tool) -> tuple[list[Tool], str | None]:
    """The tools the prompt lists and the choice line (None: no tools at all)."""
    if isinstance(tool_choice, Tool):
        return [tool_choice], "required"
    if tool_choice not in TOOL_CHOICES:
        raise ToolsError("tool_choice", f"must be one of {', '.join(TOOL_CHOICES)} or a function, got {tool_choice!r}")
    if tool_choice == "none" or not tools:
        return [], None
    return list(tools), tool_choice


def _documented(messages: Sequence[dict[str, Any]], tools: list[Tool], choice: str | None) -> list[dict[str, str]]:
    names = _call_names(messages)
    plain: list[dict[str, str]] = []
    for index, message in enumerate(messages):
        where = f"messages.{index}"
        role = message.get("role")
        if role == "developer":
            role = "system"
        if role == "tool":
            name = message.get("name") or names.get(message.get("tool_call_id", ""), "tool")
            plain.append(
                {"role": "user", "content": f"Result of the tool {name}: {_text(message.get('content'), where)}"}
            )
        elif role == "assistant" and message.get("tool_calls"):
            plain.append({"role": "assistant", "content": calls_to_json(_calls_of(message, where))})
        elif role in ("system", "user", "assistant"):
            text = _text(message.get("content"), where)
            if role == "assistant" and not text and isinstance(message.get("refusal"), str):
                text = message["refusal"]
            plain.append({"role": role, "content": text})
        else:
            raise CandorError(f"{where}.role: unknown role {role!r}")
    if choice is None:
        return plain
    listed = "\n".join(json.dumps(tool.to_json(), ensure_ascii=False) for tool in tools)
    system = TOOL_PROMPT.format(tools=listed, choice=CHOICE_LINES[choice])
    if plain and plain[0]["role"] == "system":
        return [{"role": "system", "content": plain[0]["content"] + "\n\n" + system}, *plain[1:]]
    return [{"role": "system", "content": system}, *plain]


def tool_prompt_messages(
    messages: Sequence[dict[str, Any]], tools: Sequence[Tool], tool_choice: str | Tool
) -> list[dict[str, str]]:
    """The documented tool prompt as chat messages: the conversation in plain turns (tool results as user turns,
    calls as their JSON) and a system message listing the tools and the choice. What :func:`render_tool_prompt`
    renders for a template without tools, for a server that applies its own template (a chat endpoint)."""
    offered, choice = _offered(tools, tool_choice)
    return _documented(messages, offered, choice)


def _for_template(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as transformers' tool-calling templates expect them: arguments as objects, content as text."""
    names = _call_names(messages)
    shaped: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        where = f"messages.{index}"
        role = message.get("role")
        out: dict[str, Any] = {"role": "system" if role == "developer" else role}
        out["content"] = _text(message.get("content"), where)
        if role == "assistant" and message.get("tool_calls"):
            out["tool_calls"] = [
                {"type": "function", "function": {"name": call.name, "arguments": call.arguments}}
                for call in _calls_of(message, where)
            ]
        if role == "tool":
            out["name"] = message.get("name") or names.get(message.get("tool_call_id", ""), "tool")
            if message.get("tool_call_id"):
                out["tool_call_id"] = message["tool_call_id"]
        shaped.append(out)
    return shaped


def render_tool_prompt(
    tokenizer: Any, messages: Sequence[dict[str, Any]], tools: Sequence[Tool], tool_choice: str | Tool
) -> str:
    """The prompt text (generation prompt added) that offers ``tools`` under ``tool_choice``.

    ``tool_choice``: ``"auto"`` (call or answer), ``"required"`` (call at least one), ``"none"`` (no tools
    listed), or one :class:`Tool` (only it is listed, and a call is required). What the reply may be is
    enforced by the decoding constraint (:func:`candor.tool_calls.calls_schema`), not by the prompt alone.
    """
    offered, choice = _offered(tools, tool_choice)
    if template_takes_tools(tokenizer):
        kwargs: dict[str, Any] = {"tools": [tool.to_openai() for tool in offered]} if offered else {}
        return tokenizer.apply_chat_template(
            _for_template(messages), tokenize=False, add_generation_prompt=True, **kwargs
        )
    _template_text(tokenizer)  # the plain template must exist too
    return tokenizer.apply_chat_template(
        tool_prompt_messages(messages, tools, tool_choice), tokenize=False, add_generation_prompt=True
    )
