"""The OpenAI-compatible service, tested over real HTTP on 127.0.0.1 with a tiny real model (no mocks)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
import urllib.error  # noqa: E402
import urllib.request  # noqa: E402

from candor.serve import Decoding, HonestModel, Threshold  # noqa: E402
from candor.serve.http.app import ServeSettings, create_app  # noqa: E402
from candor.serve.http.server import serve_in_thread  # noqa: E402

KEY = "test-key-not-secret"
QUESTIONS = [f"What is the capital of country number {i}?" + " really" * (i % 5) for i in range(10)]


def post(url: str, body: bytes | dict, key: str | None = KEY, timeout: float = 120) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def get(url: str, key: str | None = KEY) -> tuple[int, dict]:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def chat(question: str, **extra) -> dict:
    return {"model": "candor", "messages": [{"role": "user", "content": question}], "max_tokens": 6, **extra}


@pytest.fixture(scope="module")
def honest(tiny_model, tokenizer):
    from candor.backends.hf import HFBackend

    # A threshold in the middle of the tiny model's n-prob values, so some answers abstain.
    backend = HFBackend(tiny_model, tokenizer, batch_size=16)
    model = HonestModel(backend, confidence="n-prob", template="fewshot", decoding=Decoding(max_new_tokens=6))
    conf = sorted(a[0].confidence for a in model.answer_batch(QUESTIONS))
    # Midway between two questions' values, so batching's float noise cannot flip a decision.
    middle = (conf[len(conf) // 2 - 1] + conf[len(conf) // 2]) / 2
    model.threshold = Threshold(middle, rule="fixed", expected_accuracy=0.5, expected_coverage=0.5)
    return model


@pytest.fixture(scope="module")
def server(honest):
    settings = ServeSettings(
        api_key=KEY, max_body_bytes=4096, max_question_chars=1000, max_tokens=16, refusal="I am not sure."
    )
    with serve_in_thread(create_app(honest, settings)) as url:
        yield url


def test_the_official_openai_client_gets_the_confidence_fields(server, honest):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0)
    resp = client.chat.completions.create(
        model="candor", messages=[{"role": "user", "content": QUESTIONS[0]}], max_tokens=6
    )
    choice = resp.choices[0]
    conf = choice.model_extra["confidence"]
    direct = honest.answer(QUESTIONS[0])
    assert conf["value"] == pytest.approx(direct.confidence, rel=1e-4)
    assert conf["method"] == "n-prob" and conf["calibrated"] is False
    assert conf["threshold"] == pytest.approx(honest.threshold.value)
    assert conf["expected_accuracy"] == 0.5 and conf["expected_coverage"] == 0.5
    assert conf["abstained"] == direct.abstained
    if direct.abstained:  # --abstain-as text (the default): the refusal text is the content
        assert choice.finish_reason == "stop" and choice.message.content == "I am not sure."
        assert choice.message.refusal is None
    else:
        assert choice.message.content == direct.answer
    listed = client.models.list()
    assert [m.id for m in listed.data] == ["candor"]
    comp = client.completions.create(model="candor", prompt=QUESTIONS[1], max_tokens=6)
    assert comp.choices[0].model_extra["confidence"]["value"] == pytest.approx(
        honest.answer(QUESTIONS[1]).confidence, rel=1e-4
    )


def test_abstained_choices_carry_the_refusal(server, honest):
    direct = [honest.answer(q) for q in QUESTIONS]
    assert any(a.abstained for a in direct) and not all(a.abstained for a in direct)
    q = next(q for q, a in zip(QUESTIONS, direct, strict=True) if a.abstained)
    status, body = post(f"{server}/v1/chat/completions", chat(q))
    assert status == 200
    choice = body["choices"][0]
    # The default (--abstain-as text): the refusal text as content, never the withheld answer; "stop", as
    # OpenAI's own refusals end.
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] == "I am not sure."
    assert choice["message"]["refusal"] is None and direct[QUESTIONS.index(q)].withheld not in json.dumps(body)
    assert choice["confidence"]["abstained"] is True
    assert choice["confidence"]["value"] < choice["confidence"]["threshold"]


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
        ({"model": "candor"}, 400, "messages"),
        ({"messages": [{"role": "user", "content": "hi"}]}, 400, "model"),
        (chat("hi", n=99), 400, "n"),
        (chat("hi", max_tokens=10_000), 400, "max_tokens"),
        (chat("x" * 2000), 400, "messages"),
        (chat("hi", temperature=5), 400, "temperature"),
        (chat("hi", response_format={"type": "xml"}), 400, "response_format"),
        (chat("hi", tools=[{"type": "function", "function": {"name": ""}}]), 400, "tools.0.function.name"),
        (chat("hi", tools=[{"type": "web_search"}]), 400, "tools.0.type"),
        (chat("hi", tool_choice="required"), 400, "tool_choice"),
        (chat("hi", parallel_tool_calls="yes"), 400, "parallel_tool_calls"),
        (chat("hi", made_up_field=1), 400, "made_up_field"),
        ({**chat("hi"), "messages": [{"role": "system", "content": "Be brief."}]}, 400, "messages"),
        (
            {
                **chat("hi"),
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            },
            400,
            "messages",
        ),
        ({**chat("hi"), "model": "gpt-9"}, 404, "model"),
        (chat("hi", stop=["a", "b", "c", "d", "e"]), 400, "stop"),
    ],
)
def test_bad_requests_get_openai_shaped_errors(server, body, status, param):
    got, err = post(f"{server}/v1/chat/completions", body)
    assert got == status
    assert set(err["error"]) == {"message", "type", "param", "code"}
    assert err["error"]["message"] and err["error"]["param"] == param


def test_sampled_choices_keep_the_protocol_confidence_and_say_so(server, honest):
    status, body = post(f"{server}/v1/chat/completions", chat(QUESTIONS[2], n=3, temperature=1.0))
    assert status == 200 and [c["index"] for c in body["choices"]] == [0, 1, 2]
    direct = honest.answer(QUESTIONS[2])
    # The value is the greedy answer's, whatever the request's sampling (docs/methods.md "Generation and judging").
    for c in body["choices"]:
        assert c["confidence"]["value"] == pytest.approx(direct.confidence, rel=1e-5)
        assert c["confidence"]["abstained"] == direct.abstained
        assert c["confidence"]["abstained"] or c["confidence"]["scores_returned_text"] is False
    status, body = post(f"{server}/v1/completions", {"model": "candor", "prompt": QUESTIONS[:2], "max_tokens": 4})
    assert status == 200 and len(body["choices"]) == 2 and body["object"] == "text_completion"


def test_an_oversized_body_is_refused_with_413(server):
    got, err = post(f"{server}/v1/chat/completions", chat("y" * 10_000))
    assert got == 413 and err["error"]["code"] == "request_too_large"


def test_a_wrong_or_missing_key_is_refused_with_401(server):
    for key in ("wrong", None):
        got, err = post(f"{server}/v1/chat/completions", chat("hi"), key=key)
        assert got == 401 and err["error"]["type"] == "authentication_error"
    assert get(f"{server}/v1/models", key="wrong")[0] == 401
    assert get(f"{server}/health", key=None)[0] == 200  # health needs no key


def test_fifty_concurrent_requests_all_get_their_own_answer(server, honest):
    questions = [QUESTIONS[i % len(QUESTIONS)] + f" (#{i})" for i in range(50)]
    expected = [a[0] for a in honest.answer_batch(questions)]
    with ThreadPoolExecutor(max_workers=50) as pool:
        results = list(pool.map(lambda q: post(f"{server}/v1/chat/completions", chat(q)), questions))
    assert all(status == 200 for status, _ in results)
    for (_, body), want in zip(results, expected, strict=True):
        choice = body["choices"][0]
        assert choice["confidence"]["value"] == pytest.approx(want.confidence, rel=1e-4)
        assert choice["confidence"]["abstained"] == want.abstained
        if not want.abstained:
            assert choice["message"]["content"] == want.answer
    status, health = get(f"{server}/health")
    assert status == 200 and health["status"] == "ok"
    assert health["in_flight"] == 0 and health["admitted"] >= 50  # every admitted question was released


def test_a_full_queue_answers_503_and_the_server_stays_up(honest):
    settings = ServeSettings(queue_size=1, max_batch=1, batch_wait_ms=0, max_tokens=64)
    with serve_in_thread(create_app(honest, settings)) as url:
        body = chat("a question that takes a while to answer", max_tokens=48)
        body["n"] = 1
        with ThreadPoolExecutor(max_workers=12) as pool:
            results = list(pool.map(lambda _: post(f"{url}/v1/chat/completions", body, key=None), range(12)))
        codes = sorted(status for status, _ in results)
        assert 503 in codes and 200 in codes and set(codes) <= {200, 503}
        busy = next(b for s, b in results if s == 503)
        assert busy["error"]["code"] == "queue_full"
        assert get(f"{url}/health", key=None)[0] == 200
        assert post(f"{url}/v1/chat/completions", chat("still there?"), key=None)[0] == 200
