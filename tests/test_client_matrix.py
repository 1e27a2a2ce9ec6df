"""The compatibility matrix: the released client packages against one real ``candor serve`` (issues 54 and 62).

Every client apps are built on, in the way its documentation shows it (with candor's adapter where one
exists), plain and streamed, asks one question of a server that answers it (threshold 0.0) and of one that
abstains (threshold 1.0), under ``--abstain-as text`` and ``--abstain-as refusal``. Each cell records the
text the user sees, the finish reason, the exception raised (its type) and the confidence the documented
line reaches; the same call without candor's adapter is recorded beside it. The assertions: as documented,
an abstention is shown as the refusal text, never an empty message and never an exception (without the
adapters pydantic-ai and openai-agents raise their own refusal types under ``--abstain-as refusal``,
recorded beside); an answer is the served answer; the confidence is reachable where a line documents it.

Issue 62 adds the agent paths (tests/client_paths.py, tests/client_frameworks.py, tests/node/*_paths.mjs):
per client a tool round trip (every call validates against the tool's schema), a structured output per mode
the framework offers (each parses into its schema: the server constrains the decoding), and a second turn
after an abstention (the framework's own history of the refused turn is accepted).

The server is the embedded model (SmolLM2-135M, ``n-prob``) loaded once for the module; the four
settings are four apps over that one engine. The clients run concurrently (the engine batches their
questions). The cells go to ``benchmarks/results/client_matrix.json`` with ``CANDOR_WRITE_MATRIX=1``
(docs/serving.md's matrix is generated from that file by ``python -m benchmarks.readme_tables``);
otherwise each run is compared with the committed file, so a package release that changes what a client
shows fails here until the matrix is regenerated.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from candor.serve import Decoding, HonestModel, Threshold  # noqa: E402
from candor.serve.answering import Ask, Reply  # noqa: E402
from candor.serve.http.app import ServeSettings, create_app  # noqa: E402
from candor.serve.http.server import serve_in_thread  # noqa: E402
from tests import client_frameworks as frameworks  # noqa: E402
from tests import client_paths as agent_paths  # noqa: E402
from tests.client_paths import KEY, MAX_TOKENS, QUESTION, REFUSAL, SYSTEM, attempt, messages, seen  # noqa: E402

# Slow: 25 clients and their agent paths take about 11 minutes on 2 cores (the seconds of each are in the committed
# matrix); the default tier leaves it out and CI runs it on its own (`make test-matrix`, .ci/run). Its agent cells
# are the record of what each framework does now (docs/serving.md).
pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
NODE_DIR = Path(__file__).parent / "node"
COMMITTED = ROOT / "benchmarks" / "results" / "client_matrix.json"
MODES = ("plain", "stream")
SETTINGS = (("answered", "text"), ("answered", "refusal"), ("abstained", "text"), ("abstained", "refusal"))
# The framework's own refusal type, per client: what it raises for OpenAI's refusal field without the adapter.
REFUSAL_TYPES = {"pydantic-ai": "ContentFilterError", "openai-agents": "ModelRefusalError"}
# The exception a framework documents for a refusal, per family: raised only for an abstention, whose refusal the
# app then shows from what the exception carries (Instructor: ``InstructorRetryException.last_completion``, or the
# reply its ``completion:response`` hook kept).
DOCUMENTED_REFUSALS = {"instructor": "InstructorRetryException"}
# Abstentions a framework cannot show whatever the server sends, and why ((client, --abstain-as) -> why);
# docs/agents.md says so and what to serve it with. Their cells stay recorded as they are (the committed matrix is
# compared cell by cell), and they must never show the withheld answer.
DROPS_REFUSAL = (
    "keeps no `refusal` field: the abstention's content is null, and it shows nothing (serve --abstain-as text)"
)
UNSHOWABLE: dict[tuple[str, str], str] = {
    (name, "refusal"): DROPS_REFUSAL
    for name in (
        "LlamaIndex (`OpenAILike`)",
        "LlamaIndex (`FunctionAgent`)",
        "LlamaIndex (`ReActAgent`)",
        "Haystack (`OpenAIChatGenerator`)",
        "smolagents (`ToolCallingAgent`)",
        "smolagents (`CodeAgent`)",
        "Agno (`OpenAIChat`)",
        "Agno (`OpenAIResponses`)",
    )
}
UNSHOWABLE["Vercel AI SDK 5, `@ai-sdk/openai` (Responses)", "refusal"] = (
    "@ai-sdk/openai 2.x's response schema has no `refusal` content part (OpenAI's own, which 3.x and 4.x parse): "
    "generateText raises APICallError 'Invalid JSON response', streamText drops it (serve --abstain-as text)"
)
for _abstain_as in ("text", "refusal"):
    UNSHOWABLE["DSPy (`dspy.LM`)", _abstain_as] = (
        "DSPy's JSONAdapter asks for a structured output, whose abstention is OpenAI's refusal field; DSPy drops "
        "the field and raises AdapterParseError ('The LM returned an empty or null response')"
    )
for _abstain_as in ("text", "refusal"):
    UNSHOWABLE["Instructor (`from_openai`)", _abstain_as] = (
        "a structured abstention is OpenAI's refusal field: create raises InstructorRetryException, whose "
        "last_completion (Mode.TOOLS: the reply its completion:response hook kept) holds the refusal "
        "(DOCUMENTED_REFUSALS); create_partial yields no object and raises nothing"
    )
# Structured output modes that send the server no schema (json_object), so no grammar holds the output to it.
SCHEMALESS = {
    ("Instructor (`from_openai`)", "JSON"): "Mode.JSON sends json_object and the schema in its prompt only",
}
CLIENT_WORKERS = 4  # clients run at once (each runs its four settings at once too)
NODE_TIMEOUT_S = 900  # one Node script's cells (its requests queue behind the other clients' on one engine)


# ---------------------------------------------------------------- the Python clients, as documented


def openai_chat(url: str) -> dict[str, dict]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)

    def plain():
        choice = client.chat.completions.create(model="candor", messages=messages(), max_tokens=MAX_TOKENS).choices[0]
        message = choice.message
        return seen(message.content or message.refusal, choice.finish_reason, choice.model_extra["confidence"])

    def stream():
        text, finish, confidence = "", None, None
        for chunk in client.chat.completions.create(
            model="candor", messages=messages(), max_tokens=MAX_TOKENS, stream=True
        ):
            choice = chunk.choices[0]
            text += choice.delta.content or choice.delta.refusal or ""
            if choice.finish_reason:
                finish, confidence = choice.finish_reason, choice.model_extra["confidence"]
        return seen(text, finish, confidence)

    return {"plain": attempt(plain), "stream": attempt(stream)}


def openai_responses(url: str) -> dict[str, dict]:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    request = {"model": "candor", "instructions": SYSTEM, "input": QUESTION, "max_output_tokens": MAX_TOKENS}

    def plain():
        resp = client.responses.create(**request)
        refusals = [p.refusal for item in resp.output for p in item.content if p.type == "refusal"]
        return seen(resp.output_text or "".join(refusals), resp.status, resp.model_extra["confidence"])

    def stream():
        text, finish, confidence = "", None, None
        for event in client.responses.create(**request, stream=True):
            if event.type in ("response.output_text.delta", "response.refusal.delta"):
                text += event.delta
            if event.type in ("response.completed", "response.incomplete"):
                finish, confidence = event.response.status, event.response.model_extra["confidence"]
        return seen(text, finish, confidence)

    return {"plain": attempt(plain), "stream": attempt(stream)}


def langchain_calls(url: str, adapter: bool) -> dict[str, dict]:
    from langchain_openai import ChatOpenAI

    from candor.integrations.langchain import ChatCandor

    chat = (ChatCandor if adapter else ChatOpenAI)(
        base_url=f"{url}/v1", api_key=KEY, model="candor", max_tokens=MAX_TOKENS, max_retries=0
    )
    prompt = [("system", SYSTEM), ("human", QUESTION)]

    def shown(msg):
        refusal = msg.additional_kwargs.get("refusal") if adapter else None
        meta = msg.response_metadata
        return seen(msg.content or refusal, meta.get("finish_reason"), meta.get("confidence"))

    def stream():
        total = None
        for chunk in chat.stream(prompt):
            total = chunk if total is None else total + chunk
        return shown(total)

    return {"plain": attempt(lambda: shown(chat.invoke(prompt))), "stream": attempt(stream)}


def litellm_calls(url: str, adapter: bool) -> dict[str, dict]:
    import litellm

    from candor.integrations.litellm import CandorStream, served_answer, served_confidence

    request = {"model": "openai/candor", "api_base": f"{url}/v1", "api_key": KEY, "messages": messages()}
    request["max_tokens"] = MAX_TOKENS

    def plain():
        response = litellm.completion(**request)
        finish = response.choices[0].finish_reason
        if not adapter:
            return seen(response.choices[0].message.content, finish, None)
        confidence = served_confidence(response)
        return seen(served_answer(response).text, finish, confidence and dict(confidence.details))

    def stream():
        chunks = litellm.completion(**request, stream=True)
        stream = CandorStream(chunks) if adapter else chunks
        text, finish = "", None
        for chunk in stream:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        confidence = served_confidence(stream) if adapter else None
        return seen(text, finish, confidence and dict(confidence.details))

    return {"plain": attempt(plain), "stream": attempt(stream)}


def pydantic_ai_calls(url: str, adapter: bool) -> dict[str, dict]:
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    from candor.integrations.pydantic_ai import CandorChatModel, served_answer

    model = (CandorChatModel if adapter else OpenAIChatModel)(
        "candor", provider=OpenAIProvider(base_url=f"{url}/v1", api_key=KEY)
    )
    agent = Agent(model, instructions=SYSTEM, model_settings={"max_tokens": MAX_TOKENS})

    def shown(result, output):
        answer = served_answer(result, output)
        confidence = answer.confidence and dict(answer.confidence.details)
        return seen(answer.text if adapter else output, result.response.finish_reason, confidence)

    async def run():
        return shown(await agent.run(QUESTION), None)

    async def run_stream():
        async with agent.run_stream(QUESTION) as result:
            output = await result.get_output()
        return shown(result, output)

    return {"plain": attempt(lambda: asyncio.run(run())), "stream": attempt(lambda: asyncio.run(run_stream()))}


def openai_agents_calls(url: str, adapter: bool, responses: bool) -> dict[str, dict]:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        set_tracing_disabled,
    )

    from candor.integrations.openai_agents import CandorChatCompletionsModel, CandorResponsesModel, served_answer

    set_tracing_disabled(True)
    classes = {(True, True): CandorResponsesModel, (True, False): CandorChatCompletionsModel}
    classes |= {(False, True): OpenAIResponsesModel, (False, False): OpenAIChatCompletionsModel}

    def agent():
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
        model = classes[adapter, responses](model="candor", openai_client=client)
        return Agent(name="qa", instructions=SYSTEM, model=model, model_settings=ModelSettings(max_tokens=MAX_TOKENS))

    def shown(result):
        answer = served_answer(result)
        confidence = answer.confidence and dict(answer.confidence.details)
        return seen(answer.text if adapter else result.final_output, None, confidence)

    async def run():
        return shown(await Runner.run(agent(), QUESTION))

    async def run_streamed():
        result = Runner.run_streamed(agent(), QUESTION)
        async for _ in result.stream_events():
            pass
        return shown(result)

    return {"plain": attempt(lambda: asyncio.run(run())), "stream": attempt(lambda: asyncio.run(run_streamed()))}


# ---------------------------------------------------------------- the Node clients


def node_missing(*packages: str) -> str | None:
    """Why the Node clients cannot run here, or None."""
    if shutil.which("node") is None:
        return "node is not installed: the Node clients cannot run here"
    missing = [p for p in packages if not (NODE_DIR / "node_modules" / p / "package.json").exists()]
    if missing:
        return f"the Node packages {missing} are not installed (make node-client runs npm install in tests/node)"
    return None


def node(script: str, *args: str) -> dict[str, Any]:
    run = subprocess.run(
        ["node", str(NODE_DIR / script), *args], capture_output=True, text=True, timeout=NODE_TIMEOUT_S, check=True
    )
    return json.loads(run.stdout)


@functools.cache  # one run of client.mjs gives both rows (chat completions and Responses)
def node_openai(url: str) -> dict[str, dict[str, dict]]:
    out = node("client.mjs", f"{url}/v1", KEY, QUESTION)

    def cell(way: str) -> dict[str, Any]:
        got = out[way]
        return {**seen(got["content"] or got["refusal"], got["finish_reason"], got["confidence"]), "exception": None}

    return {
        "chat": {"plain": cell("plain"), "stream": cell("streamed")},
        "responses": {"plain": cell("responses"), "stream": cell("responses_streamed")},
    }


def node_ai_sdk(url: str, which: str) -> dict[str, dict[str, dict]]:
    """AI SDK ``which`` ("5", "6", "7": @ai-sdk/openai-compatible, with and without candor's extractor; "openai5",
    "openai6", "openai7": @ai-sdk/openai's default Responses model, no extractor)."""
    out = node("ai_sdk.mjs", which, f"{url}/v1", KEY, QUESTION)

    def cell(got: dict[str, Any]) -> dict[str, Any]:
        found = {**seen(got["shown"], got["finish_reason"], got["confidence"]), "exception": got["error"]}
        return found | ({"error": got["message"]} if got.get("message") else {})

    ways = (("adapter", "default"),) if which.startswith("openai") else (("adapter", "extractor"), ("bare", "bare"))
    return {way: {"plain": cell(out[name]["generate"]), "stream": cell(out[name]["stream"])} for way, name in ways}


@functools.cache  # one run of client_paths.mjs gives both rows' paths (chat completions and Responses)
def node_openai_paths(answering: str, abstain_text: str, abstain_refusal: str) -> dict[str, Any]:
    return node("client_paths.mjs", f"{answering}/v1", f"{abstain_text}/v1", f"{abstain_refusal}/v1", KEY)


def node_ai_sdk_paths(which: str, answering: str, abstaining: dict[str, str]) -> dict[str, Any]:
    urls = [f"{u}/v1" for u in (answering, abstaining["text"], abstaining["refusal"])]
    return node("ai_sdk_paths.mjs", which, *urls, KEY)


def node_paths(run: Callable[..., dict[str, Any]]) -> Callable[[str, dict[str, str]], dict[str, Any]]:
    """A Node script's paths as a client's ``paths`` (a script that failed outright is one exception per path)."""

    def paths(answering: str, abstaining: dict[str, str]) -> dict[str, Any]:
        try:
            return run(answering, abstaining)
        except (subprocess.SubprocessError, json.JSONDecodeError) as exc:
            why = (getattr(exc, "stderr", "") or str(exc)).strip().splitlines()
            broken = {"shown": None, "exception": type(exc).__name__, "error": why[-1][:300] if why else ""}
            return {"tool": broken, "structured": {"script": broken}, "turn2": dict.fromkeys(abstaining, broken)}

    return paths


# ---------------------------------------------------------------- the clients of the matrix


def version(distribution: str) -> str:
    return metadata.version(distribution)


def node_version(alias: str) -> str:
    return json.loads((NODE_DIR / "node_modules" / alias / "package.json").read_text())["version"]


def ai_sdk_row(major: str) -> dict[str, Any]:
    """AI SDK ``major`` with @ai-sdk/openai-compatible and candor's extractor."""
    compatible = {"5": "openai-compatible1", "6": "openai-compatible2", "7": "openai-compatible3"}[major]
    return {
        "client": f"Vercel AI SDK {major} (`candorMetadata`)",
        "family": "ai-sdk",
        "calls": ("generateText", "streamText"),
        "package": lambda: f"ai {node_version('ai' + major)}, @ai-sdk/openai-compatible {node_version(compatible)}",
        "confidence": "result.providerMetadata.candor.confidence (streamText: await result.providerMetadata)",
        "node": (f"ai{major}", compatible),
        "run": lambda url: node_ai_sdk(url, major),
        "paths": node_paths(functools.partial(node_ai_sdk_paths, major)),
    }


def ai_sdk_openai_row(major: str) -> dict[str, Any]:
    """AI SDK ``major`` with @ai-sdk/openai (its default model: the Responses API), as OpenAI's provider documents."""
    provider = f"ai-sdk-openai{int(major) - 3}"
    return {
        "client": f"Vercel AI SDK {major}, `@ai-sdk/openai` (Responses)",
        "family": "ai-sdk-openai",
        "calls": ("generateText", "streamText"),
        "package": lambda: f"ai {node_version('ai' + major)}, @ai-sdk/openai {node_version(provider)}",
        "confidence": "result.response.body.confidence (generateText only: the provider keeps no extra field)",
        "node": (f"ai{major}", provider),
        "run": lambda url: node_ai_sdk(url, f"openai{major}"),
        "paths": node_paths(functools.partial(node_ai_sdk_paths, f"openai{major}")),
    }


# Each client: its name, its calls (plain, stream), the package it is, the documented line that reaches the
# confidence (None: the framework keeps it nowhere), the Python module or Node packages it needs, how to run
# it (``run``: with and without the adapter, per server) and its agent paths (``paths``: tests/client_paths.py).
CLIENTS: list[dict[str, Any]] = [
    {
        "client": "openai (Python), chat completions",
        "family": "openai",
        "calls": ("chat.completions.create", "chat.completions.create(stream=True)"),
        "package": lambda: f"openai {version('openai')}",
        "confidence": 'resp.choices[0].model_extra["confidence"]; streamed: the last chunk\'s choice',
        "run": lambda url: {"adapter": openai_chat(url)},
        "paths": agent_paths.openai_chat_paths,
    },
    {
        "client": "openai (Python), Responses",
        "family": "openai",
        "calls": ("responses.create", "responses.create(stream=True)"),
        "package": lambda: f"openai {version('openai')}",
        "confidence": 'resp.model_extra["confidence"]; streamed: response.completed\'s response',
        "run": lambda url: {"adapter": openai_responses(url)},
        "paths": agent_paths.openai_responses_paths,
    },
    {
        "client": "openai (Node), chat completions",
        "family": "openai",
        "calls": ("chat.completions.create", "chat.completions.create({stream: true})"),
        "package": lambda: f"openai {node_version('openai')}",
        "confidence": "resp.choices[0].confidence; streamed: the last chunk's choice",
        "node": ("openai",),
        "run": lambda url: {"adapter": node_openai(url)["chat"]},
        "paths": node_paths(lambda a, b: node_openai_paths(a, b["text"], b["refusal"])["chat"]),
    },
    {
        "client": "openai (Node), Responses",
        "family": "openai",
        "calls": ("responses.create", "responses.create({stream: true})"),
        "package": lambda: f"openai {node_version('openai')}",
        "confidence": "resp.confidence; streamed: response.completed's response",
        "node": ("openai",),
        "run": lambda url: {"adapter": node_openai(url)["responses"]},
        "paths": node_paths(lambda a, b: node_openai_paths(a, b["text"], b["refusal"])["responses"]),
    },
    {
        "client": "LangChain (`ChatCandor`)",
        "family": "langchain",
        "python": "langchain_openai",
        "calls": ("invoke", "stream"),
        "package": lambda: f"langchain-openai {version('langchain-openai')}",
        "confidence": 'msg.response_metadata["confidence"]',
        "run": lambda url: {"adapter": langchain_calls(url, True), "bare": langchain_calls(url, False)},
        "paths": agent_paths.langchain_paths,
    },
    {
        "client": "LiteLLM (`CandorStream`)",
        "family": "litellm",
        "python": "litellm",
        "calls": ("completion", "completion(stream=True)"),
        "package": lambda: f"litellm {version('litellm')}",
        "confidence": "served_confidence(response); streamed: served_confidence(CandorStream(stream))",
        "run": lambda url: {"adapter": litellm_calls(url, True), "bare": litellm_calls(url, False)},
        "paths": agent_paths.litellm_paths,
    },
    {
        "client": "pydantic-ai (`CandorChatModel`)",
        "family": "pydantic-ai",
        "python": "pydantic_ai",
        "calls": ("run", "run_stream"),
        "package": lambda: f"pydantic-ai-slim {version('pydantic-ai-slim')}",
        "confidence": "served_answer(result).confidence",
        "run": lambda url: {"adapter": pydantic_ai_calls(url, True), "bare": pydantic_ai_calls(url, False)},
        "paths": agent_paths.pydantic_ai_paths,
    },
    {
        "client": "openai-agents (`CandorResponsesModel`)",
        "family": "openai-agents",
        "python": "agents",
        "calls": ("Runner.run", "Runner.run_streamed"),
        "package": lambda: f"openai-agents {version('openai-agents')}",
        "confidence": "served_answer(result).confidence",
        "run": lambda url: {
            "adapter": openai_agents_calls(url, True, True),
            "bare": openai_agents_calls(url, False, True),
        },
        "paths": functools.partial(agent_paths.openai_agents_paths, responses=True),
    },
    {
        "client": "openai-agents (`CandorChatCompletionsModel`)",
        "family": "openai-agents",
        "python": "agents",
        "calls": ("Runner.run", "Runner.run_streamed"),
        "package": lambda: f"openai-agents {version('openai-agents')}",
        "confidence": "served_answer(result).confidence",
        "run": lambda url: {
            "adapter": openai_agents_calls(url, True, False),
            "bare": openai_agents_calls(url, False, False),
        },
        "paths": functools.partial(agent_paths.openai_agents_paths, responses=False),
    },
    ai_sdk_row("5"),
    ai_sdk_row("6"),
    ai_sdk_row("7"),
    ai_sdk_openai_row("5"),
    ai_sdk_openai_row("6"),
    ai_sdk_openai_row("7"),
    {
        "client": "LlamaIndex (`OpenAILike`)",
        "family": "llamaindex",
        "python": "llama_index.llms.openai_like",
        "calls": ("chat", "stream_chat"),
        "package": lambda: f"llama-index-llms-openai-like {version('llama-index-llms-openai-like')}",
        "confidence": 'resp.raw.choices[0].model_extra["confidence"]; streamed: the last chunk\'s raw',
        "run": frameworks.llama_calls,
        "paths": frameworks.llama_paths,
    },
    *(
        {
            "client": f"LlamaIndex (`{kind}`)",
            "family": "llamaindex",
            "python": "llama_index.llms.openai_like",
            "calls": ("run", "run(streaming) + stream_events"),
            "package": lambda: f"llama-index-core {version('llama-index-core')}",
            "confidence": "output.raw's choice (the last completion the agent read)",
            "run": functools.partial(frameworks.llama_agent_calls, kind),
            "paths": functools.partial(frameworks.llama_agent_paths, kind),
        }
        for kind in ("FunctionAgent", "ReActAgent")
    ),
    {
        "client": "Haystack (`OpenAIChatGenerator`)",
        "family": "haystack",
        "python": "haystack",
        "calls": ("run", "run(streaming_callback=…)"),
        "package": lambda: f"haystack-ai {version('haystack-ai')}",
        "confidence": None,
        "run": frameworks.haystack_calls,
        "paths": frameworks.haystack_paths,
    },
    *(
        {
            "client": f"smolagents (`{kind}`)",
            "family": "smolagents",
            "python": "smolagents",
            "calls": ("run", "run(stream=True)"),
            "package": lambda: f"smolagents {version('smolagents')}",
            "confidence": None,
            "run": functools.partial(frameworks.smol_calls, kind),
            "paths": functools.partial(frameworks.smol_paths, kind),
        }
        for kind in ("ToolCallingAgent", "CodeAgent")
    ),
    *(
        {
            "client": f"Agno (`{kind}`)",
            "family": "agno",
            "python": "agno",
            "calls": ("Agent.run", "Agent.run(stream=True)"),
            "package": lambda: f"agno {version('agno')}",
            "confidence": None,
            "run": functools.partial(frameworks.agno_calls, kind),
            "paths": functools.partial(frameworks.agno_paths, kind),
        }
        for kind in ("OpenAIChat", "OpenAIResponses")
    ),
    {
        "client": "DSPy (`dspy.LM`)",
        "family": "dspy",
        "python": "dspy",
        "calls": ("Predict", "streamify(Predict)"),
        "package": lambda: f"dspy {version('dspy')}",
        "confidence": None,
        "run": frameworks.dspy_calls,
        "paths": frameworks.dspy_paths,
    },
    {
        "client": "Instructor (`from_openai`)",
        "family": "instructor",
        "python": "instructor",
        "structured": True,  # its answer is the structured object (City), its only output
        "calls": ("create(response_model=City)", "create_partial(response_model=City)"),
        "package": lambda: f"instructor {version('instructor')}",
        "confidence": (
            'create_with_completion\'s completion.choices[0].model_extra["confidence"] '
            "(create only: create_partial returns no completion)"
        ),
        "run": frameworks.instructor_calls,
        "paths": frameworks.instructor_paths,
    },
]


def missing(client: dict[str, Any]) -> str | None:
    """Why this client cannot run here (its package is not installed), or None."""
    import importlib.util

    module = client.get("python")
    if module and importlib.util.find_spec(module) is None:
        return f"{module} is not installed (its extra is in the Makefile's install line)"
    return node_missing(*client["node"]) if client.get("node") else None


# ---------------------------------------------------------------- one engine, four servers


@contextmanager
def servers(smollm_dir: Path, tokenizer: Any) -> Iterator[tuple[dict[tuple[str, str], str], str]]:
    """``{(case, abstain_as): url}`` and the answer the embedded model gives, from one engine."""
    from transformers import AutoModelForCausalLM

    from candor.backends.hf import HFBackend

    backend = HFBackend(AutoModelForCausalLM.from_pretrained(smollm_dir), tokenizer, batch_size=8)

    def model(threshold: float) -> HonestModel:
        honest = HonestModel(backend, confidence="n-prob", template="fewshot", decoding=Decoding(max_new_tokens=16))
        honest.threshold = Threshold(threshold, rule="fixed", expected_accuracy=0.5, expected_coverage=0.5)
        return honest

    models = {"answered": model(0.0), "abstained": model(1.0)}
    ask = Ask(models["answered"].prepare(QUESTION, MAX_TOKENS, (("system", SYSTEM),)), Reply(max_new_tokens=MAX_TOKENS))
    answer = models["answered"].answer_asks([ask])[0][0]
    assert not answer.abstained and answer.answer.strip(), "the embedded model answers the question"
    urls = {}
    with ExitStack() as stack:
        for case, abstain_as in SETTINGS:
            settings = ServeSettings(api_key=KEY, refusal=REFUSAL, abstain_as=abstain_as)
            urls[case, abstain_as] = stack.enter_context(serve_in_thread(create_app(models[case], settings)))
        yield urls, answer.answer


@pytest.fixture(scope="module")
def served(smollm_dir, tokenizer):
    with servers(smollm_dir, tokenizer) as found:
        yield found


def client_cells(client: dict[str, Any], urls: dict[tuple[str, str], str]) -> dict[str, Any]:
    """One client's row: its cells per setting and mode, and its agent paths (or why the harness broke on it)."""
    row = {k: client[k] for k in ("client", "family", "calls", "confidence")}
    why = missing(client)
    if why:
        return {**row, "skipped": why}
    start = time.monotonic()
    try:
        return ran_cells(client, urls, row) | {"seconds": round(time.monotonic() - start, 1)}
    except Exception as exc:  # one client's broken run fails its own tests, not the other clients'
        return {**row, "broken": f"{type(exc).__name__}: {str(exc)[:500]}"}


def ran_cells(client: dict[str, Any], urls: dict[tuple[str, str], str], row: dict[str, Any]) -> dict[str, Any]:
    cells = []
    # The four settings at once: the engine batches their questions, and Node's start-ups overlap.
    start = time.monotonic()
    with ThreadPoolExecutor(len(SETTINGS)) as pool:
        runs = list(pool.map(client["run"], [urls[setting] for setting in SETTINGS]))
    row["cells_seconds"] = round(time.monotonic() - start, 1)
    for (case, abstain_as), ran in zip(SETTINGS, runs, strict=True):
        for i, mode in enumerate(MODES):
            cell = {"case": case, "abstain_as": abstain_as, "mode": mode, "call": client["calls"][i]}
            cell |= ran["adapter"][mode]
            if "bare" in ran:
                cell["without_adapter"] = ran["bare"][mode]
            cells.append(cell)
    abstaining = {"text": urls["abstained", "text"], "refusal": urls["abstained", "refusal"]}
    found = client["paths"](urls["answered", "text"], abstaining)
    return {**row, "structured": bool(client.get("structured")), "package": client["package"](), "cells": cells} | {
        "paths": found
    }


def slowest_first(clients: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The clients, the slowest in the committed matrix first (the order their runs start in; cells are unchanged)."""
    committed = json.loads(COMMITTED.read_text(encoding="utf-8")) if COMMITTED.exists() else {"clients": []}
    took = {row["client"]: row.get("seconds", 0.0) for row in committed["clients"]}
    return sorted(clients, key=lambda client: -took.get(client["client"], float("inf")))


@pytest.fixture(scope="module")
def matrix(served) -> dict[str, Any]:
    """Every client's cells (``{client: {"skipped": why} | {"cells": [...], "paths": {...}}}``), written as JSON."""
    urls, answer = served
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM's price list, not fetched
    os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")  # smolagents, haystack: no telemetry calls
    os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")
    os.environ.setdefault("AGNO_TELEMETRY", "false")
    out: dict[str, Any] = {"answer": answer, "refusal": REFUSAL, "question": QUESTION}
    frameworks.import_frameworks()  # before the threads: concurrent first imports of LlamaIndex race
    start = time.monotonic()
    with ThreadPoolExecutor(CLIENT_WORKERS) as pool:
        # The slowest clients of the committed run start first, so that no long agent run starts last.
        futures = {c["client"]: pool.submit(client_cells, c, urls) for c in slowest_first(CLIENTS)}
        out["clients"] = [futures[c["client"]].result() for c in CLIENTS]
    out["seconds"] = round(time.monotonic() - start, 1)  # the clients' run, the server's start left out
    if os.environ.get("CANDOR_WRITE_MATRIX") == "1":
        COMMITTED.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return out


def client_row(matrix: dict[str, Any], name: str) -> dict[str, Any]:
    row = next(r for r in matrix["clients"] if r["client"] == name)
    if "skipped" in row:
        if os.environ.get("CI"):  # CI runs every client (.ci/run): a missing package is a broken setup there
            pytest.fail(f"CI must run every client of the matrix: {name}: {row['skipped']}")
        pytest.skip(row["skipped"])
    assert "broken" not in row, f"{name}: the matrix could not run it: {row['broken']}"
    return row


NAMES = [c["client"] for c in CLIENTS]
# The clients whose framework writes its own prompt around the question (an agent's instructions, DSPy's fields):
# their answer is the model's answer to that prompt, not the matrix's served answer.
OWN_PROMPT = {"LlamaIndex (`ReActAgent`)", "smolagents (`ToolCallingAgent`)", "smolagents (`CodeAgent`)"}
OWN_PROMPT |= {"Agno (`OpenAIChat`)", "Agno (`OpenAIResponses`)", "DSPy (`dspy.LM`)"}


def parses(shown: str | None) -> bool:
    try:
        agent_paths.City.model_validate_json(shown or "")
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("name", NAMES)
def test_every_cell_shows_the_answer_or_the_refusal_and_reaches_the_confidence(matrix, name):
    row = client_row(matrix, name)
    assert len(row["cells"]) == len(SETTINGS) * len(MODES)
    for cell in row["cells"]:
        where = f"{name} {cell['mode']} {cell['case']} --abstain-as {cell['abstain_as']}: {cell}"
        # As documented (with candor's adapter), an abstention is an answer, never an exception: or the exception
        # the framework documents for a refusal, which carries the refusal the app shows.
        documented = DOCUMENTED_REFUSALS.get(row["family"])
        if cell["case"] == "abstained" and documented is not None and cell["exception"] == documented:
            assert cell["shown"] == REFUSAL, where
            continue
        if cell["case"] == "abstained" and (name, cell["abstain_as"]) in UNSHOWABLE:
            assert cell["shown"] != matrix["answer"], where  # recorded as it is (UNSHOWABLE says why)
            continue
        assert cell["exception"] is None, where
        if cell["case"] == "abstained":
            assert cell["shown"] == REFUSAL, where  # never an empty message, never the withheld answer
        elif row.get("structured"):
            assert parses(cell["shown"]), where
        elif name in OWN_PROMPT:
            assert cell["shown"] and cell["shown"] != REFUSAL, where
        else:
            assert cell["shown"] == matrix["answer"], where
        finishes = (None, "stop", "completed", "content-filter") + (("tool_calls",) if row.get("structured") else ())
        assert cell["finish_reason"] in finishes, where  # a structured client's object may come as a call
        plain_only = any(only in (row["confidence"] or "") for only in ("generateText only", "create only"))
        if row["confidence"] is None or (cell["mode"] == "stream" and plain_only):
            continue  # the framework keeps the confidence nowhere: recorded, not asserted
        confidence = cell["confidence"]
        assert confidence is not None and 0.0 <= confidence["value"] <= 1.0, where
        assert confidence["abstained"] is (cell["case"] == "abstained"), where


def paths_of(matrix: dict[str, Any], name: str) -> dict[str, Any]:
    return client_row(matrix, name)["paths"]


@pytest.mark.parametrize("name", NAMES)
def test_a_tool_round_trip_calls_the_tool_with_valid_arguments_and_answers(matrix, name):
    """The call, the tool's result sent back, the final answer: no exception, every call valid against the schema."""
    cell = paths_of(matrix, name)["tool"]
    if cell is None:
        pytest.skip(f"{name} offers no tool calling")
    if cell.get("na"):
        pytest.skip(f"{name}: n/a: {cell['na']}")  # the framework offers no way to force the call (recorded)
    assert cell["exception"] is None, cell
    assert cell["calls"], f"{name}: the model called no tool: {cell}"
    assert all(call["valid"] for call in cell["calls"]), cell
    assert cell["tool_ran"] >= 1, cell
    assert cell["shown"] and cell["shown"].strip(), f"{name}: no final answer after the tool's result: {cell}"


@pytest.mark.parametrize("name", NAMES)
def test_every_structured_output_parses_into_its_schema(matrix, name):
    """With the server's grammar every structured output (each mode the framework offers) is the schema's JSON."""
    modes = paths_of(matrix, name)["structured"]
    if not modes:
        pytest.skip(f"{name} offers no structured output")
    failures = {mode: cell for mode, cell in modes.items() if cell["exception"] is not None or not cell.get("parsed")}
    failures = {mode: cell for mode, cell in failures.items() if (name, mode) not in SCHEMALESS}
    assert not failures, f"{name}: {failures}"


@pytest.mark.parametrize("name", NAMES)
def test_a_second_turn_after_an_abstention_is_accepted_and_shows_the_refusal(matrix, name):
    """The framework's own history of a refused turn (content null and a refusal, or the refusal text) is accepted."""
    row = client_row(matrix, name)
    for abstain_as, cell in row["paths"]["turn2"].items():
        where = f"{name} --abstain-as {abstain_as}: {cell}"
        if (name, abstain_as) in UNSHOWABLE:
            assert cell.get("shown") != matrix["answer"], where  # recorded as it is (UNSHOWABLE says why)
            continue
        assert cell["exception"] in (None, DOCUMENTED_REFUSALS.get(row["family"])), where
        assert cell["shown"] == REFUSAL and cell["shown_second"] == REFUSAL, where  # the server abstains on both


def test_the_bare_frameworks_are_recorded_beside_the_adapters(matrix):
    """Without candor's adapter: what issue 54 found, kept in the matrix so the adapters' reason stays visible."""
    recorded = {}
    for row in matrix["clients"]:
        for cell in row.get("cells", []):
            if "without_adapter" in cell and cell["case"] == "abstained" and cell["abstain_as"] == "refusal":
                recorded[row["family"], cell["mode"]] = cell["without_adapter"]
    for family, refusal_type in REFUSAL_TYPES.items():
        for mode in MODES:
            if (family, mode) in recorded:  # the framework's own refusal type, which the adapter turns into an answer
                assert recorded[family, mode]["exception"] == refusal_type, (family, mode)
    if ("litellm", "stream") in recorded:
        assert recorded["litellm", "stream"]["shown"] == "", "LiteLLM's stream drops a refusal: the adapter's reason"
        assert recorded["litellm", "stream"]["confidence"] is None


def comparable(cell: dict[str, Any]) -> dict[str, Any]:
    """What a cell showed, without the numbers that move with the model (the confidence's value)."""
    keep = {k: cell.get(k) for k in ("case", "abstain_as", "mode", "shown", "finish_reason", "exception")}
    keep["confidence_reached"] = cell.get("confidence") is not None
    if "without_adapter" in cell:
        keep["without_adapter"] = comparable({**cell["without_adapter"], "case": cell["case"]})
    return keep


def comparable_paths(found: dict[str, Any]) -> dict[str, Any]:
    """What the agent paths showed, without the model's own words (the final answer, the structured values)."""
    tool = found["tool"]
    keep: dict[str, Any] = {"tool": None}
    if tool is not None:
        calls = tool.get("calls") or []
        keep["tool"] = (tool["exception"], len(calls), all(c["valid"] for c in calls), bool(tool.get("shown")))
        keep["tool"] += (tool.get("na"),)
    keep["structured"] = {m: (c["exception"], c.get("parsed")) for m, c in found["structured"].items()}
    keep["turn2"] = {k: (c["exception"], c.get("shown"), c.get("shown_second")) for k, c in found["turn2"].items()}
    return keep


def test_the_committed_matrix_is_what_the_packages_do_now(matrix):
    """docs/serving.md's matrix comes from the committed JSON: it must be what this run saw, cell by cell."""
    committed = json.loads(COMMITTED.read_text(encoding="utf-8"))
    assert committed["refusal"] == REFUSAL and committed["question"] == QUESTION
    before = {r["client"]: r for r in committed["clients"]}
    compared = 0
    for row in matrix["clients"]:
        if "skipped" in row or "broken" in row:
            continue
        old = before.get(row["client"])
        assert old is not None and "cells" in old, f"{row['client']} is not in {COMMITTED.name}: regenerate it"
        exact = row["client"] not in OWN_PROMPT
        now = [comparable({**c, "shown": c["shown"] == matrix["answer"] or c["shown"]}) for c in row["cells"]]
        then = [comparable({**c, "shown": c["shown"] == committed["answer"] or c["shown"]}) for c in old["cells"]]
        if not exact:  # an agent's answer to its own prompt: whether it showed the refusal or something else
            now = [{**c, "shown": c["shown"] == REFUSAL} for c in now]
            then = [{**c, "shown": c["shown"] == REFUSAL} for c in then]
        assert now == then and comparable_paths(row["paths"]) == comparable_paths(old["paths"]), (
            f"{row['client']} shows something else than the committed matrix: rerun with CANDOR_WRITE_MATRIX=1 "
            "and python -m benchmarks.readme_tables"
        )
        compared += 1
    assert compared, "no client ran"


def test_the_documented_metadata_extractor_is_the_one_the_matrix_runs():
    """docs/serving.md's JavaScript snippet is tests/node/candor_metadata.mjs, word for word."""
    snippet = (NODE_DIR / "candor_metadata.mjs").read_text(encoding="utf-8")
    assert f"```js\n{snippet}```" in (ROOT / "docs" / "serving.md").read_text(encoding="utf-8")
