"""The openai backend's structured output and tool passthrough against a real OpenAI-compatible server: candor's
own ``candor serve`` on the embedded model, over HTTP on 127.0.0.1 (``transformers serve`` ignores
``response_format`` and parses no tool calls for this model, so it cannot show either)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

from candor.backends.base import CONSTRAINED, GENERATE, UPSTREAM_TOOLS, SamplingParams  # noqa: E402
from candor.backends.constraints import JsonConstraint  # noqa: E402
from candor.backends.openai import OpenAIBackend, calls_text, structured_output  # noqa: E402
from candor.util.errors import CandorError  # noqa: E402

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a time zone.",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
    },
}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "born": {"type": "integer"}},
    "required": ["name", "born"],
}
PARAMS = SamplingParams(max_new_tokens=48)


@pytest.fixture(scope="module")
def url(smollm_dir, tokenizer):
    from transformers import AutoModelForCausalLM

    from candor.backends.hf import HFBackend
    from candor.serve import Decoding, HonestModel
    from candor.serve.http.app import ServeSettings, create_app
    from candor.serve.http.server import serve_in_thread

    generator = HFBackend(AutoModelForCausalLM.from_pretrained(smollm_dir), tokenizer, batch_size=4)
    model = HonestModel(generator, confidence="n-prob", template="chat", decoding=Decoding(max_new_tokens=48))
    with serve_in_thread(create_app(model, ServeSettings())) as u:
        yield u


@pytest.fixture(scope="module")
def backend(url) -> OpenAIBackend:
    return OpenAIBackend("candor", base_url=f"{url}/v1", endpoint="chat")


def ask(backend: OpenAIBackend, question: str) -> str:
    return backend.render_chat([{"role": "user", "content": question}])


@pytest.mark.server
@pytest.mark.integration
def test_the_probe_grants_structured_output_and_tools_on_the_chat_endpoint(backend):
    assert {GENERATE, CONSTRAINED, UPSTREAM_TOOLS} <= backend.capabilities


@pytest.mark.server
@pytest.mark.integration
def test_a_constraint_reaches_the_server_as_its_structured_output(backend):
    [gen] = backend.generate(
        [ask(backend, "Who was Marie Curie? Answer in JSON.")], 0, PARAMS, constraint=JsonConstraint.of(PERSON)
    )
    jsonschema.validate(json.loads(gen.greedy.text), PERSON)
    [free] = backend.generate([ask(backend, "Who was Marie Curie? Answer in JSON.")], 0, PARAMS)
    assert free.greedy.text != gen.greedy.text  # without it the server answers as it likes


@pytest.mark.server
@pytest.mark.integration
def test_a_forced_tool_call_comes_back_as_the_canonical_calls(backend):
    tools = [WEATHER, TIME]
    [gen] = backend.generate_tool_calls(
        [ask(backend, "What is the weather in Paris right now?")], 0, PARAMS, tools=tools, tool_choice="required"
    )
    calls = json.loads(gen.greedy.text)
    assert gen.greedy.text == json.dumps(calls, sort_keys=True, separators=(",", ":"))
    assert len(calls) >= 1 and all(set(c) == {"name", "arguments"} for c in calls)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    for call in calls:
        jsonschema.validate(call["arguments"], schemas[call["name"]])
    assert gen.greedy.finish_reason == "stop"


@pytest.mark.server
@pytest.mark.integration
def test_a_named_tool_choice_calls_that_tool(backend):
    choice = {"type": "function", "function": {"name": "get_time"}}
    [gen] = backend.generate_tool_calls(
        [ask(backend, "What time is it in Tokyo?")], 0, PARAMS, tools=[WEATHER, TIME], tool_choice=choice
    )
    assert [c["name"] for c in json.loads(gen.greedy.text)] == ["get_time"]


def test_allow_text_is_refused_before_any_request():
    offline = OpenAIBackend("m", base_url="http://127.0.0.1:9/v1", endpoint="chat", capabilities=[GENERATE])
    with pytest.raises(CandorError, match="allow_text"):
        offline.generate(["Hi"], 0, PARAMS, constraint=JsonConstraint.of(PERSON, allow_text=True))
    completions = OpenAIBackend("m", base_url="http://127.0.0.1:9/v1", capabilities=[GENERATE])
    with pytest.raises(CandorError, match="chat endpoint"):
        completions.generate_tool_calls(["Hi"], 0, PARAMS, tools=[WEATHER])


def test_the_structured_output_field_is_openai_s_json_schema():
    assert structured_output(None, "x") == {}
    field = structured_output(JsonConstraint.of(PERSON), "x")["response_format"]
    assert field == {"type": "json_schema", "json_schema": {"name": "answer", "schema": PERSON, "strict": True}}


def test_calls_text_is_sorted_compact_json_and_keeps_malformed_arguments():
    calls = [
        {"function": {"name": "b", "arguments": '{"y": 1, "x": [2, 3]}'}},
        {"function": {"name": "a", "arguments": "not json"}},
        {"function": {"name": "c", "arguments": ""}},
    ]
    assert (
        calls_text(calls) == '[{"arguments":"not json","name":"a"},{"arguments":{"x":[2,3],"y":1},"name":"b"},'
        '{"arguments":{},"name":"c"}]'
    )
