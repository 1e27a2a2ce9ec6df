"""``POST /v1/responses`` (the OpenAI Responses API), ``--abstain-as`` and the ``x-candor-*`` headers, driven by the
official openai Python client over real HTTP with a tiny real model (no mocks).

A threshold of 1.0 makes every question abstain and 0.0 makes every question answered, so each path is taken
whatever the tiny model's values.
"""

from __future__ import annotations

import json
import urllib.request

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from candor.serve import Decoding, HonestModel, Threshold  # noqa: E402
from candor.serve.answering import Ask, Reply  # noqa: E402
from candor.serve.http.app import ServeSettings, create_app  # noqa: E402
from candor.serve.http.server import serve_in_thread  # noqa: E402
from candor.util.errors import CandorError  # noqa: E402
from tests.test_serve_app import KEY, post  # noqa: E402

REFUSAL = "I am not sure."
QUESTION = "What is the capital of France?"
INSTRUCTIONS = "You are a careful assistant. Answer briefly."
HISTORY = (("system", INSTRUCTIONS),)
STREAM_TYPES_TEXT = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def with_threshold(backend, value: float) -> HonestModel:
    model = HonestModel(backend, confidence="n-prob", template="fewshot", decoding=Decoding(max_new_tokens=6))
    model.threshold = Threshold(value, rule="fixed", expected_accuracy=0.5, expected_coverage=0.5)
    return model


@pytest.fixture(scope="module")
def backend(tiny_model, tokenizer):
    from candor.backends.hf import HFBackend

    return HFBackend(tiny_model, tokenizer, batch_size=16)


@pytest.fixture(scope="module")
def answering(backend):
    return with_threshold(backend, 0.0)


@pytest.fixture(scope="module")
def abstaining(backend):
    return with_threshold(backend, 1.0)


def direct(model: HonestModel, question: str = QUESTION, history=HISTORY, max_new_tokens: int | None = 6):
    ask = Ask(model.prepare(question, max_new_tokens, history), Reply(max_new_tokens=max_new_tokens))
    return model.answer_asks([ask])[0][0]


@pytest.fixture(scope="module")
def servers(answering, abstaining):
    """``{(abstains, abstain_as): url}``: each model served with each way of showing an abstention."""
    urls = {}
    with (
        serve_in_thread(create_app(answering, ServeSettings(api_key=KEY, refusal=REFUSAL))) as answers,
        serve_in_thread(create_app(abstaining, ServeSettings(api_key=KEY, refusal=REFUSAL))) as as_text,
        serve_in_thread(
            create_app(abstaining, ServeSettings(api_key=KEY, refusal=REFUSAL, abstain_as="refusal"))
        ) as as_refusal,
    ):
        urls[False, "text"], urls[True, "text"], urls[True, "refusal"] = answers, as_text, as_refusal
        yield urls


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)


def ask_plain(url: str, **extra):
    extra = {"max_output_tokens": 6, **extra}
    raw = client(url).responses.with_raw_response.create(
        model="candor", instructions=INSTRUCTIONS, input=QUESTION, **extra
    )
    return raw.headers, raw.parse(), raw.text


# ---------------------------------------------------------------- plain


def test_an_answer_is_an_output_text_part_with_the_confidence_on_the_response_and_its_headers(servers, answering):
    want = direct(answering)
    headers, resp, _ = ask_plain(servers[False, "text"])
    status = "incomplete" if want.finish_reason == "length" else "completed"  # the tiny model often runs to the cap
    assert resp.object == "response" and resp.status == status and resp.id.startswith("resp_")
    [item] = resp.output
    assert item.type == "message" and item.role == "assistant" and item.status == status
    [part] = item.content
    assert part.type == "output_text" and part.text == want.answer and resp.output_text == want.answer
    conf = resp.model_extra["confidence"]
    assert conf["value"] == pytest.approx(want.confidence, rel=1e-4) and conf["abstained"] is False
    # The instructions are the system turn: a question asked after one system prompt has that prompt's shape.
    assert conf["computed_on"]["earlier_messages"] == 1 and conf["computed_on"]["shape"].startswith("system:")
    assert float(headers["x-candor-confidence"]) == pytest.approx(conf["value"], abs=1e-6)
    assert headers["x-candor-confidence"] == f"{conf['value']:.6f}"
    assert headers["x-candor-abstained"] == "false" and headers["x-candor-abstained-choices"] == ""
    assert headers["x-candor-model-version"] == answering.version == conf["model_version"]
    assert resp.usage.input_tokens > 0 and resp.usage.output_tokens == want.completion_tokens
    assert resp.usage.total_tokens == resp.usage.input_tokens + resp.usage.output_tokens


@pytest.mark.parametrize("abstain_as", ["text", "refusal"])
def test_an_abstention_is_the_refusal_never_the_withheld_answer(servers, abstaining, abstain_as):
    withheld = direct(abstaining).withheld
    headers, resp, raw = ask_plain(servers[True, abstain_as])
    [part] = resp.output[0].content
    if abstain_as == "text":  # shown by every client as the answer's text
        assert part.type == "output_text" and part.text == REFUSAL and resp.output_text == REFUSAL
    else:  # the API's own refusal part
        assert part.type == "refusal" and part.refusal == REFUSAL and resp.output_text == ""
    assert resp.status == "completed" and resp.model_extra["confidence"]["abstained"] is True
    assert headers["x-candor-abstained"] == "true" and headers["x-candor-abstained-choices"] == "0"
    assert withheld and withheld not in raw


def test_an_answer_cut_by_max_output_tokens_is_incomplete(servers, answering):
    want = direct(answering, max_new_tokens=1)
    assert want.finish_reason == "length", "one token should cut the tiny model's answer"
    _, resp, _ = ask_plain(servers[False, "text"], max_output_tokens=1)
    assert resp.status == "incomplete" and resp.incomplete_details.reason == "max_output_tokens"
    assert resp.output[0].status == "incomplete" and resp.output_text == want.answer


def test_message_items_and_a_former_output_make_the_conversation(servers, answering):
    c = client(servers[False, "text"])
    first = c.responses.create(model="candor", input=[{"role": "user", "content": "Who wrote Hamlet?"}])
    items = [
        {"role": "developer", "content": [{"type": "input_text", "text": INSTRUCTIONS}]},
        {"role": "user", "content": "Who wrote Hamlet?"},
        first.output[0].model_dump(exclude_none=True),  # the assistant's output item, sent back as openai-agents does
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]},
    ]
    resp = c.responses.create(model="candor", input=items, max_output_tokens=6)
    history = (("system", INSTRUCTIONS), ("user", "Who wrote Hamlet?"), ("assistant", first.output_text))
    want = direct(answering, history=history)
    assert resp.output_text == want.answer
    assert resp.model_extra["confidence"]["value"] == pytest.approx(want.confidence, rel=1e-4)
    assert resp.model_extra["confidence"]["computed_on"]["earlier_messages"] == 3


def test_the_defaults_clients_send_are_accepted(servers):
    # openai-agents' OpenAIResponsesModel sends include: [] and tools: [] with every request.
    body = {
        "model": "candor",
        "input": QUESTION,
        "include": [],
        "tools": [],
        "tool_choice": "auto",
        "store": False,
        "parallel_tool_calls": False,
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "metadata": {"who": "test"},
        "temperature": 0,
        "top_p": 1,
    }
    status, resp = post(f"{servers[False, 'text']}/v1/responses", body)
    assert status == 200 and resp["object"] == "response" and resp["output"][0]["content"][0]["type"] == "output_text"


@pytest.mark.parametrize(
    ("extra", "param", "code"),
    [
        ({"previous_response_id": "resp_123"}, "previous_response_id", "unsupported"),
        ({"conversation": "conv_1"}, "conversation", "unsupported"),
        ({"store": True}, "store", "unsupported"),
        ({"tools": [{"type": "web_search"}]}, "tools.0.type", "invalid_value"),
        ({"tool_choice": "required"}, "tool_choice", "invalid_value"),
        ({"include": ["message.output_text.logprobs"]}, "include", "unsupported"),
        ({"text": {"format": {"type": "xml"}}}, "text.format", "invalid_value"),
        ({"reasoning": {"effort": "high"}}, "reasoning", "unsupported"),
        ({"made_up_field": 1}, "made_up_field", "unknown_parameter"),
        ({"background": True}, "background", "unsupported"),
        ({"max_output_tokens": 0}, "max_output_tokens", "invalid_value"),
        ({"max_output_tokens": "6"}, "max_output_tokens", "invalid_value"),
        ({"temperature": 3}, "temperature", "invalid_value"),
        ({"input": 5}, "input", "invalid_value"),
        ({"input": []}, "input", "unsupported"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input", "unsupported"),
        ({"input": [{"role": "tool", "content": "42"}]}, "input", "unsupported"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:x"}]}]},
            "input",
            "unsupported",
        ),
        (
            {"input": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello"}]},
            "input",
            "unsupported",
        ),
        ({"input": "   "}, "input", "invalid_value"),
        ({"input": "x" * 40_000}, "input", "context_length_exceeded"),
        ({"instructions": 7}, "instructions", "invalid_value"),
        ({"stream": "yes"}, "stream", "invalid_value"),
    ],
)
def test_bad_bodies_are_400_naming_the_field(servers, extra, param, code):
    status, err = post(f"{servers[False, 'text']}/v1/responses", {"model": "candor", "input": QUESTION, **extra})
    assert status == 400, err
    assert err["error"]["param"] == param and err["error"]["code"] == code
    assert err["error"]["message"]


def test_what_cannot_be_honoured_says_why(servers):
    status, err = post(f"{servers[False, 'text']}/v1/responses", {"model": "candor", "input": "hi", "store": True})
    assert status == 400 and "stores no responses" in err["error"]["message"]
    status, err = post(
        f"{servers[False, 'text']}/v1/responses", {"model": "candor", "input": "hi", "previous_response_id": "r"}
    )
    assert "send the whole conversation in input" in err["error"]["message"]
    status, err = post(f"{servers[False, 'text']}/v1/responses", {"model": "gpt-9", "input": "hi"})
    assert status == 404 and err["error"]["param"] == "model"


# ---------------------------------------------------------------- streamed


def stream_events(url: str, **extra) -> tuple[list, object]:
    with client(url).responses.stream(
        model="candor", instructions=INSTRUCTIONS, input=QUESTION, max_output_tokens=6, **extra
    ) as stream:
        events = list(stream)
    # response.completed, or response.incomplete for an answer cut by the cap (the SDK's get_final_response()
    # wants the former, as with OpenAI's own cut answers): the last event's response is the final one.
    return events, events[-1].response


def test_a_streamed_answer_is_the_apis_events_numbered_with_the_confidence_on_completed(servers, answering):
    want = direct(answering)
    events, final = stream_events(servers[False, "text"])
    types = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    ending = "response.incomplete" if want.finish_reason == "length" else "response.completed"
    assert [t for i, t in enumerate(types) if i == 0 or t != types[i - 1]] == [*STREAM_TYPES_TEXT[:-1], ending]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(deltas) == want.answer and final.output_text == want.answer
    done = next(e for e in events if e.type == "response.output_text.done")
    assert done.text == want.answer
    created = events[0].response
    assert created.status == "in_progress" and created.model_extra["confidence"] is None
    conf = final.model_extra["confidence"]
    assert conf["value"] == pytest.approx(want.confidence, rel=1e-4) and conf["abstained"] is False
    assert final.usage.output_tokens == want.completion_tokens


@pytest.mark.parametrize("abstain_as", ["text", "refusal"])
def test_a_streamed_abstention_is_the_refusal(servers, abstaining, abstain_as):
    withheld = direct(abstaining).withheld
    url = servers[True, abstain_as]
    events, final = stream_events(url)
    types = [e.type for e in events]
    if abstain_as == "refusal":
        assert types[3:] == [
            "response.content_part.added",
            "response.refusal.delta",
            "response.refusal.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
        assert next(e for e in events if e.type == "response.refusal.done").refusal == REFUSAL
        assert final.output[0].content[0].type == "refusal" and final.output[0].content[0].refusal == REFUSAL
    else:
        assert types == STREAM_TYPES_TEXT and final.output_text == REFUSAL
    assert final.model_extra["confidence"]["abstained"] is True
    # The raw stream (create(stream=True)) never holds the withheld answer; its headers say the model version.
    raw = client(url).responses.with_raw_response.create(model="candor", input=QUESTION, stream=True)
    assert raw.headers["x-candor-model-version"] == abstaining.version
    assert "x-candor-confidence" not in raw.headers  # sent before the decision: the confidence is in the events
    text = "".join(json.dumps(e.model_dump()) for e in raw.parse())
    assert withheld and withheld not in text
    assert '"type": "response.completed"' in text and REFUSAL in text


def test_a_streamed_cut_answer_ends_with_response_incomplete(servers):
    with client(servers[False, "text"]).responses.create(
        model="candor", input=QUESTION, max_output_tokens=1, stream=True
    ) as stream:
        events = list(stream)
    assert events[-1].type == "response.incomplete" and events[-1].response.status == "incomplete"


# ---------------------------------------------------------------- chat completions: --abstain-as and headers


def chat_raw(url: str, **extra):
    raw = client(url).chat.completions.with_raw_response.create(
        model="candor", messages=[{"role": "user", "content": QUESTION}], max_tokens=6, **extra
    )
    return raw.headers, raw.parse()


@pytest.mark.parametrize("abstain_as", ["text", "refusal"])
def test_a_chat_abstention_ends_with_stop_shown_as_asked(servers, abstain_as):
    headers, resp = chat_raw(servers[True, abstain_as], n=2, temperature=1.0)
    for choice in resp.choices:
        assert choice.finish_reason == "stop" and choice.model_extra["confidence"]["abstained"] is True
        if abstain_as == "text":
            assert choice.message.content == REFUSAL and choice.message.refusal is None
        else:
            assert choice.message.content is None and choice.message.refusal == REFUSAL
    assert headers["x-candor-abstained"] == "true" and headers["x-candor-abstained-choices"] == "0,1"
    comp = client(servers[True, abstain_as]).completions.create(model="candor", prompt=QUESTION, max_tokens=6)
    assert comp.choices[0].text == REFUSAL and comp.choices[0].finish_reason == "stop"
    assert (comp.choices[0].model_extra.get("refusal") == REFUSAL) is (abstain_as == "refusal")
    chunks = [
        c
        for c in client(servers[True, abstain_as]).chat.completions.create(
            model="candor", messages=[{"role": "user", "content": QUESTION}], max_tokens=6, stream=True
        )
        if c.choices
    ]
    content = "".join(c.choices[0].delta.content or "" for c in chunks)
    refusal = "".join(c.choices[0].delta.refusal or "" for c in chunks)
    assert (content, refusal) == ((REFUSAL, "") if abstain_as == "text" else ("", REFUSAL))
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].choices[0].model_extra["confidence"]["abstained"] is True


def test_chat_headers_describe_the_first_choice_and_a_stream_carries_the_confidence_in_each_last_chunk(
    servers, answering
):
    url = servers[False, "text"]
    headers, resp = chat_raw(url)
    conf = resp.choices[0].model_extra["confidence"]
    assert headers["x-candor-confidence"] == f"{conf['value']:.6f}" and headers["x-candor-abstained"] == "false"
    assert headers["x-candor-model-version"] == answering.version and headers["x-candor-abstained-choices"] == ""
    raw = client(url).chat.completions.with_raw_response.create(
        model="candor", messages=[{"role": "user", "content": QUESTION}], max_tokens=6, n=2, stream=True
    )
    assert raw.headers["x-candor-model-version"] == answering.version
    chunks = [c for c in raw.parse() if c.choices]
    for index in (0, 1):
        mine = [c.choices[0] for c in chunks if c.choices[0].index == index]
        assert mine[-1].finish_reason in ("stop", "length")
        assert mine[-1].model_extra["confidence"]["value"] == pytest.approx(conf["value"], rel=1e-4)


def test_cors_exposes_the_candor_headers(answering):
    settings = ServeSettings(cors_origins=("http://localhost:3000",))
    with serve_in_thread(create_app(answering, settings)) as url:
        req = urllib.request.Request(
            f"{url}/v1/responses",
            data=json.dumps({"model": "candor", "input": QUESTION, "max_output_tokens": 4}).encode(),
            headers={"Content-Type": "application/json", "Origin": "http://localhost:3000"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=120) as resp:
            exposed = resp.headers["access-control-expose-headers"].lower()
    for name in ("x-candor-confidence", "x-candor-abstained", "x-candor-model-version"):
        assert name in exposed


def test_abstain_as_is_checked_and_live_streaming_needs_refusal():
    with pytest.raises(CandorError, match="--abstain-as must be one of text, refusal"):
        ServeSettings(abstain_as="hidden")
    with pytest.raises(CandorError, match="--stream live needs --abstain-as refusal"):
        ServeSettings(stream="live")
    assert ServeSettings(stream="live", abstain_as="refusal").abstain_as == "refusal"
