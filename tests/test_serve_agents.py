"""Agents on ``candor serve`` (issue 62): tool calls and structured output with a confidence, conversations that
survive an abstention, refinement that empties an answer, one set of rules for every request field.

The embedded model (SmolLM2-135M-Instruct) answers over real HTTP, through the official ``openai`` client where
a client's behaviour is the point. Each defect listed in the issue has a test here that fails on 4132585.
"""

from __future__ import annotations

import json

import httpx
import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

from candor.serve import Decoding, HonestModel, Threshold  # noqa: E402
from candor.serve.claim_answers import ClaimPolicy  # noqa: E402
from candor.serve.http.app import ServeSettings, create_app  # noqa: E402
from candor.serve.http.server import serve_in_thread  # noqa: E402
from candor.serve.thresholds import ABSTAIN_ALL  # noqa: E402

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city"],
        },
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
    "properties": {"name": {"type": "string"}, "born": {"type": "integer"}, "alive": {"type": "boolean"}},
    "required": ["name", "born", "alive"],
    "additionalProperties": False,
}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris right now?"}]


@pytest.fixture(scope="module")
def generator(smollm_dir, tokenizer):
    from transformers import AutoModelForCausalLM

    from candor.backends.hf import HFBackend

    return HFBackend(AutoModelForCausalLM.from_pretrained(smollm_dir), tokenizer, batch_size=4)


def served(generator, threshold: float | None = None, method: str = "n-prob", **settings):
    model = HonestModel(generator, confidence=method, template="chat", decoding=Decoding(max_new_tokens=24))
    if threshold is not None:
        model.threshold = Threshold(threshold, rule="fixed")
    return serve_in_thread(create_app(model, ServeSettings(**settings)))


@pytest.fixture(scope="module")
def url(generator):
    with served(generator, max_n=8) as u:  # n up to 8: the upstream of a candor in front asks for its samples
        yield u


@pytest.fixture(scope="module")
def refusing_url(generator):
    """Every answer abstains: the second turn after an abstention, with OpenAI's refusal field."""
    with served(generator, threshold=ABSTAIN_ALL, abstain_as="refusal") as u:
        yield u


def chat(url: str, **body):
    return httpx.post(f"{url}/v1/chat/completions", json={"model": "candor", **body}, timeout=300)


def calls_of(message: dict) -> list[tuple[str, dict]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]]


def schema_of(name: str) -> dict:
    return next(t["function"]["parameters"] for t in (WEATHER, TIME) if t["function"]["name"] == name)


# ---------------------------------------------------------------- tool calls


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_tool_call_validates_against_its_tool_and_carries_its_confidence(url, choice):
    r = chat(url, messages=ASK_WEATHER, tools=[WEATHER, TIME], tool_choice=choice)
    assert r.status_code == 200, r.text
    c = r.json()["choices"][0]
    assert c["finish_reason"] == "tool_calls" and c["message"]["content"] is None
    calls = calls_of(c["message"])
    assert calls
    for name, arguments in calls:
        jsonschema.validate(arguments, schema_of(name))
    if isinstance(choice, dict):
        assert {n for n, _ in calls} == {"get_weather"}
    conf = c["confidence"]
    assert 0.0 <= conf["value"] <= 1.0 and conf["abstained"] is False
    assert [v["name"] for v in conf["tool_calls"]] == [n for n, _ in calls]
    assert all(0.0 < v["value"] <= 1.0 for v in conf["tool_calls"])
    assert conf["computed_on"]["shape"] == "tool_call" and conf["calibrated"] is False
    assert c["message"]["tool_calls"][0]["id"].startswith("call_")


def test_a_tool_round_trip_with_the_official_client(url):
    """The call, the tool's result, then the final answer: the agent loop every framework runs."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x")
    messages: list = list(ASK_WEATHER)
    first = client.chat.completions.create(model="candor", messages=messages, tools=[WEATHER], tool_choice="required")
    message = first.choices[0].message
    assert message.tool_calls, message
    messages.append(message)  # the SDK's own object, sent back as history
    for call in message.tool_calls:
        result = {"city": json.loads(call.function.arguments).get("city"), "temperature": 18, "sky": "cloudy"}
        messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
    final = client.chat.completions.create(model="candor", messages=messages, tools=[WEATHER])
    choice = final.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    conf = choice.model_extra["confidence"]
    if choice.message.tool_calls is None:
        assert choice.message.content, "the final answer after a tool result is text"
        assert conf["computed_on"]["shape"] == "tool_call" and conf["computed_on"]["earlier_messages"] == 2


def test_a_streamed_tool_call_arrives_whole_with_its_confidence(url):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x")
    stream = client.chat.completions.create(
        model="candor", messages=ASK_WEATHER, tools=[WEATHER], tool_choice="required", stream=True
    )
    arguments, names, finish, confidence = {}, {}, None, None
    for chunk in stream:
        for choice in chunk.choices:
            for d in choice.delta.tool_calls or ():
                names[d.index] = names.get(d.index, "") + (d.function.name or "")
                arguments[d.index] = arguments.get(d.index, "") + (d.function.arguments or "")
            finish = choice.finish_reason or finish
            confidence = (choice.model_extra or {}).get("confidence") or confidence
    assert finish == "tool_calls" and names
    for i, name in names.items():
        jsonschema.validate(json.loads(arguments[i]), schema_of(name))
    assert confidence is not None and len(confidence["tool_calls"]) == len(names)


def test_tool_choice_auto_alone_is_accepted_on_chat_as_on_responses(url):
    r = chat(url, messages=[{"role": "user", "content": "Who wrote Hamlet?"}], tool_choice="auto")
    assert r.status_code == 200, r.text


def test_tool_choice_rules_are_one_on_both_endpoints(url):
    bad = {"type": "function", "function": {"name": "nope"}}
    r = chat(url, messages=ASK_WEATHER, tools=[WEATHER], tool_choice=bad)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    r = httpx.post(
        f"{url}/v1/responses",
        json={"model": "candor", "input": "Weather?", "tools": [], "tool_choice": "required"},
        timeout=60,
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"


@pytest.mark.parametrize("choice", ["required", "get_weather"])
def test_a_forced_call_with_a_response_format_is_a_call_never_the_structured_output(choice):
    """DSPy's native function calling sends tools, tool_choice "required" and a response_format at once: the
    output may be the structured output only under "auto"; a forced choice is a call, as OpenAI's API makes it."""
    from candor.serve.agent_turns import AgentTurn
    from candor.tool_calls import tools_from_openai

    tools = tuple(tools_from_openai([WEATHER]))
    person = {"name": "Marie Curie", "born": 1867, "alive": False}
    call = {"name": "get_weather", "arguments": {"city": "Paris"}}
    forced = AgentTurn(messages=(), tools=tools, tool_choice=choice, output_schema=PERSON).constraint()
    jsonschema.validate(call, json.loads(forced.schema))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(person, json.loads(forced.schema))
    free = AgentTurn(messages=(), tools=tools, tool_choice="auto", output_schema=PERSON).constraint()
    jsonschema.validate(person, json.loads(free.schema))


def test_an_abstention_calls_no_tool(refusing_url):
    r = chat(refusing_url, messages=ASK_WEATHER, tools=[WEATHER], tool_choice="required")
    assert r.status_code == 200, r.text
    c = r.json()["choices"][0]
    assert c["finish_reason"] == "stop" and not c["message"].get("tool_calls")
    assert c["message"]["refusal"] and c["confidence"]["abstained"] is True


def test_responses_function_tools_round_trip(url):
    tool = {"type": "function", **WEATHER["function"]}
    body = {"model": "candor", "input": ASK_WEATHER[0]["content"], "tools": [tool], "tool_choice": "required"}
    r = httpx.post(f"{url}/v1/responses", json=body, timeout=300)
    assert r.status_code == 200, r.text
    out = r.json()["output"]
    assert out and all(item["type"] == "function_call" for item in out)
    jsonschema.validate(json.loads(out[0]["arguments"]), schema_of("get_weather"))
    history = [{"role": "user", "content": ASK_WEATHER[0]["content"]}, *out]
    history += [{"type": "function_call_output", "call_id": o["call_id"], "output": '{"temperature": 18}'} for o in out]
    again = httpx.post(f"{url}/v1/responses", json={**body, "input": history, "tool_choice": "auto"}, timeout=300)
    assert again.status_code == 200, again.text


# ---------------------------------------------------------------- structured output


def test_a_json_schema_output_parses_into_its_schema_with_field_confidences(url):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    r = chat(url, messages=[{"role": "user", "content": "Describe Marie Curie."}], response_format=fmt)
    assert r.status_code == 200, r.text
    c = r.json()["choices"][0]
    value = json.loads(c["message"]["content"])
    jsonschema.validate(value, PERSON)
    fields = c["confidence"]["fields"]
    assert set(fields) == set(value)
    assert all(f["value"] is None or 0.0 < f["value"] <= 1.0 for f in fields.values())
    assert c["confidence"]["computed_on"]["shape"] == "structured_output"


def test_json_object_and_the_official_parse_helper(url):
    r = chat(
        url,
        messages=[{"role": "user", "content": "Give a city and its country."}],
        response_format={"type": "json_object"},
    )
    assert r.status_code == 200, r.text
    assert isinstance(json.loads(r.json()["choices"][0]["message"]["content"]), dict)


def test_responses_text_format_is_structured_output(url):
    body = {
        "model": "candor",
        "input": "Describe Marie Curie.",
        "text": {
            "format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True},
            "verbosity": "low",
        },
    }
    r = httpx.post(f"{url}/v1/responses", json=body, timeout=300)
    assert r.status_code == 200, r.text
    jsonschema.validate(json.loads(r.json()["output"][0]["content"][0]["text"]), PERSON)


def test_a_structured_abstention_is_a_refusal_never_text_in_the_json(generator):
    with served(generator, threshold=ABSTAIN_ALL, abstain_as="text") as u:
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
        r = chat(u, messages=[{"role": "user", "content": "Describe Marie Curie."}], response_format=fmt)
    c = r.json()["choices"][0]
    assert c["message"]["content"] is None and c["message"]["refusal"]
    assert c["confidence"]["abstained"] is True


# ---------------------------------------------------------------- conversations after an abstention


def test_the_official_clients_second_turn_after_an_abstention(refusing_url):
    """``messages.append(choice.message)`` sends back ``content: null, refusal: ...``: accepted as history."""
    client = openai.OpenAI(base_url=f"{refusing_url}/v1", api_key="x")
    messages: list = [{"role": "user", "content": "Who wrote Hamlet?"}]
    first = client.chat.completions.create(model="candor", messages=messages)
    assert first.choices[0].message.refusal and first.choices[0].message.content is None
    messages += [first.choices[0].message, {"role": "user", "content": "And Macbeth?"}]
    second = client.chat.completions.create(model="candor", messages=messages)
    assert second.choices[0].message.refusal  # answered (here: abstained again), not refused 400


def test_an_empty_assistant_turn_with_a_refusal_and_a_responses_refusal_part_are_history(refusing_url):
    turn = {"role": "assistant", "content": "", "refusal": "I don't know."}
    r = chat(refusing_url, messages=[{"role": "user", "content": "Hi?"}, turn, {"role": "user", "content": "And?"}])
    assert r.status_code == 200, r.text
    items = [
        {"role": "user", "content": "Hi?"},
        {"type": "message", "role": "assistant", "content": [{"type": "refusal", "refusal": "I don't know."}]},
        {"role": "user", "content": "And?"},
    ]
    r = httpx.post(f"{refusing_url}/v1/responses", json={"model": "candor", "input": items}, timeout=120)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("content", ["", None])
def test_an_empty_assistant_turn_without_a_refusal_is_history_as_the_framework_sent_it(refusing_url, content):
    """LangChain's ``ChatOpenAI``, Haystack and Agno drop the ``refusal`` field: the abstention comes back as an
    assistant turn with empty or null content and nothing else. OpenAI's API accepts it; so does candor."""
    turn = {"role": "assistant", "content": content}
    r = chat(refusing_url, messages=[{"role": "user", "content": "Hi?"}, turn, {"role": "user", "content": "And?"}])
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["confidence"]["computed_on"]["earlier_messages"] == 2  # the empty turn is kept
    for sent in ({"role": "assistant", "content": content}, {"role": "assistant", "content": [], "type": "message"}):
        items = [{"role": "user", "content": "Hi?"}, sent, {"role": "user", "content": "And?"}]
        r = httpx.post(f"{refusing_url}/v1/responses", json={"model": "candor", "input": items}, timeout=120)
        assert r.status_code == 200, r.text


def test_an_item_reference_is_refused_naming_the_fix(url):
    """@ai-sdk/openai stores responses by default and sends earlier outputs back as ``item_reference``s: the 400
    names the request option that makes it send the items themselves."""
    items = [{"role": "user", "content": "Hi?"}, {"type": "item_reference", "id": "msg_1"}]
    items.append({"role": "user", "content": "And?"})
    r = httpx.post(f"{url}/v1/responses", json={"model": "candor", "input": items}, timeout=120)
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "input", r.text
    assert "input.1" in error["message"] and "store: false" in error["message"]
    assert "providerOptions: {openai: {store: false}}" in error["message"]


def test_a_system_message_after_the_question_is_an_instruction(url):
    """pydantic-ai's retry appends ``{"role": "system", "content": "Please return text."}``."""
    messages = [{"role": "user", "content": "Who wrote Hamlet?"}, {"role": "system", "content": "Please return text."}]
    r = chat(url, messages=messages)
    assert r.status_code == 200, r.text


def test_a_refused_turn_names_its_real_cause(url):
    """An empty assistant turn is history; one after the question leaves nothing to answer, and the 400 says so."""
    r = chat(url, messages=[{"role": "user", "content": "Hi"}, {"role": "assistant", "content": None}])
    error = r.json()["error"]
    assert r.status_code == 400 and "tool calls are not supported" not in error["message"]
    assert "follows the last user message" in error["message"] and error["param"] == "messages"


# ---------------------------------------------------------------- refinement that empties an answer


def test_refinement_that_removes_every_claim_is_an_abstention(generator):
    model = HonestModel(generator, confidence="n-prob", template="chat", decoding=Decoding(max_new_tokens=48))
    model.serve_claims(ClaimPolicy("claim-prob", refine="remove", threshold=1.0))  # every claim is below 1
    with serve_in_thread(create_app(model, ServeSettings())) as u:
        r = chat(u, messages=[{"role": "user", "content": "Describe Paris in three short sentences."}])
    c = r.json()["choices"][0]
    assert c["message"]["content"], "never an empty message"
    assert c["confidence"]["abstained"] is True and "claim" in c["confidence"]["reason"]
    assert r.headers["x-candor-abstained"] == "true"


# ---------------------------------------------------------------- one set of rules


@pytest.mark.parametrize(
    "field",
    [{"store": True}, {"reasoning_effort": "low"}, {"prediction": {"type": "content", "content": "x"}}, {"made_up": 1}],
)
def test_a_field_candor_would_ignore_is_refused_naming_it(url, field):
    r = chat(url, messages=[{"role": "user", "content": "Hi"}], **field)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == next(iter(field))


@pytest.mark.parametrize(
    "field", [{"store": False}, {"user": "u1"}, {"metadata": {"a": "b"}}, {"service_tier": "auto"}]
)
def test_documented_no_ops_are_accepted(url, field):
    assert chat(url, messages=[{"role": "user", "content": "Hi"}], max_tokens=2, **field).status_code == 200


def test_agnos_responses_defaults_are_accepted(url):
    body = {"model": "candor", "input": "Who wrote Hamlet?", "reasoning": {}, "text": {"verbosity": "medium"}}
    r = httpx.post(f"{url}/v1/responses", json=body, timeout=120)
    assert r.status_code == 200, r.text


def test_logprob_tokens_concatenate_to_the_content(url):
    r = chat(url, messages=[{"role": "user", "content": "What is the capital of France?"}], logprobs=True)
    c = r.json()["choices"][0]
    assert "".join(t["token"] for t in c["logprobs"]["content"]) == c["message"]["content"]


def test_calibrated_on_is_null_unless_calibrated(url):
    conf = chat(url, messages=[{"role": "user", "content": "Hi"}], max_tokens=2).json()["choices"][0]["confidence"]
    assert conf["calibrated"] is False and conf["calibrated_on"] is None


# ---------------------------------------------------------------- in front of an upstream (--backend openai)


@pytest.mark.slow
def test_tools_pass_on_to_an_upstreams_own_tool_calling(url):
    """``candor serve --backend openai --endpoint chat`` in front of a real server that calls tools (a candor
    serve on the embedded model): the tools are the upstream's, the confidence candor's, the call valid."""
    from candor.backends.openai import OpenAIBackend

    upstream = OpenAIBackend("candor", base_url=f"{url}/v1", endpoint="chat", api_key_env="NO_SUCH_KEY_VAR")
    model = HonestModel(upstream, confidence="consis-lex", template="chat", backend_name="openai")
    with serve_in_thread(create_app(model, ServeSettings())) as front:
        r = chat(front, messages=ASK_WEATHER, tools=[WEATHER], tool_choice="required")
        assert r.status_code == 200, r.text
        c = r.json()["choices"][0]
        for name, arguments in calls_of(c["message"]):
            jsonschema.validate(arguments, schema_of(name))
        conf = c["confidence"]
        assert conf["method"] == "consis-lex" and 0.0 <= conf["value"] <= 1.0
        assert conf["tool_calls"][0]["agreement"] is not None  # the k samples were the upstream's calls too
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
        r = chat(front, messages=[{"role": "user", "content": "Describe Marie Curie."}], response_format=fmt)
        assert r.status_code == 200, r.text
        jsonschema.validate(json.loads(r.json()["choices"][0]["message"]["content"]), PERSON)
