"""The JSON Schema that a reply calling the offered tools must satisfy (the constraint handed to decoding)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from candor.tool_calls.tools import Tool


def call_schema(tool: Tool) -> dict[str, Any]:
    """One call of ``tool``: ``{"name": <its name>, "arguments": <its parameters>}``, nothing else."""
    arguments = tool.parameters or {"type": "object"}
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, "arguments": arguments},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


# The most calls one reply may make in parallel: a bound on what a small model that repeats itself can emit.
MAX_PARALLEL_CALLS = 8


def calls_schema(tools: Sequence[Tool], parallel: bool) -> dict[str, Any]:
    """One call of any offered tool (``anyOf`` over them); with ``parallel``, that or a JSON list of 1 to
    :data:`MAX_PARALLEL_CALLS` calls (the prompt asks for one object unless several calls are needed)."""
    if not tools:
        raise ValueError("calls_schema needs at least one tool")
    calls = [call_schema(tool) for tool in tools]
    one = calls[0] if len(calls) == 1 else {"anyOf": calls}
    if parallel:
        return {"anyOf": [one, {"type": "array", "items": one, "minItems": 1, "maxItems": MAX_PARALLEL_CALLS}]}
    return one
