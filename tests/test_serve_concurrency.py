"""``candor serve`` under concurrency and streaming, over real HTTP on 127.0.0.1 with the tiny real model.

Each test here reproduces a defect of issue 23 (it fails on the code before the fix): one request's failure
reaching its neighbours, a lone surrogate, a prompt over the context, the request's temperature moving the
confidence, usage counts, ``seed``, log-probs, streaming, and work for clients that left.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from serve_counting import CountingBackend  # noqa: E402

from candor.backends.base import TOKENIZER  # noqa: E402
from candor.backends.hf import HFBackend  # noqa: E402
from candor.serve import Decoding, HonestModel, Threshold  # noqa: E402
from candor.serve.confidence_sources import question_item  # noqa: E402
from candor.serve.http.app import ServeSettings, create_app  # noqa: E402
from candor.serve.http.server import serve_in_thread  # noqa: E402
from candor.util.errors import CandorError  # noqa: E402

QUESTIONS = [f"Who wrote book number {i}?" for i in range(8)]


def prompt_of(honest: HonestModel, question: str) -> str:
    """The templated prompt the model reads for ``question``."""
    return honest.template(question_item(question), honest.backend)


def post(url: str, body: dict | bytes, timeout: float = 120) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def chat(question: str, **extra) -> dict:
    return {"model": "candor", "messages": [{"role": "user", "content": question}], **extra}


@pytest.fixture(scope="module")
def honest(tiny_model, tokenizer):
    backend = CountingBackend(tiny_model, tokenizer, batch_size=16)
    model = HonestModel(backend, confidence="n-prob", template="fewshot", decoding=Decoding(max_new_tokens=6))
    conf = sorted(a[0].confidence for a in model.answer_batch(QUESTIONS))
    model.threshold = Threshold((conf[3] + conf[4]) / 2)
    return model


@pytest.fixture(scope="module")
def server(honest):
    # A long batching window, so concurrent requests surely share a batch.
    settings = ServeSettings(max_tokens=64, batch_wait_ms=300, max_batch=32)
    with serve_in_thread(create_app(honest, settings)) as url:
        yield url


def concurrently(url: str, bodies: list[dict | bytes]) -> list[tuple[int, dict]]:
    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        return list(pool.map(lambda b: post(f"{url}/v1/chat/completions", b), bodies))


def check_same_as_alone(honest, question: str, status: int, body: dict) -> None:
    alone = honest.answer(question)
    assert status == 200, body
    conf = body["choices"][0]["confidence"]
    assert conf["value"] == pytest.approx(alone.confidence, abs=1e-6) and conf["abstained"] == alone.abstained
    if not alone.abstained:
        assert body["choices"][0]["message"]["content"] == alone.answer


def test_a_stop_that_empties_the_answer_fails_nobody(server, honest):
    """Defect 1: the stop string cuts the greedy answer to ''; it is answered, and its batch-mates are unharmed."""
    q = QUESTIONS[0]
    first = honest.backend.generate([prompt_of(honest, q)], 0, honest.decoding.params(honest.template.stop))
    stop = first[0].greedy.text[:1]
    assert stop.strip()
    results = concurrently(server, [chat(q, stop=[stop])] + [chat(x) for x in QUESTIONS[1:6]])
    status, body = results[0]
    assert status == 200, body
    choice = body["choices"][0]
    assert choice["message"]["content"] in ("", "I don't know.")  # answered empty, or abstained with its reason
    assert choice["confidence"]["reason"]
    for x, (status, body) in zip(QUESTIONS[1:6], results[1:], strict=True):
        check_same_as_alone(honest, x, status, body)


def test_a_lone_surrogate_gets_a_400_alone(server, honest):
    """Defect 8: the broken request is refused before batching; its neighbours answer as alone."""
    bad = json.dumps(chat("Who wrote \ud800 Hamlet?")).encode()  # json.dumps writes the \\ud800 escape
    assert b"\\ud800" in bad
    results = concurrently(server, [bad] + [chat(x) for x in QUESTIONS[:5]])
    status, err = results[0]
    assert status == 400 and err["error"]["param"] == "messages" and "surrogate" in err["error"]["message"]
    for x, (status, body) in zip(QUESTIONS[:5], results[1:], strict=True):
        check_same_as_alone(honest, x, status, body)
    status, err = post(f"{server}/v1/chat/completions", chat("hi", stop=["\ud800"]))
    assert status == 400 and err["error"]["param"] == "stop"


def test_a_prompt_over_the_context_is_refused_in_tokens_before_any_work(server, honest):
    """Defect 9: 900 emoji are few characters but thousands of tokens, beyond the tiny model's 512."""
    calls = len(honest.backend.calls)
    status, err = post(f"{server}/v1/chat/completions", chat("\U0001f600" * 900))
    assert status == 400 and err["error"]["code"] == "context_length_exceeded"
    assert "512" in err["error"]["message"]
    assert len(honest.backend.calls) == calls  # nothing was generated


def test_the_request_temperature_never_moves_the_confidence(server, honest):
    """Defect 2: sampled replies change the text only; the value is the protocol's (greedy + method samples)."""
    q = QUESTIONS[2]
    alone = honest.answer(q)
    for temperature in (0.01, 0.05, 1.0, 1.8):
        status, body = post(f"{server}/v1/chat/completions", chat(q, temperature=temperature, n=2, seed=7))
        assert status == 200
        for choice in body["choices"]:
            conf = choice["confidence"]
            assert conf["value"] == pytest.approx(alone.confidence, abs=1e-6)
            assert conf["abstained"] == alone.abstained
            assert conf["abstained"] or conf["scores_returned_text"] is False


def test_usage_counts_the_templated_prompt_and_each_distinct_answer_once(server, honest):
    """Serve side of defect 5 / defect 10: the engine's counts, not the question's tokens."""
    q = QUESTIONS[1]
    prompt_tokens = len(honest.backend.encode([prompt_of(honest, q)])[0])
    status, one = post(f"{server}/v1/chat/completions", chat(q))
    status4, four = post(f"{server}/v1/chat/completions", chat(q, n=4))
    assert status == status4 == 200
    assert one["usage"]["prompt_tokens"] == four["usage"]["prompt_tokens"] == prompt_tokens > 40
    assert four["usage"]["completion_tokens"] == one["usage"]["completion_tokens"]  # greedy n=4 repeats one answer


def test_seed_is_honoured_and_its_absence_draws_fresh_samples(server):
    """Defect 10: repeated requests at temperature 1 without a seed differ; with one they repeat."""
    body = chat(QUESTIONS[3], temperature=1.0, max_tokens=8)
    texts = {post(f"{server}/v1/chat/completions", body)[1]["choices"][0]["message"]["content"] for _ in range(4)}
    assert len(texts) > 1
    seeded = [post(f"{server}/v1/chat/completions", {**body, "seed": 11})[1] for _ in range(2)]
    assert seeded[0]["choices"][0]["message"]["content"] == seeded[1]["choices"][0]["message"]["content"]


def test_logprobs_are_the_answers_own(server, honest):
    q = QUESTIONS[4]
    alone = honest.answer_batch([q])[0][0]
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0)
    resp = client.chat.completions.create(
        model="candor", messages=[{"role": "user", "content": q}], logprobs=True, top_logprobs=2
    )
    if alone.abstained:
        assert resp.choices[0].logprobs is None
    else:
        content = resp.choices[0].logprobs.content
        assert [t.logprob for t in content] == pytest.approx(alone.completion.logprobs, abs=1e-5)
        assert all(len(t.top_logprobs) == 2 for t in content)
    comp = client.completions.create(model="candor", prompt=q, logprobs=3, temperature=0.5, seed=1)
    lp = comp.choices[0].logprobs
    assert lp is None or (len(lp.tokens) == len(lp.token_logprobs) and all(len(t) <= 3 for t in lp.top_logprobs))


def test_streaming_with_the_openai_client_equals_the_plain_answer(server, honest):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="none", max_retries=0)
    for q in QUESTIONS[:4]:
        alone = honest.answer(q)
        stream = client.chat.completions.create(
            model="candor",
            messages=[{"role": "user", "content": q}],
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finals = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
        assert len(finals) == 1 and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 0
        conf = finals[0].model_extra["confidence"]  # the answer-level confidence, in the last choice chunk
        assert conf["value"] == pytest.approx(alone.confidence, abs=1e-6)
        if alone.abstained:
            # The abstention is the refusal text (--abstain-as text); buffered, nothing of the withheld answer
            # was streamed. It ends with "stop", as OpenAI's own refusals do; confidence.abstained says so.
            assert finals[0].finish_reason == "stop" and finals[0].delta.refusal is None and conf["abstained"]
            assert text == "I don't know."
        else:
            assert text == alone.answer and finals[0].finish_reason == alone.finish_reason


def raw_sse(url: str, body: dict) -> list[str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        raw = resp.read().decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    return [e[len("data: ") :] for e in events]


def test_a_raw_sse_reader_sees_completion_chunks_and_done(server, honest):
    events = raw_sse(f"{server}/v1/completions", {"model": "candor", "prompt": QUESTIONS[:2], "stream": True})
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    for index, q in enumerate(QUESTIONS[:2]):
        alone = honest.answer(q)
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == index]
        assert mine[-1]["finish_reason"] == ("stop" if alone.abstained else alone.finish_reason)
        assert mine[-1]["confidence"]["abstained"] is alone.abstained
        if not alone.abstained:
            assert "".join(c["text"] for c in mine) == alone.answer


@pytest.fixture()
def long_answers(honest):
    """The counting backend answering up to 400 tokens, never abstaining: the greedy answer is the streamed one.

    Each token takes at least 10 ms, so the 400 take 4 s or more: a client leaving after 1 s leaves
    mid-way however fast the machine is.
    """
    honest.backend.token_delay = 0.01
    yield HonestModel(honest.backend, "n-prob", template="fewshot", decoding=Decoding(max_new_tokens=400))
    honest.backend.token_delay = 0.0


def wait_for_call(backend: CountingBackend, marker: str) -> int:
    """Tokens generated for ``marker`` once its generate call returned."""
    deadline = time.monotonic() + 120
    while not any(marker in p for prompts, _ in backend.calls for p in prompts) and time.monotonic() < deadline:
        time.sleep(0.2)
    return backend.tokens_for(marker)


def test_a_client_that_drops_mid_stream_stops_its_generation(long_answers):
    """Defect 7: the departed client's row ends; only a few of the 400 tokens it would run to are generated."""
    with serve_in_thread(
        create_app(long_answers, ServeSettings(max_tokens=400, stream="live", abstain_as="refusal"))
    ) as url:
        host, port = url.removeprefix("http://").split(":")
        marker = "Which river is the longest, asked by a client that leaves?"
        body = json.dumps(chat(marker, stream=True)).encode()
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            seen = b""
            while seen.count(b"data: ") < 3:  # the first content chunks arrived: the row is running
                got = sock.recv(4096)
                assert got and b"text/event-stream" in seen + got, (seen + got)[:300]
                seen += got
        assert 0 < wait_for_call(long_answers.backend, marker) < 200


def test_a_client_that_leaves_a_buffered_stream_stops_its_generation(long_answers):
    """Buffered streaming sends nothing before the decision; a client that leaves meanwhile still ends its row."""
    with serve_in_thread(create_app(long_answers, ServeSettings(max_tokens=400))) as url:
        host, port = url.removeprefix("http://").split(":")
        marker = "Which lake is the deepest, asked by a client that leaves a buffered stream?"
        body = json.dumps(chat(marker, stream=True)).encode()
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            time.sleep(1.0)
        assert wait_for_call(long_answers.backend, marker) < 200


def test_a_client_that_leaves_before_its_plain_answer_stops_its_generation(long_answers):
    """Defect 7 without streaming: the server notices the closed connection and ends the row."""
    with serve_in_thread(create_app(long_answers, ServeSettings(max_tokens=400))) as url:
        host, port = url.removeprefix("http://").split(":")
        marker = "Which mountain is the highest, asked by a client that hangs up?"
        body = json.dumps(chat(marker)).encode()
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            time.sleep(1.0)
        assert wait_for_call(long_answers.backend, marker) < 200


def test_a_503_part_way_through_a_multi_prompt_request_computes_none_of_it(honest):
    """Defect 7: prompts queued before the queue filled are cancelled with the 503."""
    with serve_in_thread(create_app(honest, ServeSettings(queue_size=2, max_batch=1, batch_wait_ms=0))) as url:
        prompts = [f"Unqueued question {i} of a refused request?" for i in range(5)]
        status, err = post(f"{url}/v1/completions", {"model": "candor", "prompt": prompts})
        assert status == 503 and err["error"]["code"] == "queue_full"
        time.sleep(1.0)
        assert honest.backend.tokens_for("of a refused request") == 0
        assert post(f"{url}/v1/completions", {"model": "candor", "prompt": QUESTIONS[0]})[0] == 200


@pytest.fixture(scope="module")
def head_model(tiny_model_dir, tmp_path_factory):
    from candor.serve.confidence_sources import HeadSource
    from candor.train.common import load_causal_lm
    from candor.train.elical import ConfidenceHead, HeadConfig

    model, tokenizer = load_causal_lm(tiny_model_dir, device="cpu")
    head = ConfidenceHead.create(model, tokenizer, HeadConfig(backbone=tiny_model_dir, template="fewshot"), seed=3)
    folder = head.save_pretrained(tmp_path_factory.mktemp("head") / "head")
    source = HeadSource(folder)
    conf = sorted(source.score_questions(QUESTIONS))
    backend = HFBackend.from_pretrained(tiny_model_dir, device="cpu")
    return HonestModel(
        backend, source, threshold=(conf[3] + conf[4]) / 2, template="fewshot", decoding=Decoding(max_new_tokens=5)
    )


def test_a_head_streams_its_confidence_first_and_an_abstention_as_one_chunk(head_model, tmp_path):
    log = tmp_path / "served.jsonl"
    with serve_in_thread(create_app(head_model, ServeSettings(log_records=log))) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        for q in QUESTIONS:
            alone = head_model.answer(q)
            chunks = list(
                client.chat.completions.create(model="candor", messages=[{"role": "user", "content": q}], stream=True)
            )
            first = chunks[0].choices[0]
            assert first.model_extra["confidence"]["value"] == pytest.approx(alone.confidence, abs=1e-6)
            if alone.abstained:  # one chunk, nothing generated
                assert len(chunks) == 1 and first.finish_reason == "stop"
                assert first.delta.content == "I don't know." and first.delta.refusal is None
            else:
                assert first.finish_reason is None and first.delta.role == "assistant"
                assert "".join(c.choices[0].delta.content or "" for c in chunks) == alone.answer
    from candor.annotation.records import read_records

    records = read_records(log)
    assert len(records) == len(QUESTIONS)
    for rec, q in zip(records, QUESTIONS, strict=True):
        served = rec.provenance["served"]
        assert rec.item.question == q and rec.provenance["template"] == "fewshot"
        assert served["confidence"][0]["value"] == pytest.approx(head_model.answer(q).confidence, abs=1e-6)


class NoTokenizerBackend(HFBackend):
    """The real HF engine declared without a tokenizer, as a remote server without --tokenizer is."""

    capabilities = HFBackend.capabilities - {TOKENIZER}

    def tokenize(self, text):
        raise CandorError("this backend has no tokenizer (pass --tokenizer)")


def test_usage_comes_from_the_engine_not_from_a_tokenizer(tiny_model, tokenizer):
    """Serve side of defect 5: a backend without a tokenizer still answers, with the engine's counts."""
    backend = NoTokenizerBackend(tiny_model, tokenizer)
    model = HonestModel(backend, "n-prob", template="fewshot", decoding=Decoding(max_new_tokens=4))
    with serve_in_thread(create_app(model, ServeSettings())) as url:
        status, body = post(f"{url}/v1/chat/completions", chat(QUESTIONS[0]))
    assert status == 200, body
    assert body["usage"]["prompt_tokens"] == len(backend.encode([prompt_of(model, QUESTIONS[0])])[0])
    assert body["usage"]["completion_tokens"] >= len(model.answer(QUESTIONS[0]).completion.token_ids)


def test_the_token_hook_sees_every_kept_token_and_can_end_a_row(tiny_model, tokenizer):
    """The hf decode loop's per-row hook: outputs unchanged when it keeps going; False ends the row there."""
    from candor.backends.base import SamplingParams

    backend = HFBackend(tiny_model, tokenizer)
    prompts = [f"Question: {q}\nAnswer:" for q in QUESTIONS[:3]]
    params = SamplingParams(max_new_tokens=8)
    plain = backend.generate(prompts, 2, params, seeds=[1, 2, 3])
    seen: dict[tuple[int, int], list[int]] = {}

    def keep(prompt: int, sample: int, token: int) -> bool:
        seen.setdefault((prompt, sample), []).append(token)
        return True

    hooked = backend.generate(prompts, 2, params, seeds=[1, 2, 3], on_token=keep)
    assert hooked == plain
    for p, g in enumerate(plain):
        assert seen[(p, -1)] == g.greedy.token_ids and seen[(p, 0)] == g.samples[0].token_ids

    short = backend.generate(prompts, 2, params, seeds=[1, 2, 3], on_token=lambda p, s, t: s != 0)
    for g, full in zip(short, plain, strict=True):
        assert len(g.samples[0].token_ids) <= 1
        # The other rows keep their tokens; their log-probs move only by float32 rounding once the batch
        # shrinks (a smaller matrix product), hence the tolerance.
        for mine, theirs in ((g.greedy, full.greedy), (g.samples[1], full.samples[1])):
            assert mine.token_ids == theirs.token_ids and mine.text == theirs.text
            np.testing.assert_allclose(mine.logprobs, theirs.logprobs, atol=1e-5)
