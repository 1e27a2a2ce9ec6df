"""A function tool the model may call, and the OpenAI request shapes that declare tools."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from candor.util.errors import CandorError


class ToolsError(CandorError):
    """Bad ``tools`` (or ``tool_choice``) input; ``param`` names the field, as the OpenAI error shape's ``param``."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(f"{param}: {message}")
        self.param = param


@dataclass(frozen=True)
class Tool:
    """One function: its name, what it does, and the JSON Schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI chat shape ``{"type": "function", "function": {...}}`` (what chat templates take)."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def to_json(self) -> dict[str, Any]:
        """The plain ``{"name", "description", "parameters"}`` object (what the documented prompt lists)."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}


def _one_tool(item: Any, where: str) -> Tool:
    if not isinstance(item, dict):
        raise ToolsError(where, f"must be an object, got {type(item).__name__}")
    kind = item.get("type", "function")
    if kind != "function":
        raise ToolsError(f"{where}.type", f"only function tools are supported, got {kind!r}")
    # Chat: {"type": "function", "function": {...}}; Responses: {"type": "function", "name": ...}.
    if "function" in item:
        body, prefix = item["function"], f"{where}.function"
        if not isinstance(body, dict):
            raise ToolsError(prefix, f"must be an object, got {type(body).__name__}")
    else:
        body, prefix = item, where
    name = body.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ToolsError(f"{prefix}.name", "must be a non-empty string")
    description = body.get("description", "")
    if description is None:
        description = ""
    if not isinstance(description, str):
        raise ToolsError(f"{prefix}.description", "must be a string")
    parameters = body.get("parameters")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise ToolsError(f"{prefix}.parameters", "must be a JSON Schema object")
    return Tool(name=name, description=description, parameters=parameters)


def tools_from_openai(tools: list[Any], param: str = "tools") -> list[Tool]:
    """Read OpenAI chat (``{"type": "function", "function": {...}}``) or Responses (``{"type": "function",
    "name": ...}``) tool declarations; a :class:`ToolsError` names the bad field (e.g. ``tools.1.function.name``)."""
    if not isinstance(tools, list):
        raise ToolsError(param, f"must be a list of tools, got {type(tools).__name__}")
    parsed = [_one_tool(item, f"{param}.{index}") for index, item in enumerate(tools)]
    seen: dict[str, int] = {}
    for index, tool in enumerate(parsed):
        if tool.name in seen:
            raise ToolsError(f"{param}.{index}", f"tool name {tool.name!r} repeats {param}.{seen[tool.name]}")
        seen[tool.name] = index
    return parsed
