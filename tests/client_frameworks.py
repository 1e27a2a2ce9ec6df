"""The client matrix's frameworks new in issue 62: LlamaIndex, Haystack, smolagents, Agno, DSPy, Instructor.

Each, as its documentation shows it against an OpenAI-compatible server, with no candor adapter: the plain
and streamed calls of the matrix (``*_calls(url)``: ``{"adapter": {"plain": CELL, "stream": CELL}}``, the
key the matrix reads a client's documented way from) and the agent paths (``*_paths``, tests/client_paths.py).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
from collections.abc import Callable
from typing import Any

from tests.client_paths import (
    KEY,
    MAX_TOKENS,
    QUESTION,
    SECOND,
    STRUCTURED_QUESTION,
    SYSTEM,
    TOOL_QUESTION,
    City,
    Weather,
    attempt,
    call_of,
    not_offered,
    paths,
    run_async,
    seen,
    structured_cell,
    tool_cell,
    turn_cell,
)

# The frameworks' modules the matrix uses, imported once before its clients' threads start: LlamaIndex's modules
# import each other circularly, and two threads importing them at once find a partly initialised module
# (ImportError: cannot import name 'ObjectRetriever' from partially initialized module ...).
FRAMEWORK_MODULES = (
    "llama_index.core",
    "llama_index.core.llms",
    "llama_index.core.tools",
    "llama_index.core.workflow",
    "llama_index.core.agent.workflow",
    "llama_index.llms.openai_like",
    "haystack",
    "haystack.components.generators.chat",
    "haystack.tools",
    "smolagents",
    "agno.agent",
    "agno.models.openai",
    "agno.db.in_memory",
    "dspy",
    "instructor",
    "langchain_openai",
    "langchain_core.tools",
    "litellm",
    "pydantic_ai",
    "agents",
)


def import_frameworks() -> None:
    """Import every installed framework's modules of FRAMEWORK_MODULES, one after another, in this thread."""
    for name in FRAMEWORK_MODULES:
        if importlib.util.find_spec(name.split(".")[0]) is not None:
            importlib.import_module(name)


# An agent's steps (model requests) per run: a tool call, its answer, one retry; each step is one request with
# the agent's long prompt, and a small model that misses the agent's format would retry up to the default 20.
AGENT_STEPS = 3
TIMEOUT_S = 600.0  # a request's timeout where the framework's default is shorter (the matrix shares one engine)


def confidence_of(raw: Any) -> dict[str, Any] | None:
    """The ``confidence`` object on an openai SDK completion's (or chunk's) first choice, if the framework kept it."""
    from candor.integrations.served import choice_confidence

    choices = getattr(raw, "choices", None) if not isinstance(raw, dict) else raw.get("choices")
    return choice_confidence(choices[0]) if choices else None


# ---------------------------------------------------------------- LlamaIndex


def llama_llm(url: str) -> Any:
    from llama_index.llms.openai_like import OpenAILike

    return OpenAILike(
        model="candor",
        api_base=f"{url}/v1",
        api_key=KEY,
        is_chat_model=True,
        is_function_calling_model=True,
        context_window=8192,
        max_tokens=MAX_TOKENS,
        max_retries=0,
        timeout=TIMEOUT_S,
    )


def llama_messages(question: str = QUESTION) -> list[Any]:
    from llama_index.core.llms import ChatMessage

    return [ChatMessage(role="system", content=SYSTEM), ChatMessage(role="user", content=question)]


def llama_shown(message: Any) -> str | None:
    return message.content or message.additional_kwargs.get("refusal")


def llama_calls(url: str) -> dict[str, dict]:
    llm = llama_llm(url)

    def plain():
        resp = llm.chat(llama_messages())
        return seen(llama_shown(resp.message), resp.raw.choices[0].finish_reason, confidence_of(resp.raw))

    def stream():
        last, confidence, finish = None, None, None
        for last in llm.stream_chat(llama_messages()):
            if last.raw is not None and getattr(last.raw, "choices", None):
                confidence = confidence_of(last.raw) or confidence
                finish = last.raw.choices[0].finish_reason or finish
        return seen(llama_shown(last.message) if last else None, finish, confidence)

    return {"adapter": {"plain": attempt(plain), "stream": attempt(stream)}}


def llama_paths(answering: str, abstaining: dict[str, str]) -> dict[str, Any]:
    from llama_index.core import PromptTemplate
    from llama_index.core.llms import ChatMessage
    from llama_index.core.tools import FunctionTool

    def tool():
        weather, llm = Weather(), llama_llm(answering)
        history = llama_messages(TOOL_QUESTION)
        function = FunctionTool.from_defaults(fn=weather.function())
        resp = llm.chat_with_tools([function], chat_history=history, tool_required=True)  # the first step calls it
        selections = llm.get_tool_calls_from_response(resp, error_on_no_tool_call=False)
        history.append(resp.message)
        for s in selections:
            result = weather(**s.tool_kwargs)
            history.append(ChatMessage(role="tool", content=result, additional_kwargs={"tool_call_id": s.tool_id}))
        final = llm.chat_with_tools([function], chat_history=history, tool_choice="none")  # the step after answers
        return tool_cell([call_of(s.tool_name, s.tool_kwargs) for s in selections], weather, llama_shown(final.message))

    def structured():
        prompt = PromptTemplate("{question}")
        return structured_cell(llama_llm(answering).structured_predict(City, prompt, question=STRUCTURED_QUESTION))

    def turn2(url: str):
        def run():
            llm = llama_llm(url)
            history = llama_messages()
            first = llm.chat(history)
            second = llm.chat([*history, first.message, ChatMessage(role="user", content=SECOND)])
            return turn_cell(llama_shown(first.message), llama_shown(second.message))

        return run

    return paths(tool, {"structured_predict": structured}, {k: turn2(u) for k, u in abstaining.items()})


def llama_agent(kind: str, url: str, tools: list[Any] | None = None, **kwargs: Any) -> Any:
    from llama_index.core.agent.workflow import FunctionAgent, ReActAgent

    agent_class = {"FunctionAgent": FunctionAgent, "ReActAgent": ReActAgent}[kind]
    return agent_class(tools=tools or [], llm=llama_llm(url), system_prompt=SYSTEM, **kwargs)


def llama_agent_calls(kind: str, url: str) -> dict[str, dict]:
    from llama_index.core.agent.workflow import AgentOutput, AgentStream

    def shown(output: Any) -> str | None:
        return llama_shown(output.response)

    async def plain():
        output = await llama_agent(kind, url).run(user_msg=QUESTION, max_iterations=AGENT_STEPS)
        return seen(shown(output), None, confidence_of(output.raw))

    async def stream():
        handler = llama_agent(kind, url, streaming=True).run(user_msg=QUESTION, max_iterations=AGENT_STEPS)
        raw = None
        async for event in handler.stream_events():
            if isinstance(event, AgentStream) and event.raw is not None:
                raw = event.raw if confidence_of(event.raw) else raw
            if isinstance(event, AgentOutput):
                pass
        output = await handler
        return seen(shown(output), None, confidence_of(raw))

    return {"adapter": {"plain": attempt(run_async(plain)), "stream": attempt(run_async(stream))}}


def llama_agent_paths(kind: str, answering: str, abstaining: dict[str, str]) -> dict[str, Any]:
    from llama_index.core.tools import FunctionTool
    from llama_index.core.workflow import Context

    async def tool():
        if kind == "ReActAgent":
            return not_offered(
                "ReActAgent's calls are text the model writes in its ReAct format: no request field can force one"
            )
        weather = Weather()
        # FunctionAgent's initial_tool_choice forces the call on the first step; the second step's output ends the
        # iterations (max_iterations=2: checked before its calls run), and early_stopping_method="generate" asks
        # the model for the answer without tools (under "auto" the 135M model calls the tool again).
        function = FunctionTool.from_defaults(fn=weather.function())
        agent = llama_agent(
            kind, answering, [function], initial_tool_choice="get_weather", early_stopping_method="generate"
        )
        output = await agent.run(user_msg=TOOL_QUESTION, max_iterations=2)
        calls = [call_of(c.tool_name, c.tool_kwargs) for c in output.tool_calls]
        return tool_cell(calls, weather, llama_shown(output.response))

    async def structured():
        output = await llama_agent(kind, answering, output_cls=City).run(
            user_msg=STRUCTURED_QUESTION, max_iterations=AGENT_STEPS
        )
        return structured_cell(output.structured_response)

    def turn2(url: str):
        async def run():
            agent = llama_agent(kind, url)
            context = Context(agent)
            first = await agent.run(user_msg=QUESTION, ctx=context, max_iterations=AGENT_STEPS)
            second = await agent.run(user_msg=SECOND, ctx=context, max_iterations=AGENT_STEPS)
            return turn_cell(llama_shown(first.response), llama_shown(second.response))

        return run

    return paths(
        run_async(tool), {"output_cls": run_async(structured)}, {k: run_async(turn2(u)) for k, u in abstaining.items()}
    )


# ---------------------------------------------------------------- Haystack


def haystack_generator(url: str, **kwargs: Any) -> Any:
    from haystack.components.generators.chat import OpenAIChatGenerator
    from haystack.utils import Secret

    generation = {"max_tokens": MAX_TOKENS, **kwargs.pop("generation_kwargs", {})}
    return OpenAIChatGenerator(
        api_key=Secret.from_token(KEY),
        model="candor",
        api_base_url=f"{url}/v1",
        generation_kwargs=generation,
        max_retries=0,
        timeout=TIMEOUT_S,
        **kwargs,
    )


def haystack_messages(question: str = QUESTION) -> list[Any]:
    from haystack.dataclasses import ChatMessage

    return [ChatMessage.from_system(SYSTEM), ChatMessage.from_user(question)]


def haystack_shown(reply: Any) -> str | None:
    return reply.text or reply.meta.get("refusal")


def haystack_calls(url: str) -> dict[str, dict]:
    def plain():
        reply = haystack_generator(url).run(messages=haystack_messages())["replies"][0]
        return seen(haystack_shown(reply), reply.meta.get("finish_reason"), reply.meta.get("confidence"))

    def stream():
        chunks: list[Any] = []
        reply = haystack_generator(url, streaming_callback=chunks.append).run(messages=haystack_messages())["replies"][
            0
        ]
        text = "".join(c.content or "" for c in chunks)
        return seen(text or haystack_shown(reply), reply.meta.get("finish_reason"), reply.meta.get("confidence"))

    return {"adapter": {"plain": attempt(plain), "stream": attempt(stream)}}


def haystack_paths(answering: str, abstaining: dict[str, str]) -> dict[str, Any]:
    from haystack.dataclasses import ChatMessage
    from haystack.tools import Tool

    from tests.client_paths import TOOL_DESCRIPTION, TOOL_PARAMETERS

    def tool():
        # Haystack's Agent passes one generation_kwargs to every step (a forced call would loop), so the round
        # trip is the chat generator's own loop: the first run forces the call through generation_kwargs, the
        # tool's result goes back as ChatMessage.from_tool, and the final run asks for the answer ("none").
        weather = Weather()
        function = Tool(name="get_weather", description=TOOL_DESCRIPTION, parameters=TOOL_PARAMETERS, function=weather)
        generator, history = haystack_generator(answering), haystack_messages(TOOL_QUESTION)
        first = generator.run(messages=history, tools=[function], generation_kwargs={"tool_choice": "required"})
        reply = first["replies"][0]
        history.append(reply)
        for c in reply.tool_calls:
            history.append(ChatMessage.from_tool(function.invoke(**c.arguments), origin=c))
        final = generator.run(messages=history, tools=[function], generation_kwargs={"tool_choice": "none"})
        final = final["replies"][0]
        return tool_cell([call_of(c.tool_name, c.arguments) for c in reply.tool_calls], weather, haystack_shown(final))

    def structured():
        generator = haystack_generator(answering, generation_kwargs={"response_format": City})
        reply = generator.run(messages=haystack_messages(STRUCTURED_QUESTION))["replies"][0]
        return structured_cell(reply.text, reply.meta.get("refusal"))

    def turn2(url: str):
        def run():
            generator, history = haystack_generator(url), haystack_messages()
            first = generator.run(messages=history)["replies"][0]
            second = generator.run(messages=[*history, first, ChatMessage.from_user(SECOND)])["replies"][0]
            return turn_cell(haystack_shown(first), haystack_shown(second))

        return run

    return paths(tool, {"response_format": structured}, {k: turn2(u) for k, u in abstaining.items()})


# ---------------------------------------------------------------- smolagents


def smol_model(url: str) -> Any:
    from smolagents import OpenAIServerModel

    return OpenAIServerModel(model_id="candor", api_base=f"{url}/v1", api_key=KEY, max_tokens=MAX_TOKENS)


def smol_agent(kind: str, url: str, tools: list[Any] | None = None) -> Any:
    from smolagents import CodeAgent, ToolCallingAgent

    model = smol_model(url)
    agent_class = {"ToolCallingAgent": ToolCallingAgent, "CodeAgent": CodeAgent}[kind]
    # Two steps: a tool call and the final answer (smolagents adds a last request for the answer at its limit).
    return agent_class(
        tools=tools or [], model=model, max_steps=AGENT_STEPS - 1, verbosity_level=0, instructions=SYSTEM
    )


def smol_shown(output: Any) -> str | None:
    return None if output is None else str(output)


def smol_calls(kind: str, url: str) -> dict[str, dict]:
    def plain():
        return seen(smol_shown(smol_agent(kind, url).run(QUESTION)), None, None)

    def stream():
        final = None
        for step in smol_agent(kind, url).run(QUESTION, stream=True):
            if type(step).__name__ == "FinalAnswerStep":
                final = step.output
        return seen(smol_shown(final), None, None)

    return {"adapter": {"plain": attempt(plain), "stream": attempt(stream)}}


def smol_paths(kind: str, answering: str, abstaining: dict[str, str]) -> dict[str, Any]:
    from smolagents import tool as as_tool

    def tool():
        if kind == "CodeAgent":
            return not_offered("CodeAgent's calls are Python code the model writes: no request field can force one")
        weather = Weather()  # ToolCallingAgent sends tool_choice "required" on every step (final_answer is a tool)
        agent = smol_agent(kind, answering, [as_tool(weather.function())])
        output = agent.run(TOOL_QUESTION)
        steps = [s for s in agent.memory.steps if type(s).__name__ == "ActionStep"]
        calls = [c for s in steps for c in (s.tool_calls or []) if c.name != "final_answer"]
        if kind == "CodeAgent":  # its calls are Python code the agent runs: what the tool received is the call
            recorded = [call_of("get_weather", args) for args in weather.received]
        else:
            recorded = [call_of(c.name, c.arguments) for c in calls]
        return tool_cell(recorded, weather, smol_shown(output))

    def turn2(url: str):
        def run():
            agent = smol_agent(kind, url)
            first = agent.run(QUESTION)
            second = agent.run(SECOND, reset=False)
            return turn_cell(smol_shown(first), smol_shown(second))

        return run

    def structured():
        # An agent's output is its final_answer's text; structured output is the model's own API (response_format).
        schema = {"name": "City", "schema": City.model_json_schema(), "strict": True}
        message = smol_model(answering).generate(
            [{"role": "user", "content": [{"type": "text", "text": STRUCTURED_QUESTION}]}],
            response_format={"type": "json_schema", "json_schema": schema},
        )
        return structured_cell(message.content)

    return paths(tool, {"model.generate(response_format)": structured}, {k: turn2(u) for k, u in abstaining.items()})


# ---------------------------------------------------------------- Agno


def agno_agent(kind: str, url: str, **kwargs: Any) -> Any:
    from agno.agent import Agent
    from agno.models.openai import OpenAIChat, OpenAIResponses

    if kind == "OpenAIChat":
        model = OpenAIChat(id="candor", base_url=f"{url}/v1", api_key=KEY, max_tokens=MAX_TOKENS, max_retries=0)
    else:
        model = OpenAIResponses(id="candor", base_url=f"{url}/v1", api_key=KEY, max_output_tokens=MAX_TOKENS)
        model.max_retries = 0
    return Agent(model=model, instructions=SYSTEM, telemetry=False, **kwargs)


def agno_shown(run: Any) -> str | None:
    content = run.content
    return content if isinstance(content, str) or content is None else repr(content)


class AgnoRunError(Exception):
    """An Agno run that ended with ``RunStatus.error``: Agno returns it (its content the error) rather than raising."""


def agno_checked(run: Any) -> Any:
    if str(getattr(run, "status", "")).lower().endswith("error"):
        raise AgnoRunError(run.content)
    return run


def agno_calls(kind: str, url: str) -> dict[str, dict]:
    def plain():
        return seen(agno_shown(agno_checked(agno_agent(kind, url).run(QUESTION))), None, None)

    def stream():
        text = ""
        for event in agno_agent(kind, url).run(QUESTION, stream=True):
            if type(event).__name__ == "RunErrorEvent":
                raise AgnoRunError(getattr(event, "content", ""))
            if type(event).__name__ == "RunContentEvent" and isinstance(event.content, str):
                text += event.content
        return seen(text, None, None)

    return {"adapter": {"plain": attempt(plain), "stream": attempt(stream)}}


def agno_paths(kind: str, answering: str, abstaining: dict[str, str]) -> dict[str, Any]:
    checked = agno_checked

    def tool():
        return not_offered(
            "Agno sends an Agent's tool_choice with every request of a run: a forced call would be forced again "
            "after the tool's result, so no run can force only the first step"
        )

    def structured():
        run = checked(agno_agent(kind, answering, output_schema=City).run(STRUCTURED_QUESTION))
        return structured_cell(run.content)

    def turn2(url: str):
        def run():
            from agno.db.in_memory import InMemoryDb

            agent = agno_agent(kind, url, db=InMemoryDb(), add_history_to_context=True)
            first = checked(agent.run(QUESTION, session_id="matrix"))
            second = checked(agent.run(SECOND, session_id="matrix"))
            return turn_cell(agno_shown(first), agno_shown(second))

        return run

    return paths(tool, {"output_schema": structured}, {k: turn2(u) for k, u in abstaining.items()})


# ---------------------------------------------------------------- DSPy


def dspy_lm(url: str) -> Any:
    """``dspy.LM`` on candor, declared to DSPy as an OpenAI-compatible provider that takes a response schema and
    tools (``dspy.lm15.register_provider``). Without the declaration (``"openai/candor"``) DSPy, which knows no
    model named candor, sends its JSON fallback no ``response_format``: the output is not decoded under the
    schema, and a small model's free text fails DSPy's parse (AdapterParseError)."""
    import dspy
    from dspy.lm15 import AccessPolicy, ModelSupport, OpenAIChatCompat, ProviderDefinition, register_provider

    access = AccessPolicy(provider="candor", base_url="http://127.0.0.1:8000/v1")  # each LM's api_base wins
    definition = ProviderDefinition.chat(access, compat=OpenAIChatCompat.preset("vllm"))
    register_provider(definition, supports=ModelSupport(response_schema=True, function_calling=True))  # idempotent
    return dspy.LM(
        "candor/candor", api_base=f"{url}/v1", api_key=KEY, max_tokens=MAX_TOKENS, cache=False, num_retries=0
    )


def dspy_context(url: str, **adapter: Any) -> Any:
    """DSPy on candor with its ``JSONAdapter``, which DSPy documents for models that take structured outputs: every
    reply is decoded under the signature's schema (the default ``ChatAdapter``'s field markers are free text the
    135M model does not follow; its JSON fallback runs only after that failure, and not when streaming)."""
    import dspy

    return dspy.context(lm=dspy_lm(url), adapter=dspy.JSONAdapter(**adapter))


def dspy_calls(url: str) -> dict[str, dict]:
    import dspy

    def plain():
        with dspy_context(url):
            return seen(dspy.Predict("question -> answer")(question=QUESTION).answer, None, None)

    def stream():
        async def run():
            with dspy_context(url):
                final = None
                async for item in dspy.streamify(dspy.Predict("question -> answer"))(question=QUESTION):
                    if isinstance(item, dspy.Prediction):
                        final = item
            return seen(final.answer if final is not None else None, None, None)

        return run_async(run)()

    return {"adapter": {"plain": attempt(plain), "stream": attempt(stream)}}


def dspy_paths(answering: str, abstaining: dict[str, str]) -> dict[str, Any]:
    import dspy

    fields = {"question": (str, dspy.InputField()), "tools": (list[dspy.Tool], dspy.InputField())}
    call_tools = dspy.Signature(fields | {"outputs": (dspy.ToolCalls, dspy.OutputField())}, SYSTEM)

    def tool():
        # DSPy's own tool handling with native function calling (dspy.Tool, dspy.ToolCalls): the first request
        # forces the call (config tool_choice "required"), the tool runs, and a second Predict answers from its
        # result. dspy.ReAct offers no way to force a call: its tool's name is a field the model fills.
        weather = Weather()
        get_weather = dspy.Tool(weather.function())
        with dspy_context(answering, use_native_function_calling=True):
            out = dspy.Predict(call_tools)(
                question=TOOL_QUESTION, tools=[get_weather], config={"tool_choice": "required"}
            )
            calls = out.outputs.tool_calls
            results = [str(get_weather(**c.args)) for c in calls]
            answer = dspy.Predict(dspy.Signature("question, tool_result -> answer", SYSTEM))
            final = answer(question=TOOL_QUESTION, tool_result="\n".join(results))
        return tool_cell([call_of(c.name, c.args) for c in calls], weather, final.answer)

    def structured():
        signature = dspy.Signature("question -> city: str, country: str", SYSTEM)
        with dspy_context(answering):
            out = dspy.Predict(signature)(question=STRUCTURED_QUESTION)
        return structured_cell({"city": out.city, "country": out.country})

    def turn2(url: str):
        def run():
            signature = dspy.Signature("question, history: dspy.History -> answer", SYSTEM)
            with dspy_context(url):
                predict = dspy.Predict(signature)
                first = predict(question=QUESTION, history=dspy.History(messages=[]))
                history = dspy.History(messages=[{"question": QUESTION, "answer": first.answer}])
                second = predict(question=SECOND, history=history)
            return turn_cell(first.answer, second.answer)

        return run

    return paths(tool, {"typed signature": structured}, {k: turn2(u) for k, u in abstaining.items()})


# ---------------------------------------------------------------- Instructor (structured output only)


def instructor_client(url: str, mode: str) -> Any:
    import instructor
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    return instructor.from_openai(client, mode=instructor.Mode[mode])


def instructor_refusal(exc: Exception, replies: list[Any]) -> tuple[str, Any] | None:
    """``(refusal, completion)`` when Instructor raised for an abstention, else None.

    A structured abstention is OpenAI's refusal field with no content; a tool call's (Mode.TOOLS) is no call,
    the refusal as ``--abstain-as`` says (the refusal field, or the text). Instructor raises
    ``InstructorRetryException`` for either (Mode.TOOLS: "Unable to generate a response due to <refusal>", or no
    call to validate; the JSON modes: the empty content fails the model's validation). Its ``last_completion`` is
    the reply, except when Mode.TOOLS read a refusal field (then it is None): the reply is then the one Instructor's
    documented ``completion:response`` hook received (``replies``), whose message the app shows.
    """
    from instructor.core import InstructorRetryException

    if not isinstance(exc, InstructorRetryException):
        return None
    completion = getattr(exc, "last_completion", None) or (replies[-1] if replies else None)
    message = completion.choices[0].message if completion and completion.choices else None
    refusal = None if message is None or message.tool_calls else (message.refusal or message.content)
    return (refusal, completion) if refusal else None


def instructor_answer(client: Any, create: Callable[[], Any]) -> tuple[str, Any, str | None]:
    """``(shown, completion, exception)``: the object's JSON, or the refusal Instructor raised for (its type).

    ``client`` is the Instructor client ``create`` calls: its ``completion:response`` hook keeps each raw reply.
    """
    replies: list[Any] = []
    keep = replies.append
    client.on("completion:response", keep)
    try:
        value, completion = create()
    except Exception as exc:
        found = instructor_refusal(exc, replies)
        if found is None:
            raise
        return found[0], found[1], type(exc).__name__
    finally:
        client.off("completion:response", keep)
    return value.model_dump_json(), completion, None


def instructor_calls(url: str) -> dict[str, dict]:
    """Instructor's answer is the structured object: plain ``create``, streamed ``create_partial``'s last object."""

    def plain():
        client = instructor_client(url, "TOOLS")
        shown, completion, raised = instructor_answer(
            client,
            lambda: client.create_with_completion(
                model="candor",
                response_model=City,
                messages=[{"role": "user", "content": STRUCTURED_QUESTION}],
                max_tokens=MAX_TOKENS,
                max_retries=0,
            ),
        )
        choice = completion.choices[0]
        return seen(shown, choice.finish_reason, confidence_of(completion)) | {"exception": raised}

    def stream():
        partials = instructor_client(url, "TOOLS").create_partial(
            model="candor",
            response_model=City,
            messages=[{"role": "user", "content": STRUCTURED_QUESTION}],
            max_tokens=MAX_TOKENS,
            max_retries=0,
        )
        last = None
        for partial in partials:
            last = partial
        return seen(json.dumps(last.model_dump()) if last is not None else None, None, None)

    return {"adapter": {"plain": attempt(plain), "stream": attempt(stream)}}


def instructor_paths(answering: str, abstaining: dict[str, str]) -> dict[str, Any]:
    def structured(mode: str):
        def run():
            value = instructor_client(answering, mode).create(
                model="candor",
                response_model=City,
                messages=[{"role": "user", "content": STRUCTURED_QUESTION}],
                max_tokens=MAX_TOKENS,
                max_retries=0,
            )
            return structured_cell(value)

        return run

    def turn2(url: str):
        def run():
            client = instructor_client(url, "JSON_SCHEMA")
            history = [{"role": "user", "content": STRUCTURED_QUESTION}]

            def create():
                return client.create_with_completion(
                    model="candor", response_model=City, messages=history, max_tokens=MAX_TOKENS, max_retries=0
                )

            first, completion, raised = instructor_answer(client, create)
            # The reply as history, its content kept when null (a refusal): Instructor reads every message's content.
            history.append(completion.choices[0].message.model_dump(include={"role", "content", "refusal"}))
            history.append({"role": "user", "content": SECOND})
            second, _, raised_again = instructor_answer(client, create)
            return turn_cell(first, second) | {"exception": raised or raised_again}

        return run

    modes = ("TOOLS", "JSON", "JSON_SCHEMA")
    return paths(None, {m: structured(m) for m in modes}, {k: turn2(u) for k, u in abstaining.items()})
