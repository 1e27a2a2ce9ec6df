"""OpenAI-compatible request bodies and the OpenAI error shape.

Fields candor acts on are declared, and so are those it cannot honour, which are
refused (400 ``unsupported``) unless they hold their no-op default; fields that
change nothing about the answer (``user``, ``metadata`` …) are accepted and
ignored. Types are strict,
as the OpenAI API checks them: ``"n": true``, ``"max_tokens": "10"`` or
``"temperature": "0"`` are refused, never coerced (an integer is a valid number).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from candor.serve.answering import Reply


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    name: str
    arguments: str = "{}"


class ToolCall(BaseModel):
    """An assistant turn's call, sent back as history (``message.tool_calls[i]`` of an earlier response)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    id: str | None = None
    type: str = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    role: str
    content: str | list[dict[str, Any]] | None = None
    refusal: str | None = None  # an abstention sent back as history (``messages.append(choice.message)``)
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def text(self) -> str:
        """The message's text; OpenAI's list-of-parts form keeps only its text parts."""
        if isinstance(self.content, list):
            return "".join(str(p.get("text", "")) for p in self.content if p.get("type") == "text")
        return self.content or ""

    def said(self) -> str:
        """What the turn said: its text, or for an abstention sent back (no text) its refusal."""
        text = self.text()
        return text if text.strip() or not self.refusal else self.refusal


class _Sampling(BaseModel):
    # Unknown fields are kept so that they can be refused by name (``unsupported``), never silently ignored.
    model_config = ConfigDict(extra="allow", strict=True)

    model: str
    n: int = 1
    max_tokens: int | None = None
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1)  # as OpenAI: a 64-bit integer
    # Used (candor.serve.http.agent_requests): tools and structured output.
    response_format: Any = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    # Declared so that they are refused (``unsupported``) rather than silently ignored;
    # each is accepted at its no-op value (NO_OP_VALUES).
    functions: Any = None
    function_call: Any = None
    logit_bias: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    store: Any = None
    reasoning_effort: Any = None
    prediction: Any = None
    audio: Any = None
    modalities: Any = None
    web_search_options: Any = None

    def unsupported(self) -> list[str]:
        """Fields a client set that candor cannot honour (answered 400 ``unsupported``): a declared field away
        from its no-op value, or a field candor does not know (never silently ignored)."""
        declared = [
            name for name in self.model_fields_set & set(NO_OP_VALUES) if getattr(self, name) not in NO_OP_VALUES[name]
        ]
        return declared + unknown_fields(self)

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
    "functions": (None, []),
    "function_call": (None, "none"),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "store": (None, False),
    "reasoning_effort": (None,),
    "prediction": (None,),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "web_search_options": (None,),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
}
# The agent fields on /v1/completions, where nothing can call a tool or be structured: refused unless no-ops.
AGENT_NO_OP_VALUES: dict[str, tuple[Any, ...]] = {
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "parallel_tool_calls": (None, True, False),
    "response_format": (None, {"type": "text"}),
}
# Fields that change nothing about an answer, accepted whatever they hold and documented as no-ops
# (docs/serving.md "Request fields"): who asks, tags, and hints for OpenAI's own infrastructure.
IGNORED_FIELDS = frozenset({"user", "metadata", "service_tier", "safety_identifier", "prompt_cache_key", "verbosity"})


def unknown_fields(body: BaseModel) -> list[str]:
    """The body's fields that its schema does not declare and that are not documented no-ops, sorted."""
    return sorted(set(body.model_extra or {}) - IGNORED_FIELDS)


MAX_TOP_LOGPROBS = 5  # the alternatives the engine keeps per token
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
INSTRUCTION_ROLES = ("system", "developer")


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

    def turns(self) -> list[dict[str, Any]]:
        """The conversation as checked chat messages: ``{"role", "content", "tool_calls"?, "tool_call_id"?, "name"?}``.

        ``content`` is the turn's text (an abstention sent back: its refusal); ``developer`` is ``system``.
        An assistant turn with empty or null content and nothing else is kept as the empty turn it is: the
        OpenAI API accepts it, and frameworks that drop the ``refusal`` field (LangChain's ``ChatOpenAI``,
        Haystack, Agno) send an abstention back that way. Raises ``ValueError`` (one line naming the
        message, for a 400) for a role candor does not know, non-text content (images, audio), or a tool
        call whose arguments are not a JSON object.
        """
        out = []
        for i, m in enumerate(self.messages):
            if m.role not in ROLES:
                raise ValueError(
                    f"messages.{i}.role: {m.role!r} is not supported (system, developer, user, assistant, tool)"
                )
            if isinstance(m.content, list) and any(p.get("type") != "text" for p in m.content):
                raise ValueError(f"messages.{i}.content: only text content parts are supported (no images or audio)")
            turn: dict[str, Any] = {"role": ROLES[m.role], "content": m.said()}
            if m.role == "assistant" and m.tool_calls:
                turn["tool_calls"] = [_call_of(c, f"messages.{i}.tool_calls.{j}") for j, c in enumerate(m.tool_calls)]
            if m.role == "tool":
                turn["tool_call_id"] = m.tool_call_id or ""
                if m.name:
                    turn["name"] = m.name
            out.append(turn)
        return out

    def has_tool_turns(self) -> bool:
        """Whether the conversation holds tool calls or tool results (it is then answered as an agent turn)."""
        return any(m.role == "tool" or m.tool_calls for m in self.messages)

    def history_and_question(self) -> tuple[tuple[tuple[str, str], ...], str]:
        """``(history, question)`` for a conversation without tool turns (:func:`history_and_question`)."""
        return history_and_question(self.turns(), "messages")

    def token_cap(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def texts(self) -> list[str]:
        """Every text a client sent in the messages: contents, refusals and calls' arguments (bounded in all)."""
        out = []
        for m in self.messages:
            out += [m.text(), m.refusal or ""]
            out += [c.function.name + c.function.arguments for c in m.tool_calls or ()]
        return out


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

    def unsupported(self) -> list[str]:
        """As chat's, and the agent fields, which a completion (a question asked alone) cannot use."""
        agent = [name for name in AGENT_NO_OP_VALUES if getattr(self, name) not in AGENT_NO_OP_VALUES[name]]
        return super().unsupported() + agent

    def questions(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    def token_cap(self) -> int | None:
        return self.max_tokens

    def texts(self) -> list[str]:
        return self.questions()


class InputItem(BaseModel):
    """One item of a Responses API ``input`` list: a message, a function call, or a function call's output."""

    model_config = ConfigDict(extra="ignore", strict=True)

    type: str = "message"
    role: str | None = None
    content: str | list[dict[str, Any]] | None = None
    call_id: str | None = None  # function_call, function_call_output
    name: str | None = None  # function_call
    arguments: str | None = None  # function_call
    output: str | list[dict[str, Any]] | None = None  # function_call_output


# The content parts a Responses message may hold here, by role, and the field each keeps its text in.
# An assistant turn sent back (a former output item) holds output_text, or the refusal it gave.
INPUT_PARTS = {"input_text": "text"}
ASSISTANT_PARTS = {"output_text": "text", "refusal": "refusal", "input_text": "text"}


class ResponsesRequest(BaseModel):
    """``POST /v1/responses``: ``input`` (a string, or items) after ``instructions`` is the conversation.

    Nothing is stored: ``previous_response_id``, ``conversation``, ``prompt`` and ``store: true``
    are refused, as is every option candor cannot honour (``RESPONSES_NO_OP_VALUES``) and every field it
    does not know. Function tools and ``text.format`` (structured output) are used.
    """

    model_config = ConfigDict(extra="allow", strict=True)
    text_param: ClassVar[str] = "input"
    cap_param: ClassVar[str] = "max_output_tokens"

    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)  # None: greedy, the scored answer's decoding
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool = False
    # Used (candor.serve.http.agent_requests): function tools and structured output (``text.format``).
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    text: Any = None
    # Declared so that they are refused unless they hold their no-op value (RESPONSES_NO_OP_VALUES).
    previous_response_id: Any = None
    conversation: Any = None
    prompt: Any = None
    store: Any = None
    background: Any = None
    max_tool_calls: Any = None
    include: Any = None
    reasoning: Any = None
    top_logprobs: Any = None
    truncation: Any = None
    stream_options: Any = None

    # A Responses request asks for one reply, with no stop strings, seed or log-probs.
    n: ClassVar[int] = 1

    def unsupported(self) -> list[str]:
        table = RESPONSES_NO_OP_VALUES
        declared = [name for name in table if name in self.model_fields_set and getattr(self, name) not in table[name]]
        if (
            "reasoning" in declared
            and isinstance(self.reasoning, dict)
            and all(v is None for v in self.reasoning.values())
        ):
            declared.remove("reasoning")  # {"effort": null, "summary": null} asks for nothing, as {} does
        return declared + unknown_fields(self)

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
            out += [item.name or "", item.arguments or "", json.dumps(item.output) if item.output else ""]
        return out

    def has_tool_turns(self) -> bool:
        return any(item.type in ("function_call", "function_call_output") for item in self.items())

    def turns(self) -> list[dict[str, Any]]:
        """The conversation as chat messages (as :meth:`ChatRequest.turns`), ``instructions`` first.

        Consecutive ``function_call`` items are one assistant turn's calls; a ``function_call_output`` is a
        ``tool`` message. Raises ``ValueError`` naming the item for anything else (a reasoning item, a
        reference, an image part, a role candor does not know).
        """
        turns: list[dict[str, Any]] = [{"role": "system", "content": self.instructions}] if self.instructions else []
        for i, item in enumerate(self.items()):
            where = "input" if isinstance(self.input, str) else f"input.{i}"
            if item.type == "function_call":
                call = ToolCall(
                    id=item.call_id, function=FunctionCall(name=item.name or "", arguments=item.arguments or "{}")
                )
                parsed = _call_of(call, where)
                if turns and turns[-1]["role"] == "assistant" and "tool_calls" in turns[-1]:
                    turns[-1]["tool_calls"].append(parsed)
                else:
                    turns.append({"role": "assistant", "content": "", "tool_calls": [parsed]})
            elif item.type == "function_call_output":
                output = item.output
                text = output if isinstance(output, str) else "".join(str(p.get("text", "")) for p in output or [])
                turns.append({"role": "tool", "content": text, "tool_call_id": item.call_id or ""})
            elif item.type == "message" and item.role is not None:
                turns.append(self._message(item, where))
            elif item.type == "item_reference":
                raise ValueError(
                    f"{where}: an item_reference refers to a stored response, and candor stores none: send the "
                    "earlier output items themselves. A client that stores by default sends references; set "
                    "store: false on the request (the AI SDK's @ai-sdk/openai: providerOptions: "
                    "{openai: {store: false}})"
                )
            else:
                raise ValueError(
                    f"{where}: items of type {item.type!r} are not supported (message, function_call and "
                    "function_call_output; candor stores no responses to refer to)"
                )
        return turns

    @staticmethod
    def _message(item: InputItem, where: str) -> dict[str, Any]:
        if item.role not in ROLES or item.role == "tool":
            raise ValueError(f"{where}.role: {item.role!r} is not supported (system, developer, user, assistant)")
        parts = ASSISTANT_PARTS if item.role == "assistant" else INPUT_PARTS
        if isinstance(item.content, list):
            wrong = [p.get("type") for p in item.content if p.get("type") not in parts]
            if wrong:
                raise ValueError(
                    f"{where}.content: {wrong[0]!r} parts are not supported here ({', '.join(parts)} only: "
                    "no images, files or audio)"
                )
            text = "".join(str(p.get(parts[p["type"]]) or "") for p in item.content)
        else:
            text = item.content or ""
        return {"role": ROLES[item.role], "content": text}

    def history_and_question(self) -> tuple[tuple[tuple[str, str], ...], str]:
        """``(history, question)`` for a conversation without tool turns (:func:`history_and_question`)."""
        return history_and_question(self.turns(), "input")


# What a refused Responses field may hold and still be accepted: its no-op value, as clients send it by default
# (openai-agents sends ``include: []`` and ``tools: []``; a ``tool_choice`` of "auto" with no tools calls none).
RESPONSES_NO_OP_VALUES: dict[str, tuple[Any, ...]] = {
    "previous_response_id": (None,),
    "conversation": (None,),
    "prompt": (None,),
    "store": (None, False),
    "background": (None, False),
    "max_tool_calls": (None,),
    "include": (None, []),
    "reasoning": (None, {}),
    "top_logprobs": (None, 0),
    "truncation": (None, "disabled"),
    "stream_options": (None, {}, {"include_obfuscation": False}),
}
# Why a field is refused, where its name alone does not say.
UNSUPPORTED_WHY = {
    "previous_response_id": "candor stores no responses; send the whole conversation in input",
    "conversation": "candor stores no conversations; send the whole conversation in input",
    "prompt": "candor keeps no stored prompts; send instructions and input",
    "store": "candor stores no responses or completions (send store: false, or leave it out)",
    "background": "responses are answered in the request that asks for them",
    "max_tool_calls": "a reply holds the calls the model makes in one turn; limit them with parallel_tool_calls",
    "include": "no extra output (log-probs, sources) is included in a response",
    "reasoning": "the served model does not reason before answering (reasoning: {} is accepted)",
    "reasoning_effort": "the served model does not reason before answering",
    "prediction": "candor decodes every token (no predicted outputs)",
    "functions": "the legacy functions field is not supported: send tools",
    "function_call": "the legacy function_call field is not supported: send tool_choice",
    "truncation": "a conversation too long for the model answers 400, never truncated",
    "audio": "candor answers in text only",
    "modalities": "candor answers in text only",
    "tools": "a completion is a question asked alone: send tools to /v1/chat/completions or /v1/responses",
    "tool_choice": "a completion calls no tools: use /v1/chat/completions or /v1/responses",
    "response_format": "a completion is plain text: ask for structured output on /v1/chat/completions",
}


def history_and_question(turns: list[dict[str, Any]], param: str) -> tuple[tuple[tuple[str, str], ...], str]:
    """``(history, question)``: the earlier turns as ``(role, text)`` and the last user message's text.

    System or developer messages after the last user message (a framework's retry instruction) are
    instructions for it: they join the history, in their order, just before the question. Raises
    ``ValueError`` (one line naming ``param``, for a 400) for a conversation with no user message, or
    with another turn after its last one (tool turns are answered by the agent path, never here).
    """
    users = [i for i, t in enumerate(turns) if t["role"] == "user"]
    if not users:
        raise ValueError(f"{param}: there is no user message to answer")
    last = users[-1]
    after = turns[last + 1 :]
    wrong = [t["role"] for t in after if t["role"] not in INSTRUCTION_ROLES]
    if wrong:
        raise ValueError(
            f"{param}: a {wrong[0]!r} message follows the last user message; only system or developer "
            "messages may follow the question"
        )
    history = [(t["role"], t["content"]) for t in turns[:last] + after]
    return tuple(history), turns[last]["content"]


def _call_of(call: ToolCall, where: str) -> dict[str, Any]:
    """A call sent back as history, its arguments parsed (a JSON object)."""
    try:
        arguments = json.loads(call.function.arguments or "{}")
    except ValueError:
        raise ValueError(f"{where}.function.arguments: not valid JSON") from None
    if not isinstance(arguments, dict):
        raise ValueError(f"{where}.function.arguments: must be a JSON object")
    return {"id": call.id or "", "name": call.function.name, "arguments": arguments}


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """``{"error": {"message", "type", "param", "code"}}``, as the OpenAI API answers."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
