"""OpenAI-compatible request bodies and the OpenAI error shape.

Fields candor acts on are declared, and so are those it cannot honour, which are
refused (400 ``unsupported``) unless they hold their no-op default; fields that
change nothing about the answer (``user``, ``metadata`` …) are accepted and
ignored. Types are strict,
as the OpenAI API checks them: ``"n": true``, ``"max_tokens": "10"`` or
``"temperature": "0"`` are refused, never coerced (an integer is a valid number).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from candor.serve.answering import Reply


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

    def reply(self) -> Reply:
        """How the returned text is decoded (the confidence never depends on it)."""
        return Reply(
            n=self.n,
            max_new_tokens=self.token_cap(),  # type: ignore[attr-defined]
            temperature=self.temperature,
            top_p=self.top_p,
            stop=self.stops(),
            seed=self.seed,
        )


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
    text_param: ClassVar[str] = "messages"  # the field a request's texts are in (named by a 400)
    cap_param: ClassVar[str] = "max_tokens"

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)

    def top_logprobs_wanted(self) -> int | None:
        """Alternatives per token when log-probs are asked for; None when they are not."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def history_and_question(self) -> tuple[tuple[tuple[str, str], ...], str]:
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

    def texts(self) -> list[str]:
        return [m.text() for m in self.messages]


class CompletionRequest(_Sampling):
    text_param: ClassVar[str] = "prompt"
    cap_param: ClassVar[str] = "max_tokens"

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

    def texts(self) -> list[str]:
        return self.questions()


class InputItem(BaseModel):
    """One item of a Responses API ``input`` list; only messages are conversations here."""

    model_config = ConfigDict(extra="ignore", strict=True)

    type: str = "message"
    role: str | None = None
    content: str | list[dict[str, Any]] | None = None


# The content parts a Responses message may hold here, by role, and the field each keeps its text in.
# An assistant turn sent back (a former output item) holds output_text, or the refusal it gave.
INPUT_PARTS = {"input_text": "text"}
ASSISTANT_PARTS = {"output_text": "text", "refusal": "refusal", "input_text": "text"}


class ResponsesRequest(BaseModel):
    """``POST /v1/responses``: ``input`` (a string, or message items) after ``instructions`` is the conversation.

    Nothing is stored: ``previous_response_id``, ``conversation``, ``prompt`` and ``store: true``
    are refused, as are tools and every option candor cannot honour (``RESPONSES_NO_OP_VALUES``).
    """

    model_config = ConfigDict(extra="ignore", strict=True)
    text_param: ClassVar[str] = "input"
    cap_param: ClassVar[str] = "max_output_tokens"

    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)  # None: greedy, the scored answer's decoding
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool = False
    # Declared so that they are refused unless they hold their no-op value (RESPONSES_NO_OP_VALUES).
    previous_response_id: Any = None
    conversation: Any = None
    prompt: Any = None
    store: Any = None
    background: Any = None
    tools: Any = None
    tool_choice: Any = None
    max_tool_calls: Any = None
    include: Any = None
    text: Any = None
    reasoning: Any = None
    top_logprobs: Any = None
    truncation: Any = None
    stream_options: Any = None

    # A Responses request asks for one reply, with no stop strings, seed or log-probs.
    n: ClassVar[int] = 1

    def unsupported(self) -> list[str]:
        table = RESPONSES_NO_OP_VALUES
        return [name for name in table if name in self.model_fields_set and getattr(self, name) not in table[name]]

    def stops(self) -> tuple[str, ...]:
        return ()

    def top_logprobs_wanted(self) -> int | None:
        return None

    def token_cap(self) -> int | None:
        return self.max_output_tokens

    def reply(self) -> Reply:
        return Reply(
            max_new_tokens=self.max_output_tokens,
            temperature=0.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
        )

    def items(self) -> list[InputItem]:
        return [InputItem(role="user", content=self.input)] if isinstance(self.input, str) else list(self.input)

    def texts(self) -> list[str]:
        """Every text the request holds (bounded before the items are checked as a conversation)."""
        out = [self.instructions or ""]
        for item in self.items():
            parts = item.content if isinstance(item.content, list) else [{"text": item.content or ""}]
            out += [str(p.get("text") or p.get("refusal") or "") for p in parts]
        return out

    def history_and_question(self) -> tuple[tuple[tuple[str, str], ...], str]:
        """``(history, question)``: ``instructions`` as the system turn, the items' turns, the last user message.

        Raises ``ValueError`` (one line naming the item, for a 400) for an item that is not a message
        (a function call, a reasoning item, a reference), a role other than system/developer/user/
        assistant, a part other than text (images, files, audio), or a last item that is not the user's.
        """
        turns = self._turns()
        if not turns or turns[-1][0] != "user":
            raise ValueError("input: the last item must be the user's question")
        history = ((("system", self.instructions),) if self.instructions else ()) + tuple(turns[:-1])
        return history, turns[-1][1]

    def _turns(self) -> list[tuple[str, str]]:
        turns = []
        for i, item in enumerate(self.items()):
            where = "input" if isinstance(self.input, str) else f"input.{i}"
            if item.type != "message" or item.role is None:
                raise ValueError(
                    f"{where}: items of type {item.type!r} are not supported (messages only: candor calls no "
                    "tools and stores no responses)"
                )
            if item.role not in ROLES:
                raise ValueError(f"{where}.role: {item.role!r} is not supported (system, developer, user, assistant)")
            parts = ASSISTANT_PARTS if item.role == "assistant" else INPUT_PARTS
            if isinstance(item.content, list):
                wrong = [p.get("type") for p in item.content if p.get("type") not in parts]
                if wrong:
                    raise ValueError(
                        f"{where}.content: {wrong[0]!r} parts are not supported here ({', '.join(parts)} only: "
                        "no images, files or audio)"
                    )
                text = "".join(str(p.get(parts[p["type"]], "")) for p in item.content)
            else:
                text = item.content or ""
            if item.role == "assistant" and not text.strip():
                raise ValueError(f"{where}: an assistant turn needs text content")
            turns.append((ROLES[item.role], text))
        return turns


# What a refused Responses field may hold and still be accepted: its no-op value, as clients send it by default
# (openai-agents sends ``include: []`` and ``tools: []``; a ``tool_choice`` of "auto" with no tools calls none).
RESPONSES_NO_OP_VALUES: dict[str, tuple[Any, ...]] = {
    "previous_response_id": (None,),
    "conversation": (None,),
    "prompt": (None,),
    "store": (None, False),
    "background": (None, False),
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
    "max_tool_calls": (None,),
    "include": (None, []),
    "text": (None, {"format": {"type": "text"}}),
    "reasoning": (None,),
    "top_logprobs": (None, 0),
    "truncation": (None, "disabled"),
    "stream_options": (None, {}, {"include_obfuscation": False}),
}
# Why a field is refused, where its name alone does not say.
UNSUPPORTED_WHY = {
    "previous_response_id": "candor stores no responses; send the whole conversation in input",
    "conversation": "candor stores no conversations; send the whole conversation in input",
    "prompt": "candor keeps no stored prompts; send instructions and input",
    "store": "candor stores no responses (send store: false, or leave it out)",
    "background": "responses are answered in the request that asks for them",
    "tools": "candor answers questions and calls no tools",
    "tool_choice": "candor calls no tools",
    "max_tool_calls": "candor calls no tools",
    "include": "no extra output (log-probs, sources) is included in a response",
    "text": "the answer is plain text (format text only)",
    "truncation": "a conversation too long for the model answers 400, never truncated",
}


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """``{"error": {"message", "type", "param", "code"}}``, as the OpenAI API answers."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
