"""An agent's turn: a conversation answered with a tool call or a structured output, and what each carries.

A request that offers ``tools`` (with a ``tool_choice`` other than ``"none"``), asks for a structured
output (``response_format``, Responses ``text.format``) or holds tool calls and tool results in its
history is an :class:`AgentTurn`. It is answered as a question is (docs/methods.md "Generation and
judging"): the greedy output and the source's samples at :data:`~candor.serve.answering.PROTOCOL_SAMPLES`,
seeded by the conversation, each decoded **grammar-constrained** where the backend can
(:class:`~candor.backends.constraints.JsonConstraint`), so a call always parses into one offered tool's
arguments and a structured output into its schema. The confidence is the method's, on the canonical
text of the output (:func:`canonical_text`), and:

- each call gets its own values (:func:`call_values`): ``value``, the geometric mean probability of the
  call's tokens (the model's distribution before the grammar's mask), and ``agreement``, the share of the
  samples that make an equal call (same function, arguments equal after JSON normalisation);
- each top-level field of a structured output gets the same two (:func:`field_values`).

An abstention makes no call. The reply of an agent turn never streams before its decision.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from candor.annotation.records import Record
from candor.backends.base import Completion
from candor.backends.constraints import JsonConstraint
from candor.tool_calls import Call, Tool, calls_agree, calls_canonical, calls_schema, parse_calls

# The request shapes of agent turns (``confidence.computed_on.shape``); no calibration is fitted on them.
TOOL_CALL, STRUCTURED, TOOL_CONVERSATION = "tool_call", "structured_output", "tool_conversation"
AGENT_MAX_NEW_TOKENS = 256  # an agent turn's token cap when the request names none (a call is longer than an answer)
JSON_OBJECT: dict[str, Any] = {"type": "object"}  # ``response_format: {"type": "json_object"}``


@dataclass(frozen=True)
class AgentTurn:
    """What an agent's request asks beyond a question: the conversation, the tools, the output's schema."""

    messages: tuple[dict[str, Any], ...]  # chat messages: role, content, tool_calls, tool_call_id, name
    tools: tuple[Tool, ...] = ()
    tool_choice: str = "auto"  # "auto", "none", "required", or the name of the one tool to call
    parallel: bool = True
    output_schema: dict[str, Any] | None = None  # a structured output's JSON Schema

    @property
    def calls_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"

    def offered(self) -> tuple[Tool, ...]:
        """The tools the model may call: all, or the one ``tool_choice`` names."""
        if self.tool_choice in ("auto", "required", "none"):
            return self.tools
        return tuple(t for t in self.tools if t.name == self.tool_choice)

    def constraint(self) -> JsonConstraint | None:
        """The grammar every output is decoded under; None: free text."""
        if self.calls_tools:
            schema = calls_schema(self.offered(), self.parallel)
            if self.output_schema is not None and self.tool_choice == "auto":  # "required" or a name: a call
                schema = {"anyOf": [schema, self.output_schema]}
            return JsonConstraint.of(schema, allow_text=self.tool_choice == "auto" and self.output_schema is None)
        if self.output_schema is not None:
            return JsonConstraint.of(self.output_schema)
        return None

    @property
    def shape(self) -> str:
        if self.calls_tools:
            return TOOL_CALL
        return STRUCTURED if self.output_schema is not None else TOOL_CONVERSATION

    def question(self) -> str:
        """The last user message's text (what seeds and a question-level head read)."""
        users = [m["content"] for m in self.messages if m["role"] == "user"]
        return users[-1] if users and users[-1].strip() else "(no question)"

    def history(self) -> tuple[tuple[str, str], ...]:
        """Every turn as ``(role, text)``, tool calls as their canonical JSON: the conversation's key."""
        out = []
        for m in self.messages:
            text = m["content"]
            if m.get("tool_calls"):
                text = calls_canonical([Call(c["name"], c["arguments"]) for c in m["tool_calls"]])
            out.append((m["role"], text))
        return tuple(out)


@dataclass
class AgentReply:
    """What an agent turn's choice carries besides its text: its calls and their values, or its fields'."""

    calls: list[Call] | None = None
    call_values: list[dict[str, Any]] = field(default_factory=list)
    fields: dict[str, dict[str, Any]] | None = None
    call_ids: list[str] = field(default_factory=list)  # given when first shown (candor.serve.http.responses)

    def describe(self) -> dict[str, Any]:
        """The agent part of a choice's ``confidence`` object."""
        out: dict[str, Any] = {}
        if self.calls is not None:
            out["tool_calls"] = self.call_values
        if self.fields is not None:
            out["fields"] = self.fields
        return out


def parsed_output(turn: AgentTurn, text: str) -> list[Call] | None:
    """The calls a text makes, when the turn offers tools; None for a text (or structured) answer."""
    return parse_calls(text) if turn.calls_tools else None


def canonical_text(turn: AgentTurn, completion: Completion) -> Completion:
    """The completion with its text in canonical form (calls sorted and normalised, JSON re-serialised),
    so that the method compares outputs, not their spacing."""
    calls = parsed_output(turn, completion.text)
    if calls is not None:
        return _with_text(completion, calls_canonical(calls))
    if turn.output_schema is not None:
        try:
            return _with_text(completion, json.dumps(json.loads(completion.text), sort_keys=True))
        except ValueError:
            return completion
    return completion


def _with_text(completion: Completion, text: str) -> Completion:
    return replace(completion, text=text)


def exact_agreement(record: Record) -> float:
    """The share of the samples whose canonical output equals the greedy one's (an agent turn's consistency)."""
    if not record.samples:
        return float("nan")
    return sum(s.text == record.greedy.text for s in record.samples) / len(record.samples)


def token_offsets(completion: Completion) -> list[tuple[int, int]]:
    """Each token's ``[start, end)`` in the completion's (stripped) text."""
    raw = "".join(completion.tokens)
    at = -(len(raw) - len(raw.lstrip()))
    out = []
    for tok in completion.tokens:
        out.append((at, at + len(tok)))
        at += len(tok)
    return out


def span_probability(completion: Completion, start: int, end: int) -> float | None:
    """The geometric mean probability of the tokens overlapping ``[start, end)`` of the text (None: none)."""
    lps = [
        lp
        for (a, b), lp in zip(token_offsets(completion), completion.logprobs, strict=False)
        if a < end and b > start and lp is not None
    ]
    return math.exp(sum(lps) / len(lps)) if lps else None


def element_spans(text: str) -> list[tuple[int, int]]:
    """The ``[start, end)`` of each top-level value of a JSON array, or of the one value when not an array."""
    decoder = json.JSONDecoder()
    i = _skip(text, 0)
    if not text.startswith("[", i):
        _, end = decoder.raw_decode(text, i)
        return [(i, end)]
    out, i = [], _skip(text, i + 1)
    while i < len(text) and text[i] != "]":
        _, end = decoder.raw_decode(text, i)
        out.append((i, end))
        i = _skip(text, end)
        if i < len(text) and text[i] == ",":
            i = _skip(text, i + 1)
    return out


def field_spans(text: str) -> dict[str, tuple[int, int]]:
    """The ``[start, end)`` of each top-level field's value of a JSON object ({} for another value)."""
    decoder = json.JSONDecoder()
    i = _skip(text, 0)
    if not text.startswith("{", i):
        return {}
    out, i = {}, _skip(text, i + 1)
    while i < len(text) and text[i] != "}":
        key, i = decoder.raw_decode(text, i)
        i = _skip(text, _skip(text, i) + 1)  # past the colon
        _, end = decoder.raw_decode(text, i)
        out[str(key)] = (i, end)
        i = _skip(text, end)
        if i < len(text) and text[i] == ",":
            i = _skip(text, i + 1)
    return out


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def call_values(
    completion: Completion, calls: Sequence[Call], samples: Sequence[list[Call] | None]
) -> list[dict[str, Any]]:
    """Per call: its tokens' geometric mean probability and the share of samples that make an equal call."""
    try:
        spans = element_spans(completion.text)
    except ValueError:
        spans = []
    out = []
    for i, call in enumerate(calls):
        value = span_probability(completion, *spans[i]) if len(spans) == len(calls) else None
        agree = [any(calls_agree([call], [c]) for c in s or ()) for s in samples]
        out.append(
            {
                "index": i,
                "name": call.name,
                "value": value,
                "agreement": sum(agree) / len(agree) if agree else None,
            }
        )
    return out


def field_values(completion: Completion, samples: Sequence[str]) -> dict[str, dict[str, Any]] | None:
    """Per top-level field of a JSON object: its value's tokens' probability and the samples agreeing on it."""
    try:
        spans = field_spans(completion.text)
        value = json.loads(completion.text)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    parsed = []
    for s in samples:
        try:
            parsed.append(json.loads(s))
        except ValueError:
            parsed.append(None)
    out = {}
    for key, (start, end) in spans.items():
        agree = [isinstance(p, dict) and key in p and _same(p[key], value.get(key)) for p in parsed]
        out[key] = {
            "value": span_probability(completion, start, end),
            "agreement": sum(agree) / len(agree) if agree else None,
        }
    return out


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
