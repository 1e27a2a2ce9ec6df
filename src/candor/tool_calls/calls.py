"""A call of a tool as the model wrote it: parsing, a canonical text, and agreement between two answers."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

CALL_OPENERS = ("{", "[")  # a reply that starts with one of these is an attempt at a call (JSON), never plain text
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)
_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def normalise(value: Any) -> Any:
    """A JSON value with whole floats as integers (``1.0`` → ``1``), so equal numbers have one text."""
    if isinstance(value, bool) or value is None or isinstance(value, str | int):
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, dict):
        return {str(key): normalise(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [normalise(item) for item in value]
    return value


@dataclass(frozen=True)
class Call:
    """One call: the function's name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any]

    def canonical(self) -> str:
        """Keys sorted, no spaces, whole numbers as integers: two equal calls have one text."""
        return json.dumps(
            {"name": self.name, "arguments": normalise(self.arguments)},
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
        )


def _call_of(item: Any) -> Call | None:
    if not isinstance(item, dict):
        return None
    if isinstance(item.get("function"), dict):  # the OpenAI tool_calls shape
        item = item["function"]
    name = item.get("name")
    if not isinstance(name, str) or not name:
        return None
    arguments = item.get("arguments", item.get("parameters", {}))
    if isinstance(arguments, str):  # the OpenAI wire shape carries arguments as JSON text
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return Call(name=name, arguments=arguments)


def _first_json(text: str) -> Any:
    """The JSON value the text starts with (text after it is ignored); raises ValueError if there is none."""
    value, _ = json.JSONDecoder().raw_decode(text)
    return value


def starts_like_call(text: str) -> bool:
    """The reply is an attempt at a call: it starts (after blanks, a code fence or a ``<tool_call>`` tag) with JSON."""
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1)
    return body.startswith(CALL_OPENERS) or body.startswith("<tool_call>")


def may_become_call(prefix: str) -> bool:
    """Whether a reply that starts with ``prefix`` can still turn out a call for :func:`parse_calls` (False: it is
    a plain answer whatever follows, so a caller may stop generating it once that is all it needs to know)."""
    body = prefix.lstrip()
    if not body or body.startswith(CALL_OPENERS):
        return True
    if body.startswith("<"):
        return "<tool_call>".startswith(body) or body.startswith("<tool_call>")
    if not body.startswith("`"):
        return False
    if "```".startswith(body):
        return True
    if not body.startswith("```"):
        return False
    rest = body[3:]
    if "json".startswith(rest):
        return True
    if rest.startswith("json"):
        rest = rest[4:]
    after = rest.lstrip()
    return not after or after.startswith(CALL_OPENERS)


def parse_calls(text: str) -> list[Call] | None:
    """The calls in a reply, or None when it is not a call (a plain answer, or JSON that is not a call).

    Accepted: one JSON object ``{"name", "arguments"}`` (``parameters`` is read as ``arguments``, and
    arguments may be JSON text as on the OpenAI wire), a JSON list of them, either inside a ```` ```json ````
    fence, or ``<tool_call>…</tool_call>`` blocks (the tool-calling chat templates' format). The reply
    must START with the call; text after the complete JSON value is ignored.
    """
    body = text.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1)
    try:
        if body.startswith("<tool_call>"):
            values = [_first_json(block) for block in _TAGGED.findall(body)]
        elif body.startswith(CALL_OPENERS):
            first = _first_json(body)
            values = first if isinstance(first, list) else [first]
        else:
            return None
    except ValueError:
        return None
    calls = [_call_of(value) for value in values]
    if not calls or any(call is None for call in calls):
        return None
    return [call for call in calls if call is not None]


def calls_canonical(calls: Sequence[Call]) -> str:
    """The canonical text of a list of calls: a JSON list, sorted as a set (the order of parallel calls is free)."""
    return "[" + ",".join(sorted(call.canonical() for call in calls)) + "]"


def calls_agree(a: Sequence[Call], b: Sequence[Call]) -> bool:
    """The same calls (as a multiset): same function names, arguments equal after :func:`normalise`."""
    return calls_canonical(a) == calls_canonical(b)


def calls_to_json(calls: Sequence[Call]) -> str:
    """The reply text of calls in the documented prompt's format: one object, or a list for several."""
    items = [{"name": call.name, "arguments": call.arguments} for call in calls]
    return json.dumps(items[0] if len(items) == 1 else items, ensure_ascii=False)
