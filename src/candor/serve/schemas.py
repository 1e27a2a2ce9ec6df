"""OpenAI-compatible request bodies and the OpenAI error shape.

Only the fields candor acts on are declared; others an OpenAI client may send
(``user``, ``presence_penalty`` …) are accepted and ignored. Types are strict,
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
    seed: int | None = None
    # Declared so that they are refused (``unsupported``) rather than silently ignored.
    response_format: Any = None
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None

    def unsupported(self) -> list[str]:
        """Fields a client set that candor cannot honour (answered 400 ``unsupported``)."""
        return [name for name in ("response_format", "tools", "tool_choice", "functions")
                if getattr(self, name) is not None]  # fmt: skip

    def stops(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    def top_logprobs_wanted(self) -> int | None:
        """Alternatives per token when log-probs are asked for; None when they are not."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def question(self) -> str:
        """The last user message: the question the model answers (earlier turns are not used)."""
        for m in reversed(self.messages):
            if m.role == "user":
                return m.text()
        return ""

    def token_cap(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str | list[str]
    logprobs: int | None = Field(default=None, ge=0, le=5)

    def top_logprobs_wanted(self) -> int | None:
        return self.logprobs

    def questions(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    def token_cap(self) -> int | None:
        return self.max_tokens


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """``{"error": {"message", "type", "param", "code"}}``, as the OpenAI API answers."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
