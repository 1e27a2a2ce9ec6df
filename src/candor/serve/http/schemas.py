"""OpenAI-compatible request bodies and the OpenAI error shape.

Fields candor acts on are declared, and so are those it cannot honour, which are
refused (400 ``unsupported``) unless they hold their no-op default; fields that
change nothing about the answer (``user``, ``metadata`` …) are accepted and
ignored. Types are strict,
as the OpenAI API checks them: ``"n": true``, ``"max_tokens": "10"`` or
``"temperature": "0"`` are refused, never coerced (an integer is a valid number).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    role: str
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        """The message's text; OpenAI's list-of-parts form keeps only its text parts."""
        if isinstance(self.content, list):
            return "".join(str(p.get("text", "")) for p in self.content if p.get("type") == "text")
        return self.content or ""


class _Sampling(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str
    n: int = 1
    max_tokens: int | None = None
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)  # as OpenAI: a 64-bit integer
    # Declared so that they are refused (``unsupported``) rather than silently ignored;
    # each is accepted at its no-op value (NO_OP_VALUES).
    response_format: Any = None
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    logit_bias: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None

    def unsupported(self) -> list[str]:
        """Fields a client set that candor cannot honour (answered 400 ``unsupported``)."""
        return [
            name for name in self.model_fields_set & set(NO_OP_VALUES) if getattr(self, name) not in NO_OP_VALUES[name]
        ]

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


# What a refused field may hold and still be accepted: its no-op value, as clients send it by default.
NO_OP_VALUES: dict[str, tuple[Any, ...]] = {
    "response_format": (None, {"type": "text"}),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
}
MAX_TOP_LOGPROBS = 5  # the alternatives the engine keeps per token
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)

    def top_logprobs_wanted(self) -> int | None:
        """Alternatives per token when log-probs are asked for; None when they are not."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def conversation(self) -> tuple[tuple[tuple[str, str], ...], str]:
        """``(history, question)``: the earlier turns as ``(role, text)`` and the last user message.

        Raises ``ValueError`` (one line, for a 400) for what a conversation cannot hold here: a role
        other than system/developer/user/assistant, non-text content, an assistant turn without text
        (a tool call), or a last message that is not the user's.
        """
        turns = []
        for i, m in enumerate(self.messages):
            if m.role not in ROLES:
                raise ValueError(
                    f"messages.{i}.role: {m.role!r} is not supported (system, developer, user, "
                    "assistant; tools are not supported)"
                )
            if isinstance(m.content, list) and any(p.get("type") != "text" for p in m.content):
                raise ValueError(f"messages.{i}.content: only text content parts are supported (no images or audio)")
            if m.role == "assistant" and not m.text().strip():
                raise ValueError(f"messages.{i}: an assistant turn needs text content (tool calls are not supported)")
            turns.append((ROLES[m.role], m.text()))
        if turns[-1][0] != "user":
            raise ValueError(f"the last message must be the user's question (got a {self.messages[-1].role!r} message)")
        return tuple(turns[:-1]), turns[-1][1]

    def token_cap(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str | list[str]
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: Any = None
    best_of: Any = None
    suffix: Any = None

    def top_logprobs_wanted(self) -> int | None:
        return self.logprobs

    def questions(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    def token_cap(self) -> int | None:
        return self.max_tokens


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """``{"error": {"message", "type", "param", "code"}}``, as the OpenAI API answers."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
