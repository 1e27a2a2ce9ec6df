"""The compatibility matrix: the released client packages against one real ``candor serve`` (issue 54, parts 2 and 3).

Every client apps are built on, in the way docs/serving.md documents for it (with candor's adapter where one
exists), plain and streamed, asks one question of a server that answers it (threshold 0.0) and of one that
abstains (threshold 1.0), under ``--abstain-as text`` and ``--abstain-as refusal``. Each cell records the
text the user sees, the finish reason, the exception raised (its type) and the confidence the documented
line reaches; the same call without candor's adapter is recorded beside it. The assertions: as documented,
an abstention is shown as the refusal text, never an empty message and never an exception (without the
adapters pydantic-ai and openai-agents raise their own refusal types under ``--abstain-as refusal``,
recorded beside); an answer is the served answer; the confidence is reachable in every cell.

The server is the embedded model (SmolLM2-135M, ``n-prob``) loaded once for the module; the four
settings are four apps over that one engine. The cells go to ``benchmarks/results/client_matrix.json``
with ``CANDOR_WRITE_MATRIX=1`` (docs/serving.md's matrix is generated from that file by
``python -m benchmarks.readme_tables``); otherwise each run is compared with the committed file, so a
package release that changes what a client shows fails here until the matrix is regenerated.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
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
from tests.test_serve_app import KEY  # noqa: E402

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
NODE_DIR = Path(__file__).parent / "node"
COMMITTED = ROOT / "benchmarks" / "results" / "client_matrix.json"
REFUSAL = "I am not sure."
QUESTION = "What is the capital of France?"
SYSTEM = "Answer briefly."
MAX_TOKENS = 64  # the embedded model's answer ends well before (an incomplete Responses stream is an agents error)
MODES = ("plain", "stream")
SETTINGS = (("answered", "text"), ("answered", "refusal"), ("abstained", "text"), ("abstained", "refusal"))
# The framework's own refusal type, per client: what it raises for OpenAI's refusal field without the adapter.
REFUSAL_TYPES = {"pydantic-ai": "ContentFilterError", "openai-agents": "ModelRefusalError"}


def attempt(call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """What one call showed, or the type of the exception it raised."""
    try:
        return {**call(), "exception": None}
    except Exception as exc:  # recorded: a cell says what the user got, an exception included
        return {"shown": None, "finish_reason": None, "confidence": None, "exception": type(exc).__name__}


def seen(shown: str | None, finish_reason: str | None, confidence: Any) -> dict[str, Any]:
    """A cell: the text shown, the finish reason, and the confidence the documented line reached (its value)."""
    reached = {"value": confidence["value"], "abstained": confidence["abstained"]} if confidence else None
    return {"shown": shown, "finish_reason": finish_reason, "confidence": reached}


def messages() -> list[dict[str, str]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]


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
        ["node", str(NODE_DIR / script), *args], capture_output=True, text=True, timeout=120, check=True
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


def node_ai_sdk(url: str, major: str) -> dict[str, dict[str, dict]]:
    out = node("ai_sdk.mjs", major, f"{url}/v1", KEY, QUESTION)

    def cell(got: dict[str, Any]) -> dict[str, Any]:
        return {**seen(got["shown"], got["finish_reason"], got["confidence"]), "exception": got["error"]}

    return {
        way: {"plain": cell(out[name]["generate"]), "stream": cell(out[name]["stream"])}
        for way, name in (("adapter", "extractor"), ("bare", "bare"))
    }


# ---------------------------------------------------------------- the clients of the matrix


def version(distribution: str) -> str:
    return metadata.version(distribution)


def node_version(alias: str) -> str:
    return json.loads((NODE_DIR / "node_modules" / alias / "package.json").read_text())["version"]


# Each client: its name, its calls (plain, stream), the package it is, the documented line that reaches the
# confidence, the Node packages it needs (if any), and how to run it (with and without the adapter).
CLIENTS: list[dict[str, Any]] = [
    {
        "client": "openai (Python), chat completions",
        "family": "openai",
        "calls": ("chat.completions.create", "chat.completions.create(stream=True)"),
        "package": lambda: f"openai {version('openai')}",
        "confidence": 'resp.choices[0].model_extra["confidence"]; streamed: the last chunk\'s choice',
        "run": lambda url: {"adapter": openai_chat(url)},
    },
    {
        "client": "openai (Python), Responses",
        "family": "openai",
        "calls": ("responses.create", "responses.create(stream=True)"),
        "package": lambda: f"openai {version('openai')}",
        "confidence": 'resp.model_extra["confidence"]; streamed: response.completed\'s response',
        "run": lambda url: {"adapter": openai_responses(url)},
    },
    {
        "client": "openai (Node), chat completions",
        "family": "openai",
        "calls": ("chat.completions.create", "chat.completions.create({stream: true})"),
        "package": lambda: f"openai {node_version('openai')}",
        "confidence": "resp.choices[0].confidence; streamed: the last chunk's choice",
        "node": ("openai",),
        "run": lambda url: {"adapter": node_openai(url)["chat"]},
    },
    {
        "client": "openai (Node), Responses",
        "family": "openai",
        "calls": ("responses.create", "responses.create({stream: true})"),
        "package": lambda: f"openai {node_version('openai')}",
        "confidence": "resp.confidence; streamed: response.completed's response",
        "node": ("openai",),
        "run": lambda url: {"adapter": node_openai(url)["responses"]},
    },
    {
        "client": "LangChain (`ChatCandor`)",
        "family": "langchain",
        "python": "langchain_openai",
        "calls": ("invoke", "stream"),
        "package": lambda: f"langchain-openai {version('langchain-openai')}",
        "confidence": 'msg.response_metadata["confidence"]',
        "run": lambda url: {"adapter": langchain_calls(url, True), "bare": langchain_calls(url, False)},
    },
    {
        "client": "LiteLLM (`CandorStream`)",
        "family": "litellm",
        "python": "litellm",
        "calls": ("completion", "completion(stream=True)"),
        "package": lambda: f"litellm {version('litellm')}",
        "confidence": "served_confidence(response); streamed: served_confidence(CandorStream(stream))",
        "run": lambda url: {"adapter": litellm_calls(url, True), "bare": litellm_calls(url, False)},
    },
    {
        "client": "pydantic-ai (`CandorChatModel`)",
        "family": "pydantic-ai",
        "python": "pydantic_ai",
        "calls": ("run", "run_stream"),
        "package": lambda: f"pydantic-ai-slim {version('pydantic-ai-slim')}",
        "confidence": "served_answer(result).confidence",
        "run": lambda url: {"adapter": pydantic_ai_calls(url, True), "bare": pydantic_ai_calls(url, False)},
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
    },
    {
        "client": "Vercel AI SDK 5 (`candorMetadata`)",
        "family": "ai-sdk",
        "calls": ("generateText", "streamText"),
        "package": lambda: f"ai {node_version('ai5')}, @ai-sdk/openai-compatible {node_version('openai-compatible1')}",
        "confidence": "result.providerMetadata.candor.confidence (streamText: await result.providerMetadata)",
        "node": ("ai5", "openai-compatible1"),
        "run": lambda url: node_ai_sdk(url, "5"),
    },
    {
        "client": "Vercel AI SDK 6 (`candorMetadata`)",
        "family": "ai-sdk",
        "calls": ("generateText", "streamText"),
        "package": lambda: f"ai {node_version('ai6')}, @ai-sdk/openai-compatible {node_version('openai-compatible2')}",
        "confidence": "result.providerMetadata.candor.confidence (streamText: await result.providerMetadata)",
        "node": ("ai6", "openai-compatible2"),
        "run": lambda url: node_ai_sdk(url, "6"),
    },
]


def missing(client: dict[str, Any]) -> str | None:
    """Why this client cannot run here (its package is not installed), or None."""
    import importlib.util

    module = client.get("python")
    if module and importlib.util.find_spec(module) is None:
        return f"{module} is not installed (its extra is in the Makefile's install line)"
    return node_missing(*client["node"]) if client.get("node") else None


# ---------------------------------------------------------------- one server, four settings


@pytest.fixture(scope="module")
def served(smollm_dir, tokenizer):
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
    from contextlib import ExitStack

    with ExitStack() as stack:
        for case, abstain_as in SETTINGS:
            settings = ServeSettings(api_key=KEY, refusal=REFUSAL, abstain_as=abstain_as)
            urls[case, abstain_as] = stack.enter_context(serve_in_thread(create_app(models[case], settings)))
        yield urls, answer.answer


@pytest.fixture(scope="module")
def matrix(served) -> dict[str, Any]:
    """Every client's cells (``{client: {"skipped": why} | {"cells": [...]}}``), written as the matrix's JSON."""
    urls, answer = served
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM's price list, not fetched
    out: dict[str, Any] = {"answer": answer, "refusal": REFUSAL, "question": QUESTION, "clients": []}
    for client in CLIENTS:
        row = {k: client[k] for k in ("client", "family", "calls", "confidence")}
        why = missing(client)
        if why:
            out["clients"].append({**row, "skipped": why})
            continue
        cells = []
        # The four settings at once: the engine batches their questions, and Node's start-ups overlap.
        with ThreadPoolExecutor(len(SETTINGS)) as pool:
            runs = list(pool.map(client["run"], [urls[setting] for setting in SETTINGS]))
        for (case, abstain_as), ran in zip(SETTINGS, runs, strict=True):
            for i, mode in enumerate(MODES):
                cell = {"case": case, "abstain_as": abstain_as, "mode": mode, "call": client["calls"][i]}
                cell |= ran["adapter"][mode]
                if "bare" in ran:
                    cell["without_adapter"] = ran["bare"][mode]
                cells.append(cell)
        out["clients"].append({**row, "package": client["package"](), "cells": cells})
    if os.environ.get("CANDOR_WRITE_MATRIX") == "1":
        COMMITTED.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return out


def client_row(matrix: dict[str, Any], name: str) -> dict[str, Any]:
    row = next(r for r in matrix["clients"] if r["client"] == name)
    if "skipped" in row:
        pytest.skip(row["skipped"])
    return row


NAMES = [c["client"] for c in CLIENTS]


@pytest.mark.parametrize("name", NAMES)
def test_every_cell_shows_the_answer_or_the_refusal_and_reaches_the_confidence(matrix, name):
    row = client_row(matrix, name)
    assert len(row["cells"]) == len(SETTINGS) * len(MODES)
    for cell in row["cells"]:
        where = f"{name} {cell['mode']} {cell['case']} --abstain-as {cell['abstain_as']}: {cell}"
        # As documented (with candor's adapter), an abstention is an answer, never an exception.
        assert cell["exception"] is None, where
        expected = REFUSAL if cell["case"] == "abstained" else matrix["answer"]
        assert cell["shown"] == expected, where  # never an empty message, never the withheld answer
        assert cell["finish_reason"] in (None, "stop", "completed", "content-filter"), where
        confidence = cell["confidence"]
        assert confidence is not None and 0.0 <= confidence["value"] <= 1.0, where
        assert confidence["abstained"] is (cell["case"] == "abstained"), where


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


def test_the_committed_matrix_is_what_the_packages_do_now(matrix):
    """docs/serving.md's matrix comes from the committed JSON: it must be what this run saw, cell by cell."""
    committed = json.loads(COMMITTED.read_text(encoding="utf-8"))
    assert committed["refusal"] == REFUSAL and committed["question"] == QUESTION
    before = {r["client"]: r for r in committed["clients"]}
    compared = 0
    for row in matrix["clients"]:
        if "skipped" in row:
            continue
        old = before.get(row["client"])
        assert old is not None and "cells" in old, f"{row['client']} is not in {COMMITTED.name}: regenerate it"
        now = [comparable({**c, "shown": c["shown"] == matrix["answer"] or c["shown"]}) for c in row["cells"]]
        then = [comparable({**c, "shown": c["shown"] == committed["answer"] or c["shown"]}) for c in old["cells"]]
        assert now == then, (
            f"{row['client']} shows something else than the committed matrix: rerun with CANDOR_WRITE_MATRIX=1 "
            "and python -m benchmarks.readme_tables"
        )
        compared += 1
    assert compared, "no client ran"


def test_the_documented_metadata_extractor_is_the_one_the_matrix_runs():
    """docs/serving.md's JavaScript snippet is tests/node/candor_metadata.mjs, word for word."""
    snippet = (NODE_DIR / "candor_metadata.mjs").read_text(encoding="utf-8")
    assert f"```js\n{snippet}```" in (ROOT / "docs" / "serving.md").read_text(encoding="utf-8")
