"""The adapters under ``candor serve --stream live``: text streamed, then withdrawn by the refusal (issue 62).

A live stream sends the answer's tokens as they come; when the model then abstains, the last chunk carries
the refusal (``delta.refusal``), which withdraws the text before it. Each adapter must show the refusal
alone, never the withdrawn text run into it ("ParisI am not sure."): LiteLLM's ``CandorStream``
(``served_answer(stream).text``), pydantic-ai's ``CandorChatModel`` (``run_stream``'s output) and
openai-agents' ``CandorChatCompletionsModel`` (``Runner.run_streamed``'s final output).

The server is real: the tiny Llama (its answers are long token strings, so text streams before the decision)
behind ``candor serve``'s app, with a threshold of 1.0 so that every answer is withdrawn.
"""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from candor.serve import Decoding, HonestModel, Threshold  # noqa: E402
from candor.serve.http.app import ServeSettings, create_app  # noqa: E402
from candor.serve.http.server import serve_in_thread  # noqa: E402

KEY = "live-key-not-secret"
REFUSAL = "I am not sure."
QUESTION = "What is the capital of France?"
MESSAGES = [{"role": "user", "content": QUESTION}]


@pytest.fixture(scope="module")
def live_url(tiny_model, tokenizer):
    from candor.backends.hf import HFBackend

    honest = HonestModel(
        HFBackend(tiny_model, tokenizer, batch_size=4), confidence="n-prob", template="fewshot", decoding=Decoding(6)
    )
    honest.threshold = Threshold(1.0, rule="fixed", expected_accuracy=0.5, expected_coverage=0.5)
    settings = ServeSettings(api_key=KEY, refusal=REFUSAL, abstain_as="refusal", stream="live")
    with serve_in_thread(create_app(honest, settings)) as url:
        yield url


def test_the_live_server_streams_text_then_withdraws_it(live_url):
    """The premise of the tests below: text arrives before the refusal that withdraws it."""
    client = openai.OpenAI(base_url=f"{live_url}/v1", api_key=KEY, max_retries=0)
    chunks = [
        c
        for c in client.chat.completions.create(model="candor", messages=MESSAGES, max_tokens=6, stream=True)
        if c.choices
    ]
    assert "".join(c.choices[0].delta.content or "" for c in chunks).strip(), "no text streamed before the decision"
    assert chunks[-1].choices[0].delta.refusal == REFUSAL


def test_litellm_candor_stream_shows_only_the_refusal(live_url):
    litellm = pytest.importorskip("litellm")
    from candor.integrations.litellm import CandorStream, served_answer

    stream = CandorStream(
        litellm.completion(
            model="openai/candor",
            api_base=f"{live_url}/v1",
            api_key=KEY,
            messages=MESSAGES,
            max_tokens=6,
            stream=True,
        )
    )
    chunks = list(stream)
    assert chunks
    answer = served_answer(stream)
    assert answer.text == REFUSAL and answer.abstained, answer
    assert stream.withdrawn, "the text streamed before the refusal is recorded as withdrawn"


def test_pydantic_ai_candor_chat_model_shows_only_the_refusal(live_url):
    pytest.importorskip("pydantic_ai")
    from pydantic_ai import Agent
    from pydantic_ai.providers.openai import OpenAIProvider

    from candor.integrations.pydantic_ai import CandorChatModel, served_answer

    model = CandorChatModel("candor", provider=OpenAIProvider(base_url=f"{live_url}/v1", api_key=KEY))
    agent = Agent(model, model_settings={"max_tokens": 6})

    async def run():
        async with agent.run_stream(QUESTION) as result:
            output = await result.get_output()
        return result, output

    result, output = asyncio.run(run())
    assert output == REFUSAL
    answer = served_answer(result, output)
    assert answer.text == REFUSAL and answer.abstained, answer


def test_openai_agents_candor_chat_completions_model_shows_only_the_refusal(live_url):
    pytest.importorskip("agents")
    from agents import Agent, ModelSettings, Runner, set_tracing_disabled

    from candor.integrations.openai_agents import CandorChatCompletionsModel, served_answer

    set_tracing_disabled(True)

    async def run():
        client = openai.AsyncOpenAI(base_url=f"{live_url}/v1", api_key=KEY, max_retries=0)
        agent = Agent(
            name="qa", model=CandorChatCompletionsModel("candor", client), model_settings=ModelSettings(max_tokens=6)
        )
        result = Runner.run_streamed(agent, QUESTION)
        async for _ in result.stream_events():
            pass
        return result

    result = asyncio.run(run())
    assert result.final_output == REFUSAL
    answer = served_answer(result)
    assert answer.text == REFUSAL and answer.abstained, answer
