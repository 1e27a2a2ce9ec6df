"""Real chat traffic on ``candor serve``: conversations, long answers, refusals the clients' frameworks see,
fields used or refused, and requests that used to answer 500 or hold a connection (tiny real model, real HTTP).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from candor.serve import Decoding, HonestModel, Threshold  # noqa: E402
from candor.serve.answering import Ask, Reply  # noqa: E402
from candor.serve.http.app import ServeSettings, create_app  # noqa: E402
from candor.serve.http.server import serve_in_thread  # noqa: E402
from tests.test_serve_app import KEY, get, post  # noqa: E402

QUESTIONS = [f"Which city hosts the museum number {i}?" + " Please." * (i % 4) for i in range(8)]
SYSTEM = "You are a careful assistant. Answer briefly."
HISTORY = (("system", SYSTEM), ("user", "Who wrote Hamlet?"), ("assistant", "William Shakespeare"))
NODE_DIR = Path(__file__).parent / "node"
NODE_HISTORY = (("system", "Answer briefly."),)  # what tests/node/client.mjs sends before the question


def conversation(question: str, history=HISTORY) -> list[dict]:
    return [{"role": role, "content": text} for role, text in history] + [{"role": "user", "content": question}]


@pytest.fixture(scope="module")
def honest(tiny_model, tokenizer):
    from candor.backends.hf import HFBackend

    backend = HFBackend(tiny_model, tokenizer, batch_size=16)
    return splitting(HonestModel(backend, confidence="n-prob", template="fewshot", decoding=Decoding(6)), HISTORY)


def splitting(model: HonestModel, history) -> HonestModel:
    """The model (its backend shared) with a threshold that splits the questions asked after ``history``."""
    values = sorted(direct(model, q, history).confidence for q in QUESTIONS)
    middle = (values[len(values) // 2 - 1] + values[len(values) // 2]) / 2
    split = HonestModel(model.backend, confidence="n-prob", template="fewshot", decoding=model.decoding)
    split.threshold = Threshold(middle, rule="fixed", expected_accuracy=0.5, expected_coverage=0.5)
    return split


@pytest.fixture(scope="module")
def server(honest):
    # OpenAI's refusal field, as the clients' refusal handling below is about (--abstain-as text: test_serve_app).
    settings = ServeSettings(api_key=KEY, refusal="I am not sure.", body_timeout_s=1.0, abstain_as="refusal")
    with serve_in_thread(create_app(honest, settings)) as url:
        yield url


def direct(model: HonestModel, question: str, history=HISTORY, **reply):
    ask = Ask(model.prepare(question, reply.get("max_new_tokens"), history), Reply(**reply))
    return model.answer_asks([ask])[0][0]


def abstained_and_answered(model: HonestModel, history=HISTORY) -> tuple[str, str]:
    answers = {q: direct(model, q, history) for q in QUESTIONS}
    declined = [q for q, a in answers.items() if a.abstained]
    kept = [q for q, a in answers.items() if not a.abstained]
    assert declined and kept, "the threshold should split the questions asked in the conversation"
    return declined[0], kept[0]


# ---------------------------------------------------------------- conversations


def test_a_conversation_is_rendered_whole_in_the_template(honest):
    prompted = honest.prepare("And Macbeth?", history=HISTORY)
    assert prompted.prompt.startswith(SYSTEM + "\n")
    assert prompted.prompt.endswith(
        "Question: Who wrote Hamlet?\nAnswer: William Shakespeare\nQuestion: And Macbeth?\nAnswer:"
    )
    alone = honest.prepare("And Macbeth?")
    assert alone.prompt.endswith("Question: And Macbeth?\nAnswer:") and SYSTEM not in alone.prompt
    assert prompted.shape == "conversation" and alone.shape == "question"


def test_a_conversation_is_answered_with_the_confidence_of_the_question_asked_in_it(server, honest):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0)
    for q in QUESTIONS[:3]:
        resp = client.chat.completions.create(model="candor", messages=conversation(q), max_tokens=6)
        conf = resp.choices[0].model_extra["confidence"]
        expected = direct(honest, q)
        assert conf["value"] == pytest.approx(expected.confidence, rel=1e-4)
        assert conf["computed_on"] == {"shape": "conversation", "earlier_messages": 3}
        assert conf["value"] != pytest.approx(direct(honest, q, ()).confidence, rel=1e-6)  # the history matters
        alone = (
            client.chat.completions.create(model="candor", messages=[{"role": "user", "content": q}], max_tokens=6)
            .choices[0]
            .model_extra["confidence"]
        )
        assert alone["computed_on"] == {"shape": "question", "earlier_messages": 0}


def test_calibrated_says_whether_the_value_was_fitted_for_this_shape(honest):
    import numpy as np

    from candor.serve.http.responses import confidence_object as _confidence

    rng = np.random.default_rng(0)
    calibrated = HonestModel(honest.backend, confidence="n-prob", template="fewshot", decoding=honest.decoding)
    calibrated.fit_calibrator("platt", rng.random(50), (rng.random(50) < 0.5).astype(int))
    for history, expect in (((), True), (HISTORY, False)):
        ask = Ask(calibrated.prepare(QUESTIONS[0], None, history), Reply())
        answer = calibrated.answer_asks([ask])[0][0]
        conf = _confidence(answer, ask)
        assert conf["calibrated"] is expect
        # Where it was fitted, only when it is calibrated for this request (null otherwise: issue 62).
        where = "a platt calibrator fitted on 50 labelled questions asked alone"
        assert conf["calibrated_on"] == (where if expect else None)
    uncalibrated = _confidence(honest.answer(QUESTIONS[0]), Ask(honest.prepare(QUESTIONS[0]), Reply()))
    assert uncalibrated["calibrated"] is False and uncalibrated["calibrated_on"] is None


def test_the_confidence_object_says_what_the_model_stood_for_when_it_answered(honest):
    """A reload may replace the model between its answer and the response: the response reads the answer."""
    from candor.serve import Threshold
    from candor.serve.http.responses import confidence_object

    model = HonestModel(honest.backend, confidence="n-prob", template="fewshot", decoding=honest.decoding)
    model.threshold = Threshold(0.0, expected_accuracy=0.5, expected_coverage=1.0)
    ask = Ask(model.prepare(QUESTIONS[0]), Reply())
    answer = model.answer_asks([ask])[0][0]
    model.version, model.threshold = "the next one", Threshold(0.9, expected_accuracy=0.99, expected_coverage=0.1)
    said = confidence_object(answer, ask)
    assert said["model_version"] == "unsaved" and said["threshold"] == 0.0
    assert (said["expected_accuracy"], said["expected_coverage"]) == (0.5, 1.0)


def test_a_head_trained_on_labels_is_calibrated(tiny_model_dir, tmp_path, honest):
    from candor.serve.confidence_sources import HeadSource
    from tests.test_serve_prefill_head import make_head

    folder = make_head(tiny_model_dir, tmp_path / "head")
    config_path = Path(folder) / "elical_config.json"
    config = json.loads(config_path.read_text())
    for stages, expect in ((["eli"], False), (["eli", "cal"], True)):
        config_path.write_text(json.dumps({**config, "meta": {"stages": stages}}))
        model = HonestModel(honest.backend, HeadSource(folder), template="fewshot", decoding=Decoding(3))
        assert model.answer(QUESTIONS[0]).calibrated is expect
        assert model.calibration("question")["calibrated"] is expect


def test_conversations_refuse_keeps_one_question_per_request(honest):
    with serve_in_thread(create_app(honest, ServeSettings(conversations="refuse"))) as url:
        status, body = post(f"{url}/v1/chat/completions", {"model": "candor", "messages": conversation("Hi?")})
        assert status == 400 and body["error"]["code"] == "unsupported"
        assert "--conversations" in body["error"]["message"]
        status, _ = post(f"{url}/v1/chat/completions", {"model": "candor", "messages": conversation("Hi?", ())})
        assert status == 200
    with pytest.raises(Exception, match="conversations"):
        ServeSettings(conversations="sometimes")


@pytest.mark.parametrize(
    ("messages", "says"),
    [
        ([{"role": "system", "content": "Be brief."}], "there is no user message to answer"),
        ([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}], "follows the last user"),
        ([{"role": "function", "content": "x", "name": "f"}, {"role": "user", "content": "Hi"}], "not supported"),
        ([{"role": "user", "content": "   "}], "question is empty"),
    ],
)
def test_conversations_that_cannot_be_answered_say_why(server, messages, says):
    status, body = post(f"{server}/v1/chat/completions", {"model": "candor", "messages": messages})
    assert status == 400 and says in body["error"]["message"] and body["error"]["param"] == "messages"


# ---------------------------------------------------------------- long answers


def test_max_tokens_follows_the_models_context(server, honest):
    question = QUESTIONS[1]
    limit = honest.context_length
    status, body = post(
        f"{server}/v1/chat/completions",
        {"model": "candor", "max_tokens": limit - 100, "messages": [{"role": "user", "content": question}]},
    )
    assert status == 200 and limit - 100 > 256, body  # 256 was a fixed cap
    status, body = post(
        f"{server}/v1/chat/completions",
        {"model": "candor", "max_tokens": limit + 1, "messages": [{"role": "user", "content": question}]},
    )
    assert status == 400 and body["error"]["param"] == "max_tokens" and str(limit) in body["error"]["message"]


def test_a_longer_cap_returns_the_greedy_answer_it_scored_without_generating_again(smollm_dir, tokenizer):
    from transformers import AutoModelForCausalLM

    from tests.serve_counting import CountingBackend

    # The embedded model: its few-shot answers end at a newline, well before the cap (the tiny one's never do).
    counting = CountingBackend(AutoModelForCausalLM.from_pretrained(smollm_dir), tokenizer, batch_size=4)
    model = HonestModel(counting, confidence="n-prob", template="fewshot", decoding=Decoding(max_new_tokens=16))
    short = direct(model, "Who wrote Hamlet?", ())
    assert len(short.completion.token_ids) < 16
    counting.calls.clear()
    longer = direct(model, "Who wrote Hamlet?", (), max_new_tokens=300)
    assert longer.answer == short.answer and longer.scores_returned_text is True
    assert len(counting.calls) == 1, "the protocol's greedy answer is the reply: no second generation"


def test_a_sampled_reply_equal_to_the_greedy_answer_scores_the_returned_text(honest):
    greedy = direct(honest, QUESTIONS[3], ())
    replies = [direct(honest, QUESTIONS[3], (), temperature=0.05, seed=s) for s in range(4)]
    same = [r for r in replies if r.answer == greedy.answer]
    assert same, "at temperature 0.05 some reply should equal the greedy answer"
    assert all(r.scores_returned_text for r in same)


# ---------------------------------------------------------------- refusals the clients see


def test_the_python_client_sees_an_abstention_as_a_refusal_plain_and_streamed(server, honest):
    declined, kept = abstained_and_answered(honest)
    withheld = direct(honest, declined).withheld
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0)
    resp = client.chat.completions.create(model="candor", messages=conversation(declined), max_tokens=6)
    message = resp.choices[0].message
    assert message.content is None and message.refusal == "I am not sure."
    assert resp.choices[0].finish_reason == "stop"  # as OpenAI's own refusals end
    assert resp.usage.completion_tokens > 0, "the withheld answer was generated and scored"
    chunks = list(
        client.chat.completions.create(model="candor", messages=conversation(declined), max_tokens=6, stream=True)
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    refusal = "".join(c.choices[0].delta.refusal or "" for c in chunks if c.choices)
    assert content == "" and refusal == "I am not sure."
    assert withheld and withheld not in json.dumps([c.model_dump() for c in chunks])
    streamed = client.chat.completions.create(model="candor", messages=conversation(kept), max_tokens=6, stream=True)
    parts = [c for c in streamed if c.choices]
    text = "".join(c.choices[0].delta.content or "" for c in parts)
    assert text == direct(honest, kept).answer
    # Buffered: no text before the decision, so the confidence arrives with (or right after) the text.
    with_text = [i for i, c in enumerate(parts) if c.choices[0].delta.content]
    with_conf = [i for i, c in enumerate(parts) if (c.choices[0].model_extra or {}).get("confidence")]
    assert len(with_text) == 1 and with_conf and with_conf[0] - with_text[0] <= 1


def test_stream_live_sends_tokens_before_the_decision(honest):
    honest = splitting(honest, ())
    declined, _ = abstained_and_answered(honest, ())
    withheld = direct(honest, declined, ()).withheld
    with serve_in_thread(create_app(honest, ServeSettings(stream="live", abstain_as="refusal"))) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        chunks = [
            c
            for c in client.chat.completions.create(
                model="candor", messages=[{"role": "user", "content": declined}], max_tokens=6, stream=True
            )
            if c.choices
        ]
        content = "".join(c.choices[0].delta.content or "" for c in chunks)
        assert content == withheld  # streamed live, then withdrawn by the refusal
        assert chunks[-1].choices[0].delta.refusal and chunks[-1].choices[0].finish_reason == "stop"


def test_langchain_sees_the_confidence_and_a_refusal_never_the_withheld_text(server, honest):
    pytest.importorskip("langchain_openai")
    from candor.integrations.langchain import ChatCandor

    declined, kept = abstained_and_answered(honest)
    withheld = direct(honest, declined).withheld
    llm = ChatCandor(base_url=f"{server}/v1", api_key=KEY, model="candor", max_tokens=400, max_retries=0)
    history = [(role if role != "assistant" else "ai", text) for role, text in HISTORY]
    msg = llm.invoke([*history, ("human", declined)])
    assert msg.content == "" and msg.additional_kwargs["refusal"] == "I am not sure."
    assert msg.response_metadata["confidence"]["abstained"] is True
    total = None
    for chunk in llm.stream([*history, ("human", declined)]):
        total = chunk if total is None else total + chunk
    assert total.content == "" and withheld not in str(total)
    assert total.additional_kwargs["refusal"] == "I am not sure."
    assert total.response_metadata["confidence"]["abstained"] is True
    answered = llm.invoke([*history, ("human", kept)])
    assert answered.content == direct(honest, kept, max_new_tokens=400).answer
    assert answered.response_metadata["confidence"]["value"] == pytest.approx(direct(honest, kept).confidence, rel=1e-4)
    total = None
    for chunk in llm.stream([*history, ("human", kept)]):
        total = chunk if total is None else total + chunk
    assert total.content == answered.content
    assert total.response_metadata["confidence"]["value"] == pytest.approx(
        answered.response_metadata["confidence"]["value"], rel=1e-6
    )


def test_the_node_openai_client_sees_an_abstention_as_a_refusal(honest):
    if shutil.which("node") is None:
        pytest.skip("node is not installed: the Node openai client cannot run here")
    if not (NODE_DIR / "node_modules" / "openai").exists():
        pytest.skip("the Node openai package is not installed (make node-client runs npm install in tests/node)")
    history = NODE_HISTORY
    honest = splitting(honest, history)
    declined, kept = abstained_and_answered(honest, history)
    withheld = direct(honest, declined, history).withheld
    settings = ServeSettings(api_key=KEY, refusal="I am not sure.", abstain_as="refusal")
    with serve_in_thread(create_app(honest, settings)) as server:
        runs = [
            (
                subprocess.run(
                    ["node", str(NODE_DIR / "client.mjs"), f"{server}/v1", KEY, question],
                    capture_output=True,
                    text=True,
                    timeout=120,
                    check=True,
                ),
                abstains,
            )
            for question, abstains in ((declined, True), (kept, False))
        ]
    for run, abstains in runs:
        seen = json.loads(run.stdout)
        # Chat completions, then the Responses API (client.responses.create), plain and streamed.
        for way in ("plain", "streamed", "responses", "responses_streamed"):
            if abstains:
                assert seen[way]["refusal"] == "I am not sure." and not seen[way]["content"]
                assert withheld not in run.stdout
            else:
                answer = direct(honest, kept, history, max_new_tokens=400).answer
                assert seen[way]["content"] == answer and seen[way]["refusal"] is None
            assert seen[way]["confidence"]["abstained"] is abstains
        for way in ("responses", "responses_streamed"):
            assert seen[way]["finish_reason"] in ("completed", "incomplete")


# ---------------------------------------------------------------- fields used or refused


@pytest.mark.parametrize(
    ("path", "extra", "param"),
    [
        ("chat", {"logit_bias": {"42": 5}}, "logit_bias"),
        ("chat", {"presence_penalty": 0.5}, "presence_penalty"),
        ("chat", {"frequency_penalty": -1}, "frequency_penalty"),
        ("chat", {"store": True}, "store"),
        ("chat", {"reasoning_effort": "low"}, "reasoning_effort"),
        ("chat", {"prediction": {"type": "content", "content": "x"}}, "prediction"),
        ("completions", {"response_format": {"type": "json_object"}}, "response_format"),
        ("completions", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ("chat", {"logprobs": True, "top_logprobs": 6}, "top_logprobs"),
        ("chat", {"logprobs": True, "stream": True}, "logprobs"),
        ("completions", {"echo": True}, "echo"),
        ("completions", {"best_of": 3}, "best_of"),
        ("completions", {"suffix": "!"}, "suffix"),
        ("completions", {"logprobs": 2, "stream": True}, "logprobs"),
    ],
)
def test_fields_candor_cannot_honour_are_refused(server, path, extra, param):
    if path == "chat":
        body = {"model": "candor", "messages": [{"role": "user", "content": "Hi?"}], **extra}
    else:
        body = {"model": "candor", "prompt": "Hi?", **extra}
    status, answer = post(f"{server}/v1/{path}/completions" if path == "chat" else f"{server}/v1/completions", body)
    assert status == 400 and answer["error"]["param"] == param, answer


def test_no_op_values_of_those_fields_are_accepted(server):
    chat = {
        "model": "candor",
        "messages": [{"role": "user", "content": "Hi?"}],
        "max_tokens": 3,
        "response_format": {"type": "text"},
        "presence_penalty": 0,
        "frequency_penalty": 0.0,
        "logit_bias": {},
    }
    assert post(f"{server}/v1/chat/completions", chat)[0] == 200
    comp = {"model": "candor", "prompt": "Hi?", "max_tokens": 3, "echo": False, "best_of": 1, "suffix": ""}
    assert post(f"{server}/v1/completions", comp)[0] == 200


# ---------------------------------------------------------------- what used to answer 500 or hang


def test_a_huge_seed_and_deep_nesting_are_400_not_500(server):
    digits = b'{"model": "candor", "messages": [{"role": "user", "content": "Hi"}], "seed": ' + b"9" * 5000 + b"}"
    status, body = post(f"{server}/v1/chat/completions", digits)
    assert status == 400 and body["error"]["code"] == "invalid_json"
    status, body = post(
        f"{server}/v1/chat/completions",
        {"model": "candor", "seed": 2**70, "messages": [{"role": "user", "content": "Hi"}]},
    )
    assert status == 400 and body["error"]["param"] == "seed"
    deep = b'{"model": "candor", "x": ' + b"[" * 10_000 + b"]" * 10_000 + b"}"
    status, body = post(f"{server}/v1/chat/completions", deep)
    assert status == 400 and body["error"]["code"] == "invalid_json"


def test_a_half_sent_body_is_answered_408_within_the_timeout(server):
    host, port = server.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + KEY.encode() + b'\r\nContent-Length: 500\r\n\r\n{"model"'
        )
        started = time.monotonic()
        reply = sock.recv(4096)
    assert reply.startswith(b"HTTP/1.1 408") and time.monotonic() - started < 5


def test_too_many_prompts_name_a_code(server):
    status, body = post(f"{server}/v1/completions", {"model": "candor", "prompt": ["Hi?"] * 17})
    assert status == 400 and body["error"]["code"] == "invalid_value"


# ---------------------------------------------------------------- exposure


def test_api_docs_are_off_by_default_and_behind_the_key_when_on(server, honest):
    for path in ("/docs", "/redoc", "/openapi.json"):
        assert get(f"{server}{path}")[0] == 404
    with serve_in_thread(create_app(honest, ServeSettings(api_key=KEY, docs=True))) as url:
        assert get(f"{url}/openapi.json", key=None)[0] == 401
        status, schema = get(f"{url}/openapi.json")
        assert status == 200 and "/v1/chat/completions" in schema["paths"]
        import urllib.request

        req = urllib.request.Request(f"{url}/docs", headers={"Authorization": f"Bearer {KEY}"})
        page = urllib.request.urlopen(req, timeout=30).read().decode()
        assert "/v1/chat/completions" in page and "http" not in page.replace("http-equiv", "")  # nothing external
