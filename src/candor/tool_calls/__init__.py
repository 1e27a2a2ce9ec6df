"""Tool calls: the tools offered, the calls a model makes, the schema that constrains them, and the prompt.

One module per concept: :mod:`.tools` (declarations), :mod:`.calls` (parsing, canonical text, agreement),
:mod:`.schema` (the JSON Schema of a reply that calls), :mod:`.prompt` (the prompt that offers the tools),
and :mod:`.bfcl` (the Berkeley Function Calling Leaderboard's data and judge, for benchmarks).
"""

from candor.tool_calls.calls import (
    Call,
    calls_agree,
    calls_canonical,
    may_become_call,
    parse_calls,
    starts_like_call,
)
from candor.tool_calls.prompt import TOOL_PROMPT, render_tool_prompt, template_takes_tools, tool_prompt_messages
from candor.tool_calls.schema import calls_schema
from candor.tool_calls.tools import Tool, ToolsError, tools_from_openai

__all__ = [
    "TOOL_PROMPT",
    "Call",
    "Tool",
    "ToolsError",
    "calls_agree",
    "calls_canonical",
    "calls_schema",
    "may_become_call",
    "parse_calls",
    "render_tool_prompt",
    "starts_like_call",
    "template_takes_tools",
    "tool_prompt_messages",
    "tools_from_openai",
]
