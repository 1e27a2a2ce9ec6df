"""Operations and protocol hygiene of ``candor serve``: error shapes, strict types, auth scheme, content
types, ``/metrics``, ``x-request-id`` and the access log, ``/health`` and ``/ready``, CORS, SIGTERM.

Real uvicorn servers on 127.0.0.1 around the tiny random Llama (no mocks); the official ``openai``
client where a client is involved, raw HTTP for headers and content types.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")
openai = pytest.importorskip("openai")
try:
    import httpx
except ImportError:  # recent openai clients ship the same API as httpx2
    httpx = pytest.importorskip("httpx2")
from helpers import free_port  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

import candor  # noqa: E402
from candor.cli import app as cli_app  # noqa: E402
from candor.serve import Decoding, HonestModel, Threshold  # noqa: E402
from candor.serve.http.app import ServeSettings, create_app  # noqa: E402
from candor.serve.http.server import serve_in_thread  # noqa: E402

KEY = "ops-key-not-secret"
QUESTIONS = [f"Which river flows through city number {i}?" + " please" * (i % 3) for i in range(8)]
SRC = str(Path(candor.__file__).resolve().parents[1])  # the subprocess runs the candor these tests import


def chat(question: str = "Who wrote Hamlet?", **extra) -> dict:
    return {"model": "candor", "messages": [{"role": "user", "content": question}], "max_tokens": 4, **extra}


def auth(key: str = KEY, scheme: str = "Bearer") -> dict[str, str]:
    return {"Authorization": f"{scheme} {key}"}


@pytest.fixture(scope="module")
def honest(tiny_model, tokenizer):
    from candor.backends.hf import HFBackend

    backend = HFBackend(tiny_model, tokenizer, batch_size=8)
    model = HonestModel(backend, confidence="n-prob", template="fewshot", decoding=Decoding(max_new_tokens=4))
    conf = sorted(a[0].confidence for a in model.answer_batch(QUESTIONS))
    # Midway between two questions' values, so some answers abstain and float noise flips none.
    model.threshold = Threshold((conf[3] + conf[4]) / 2, rule="fixed")
    return model


@pytest.fixture(scope="module")
def server(honest):
    app = create_app(honest, ServeSettings(api_key=KEY, max_tokens=16))
    with serve_in_thread(app) as url:
        yield url, app


def metrics_of(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of ``GET /metrics``, keyed by (sample name, sorted labels)."""
    text = httpx.get(f"{url}/metrics").text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


# ---------------------------------------------------------------- protocol hygiene


def test_unknown_paths_and_methods_answer_in_the_openai_error_shape(server):
    url, _ = server
    missing = httpx.post(f"{url}/v1/embeddings", json={"model": "candor", "input": "x"}, headers=auth())
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "unknown_url" and "/v1/embeddings" in missing.json()["error"]["message"]
    assert set(missing.json()["error"]) == {"message", "type", "param", "code"}
    wrong = httpx.get(f"{url}/v1/chat/completions", headers=auth())
    assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"
    assert wrong.json()["error"]["code"] == "method_not_allowed" and "detail" not in wrong.json()
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError) as err:
        client.embeddings.create(model="candor", input="x")
    assert err.value.code == "unknown_url" and err.value.type == "invalid_request_error"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"n": True}, "n"),
        ({"max_tokens": "10"}, "max_tokens"),
        ({"temperature": "0"}, "temperature"),
        ({"top_p": "1"}, "top_p"),
        ({"stream": "false"}, "stream"),
        ({"temperature": 5}, "temperature"),
    ],
)
def test_wrongly_typed_fields_are_refused_with_400_naming_them(server, extra, param):
    url, _ = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="candor", messages=[{"role": "user", "content": "hi"}], extra_body=extra)
    assert err.value.status_code == 400 and err.value.param == param and param in err.value.message


def test_a_missing_field_is_400_not_422_and_an_integer_temperature_is_a_number(server):
    url, _ = server
    for body, param in (({"model": "candor"}, "messages"), ({"prompt": "hi"}, "model")):
        path = "/v1/chat/completions" if "prompt" not in body else "/v1/completions"
        got = httpx.post(f"{url}{path}", json=body, headers=auth())
        assert got.status_code == 400 and got.json()["error"]["param"] == param
    assert httpx.post(f"{url}/v1/chat/completions", json=chat(temperature=0), headers=auth()).status_code == 200


def test_the_bearer_scheme_is_case_insensitive_and_other_schemes_are_refused(server):
    url, _ = server
    for scheme in ("bearer", "BEARER", "Bearer"):
        got = httpx.post(f"{url}/v1/chat/completions", json=chat(), headers=auth(scheme=scheme))
        assert got.status_code == 200, scheme
    for headers in (auth(scheme="Basic"), auth(key="wrong", scheme="bearer"), {"Authorization": KEY}):
        assert httpx.post(f"{url}/v1/chat/completions", json=chat(), headers=headers).status_code == 401


def test_models_retrieve_works_with_the_official_client(server, honest):
    url, _ = server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    card = client.models.retrieve("candor")
    assert card.id == "candor" and card.owned_by == "candor"
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("gpt-4o")
    assert err.value.code == "model_not_found" and err.value.param == "model"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.retrieve("candor")
    # A model id with a slash, as Hugging Face names are.
    with serve_in_thread(create_app(honest, ServeSettings(model_id="org/honest-1"))) as other:
        client = openai.OpenAI(base_url=f"{other}/v1", api_key="unused", max_retries=0)
        assert client.models.retrieve("org/honest-1").id == "org/honest-1"


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_body_that_is_not_declared_json_is_refused_before_any_work(server, content_type):
    url, app = server
    before = app.state.admission.admitted
    headers = auth() | ({"Content-Type": content_type} if content_type else {})
    request = httpx.Request("POST", f"{url}/v1/chat/completions", content=json.dumps(chat()).encode(), headers=headers)
    if content_type is None:  # httpx sends none for raw bytes; make sure
        request.headers.pop("Content-Type", None)
    with httpx.Client() as client:
        got = client.send(request)
    assert got.status_code == 415 and got.json()["error"]["code"] == "unsupported_media_type"
    assert app.state.admission.admitted == before  # nothing was generated
    ok = httpx.post(
        f"{url}/v1/chat/completions",
        content=json.dumps(chat()).encode(),
        headers=auth() | {"Content-Type": "application/json; charset=utf-8"},
    )
    assert ok.status_code == 200 and app.state.admission.admitted == before + 1


def test_a_full_queue_answers_503_with_retry_after(honest):
    settings = ServeSettings(queue_size=1, max_batch=1, batch_wait_ms=0, max_tokens=64)
    with serve_in_thread(create_app(honest, settings)) as url:
        body = chat("a question that takes a while to answer", max_tokens=48)
        with ThreadPoolExecutor(max_workers=12) as pool:
            results = list(
                pool.map(lambda _: httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120), range(12))
            )
        busy = [r for r in results if r.status_code == 503]
        assert busy and all(r.headers["retry-after"] == "1" for r in busy)
        assert all("retry-after" not in r.headers for r in results if r.status_code == 200)


# ---------------------------------------------------------------- health, readiness, metrics


def test_health_is_alive_and_ready_turns_503_with_retry_after_while_draining(honest):
    app = create_app(honest, ServeSettings())
    assert not app.state.lifecycle.ready  # not started: the engine is not running yet
    with serve_in_thread(app) as url:
        assert httpx.get(f"{url}/ready").status_code == 200
        app.state.lifecycle.begin_draining()  # what SIGTERM calls (see the subprocess test below)
        ready = httpx.get(f"{url}/ready")
        assert ready.status_code == 503 and ready.headers["retry-after"] == "1"
        assert ready.json()["error"]["code"] == "draining"
        assert httpx.get(f"{url}/health").status_code == 200


def test_metrics_count_exactly_what_the_requests_did(honest):
    app = create_app(honest, ServeSettings())
    questions = QUESTIONS[:5]
    direct = [honest.answer(q) for q in questions]
    with serve_in_thread(app) as url:
        before = metrics_of(url)
        for q in questions:  # one at a time: each is a batch of one, exactly as answered directly
            assert httpx.post(f"{url}/v1/chat/completions", json=chat(q)).status_code == 200
        assert (
            httpx.post(
                f"{url}/v1/completions", json={"model": "candor", "prompt": questions[:2], "max_tokens": 4}
            ).status_code
            == 200
        )
        assert httpx.post(f"{url}/v1/chat/completions", json=chat(n="2")).status_code == 400
        assert httpx.get(f"{url}/nowhere/{time.time()}").status_code == 404
        after = metrics_of(url)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    chat_route = {"method": "POST", "route": "/v1/chat/completions"}
    assert moved("candor_requests_total", **chat_route, status="200") == 5
    assert moved("candor_requests_total", **chat_route, status="400") == 1
    assert moved("candor_requests_total", method="POST", route="/v1/completions", status="200") == 1
    assert moved("candor_requests_total", method="GET", route="unmatched", status="404") == 1
    assert moved("candor_request_duration_seconds_count", route="/v1/chat/completions") == 6
    # 5 chat answers + 2 completions answers; the abstentions are those of the same questions asked directly.
    abstained = sum(a.abstained for a in direct) + sum(a.abstained for a in direct[:2])
    assert 0 < abstained < 7
    assert moved("candor_answers_total") == 7 and moved("candor_abstentions_total") == abstained
    assert moved("candor_confidence_count") == 7
    expected_sum = sum(a.confidence for a in direct) + sum(a.confidence for a in direct[:2])
    assert moved("candor_confidence_sum") == pytest.approx(expected_sum, rel=1e-4)
    assert moved("candor_time_to_first_token_seconds_count") == 6  # one per answered request
    # One observation per question: the questions in flight when it was admitted (the two prompts of the
    # completions request are in flight together).
    assert moved("candor_batch_size_count") == 7 and moved("candor_batch_size_sum") == 5 + 2 + 2
    assert value(after, "candor_queue_depth") == 0
    assert value(after, "candor_requests_in_flight") == 1  # the scrape itself


def test_two_apps_in_one_process_keep_their_own_counts(honest):
    first, second = create_app(honest, ServeSettings()), create_app(honest, ServeSettings())
    with serve_in_thread(first) as a, serve_in_thread(second) as b:
        start = metrics_of(b)
        assert httpx.post(f"{a}/v1/chat/completions", json=chat()).status_code == 200
        assert value(metrics_of(a), "candor_answers_total") == 1
        assert value(metrics_of(b), "candor_answers_total") == value(start, "candor_answers_total") == 0


# ---------------------------------------------------------------- request ids and the access log


def access_lines(records: list[logging.LogRecord]) -> list[dict]:
    return [json.loads(r.getMessage()) for r in records if r.name == "candor.serve.access"]


def test_request_ids_are_echoed_when_safe_and_generated_otherwise(server, caplog):
    url, _ = server
    with caplog.at_level(logging.INFO, logger="candor.serve.access"):
        given = httpx.post(f"{url}/v1/chat/completions", json=chat(), headers=auth() | {"x-request-id": "abc-123.x"})
        fresh = httpx.post(f"{url}/v1/chat/completions", json=chat(), headers=auth())
        unsafe = httpx.get(f"{url}/health", headers={"x-request-id": 'a b"<script>'})
        too_long = httpx.get(f"{url}/health", headers={"x-request-id": "a" * 129})
        refused = httpx.post(f"{url}/v1/chat/completions", json=chat(), headers={"x-request-id": "denied-1"})
        missing = httpx.get(f"{url}/nowhere", headers={"x-request-id": "lost-1"})
    assert given.headers["x-request-id"] == "abc-123.x"
    for response in (fresh, unsafe, too_long):
        assert re.fullmatch(r"[0-9a-f]{32}", response.headers["x-request-id"])
    assert fresh.headers["x-request-id"] != unsafe.headers["x-request-id"]
    assert refused.status_code == 401 and refused.headers["x-request-id"] == "denied-1"
    assert missing.status_code == 404 and missing.headers["x-request-id"] == "lost-1"
    lines = {line["request_id"]: line for line in access_lines(caplog.records)}
    line = lines["abc-123.x"]
    assert line["method"] == "POST" and line["path"] == "/v1/chat/completions" and line["status"] == 200
    assert line["answers"] == 1 and line["abstained"] in (0, 1) and line["latency_ms"] > 0
    assert "prompt" not in line and "Hamlet" not in json.dumps(line)  # no prompt text unless asked
    assert lines["denied-1"]["status"] == 401 and lines["lost-1"]["status"] == 404
    assert lines[unsafe.headers["x-request-id"]]["path"] == "/health"


def test_the_access_log_counts_abstentions_and_carries_prompts_only_when_asked(honest, caplog):
    direct = [honest.answer(q) for q in QUESTIONS]
    question = next(q for q, a in zip(QUESTIONS, direct, strict=True) if a.abstained)
    prompts = {"model": "candor", "prompt": QUESTIONS[:3], "max_tokens": 4}
    app = create_app(honest, ServeSettings(log_prompts=True))
    with caplog.at_level(logging.INFO, logger="candor.serve.access"), serve_in_thread(app) as url:
        got = httpx.post(f"{url}/v1/chat/completions", json=chat(question), headers={"x-request-id": "p-1"})
        comp = httpx.post(f"{url}/v1/completions", json=prompts, headers={"x-request-id": "p-2"})
    assert got.status_code == 200 and comp.status_code == 200
    lines = {line["request_id"]: line for line in access_lines(caplog.records)}
    assert lines["p-1"]["abstained"] == 1 and lines["p-1"]["prompt"] == [{"role": "user", "content": question}]
    assert lines["p-2"]["answers"] == 3 and lines["p-2"]["abstained"] == sum(a.abstained for a in direct[:3])
    assert lines["p-2"]["prompt"] == QUESTIONS[:3]


def test_an_unexpected_error_is_a_500_in_the_openai_shape_that_keeps_its_request_id(honest, caplog):
    app = create_app(honest, ServeSettings())

    async def broken() -> None:
        raise RuntimeError("a defect in a route")

    app.add_api_route("/v1/broken", broken)  # a real route of the real app, broken on purpose
    with caplog.at_level(logging.INFO), serve_in_thread(app) as url:
        got = httpx.get(f"{url}/v1/broken", headers={"x-request-id": "boom-1"})
        assert httpx.get(f"{url}/health").status_code == 200  # the server is still up
    assert got.status_code == 500 and got.headers["x-request-id"] == "boom-1"
    assert got.json()["error"] == {
        "message": "internal error: RuntimeError",
        "type": "server_error",
        "param": None,
        "code": None,
    }
    line = next(x for x in access_lines(caplog.records) if x["request_id"] == "boom-1")
    assert line["status"] == 500 and "incomplete" not in line
    assert any("boom-1" in r.getMessage() and r.exc_info for r in caplog.records)  # the traceback is logged once


def test_a_stream_the_client_drops_is_logged_as_incomplete(honest, caplog):
    import asyncio

    from fastapi.responses import StreamingResponse

    app = create_app(honest, ServeSettings())

    async def endless():  # what a streamed answer looks like to the middleware, with no end
        yield b"data: {}\n\n"
        await asyncio.sleep(3600)

    app.add_api_route("/v1/endless", lambda: StreamingResponse(endless(), media_type="text/event-stream"))
    with caplog.at_level(logging.INFO), serve_in_thread(app) as url:
        with httpx.stream("GET", f"{url}/v1/endless", headers={"x-request-id": "drop-1"}) as resp:
            assert next(resp.iter_bytes()).startswith(b"data:")
        deadline = time.monotonic() + 30  # the server notices the closed connection on its own schedule
        while not any(x["request_id"] == "drop-1" for x in access_lines(caplog.records)):
            assert time.monotonic() < deadline, "the dropped stream was never logged"
            time.sleep(0.05)
    line = next(x for x in access_lines(caplog.records) if x["request_id"] == "drop-1")
    assert line["status"] == 200 and line["incomplete"] is True


# ---------------------------------------------------------------- CORS


def test_cors_is_off_by_default_and_on_for_the_given_origins_only(server, honest):
    url, _ = server
    preflight = {
        "Origin": "https://app.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    off = httpx.options(f"{url}/v1/chat/completions", headers=preflight)
    assert off.status_code == 405 and not any(h.startswith("access-control-") for h in off.headers)
    plain = httpx.get(f"{url}/health", headers={"Origin": "https://app.example"})
    assert not any(h.startswith("access-control-") for h in plain.headers)
    with serve_in_thread(create_app(honest, ServeSettings(cors_origins=("https://app.example",)))) as on:
        allowed = httpx.options(f"{on}/v1/chat/completions", headers=preflight)
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == "https://app.example"
        assert "POST" in allowed.headers["access-control-allow-methods"]
        answered = httpx.post(f"{on}/v1/chat/completions", json=chat(), headers={"Origin": "https://app.example"})
        assert answered.headers["access-control-allow-origin"] == "https://app.example"
        assert answered.headers["access-control-expose-headers"].split(", ") == [
            "x-request-id",
            "x-candor-confidence",
            "x-candor-abstained",
            "x-candor-abstained-choices",
            "x-candor-model-version",
        ]
        other = httpx.options(f"{on}/v1/chat/completions", headers=preflight | {"Origin": "https://evil.example"})
        assert other.status_code == 400 and "access-control-allow-origin" not in other.headers


def test_a_malformed_cors_origin_is_refused_before_the_model_loads():
    result = CliRunner().invoke(
        cli_app, ["serve", "--model", "/nonexistent/model", "--cors-origin", "https://app.example/"]
    )
    assert result.exit_code == 2 and "not an origin" in result.output


# ---------------------------------------------------------------- SIGTERM on a real `candor serve`


def wait_until(check, proc: subprocess.Popen, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{what}: {proc.communicate()[1].decode()[-3000:]}")
        time.sleep(0.1)


@pytest.mark.slow  # over a minute on 2 shared cores (make test-slow)
def test_sigterm_finishes_the_in_flight_request_and_exits_0(tiny_model_dir):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    env.pop("CANDOR_API_KEY", None)
    # The in-flight request decodes 4 × 450 tokens, so it is surely still running while draining is checked.
    cmd = [
        sys.executable,
        "-m",
        "candor.cli",
        "serve",
        "--model",
        tiny_model_dir,
        "--port",
        str(port),
        "--max-new-tokens",
        "4",
        "--threshold",
        "0.0",
        "--batch-wait-ms",
        "4000",
        "--max-batch",
        "4",
        "--log-prompts",
        "--cors-origin",
        "https://app.example",
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def answers(path: str) -> bool:
        try:
            return httpx.get(f"{base}{path}", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    wait_until(lambda: answers("/ready"), proc, "candor serve did not become ready")
    result: dict = {}

    def slow() -> None:
        headers = {"x-request-id": "in-flight-1", "Origin": "https://app.example"}
        body = chat(max_tokens=450, n=4, temperature=1.0)
        resp = httpx.post(f"{base}/v1/chat/completions", json=body, headers=headers, timeout=300)
        result.update(status=resp.status_code, body=resp.json(), cors=resp.headers.get("access-control-allow-origin"))

    caller = threading.Thread(target=slow)
    caller.start()
    in_flight = lambda: value(metrics_of(base), "candor_requests_in_flight") >= 2  # noqa: E731 (it and the scrape)
    wait_until(in_flight, proc, "the request never arrived")
    proc.send_signal(signal.SIGTERM)

    def status(path: str) -> int | None:
        try:
            return httpx.get(f"{base}{path}", timeout=2).status_code
        except httpx.TransportError:
            return None

    # Draining keeps listening: /ready says 503 (a load balancer sees the instance leave) and new work is 503.
    wait_until(lambda: status("/ready") == 503, proc, "/ready did not answer 503 while draining")
    assert caller.is_alive(), "the in-flight request ended before draining could be checked"
    refused = httpx.post(f"{base}/v1/chat/completions", json=chat(), timeout=30)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
    wait_until(lambda: not answers("/health"), proc, "the server kept accepting connections after draining")
    caller.join(timeout=120)
    assert result["status"] == 200 and result["body"]["choices"][0]["finish_reason"] in ("stop", "length")
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr.decode()[-3000:]
    logged = {x["request_id"]: x for x in map(json.loads, filter(is_json_line, stderr.decode().splitlines()))}
    assert logged["in-flight-1"]["status"] == 200 and logged["in-flight-1"]["answers"] == 4
    # --log-prompts and --cors-origin reach the running service.
    assert logged["in-flight-1"]["prompt"] == chat()["messages"] and result["cors"] == "https://app.example"


def is_json_line(line: str) -> bool:
    return line.startswith("{") and line.endswith("}")
