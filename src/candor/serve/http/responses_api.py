"""The OpenAI Responses API shapes (``POST /v1/responses``): the response object and its streamed events.

A response holds one ``output`` item, the assistant's message, with one content part: the answer as
an ``output_text`` part or, for an abstention, the refusal: the API's own ``refusal`` part with
``--abstain-as refusal``, the refusal text as an ``output_text`` part with ``--abstain-as text``. The
response carries a top-level ``confidence`` object (as a chat choice does) and, plain, the
``x-candor-*`` headers. An answer cut by ``max_output_tokens`` is ``status: "incomplete"`` (its stream
ends with ``response.incomplete``). A stream is the API's events, each with its ``sequence_number``:
``response.created``, ``response.in_progress``, ``response.output_item.added``,
``response.content_part.added``, then ``response.output_text.delta`` … ``response.output_text.done``
(or ``response.refusal.delta``, ``response.refusal.done``), ``response.content_part.done``,
``response.output_item.done`` and ``response.completed``, whose response carries the confidence.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from candor.serve.agent_turns import AgentTurn
from candor.serve.answering import HonestAnswer
from candor.serve.http.responses import refusal_as_text, tool_calls_of
from candor.serve.http.schemas import ResponsesRequest
from candor.serve.http.settings import ServeSettings
from candor.serve.http.streaming import sse


@dataclass(frozen=True)
class ResponseShell:
    """What a response says about itself before it is answered: ids, time, model and the request's settings."""

    body: ResponsesRequest
    settings: ServeSettings
    agent: AgentTurn | None = None  # an agent turn: its output is a function call or a structured output
    id: str = field(default_factory=lambda: f"resp_{uuid.uuid4().hex}")
    item_id: str = field(default_factory=lambda: f"msg_{uuid.uuid4().hex}")
    created_at: int = field(default_factory=lambda: int(time.time()))

    def response(
        self,
        status: str,
        output: list[dict[str, Any]],
        usage: dict[str, Any] | None = None,
        confidence: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        body = self.body
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "instructions": body.instructions,
            "max_output_tokens": body.max_output_tokens,
            "model": self.settings.model_id,
            "output": output,
            "parallel_tool_calls": body.parallel_tool_calls is not False,
            "previous_response_id": None,
            "reasoning": None,
            "store": False,
            "temperature": body.reply().temperature,
            "text": body.text if isinstance(body.text, dict) else {"format": {"type": "text"}},
            "tool_choice": body.tool_choice if body.tool_choice is not None else ("auto" if body.tools else "none"),
            "tools": body.tools or [],
            "top_p": body.reply().top_p,
            "truncation": "disabled",
            "usage": usage,
            "user": None,
            "metadata": {},
            "confidence": confidence,
        }

    def message(self, status: str, content: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.item_id, "type": "message", "role": "assistant", "status": status, "content": content}

    @property
    def structured(self) -> bool:
        return self.agent is not None and self.agent.output_schema is not None


def function_calls(answer: HonestAnswer) -> list[dict[str, Any]] | None:
    """An answer's calls as the Responses API's ``function_call`` output items; None when it makes none."""
    calls = tool_calls_of(answer)
    if calls is None:
        return None
    return [
        {
            "id": f"fc_{c['id'].removeprefix('call_')}",
            "type": "function_call",
            "status": "completed",
            "call_id": c["id"],
            "name": c["function"]["name"],
            "arguments": c["function"]["arguments"],
        }
        for c in calls
    ]


def status_of(answer: HonestAnswer) -> str:
    """``"incomplete"`` for an answer cut by the token cap, else ``"completed"``."""
    return "incomplete" if not answer.abstained and answer.finish_reason == "length" else "completed"


def is_refusal(answer: HonestAnswer, settings: ServeSettings, structured: bool = False) -> bool:
    """The answer is shown as the API's ``refusal`` part (an abstention, with ``--abstain-as refusal`` or
    for a structured output, whose parser must never be handed the refusal text)."""
    return answer.abstained and (structured or not refusal_as_text(settings))


def text_of(answer: HonestAnswer, settings: ServeSettings) -> str:
    """The text shown: the answer, or for an abstention the refusal text (never the withheld answer)."""
    return settings.refusal if answer.abstained else (answer.answer or "")


def content_part(answer: HonestAnswer, settings: ServeSettings, structured: bool = False) -> dict[str, Any]:
    if is_refusal(answer, settings, structured):
        return {"type": "refusal", "refusal": settings.refusal}
    return {"type": "output_text", "text": text_of(answer, settings), "annotations": [], "logprobs": []}


def usage_object(usage: dict[str, int]) -> dict[str, Any]:
    """The chat usage counts in the Responses shape (candor counts no cached or reasoning tokens: 0)."""
    return {
        "input_tokens": usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage["total_tokens"],
    }


def response_body(
    shell: ResponseShell, answer: HonestAnswer, confidence: dict[str, Any], usage: dict[str, int]
) -> dict[str, Any]:
    """The whole response to a plain (not streamed) request."""
    status = status_of(answer)
    calls = function_calls(answer)
    items = (
        calls
        if calls is not None
        else [shell.message(status, [content_part(answer, shell.settings, shell.structured)])]
    )
    return shell.response(status, items, usage_object(usage), confidence)


class ResponseEvents:
    """The Responses API's server-sent events for one response, numbered in the order they are sent."""

    def __init__(self, shell: ResponseShell) -> None:
        self.shell = shell
        self._sequence = 0
        self._text_opened = False
        self._sent = ""

    def _event(self, type_: str, **fields: Any) -> str:
        out = sse({"type": type_, "sequence_number": self._sequence, **fields})
        self._sequence += 1
        return out

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.shell.item_id, "output_index": 0, "content_index": 0}

    def start(self) -> list[str]:
        """Created and in progress, with the (still empty) assistant message as its output item."""
        pending = self.shell.response("in_progress", [])
        out = [
            self._event("response.created", response=pending),
            self._event("response.in_progress", response=pending),
        ]
        if self.shell.agent is None:  # an agent turn's item is known only once it is decided (a call, or a message)
            out += self._message_added()
        return out

    def _message_added(self) -> list[str]:
        return [self._event("response.output_item.added", output_index=0, item=self.shell.message("in_progress", []))]

    def _calls(self, calls: list[dict[str, Any]]) -> list[str]:
        """Each call as its own output item: added, its arguments (one delta), done."""
        out = []
        for i, item in enumerate(calls):
            where = {"item_id": item["id"], "output_index": i}
            out += [
                self._event(
                    "response.output_item.added",
                    output_index=i,
                    item={**item, "status": "in_progress", "arguments": ""},
                ),
                self._event("response.function_call_arguments.delta", **where, delta=item["arguments"]),
                self._event("response.function_call_arguments.done", **where, arguments=item["arguments"]),
                self._event("response.output_item.done", output_index=i, item=item),
            ]
        return out

    def _open_text(self) -> list[str]:
        if self._text_opened:
            return []
        self._text_opened = True
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [self._event("response.content_part.added", **self._where(), part=part)]

    def text(self, delta: str) -> list[str]:
        """More of the answer's text (the output_text part is opened by its first delta)."""
        self._sent += delta
        return [
            *self._open_text(),
            self._event("response.output_text.delta", **self._where(), delta=delta, logprobs=[]),
        ]

    def finish(self, answer: HonestAnswer, confidence: dict[str, Any], rest: str, usage: dict[str, int]) -> list[str]:
        """The part's last text (``rest``, or the refusal), every done event and the completed response."""
        settings = self.shell.settings
        calls = function_calls(answer)
        if calls is not None:
            status = status_of(answer)
            final = self.shell.response(status, calls, usage_object(usage), confidence)
            return [*self._calls(calls), self._event(f"response.{status}", response=final)]
        structured = self.shell.structured
        part = content_part(answer, settings, structured)
        out: list[str] = [] if self.shell.agent is None else self._message_added()
        if is_refusal(answer, settings, structured):
            refusal = settings.refusal
            out += [
                self._event("response.content_part.added", **self._where(), part={"type": "refusal", "refusal": ""}),
                self._event("response.refusal.delta", **self._where(), delta=refusal),
                self._event("response.refusal.done", **self._where(), refusal=refusal),
            ]
        else:
            rest = text_of(answer, settings) if answer.abstained else rest
            out += self._open_text()
            if rest:
                out += self.text(rest)
            text = part["text"]
            out.append(self._event("response.output_text.done", **self._where(), text=text, logprobs=[]))
        out.append(self._event("response.content_part.done", **self._where(), part=part))
        status = status_of(answer)
        item = self.shell.message(status, [part])
        out.append(self._event("response.output_item.done", output_index=0, item=item))
        final = self.shell.response(status, [item], usage_object(usage), confidence)
        out.append(self._event(f"response.{status}", response=final))
        return out

    def error(self, error: dict[str, Any]) -> list[str]:
        """An error that ended the answering: the API's ``error`` event, then ``response.failed``."""
        failed = self.shell.response("failed", [])
        failed["error"] = {"code": error.get("code") or "server_error", "message": error["message"]}
        return [
            self._event("error", code=error.get("code"), message=error["message"], param=error.get("param")),
            self._event("response.failed", response=failed),
        ]
