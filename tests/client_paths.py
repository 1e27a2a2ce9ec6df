"""The client matrix's agent paths per framework: a tool round trip, a structured output, a turn after an abstention.

tests/test_client_matrix.py runs these against its servers (issue 62). Each path is written the way the
framework documents it; what it showed is recorded as a cell:

- ``tool``: the question below with one tool (``get_weather``); the call(s) the model made, each checked
  against the tool's schema, the tool's result sent back, and the final answer (``calls``, ``shown``). The
  first step forces the call and the step after the result asks for the answer (``tool_choice`` "required"
  then "none", or the framework's own way to say so): the protocol path is what is tested, not the model's
  choice (under "auto" the 135M model answers in prose, and after a result calls the tool again). A framework
  that offers no way to force the call records ``na`` and why (:func:`not_offered`);
- ``structured``: the capital as a ``City`` (``city``, ``country``), per output mode the framework offers
  (``parsed``: it parsed into the schema; ``shown``: its JSON, or the refusal);
- ``turn2``: a question the server abstains on, the framework's own history of that turn, then a second
  question (``shown`` of both turns), under ``--abstain-as text`` and ``refusal``.

A cell that raised records the exception's type and the first line of its message. Every framework's
plain and streamed calls for the clients new in issue 62 are here too (``*_calls``, as in the matrix).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

KEY = "test-key-not-secret"  # tests/test_serve_app.py's key: the matrix's servers take it
REFUSAL = "I am not sure."
QUESTION = "What is the capital of France?"
SECOND = "And what is the capital of Germany?"
SYSTEM = "Answer briefly."
MAX_TOKENS = 64  # the embedded model's answer ends well before (an incomplete Responses stream is an agents error)
TOOL_QUESTION = "What is the weather in Paris right now? Use the get_weather tool."
TOOL_RESULT = "Sunny, 21 degrees Celsius."
TOOL_DESCRIPTION = "Get the current weather in a city."
TOOL_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "The city's name."}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOL_SPEC = {
    "type": "function",
    "function": {"name": "get_weather", "description": TOOL_DESCRIPTION, "parameters": TOOL_PARAMETERS},
}
RESPONSES_TOOL = {"type": "function", "name": "get_weather", "description": TOOL_DESCRIPTION}
RESPONSES_TOOL |= {"parameters": TOOL_PARAMETERS, "strict": True}
STRUCTURED_QUESTION = "What is the capital of France? Give the city and its country."
# A JSON mode's question (json_object: any JSON object) names the keys itself, as LangChain's json_mode documents.
JSON_MODE_QUESTION = f'{STRUCTURED_QUESTION} Answer in JSON with the keys "city" and "country".'


class City(BaseModel):
    """The structured output every framework is asked for."""

    city: str
    country: str


def valid_call(name: str, arguments: Any) -> bool:
    """Whether a tool call validates against ``get_weather``'s schema (its one required string, nothing else)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return False
    return (
        name == "get_weather"
        and isinstance(arguments, dict)
        and set(arguments) == {"city"}
        and (isinstance(arguments["city"], str))
    )


def call_of(name: str, arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):
            arguments = json.loads(arguments)
    return {"name": name, "arguments": arguments, "valid": valid_call(name, arguments)}


class Weather:
    """The tool, with what it was called with (a fresh one per cell: cells run concurrently)."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []

    def __call__(self, city: str) -> str:
        self.received.append({"city": city})
        return TOOL_RESULT

    def function(self) -> Callable[[str], str]:
        """A plain function named ``get_weather`` with a docstring, as frameworks read tools from."""

        def get_weather(city: str) -> str:
            """Get the current weather in a city.

            Args:
                city: The city's name.
            """
            return self(city)

        return get_weather


def failed(exc: BaseException) -> dict[str, Any]:
    lines = str(exc).strip().splitlines()
    return {"exception": type(exc).__name__, "error": lines[0][:300] if lines else ""}


def attempt(call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """What one call showed, or the type of the exception it raised (and its message's first line)."""
    try:
        return {"exception": None, **call()}  # a call may name the exception its framework raised for a refusal
    except Exception as exc:  # recorded: a cell says what the user got, an exception included
        return {"shown": None, "finish_reason": None, "confidence": None, **failed(exc)}


def seen(shown: str | None, finish_reason: str | None, confidence: Any) -> dict[str, Any]:
    """A cell: the text shown, the finish reason, and the confidence the documented line reached (its value)."""
    reached = {"value": confidence["value"], "abstained": confidence["abstained"]} if confidence else None
    return {"shown": shown, "finish_reason": finish_reason, "confidence": reached}


def tool_cell(calls: list[dict[str, Any]], weather: Weather, shown: str | None) -> dict[str, Any]:
    return {"calls": calls, "tool_ran": len(weather.received), "shown": shown}


def not_offered(why: str) -> dict[str, Any]:
    """A path the framework offers no way to take (``n/a``, with why): recorded, never faked."""
    return {"shown": None, "na": why}


def structured_cell(value: Any, refusal: str | None = None) -> dict[str, Any]:
    """A structured output: whether it parsed into ``City``, and what was shown (its JSON, or the refusal)."""
    if isinstance(value, City):
        return {"parsed": True, "shown": value.model_dump_json(), "refusal": refusal}
    if isinstance(value, dict):
        value = json.dumps(value)
    try:
        return {"parsed": True, "shown": City.model_validate_json(value).model_dump_json(), "refusal": refusal}
    except Exception:  # not JSON of the schema: recorded as not parsed, with what was shown
        return {"parsed": False, "shown": value if isinstance(value, str) else repr(value), "refusal": refusal}


def turn_cell(first: str | None, second: str | None) -> dict[str, Any]:
    return {"shown": first, "shown_second": second}


def run_async(coroutine_function: Callable[[], Any]) -> Callable[[], Any]:
    return lambda: asyncio.run(coroutine_function())


def messages(question: str = QUESTION) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


# ---------------------------------------------------------------- the official openai client (Python)


def openai_client(url: str) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)


def openai_chat_paths(answering: str, abstaining: dict[str, str]) -> dict[str, Any]:
    def tool():
        client, weather = openai_client(answering), Weather()
        history = messages(TOOL_QUESTION)
        choice = client.chat.completions.create(  # the first step forces the call (the app's choice, not the model's)
            model="candor", messages=history, tools=[TOOL_SPEC], tool_choice="required", max_tokens=MAX_TOKENS
        ).choices[0]
        calls = [call_of(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        history.append(choice.message)  # the SDK's documented loop: the assistant message as it came
        for c in choice.message.tool_calls or []:
            result = weather(**json.loads(c.function.arguments))
            history.append({"role": "tool", "tool_call_id": c.id, "content": result})
        final = client.chat.completions.create(model="candor", messages=history, tools=[TOOL_SPEC], tool_choice="none")
        message = final.choices[0].message
        return tool_cell(calls, weather, message.content or message.refusal)

    def structured():
        client = openai_client(answering)
        message = (
            client.chat.completions.parse(
                model="candor", messages=messages(STRUCTURED_QUESTION), response_format=City, max_tokens=MAX_TOKENS
            )
            .choices[0]
            .message
        )
        return structured_cell(message.parsed if message.parsed else message.content, message.refusal)

    def turn2(url: str):
        def run():
            client = openai_client(url)
            history = messages()
            first = client.chat.completions.create(model="candor", messages=history, max_tokens=MAX_TOKENS)
            history.append(first.choices[0].message)  # content None and a refusal under --abstain-as refusal
            history.append({"role": "user", "content": SECOND})
            second = client.chat.completions.create(model="candor", messages=history, max_tokens=MAX_TOKENS)
            shown = [m.content or m.refusal for m in (first.choices[0].message, second.choices[0].message)]
            return turn_cell(*shown)

        return run

    return paths(tool, {"response_format": structured}, {k: turn2(u) for k, u in abstaining.items()})


def openai_responses_paths(answering: str, abstaining: dict[str, str]) -> dict[str, Any]:
    def text_of(resp: Any) -> str:
        refusals = [
            p.refusal for item in resp.output if item.type == "message" for p in item.content if p.type == "refusal"
        ]
        return resp.output_text or "".join(refusals)

    def tool():
        client, weather = openai_client(answering), Weather()
        request = {
            "model": "candor",
            "instructions": SYSTEM,
            "tools": [RESPONSES_TOOL],
            "max_output_tokens": MAX_TOKENS,
        }
        items: list[Any] = [{"role": "user", "content": TOOL_QUESTION}]
        resp = client.responses.create(input=items, tool_choice="required", **request)
        called = [o for o in resp.output if o.type == "function_call"]
        items += resp.output
        for c in called:
            items.append(
                {"type": "function_call_output", "call_id": c.call_id, "output": weather(**json.loads(c.arguments))}
            )
        final = client.responses.create(input=items, tool_choice="none", **request)
        return tool_cell([call_of(c.name, c.arguments) for c in called], weather, text_of(final))

    def structured():
        client = openai_client(answering)
        resp = client.responses.parse(
            model="candor", input=STRUCTURED_QUESTION, text_format=City, max_output_tokens=MAX_TOKENS
        )
        refusal = text_of(resp) if resp.output_parsed is None else None
        return structured_cell(resp.output_parsed or resp.output_text, refusal)

    def turn2(url: str):
        def run():
            client = openai_client(url)
            request = {"model": "candor", "instructions": SYSTEM, "max_output_tokens": MAX_TOKENS}
            items: list[Any] = [{"role": "user", "content": QUESTION}]
            first = client.responses.create(input=items, **request)
            items += first.output
            items.append({"role": "user", "content": SECOND})
            second = client.responses.create(input=items, **request)
            return turn_cell(text_of(first), text_of(second))

        return run

    return paths(tool, {"text_format": structured}, {k: turn2(u) for k, u in abstaining.items()})


def paths(
    tool: Callable[[], dict] | None,
    structured: dict[str, Callable[[], dict]],
    turn2: dict[str, Callable[[], dict]],
) -> dict[str, Any]:
    """Run one client's paths (one after another: each is a short conversation with the server)."""
    out: dict[str, Any] = {"tool": attempt(tool) if tool else None}
    out["structured"] = {mode: attempt(run) for mode, run in structured.items()}
    out["turn2"] = {abstain_as: attempt(run) for abstain_as, run in turn2.items()}
    return out


# ---------------------------------------------------------------- LangChain (ChatCandor)


def langchain_paths(answering: str, abstaining: dict[str, str]) -> dict[str, Any]:
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage

    from candor.integrations.langchain import ChatCandor

    def chat(url: str) -> Any:
        return ChatCandor(base_url=f"{url}/v1", api_key=KEY, model="candor", max_tokens=MAX_TOKENS, max_retries=0)

    def shown(msg: Any) -> str | None:
        return msg.content or msg.additional_kwargs.get("refusal")

    def tool():
        from langchain_core.tools import tool as as_tool

        weather = Weather()
        get_weather = as_tool(weather.function())
        forced = chat(answering).bind_tools([get_weather], tool_choice="get_weather")  # the first step calls it
        llm = chat(answering).bind_tools([get_weather], tool_choice="none")  # the step after asks for the answer
        history: list[Any] = [SystemMessage(SYSTEM), HumanMessage(TOOL_QUESTION)]
        first = forced.invoke(history)
        history.append(first)
        for c in first.tool_calls:
            history.append(ToolMessage(weather(**c["args"]), tool_call_id=c["id"]))
        final = llm.invoke(history)
        return tool_cell([call_of(c["name"], c["args"]) for c in first.tool_calls], weather, shown(final))

    def structured(method: str):
        def run():
            out = (
                chat(answering)
                .with_structured_output(City, method=method, include_raw=True)
                .invoke(
                    [
                        SystemMessage(SYSTEM),
                        HumanMessage(JSON_MODE_QUESTION if method == "json_mode" else STRUCTURED_QUESTION),
                    ]
                )
            )
            if out.get("parsing_error"):
                raise out["parsing_error"]
            raw = out["raw"]
            return structured_cell(out["parsed"] or raw.content, raw.additional_kwargs.get("refusal"))

        return run

    def turn2(url: str):
        def run():
            llm = chat(url)
            history: list[Any] = [SystemMessage(SYSTEM), HumanMessage(QUESTION)]
            first = llm.invoke(history)
            second = llm.invoke([*history, first, HumanMessage(SECOND)])
            return turn_cell(shown(first), shown(second))

        return run

    methods = ("json_schema", "function_calling", "json_mode")
    return paths(tool, {m: structured(m) for m in methods}, {k: turn2(u) for k, u in abstaining.items()})


# ---------------------------------------------------------------- LiteLLM


def litellm_paths(answering: str, abstaining: dict[str, str]) -> dict[str, Any]:
    import litellm

    from candor.integrations.litellm import served_answer

    def request(url: str) -> dict[str, Any]:
        return {"model": "openai/candor", "api_base": f"{url}/v1", "api_key": KEY, "max_tokens": MAX_TOKENS}

    def tool():
        weather = Weather()
        history = messages(TOOL_QUESTION)
        response = litellm.completion(**request(answering), messages=history, tools=[TOOL_SPEC], tool_choice="required")
        message = response.choices[0].message
        history.append(message)  # LiteLLM's documented loop
        for c in message.tool_calls or []:
            result = weather(**json.loads(c.function.arguments))
            history.append({"role": "tool", "tool_call_id": c.id, "name": c.function.name, "content": result})
        final = litellm.completion(**request(answering), messages=history, tools=[TOOL_SPEC], tool_choice="none")
        calls = [call_of(c.function.name, c.function.arguments) for c in message.tool_calls or []]
        return tool_cell(calls, weather, served_answer(final).text)

    def structured():
        response = litellm.completion(
            **request(answering), messages=messages(STRUCTURED_QUESTION), response_format=City
        )
        message = response.choices[0].message
        return structured_cell(message.content, getattr(message, "refusal", None))

    def turn2(url: str):
        def run():
            history = messages()
            first = litellm.completion(**request(url), messages=history)
            history.append(first.choices[0].message)
            history.append({"role": "user", "content": SECOND})
            second = litellm.completion(**request(url), messages=history)
            return turn_cell(served_answer(first).text, served_answer(second).text)

        return run

    return paths(tool, {"response_format": structured}, {k: turn2(u) for k, u in abstaining.items()})


# ---------------------------------------------------------------- pydantic-ai (CandorChatModel)


def pydantic_ai_paths(answering: str, abstaining: dict[str, str]) -> dict[str, Any]:
    from pydantic_ai import Agent, NativeOutput, PromptedOutput, ToolOutput
    from pydantic_ai.messages import ToolCallPart
    from pydantic_ai.providers.openai import OpenAIProvider

    from candor.integrations.pydantic_ai import CandorChatModel, served_answer

    def agent(url: str, **kwargs: Any) -> Any:
        model = CandorChatModel("candor", provider=OpenAIProvider(base_url=f"{url}/v1", api_key=KEY))
        settings = kwargs.pop("model_settings", {"max_tokens": MAX_TOKENS})
        return Agent(model, instructions=SYSTEM, model_settings=settings, **kwargs)

    # A structured output is one final_result call: parallel_tool_calls off, as an app asking for one object sets
    # it (pydantic-ai leaves OpenAI's default, true, and the 135M model then repeats the call in a JSON list until
    # max_tokens, which pydantic-ai retries and gives up on: "Exceeded maximum output retries").
    one_output = {"max_tokens": MAX_TOKENS, "parallel_tool_calls": False}

    async def tool():
        from pydantic_ai.capabilities import AbstractCapability

        class CallFirst(AbstractCapability):
            """pydantic-ai's documented way to vary tool_choice per step (a static 'required' is a UserError):
            per-step model settings from a capability. The first step calls the tool, the next answers."""

            def get_model_settings(self) -> Any:
                return lambda ctx: {"tool_choice": ["get_weather"] if ctx.run_step <= 1 else "none"}

        weather = Weather()
        qa = agent(answering, tools=[weather.function()], capabilities=[CallFirst()])
        result = await qa.run(TOOL_QUESTION)
        parts = [p for m in result.all_messages() for p in getattr(m, "parts", []) if isinstance(p, ToolCallPart)]
        return tool_cell([call_of(p.tool_name, p.args) for p in parts], weather, served_answer(result).text)

    def structured(output_type: Any):
        async def run():
            qa = agent(answering, output_type=output_type, model_settings=one_output)
            result = await qa.run(STRUCTURED_QUESTION)
            return structured_cell(result.output)

        return run

    async def after_a_retry():
        """An output validator that asks once for another try: pydantic-ai's retry request, then the output."""
        from pydantic_ai import ModelRetry

        qa, asked = agent(answering, output_type=City, model_settings=one_output), []

        @qa.output_validator
        def once_more(output: City) -> City:
            asked.append(output)
            if len(asked) == 1:
                raise ModelRetry("Give the city and the country again.")
            return output

        result = await qa.run(STRUCTURED_QUESTION)
        return structured_cell(result.output)

    def turn2(url: str):
        async def run():
            qa = agent(url)
            first = await qa.run(QUESTION)
            second = await qa.run(SECOND, message_history=first.all_messages())
            return turn_cell(served_answer(first).text, served_answer(second).text)

        return run

    modes = {"ToolOutput": ToolOutput(City), "NativeOutput": NativeOutput(City), "PromptedOutput": PromptedOutput(City)}
    return paths(
        run_async(tool),
        {name: run_async(structured(mode)) for name, mode in modes.items()}
        | {"after a retry": run_async(after_a_retry)},
        {k: run_async(turn2(u)) for k, u in abstaining.items()},
    )


# ---------------------------------------------------------------- openai-agents


def openai_agents_paths(answering: str, abstaining: dict[str, str], responses: bool) -> dict[str, Any]:
    import openai
    from agents import Agent, ModelSettings, Runner, ToolCallItem, function_tool, set_tracing_disabled

    from candor.integrations.openai_agents import CandorChatCompletionsModel, CandorResponsesModel, served_answer

    set_tracing_disabled(True)
    model_class = CandorResponsesModel if responses else CandorChatCompletionsModel

    def agent(url: str, settings: Any = None, **kwargs: Any) -> Any:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
        settings = settings or ModelSettings(max_tokens=MAX_TOKENS)
        return Agent(
            name="qa", instructions=SYSTEM, model=model_class("candor", client), model_settings=settings, **kwargs
        )

    async def tool():
        weather = Weather()
        # tool_choice "required" forces the first step's call; the agent's reset_tool_choice (on by default) drops
        # it after, and the tool's is_enabled offers it until it ran, so the step after its result answers.
        forced = ModelSettings(max_tokens=MAX_TOKENS, tool_choice="required")
        get_weather = function_tool(weather.function(), is_enabled=lambda ctx, agent: not weather.received)
        result = await Runner.run(agent(answering, forced, tools=[get_weather]), TOOL_QUESTION, max_turns=4)
        raw = [item.raw_item for item in result.new_items if isinstance(item, ToolCallItem)]
        calls = [call_of(getattr(r, "name", None), getattr(r, "arguments", None)) for r in raw]
        return tool_cell(calls, weather, served_answer(result).text)

    async def structured():
        result = await Runner.run(agent(answering, output_type=City), STRUCTURED_QUESTION, max_turns=2)
        return structured_cell(result.final_output)

    def turn2(url: str):
        async def run():
            qa = agent(url)
            first = await Runner.run(qa, QUESTION)
            second = await Runner.run(qa, [*first.to_input_list(), {"role": "user", "content": SECOND}])
            return turn_cell(served_answer(first).text, served_answer(second).text)

        return run

    return paths(
        run_async(tool), {"output_type": run_async(structured)}, {k: run_async(turn2(u)) for k, u in abstaining.items()}
    )
