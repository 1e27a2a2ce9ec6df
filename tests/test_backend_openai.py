"""The openai backend against real HTTP servers on 127.0.0.1 (never mocks).

- ``transformers serve`` on the embedded model, started once for the module:
  the black-box case (it ignores ``n``, ``logprobs`` and ``top_logprobs``).
- A tiny flaky server written here (http.server) that fails the first
  request with a 503 or a dropped connection and answers afterwards: the
  backend retries and succeeds.
- A closed port: one clear error, and exit 2 from the CLI.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers import free_port, transformers_serve
from typer.testing import CliRunner

from candor.backends.base import CONSTRAINED, GENERATE, LOGPROBS, SCORE, TOKENIZER, TOP_LOGPROBS, SamplingParams
from candor.backends.openai import SAMPLES_N, OpenAIBackend
from candor.util.errors import CandorError
from tests.http_replies import send_json

HAVE_SERVING = all(importlib.util.find_spec(m) is not None for m in ("fastapi", "uvicorn"))
_skip_without_serving = pytest.mark.skipif(
    not HAVE_SERVING, reason="transformers serve needs fastapi and uvicorn (pip install fastapi uvicorn)"
)


def needs_serve(test):
    """A test on the real ``transformers serve`` (the embedded model, so also an integration test)."""
    return pytest.mark.server(pytest.mark.integration(_skip_without_serving(test)))


PROMPTS = [
    "Question: What is the largest planet in the solar system?\nAnswer: Jupiter\nQuestion: Who wrote Hamlet?\nAnswer:",
    "The capital of France is",
]
PARAMS = SamplingParams(max_new_tokens=8, stop=("\n",))


@pytest.fixture(scope="module")
def served(smollm_dir, tmp_path_factory):
    """``transformers serve`` on the embedded model's safetensors folder, offline, on a free port."""
    if not HAVE_SERVING:
        pytest.skip("transformers serve needs fastapi and uvicorn (pip install fastapi uvicorn)")
    with transformers_serve(smollm_dir, tmp_path_factory.mktemp("serve") / "serve.log") as url:
        yield url


@pytest.fixture(scope="module")
def remote(served, smollm_dir) -> OpenAIBackend:
    return OpenAIBackend(str(smollm_dir), base_url=served, tokenizer=str(smollm_dir), max_concurrency=2)


@pytest.fixture(scope="module")
def local(smollm_dir):
    from candor.backends.hf import HFBackend

    return HFBackend.from_pretrained(str(smollm_dir))


# ---------------------------------------------------------------- transformers serve: the black-box case


@needs_serve
def test_probe_finds_a_black_box_server(remote) -> None:
    # Structured output is passed on as asked (response_format); a server that ignores it answers in free text.
    assert remote.capabilities == {GENERATE, TOKENIZER, CONSTRAINED}
    assert not {SAMPLES_N, LOGPROBS, TOP_LOGPROBS} & remote.capabilities


@needs_serve
def test_greedy_equals_the_in_process_backend(remote, local) -> None:
    prompts = [*PROMPTS, local.render_chat([{"role": "user", "content": "What is the capital of Italy?"}])]
    assert remote.render_chat([{"role": "user", "content": "What is the capital of Italy?"}]) == prompts[-1]
    theirs = remote.generate(prompts, 0, PARAMS, greedy=True)
    mine = local.generate(prompts, 0, PARAMS, greedy=True)
    assert [g.greedy.text for g in theirs] == [g.greedy.text for g in mine]
    assert sum(bool(g.greedy.text) for g in mine) >= 2  # not a comparison of empty answers
    assert all(g.greedy.logprobs == [] for g in theirs)  # the server gave none, and none were invented


@needs_serve
def test_chat_endpoint_greedy_equals_the_in_process_backend(served, smollm_dir, local) -> None:
    chat = OpenAIBackend(str(smollm_dir), base_url=served, endpoint="chat")
    message = [{"role": "user", "content": "What is the capital of Italy?"}]
    theirs = chat.generate([chat.render_chat(message)], 0, PARAMS, greedy=True)[0].greedy
    mine = local.generate([local.render_chat(message)], 0, PARAMS, greedy=True)[0].greedy
    assert theirs.text == mine.text and mine.text


@needs_serve
def test_samples_come_from_repeated_requests_when_n_is_ignored(remote) -> None:
    gens = remote.generate(PROMPTS, 3, PARAMS, greedy=False, seeds=[1, 2])
    assert [g.greedy for g in gens] == [None, None]
    assert [len(g.samples) for g in gens] == [3, 3]
    assert all(isinstance(s.text, str) for g in gens for s in g.samples)


@needs_serve
def test_63_bit_prompt_seeds_are_taken_by_transformers_serve(remote) -> None:
    # The serve path seeds each question with a 63-bit hash; the server seeds torch with what it is sent.
    gens = remote.generate(PROMPTS[:1], 2, PARAMS, greedy=False, seeds=[2**63 - 1])
    assert len(gens[0].samples) == 2 and all(isinstance(s.text, str) for s in gens[0].samples)


@needs_serve
def test_usage_and_finish_reason_come_from_transformers_serve(served, smollm_dir) -> None:
    bare = OpenAIBackend(str(smollm_dir), base_url=served, max_concurrency=2)  # no tokenizer: none is needed
    params = SamplingParams(max_new_tokens=2)
    gen = bare.generate([PROMPTS[0]], 1, params, greedy=True, seeds=[3])[0]
    assert [c.finish_reason for c in (gen.greedy, *gen.samples)] == ["length", "length"]
    assert [c.completion_tokens for c in (gen.greedy, *gen.samples)] == [2, 2]
    from transformers import AutoTokenizer

    local_count = len(AutoTokenizer.from_pretrained(smollm_dir)(PROMPTS[0])["input_ids"])
    assert gen.prompt_tokens == local_count  # the server's own count of what it read


@needs_serve
def test_candor_serve_over_transformers_serve_reports_the_servers_usage(served, smollm_dir) -> None:
    """``HonestModel`` + ``create_app`` over the openai backend, with no local tokenizer anywhere."""
    pytest.importorskip("fastapi")
    from candor.serve import Decoding, HonestModel
    from candor.serve.confidence_sources import EstimatorSource

    backend = OpenAIBackend(str(smollm_dir), base_url=served, max_concurrency=2)
    model = HonestModel(
        backend,
        confidence=EstimatorSource("consis-lex", samples=2),
        template="fewshot",
        decoding=Decoding(max_new_tokens=2),
        backend_name="openai",
    )
    status, answer = ask_candor_serve(model)
    assert status == 200, answer
    assert answer["usage"]["completion_tokens"] > 0
    assert answer["choices"][0]["finish_reason"] == "length"


@needs_serve
def test_scoring_where_transformers_serve_echoes_nothing_is_an_error_not_probability_1(served, smollm_dir) -> None:
    # A user who claims prompt scoring for a server that ignores echo and logprobs gets an error, not [].
    claimed = OpenAIBackend(str(smollm_dir), base_url=served, capabilities=[GENERATE, LOGPROBS, SCORE])
    with pytest.raises(CandorError, match="cannot score continuations"):
        claimed.score([PROMPTS[1]], [" Paris"])


@needs_serve
def test_logprob_estimators_refuse_and_black_box_ones_run(remote) -> None:
    from helpers import annotated_records

    from candor.estimators import score_records

    records = annotated_records(2)
    with pytest.raises(CandorError, match="p-true.*next_token_logprobs"):
        score_records(records, ["self-consistency", "p-true"], remote, progress=False)
    options = {"self-consistency": {"m": 2, "max_new_tokens": 8}}
    table = score_records(records, ["verbal-number", "self-consistency"], remote, progress=False, options=options)
    allowed = {round(i / 9, 6) for i in range(10)} | {0.5}
    assert {round(row.confidence["verbal-number"], 6) for row in table.rows} <= allowed
    assert {row.confidence["self-consistency"] for row in table.rows} <= {0.0, 0.5, 1.0}


@needs_serve
def test_annotate_through_the_server(remote, tmp_path) -> None:
    from candor.annotation.builder import AnnotateConfig, annotate
    from candor.annotation.prompts import TEMPLATES
    from candor.annotation.records import read_records
    from candor.data.items import QAItem

    items = [
        QAItem(id="q:1", dataset="toy", split="test", question="Who wrote Hamlet?", answers=("Shakespeare",)),
        QAItem(id="q:2", dataset="toy", split="test", question="What is the capital of Italy?", answers=("Rome",)),
    ]
    config = AnnotateConfig(k=2, params=SamplingParams(max_new_tokens=6), batch_size=2)
    annotate(items, remote, tmp_path / "r.jsonl", TEMPLATES.get("fewshot"), config, progress=False)
    records = read_records(tmp_path / "r.jsonl")
    assert [r.id for r in records] == ["q:1", "q:2"]
    assert all(len(r.samples) == 2 and len(r.consistency) == 2 for r in records)
    assert records[0].provenance["model"] == remote.model_name
    # Issue 63 defect 6: transformers serve refuses the non-standard top_k (422) and candor drops it; the
    # provenance says what was applied (no top-k) and what was asked for and dropped.
    samples = records[0].provenance["decoding"]["samples"]
    assert (samples["top_k"], samples["dropped"]) == (0, {"top_k": 50})
    assert samples["top_p"] == config.params.top_p and samples["temperature"] == config.params.temperature


# ---------------------------------------------------------------- capabilities without a server


def test_refusal_comes_before_any_request() -> None:
    from helpers import annotated_records

    from candor.estimators import score_records

    # Nothing listens on this port: a request would fail with "cannot reach", not with the refusal.
    backend = OpenAIBackend("m", base_url=f"http://127.0.0.1:{free_port()}/v1", capabilities=[GENERATE])
    with pytest.raises(CandorError, match="needs next_token_logprobs"):
        score_records(annotated_records(1), ["p-true"], backend, progress=False)


# ---------------------------------------------------------------- retries against a real flaky server


class LocalServer:
    """A ``ThreadingHTTPServer`` on a free port of 127.0.0.1 serving ``handler`` (``url``: its /v1)."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class FlakyServer(LocalServer):
    """An OpenAI-shaped /v1/completions that fails its first ``failures`` requests, then answers."""

    def __init__(self, failure: str, failures: int = 1) -> None:
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests += 1
                if outer.requests <= failures:
                    if failure == "drop":
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    self.send_response(int(failure))
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(b'{"error": {"message": "busy"}}')
                    return
                answer = {
                    "id": "x",
                    "object": "text_completion",
                    "created": 0,
                    "model": body["model"],
                    "choices": [{"index": 0, "text": " Paris\nmore", "finish_reason": "length", "logprobs": None}],
                }
                send_json(self, 200, answer)

            def log_message(self, *args) -> None:
                pass

        super().__init__(Handler)


@pytest.mark.parametrize("failure", ["503", "429", "drop"])
def test_a_failed_request_is_retried_and_succeeds(failure) -> None:
    with FlakyServer(failure) as server:
        backend = OpenAIBackend("m", base_url=server.url, capabilities=[GENERATE], max_retries=3)
        gens = backend.generate(["Capital of France?"], 0, PARAMS, greedy=True)
        assert gens[0].greedy.text == "Paris"  # cut at the stop string client-side
        assert server.requests == 2


def test_a_client_error_is_not_retried() -> None:
    with FlakyServer("400", failures=5) as server:
        backend = OpenAIBackend("m", base_url=server.url, capabilities=[GENERATE], max_retries=3)
        with pytest.raises(CandorError, match="answered 400"):
            backend.generate(["q"], 0, PARAMS, greedy=True)
        assert server.requests == 1


def test_retries_give_up_with_one_error() -> None:
    with FlakyServer("503", failures=10) as server:
        backend = OpenAIBackend("m", base_url=server.url, capabilities=[GENERATE], max_retries=2)
        with pytest.raises(CandorError, match="answered 503"):
            backend.generate(["q"], 0, PARAMS, greedy=True)
        assert server.requests == 3


class BoundedChoicesServer(LocalServer):
    """/v1/completions that takes at most ``most`` choices a request and refuses more as llama.cpp's server does
    (its words, measured on llama-server 0.3.36 with 2 slots: 400 "Field 'n': Value must be between 1 <= value
    <= 2, but got 5"); ``refuse_all`` refuses every request instead."""

    def __init__(self, most: int = 2, refuse_all: bool = False) -> None:
        self.sizes: list[int] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                n = body.get("n", 1)
                outer.sizes.append(n)
                if refuse_all or n > most:
                    error = {"message": f"Field 'n': Value must be between 1 <= value <= {most}, but got {n}"}
                    return send_json(self, 400, {"error": {"code": 400, "type": "invalid_request_error", **error}})
                text = f" sample {len(outer.sizes)}"
                choices = [{"index": i, "text": text, "finish_reason": "stop", "logprobs": None} for i in range(n)]
                send_json(
                    self, 200, {"id": "x", "object": "text_completion", "model": body["model"], "choices": choices}
                )

            def log_message(self, *args) -> None:
                pass

        super().__init__(Handler)


def test_samples_beyond_the_servers_choice_bound_go_one_request_each() -> None:
    """The probe asks n = 2, which llama.cpp takes; k = 5 was then refused 400 and the run died."""
    with BoundedChoicesServer(most=2) as server:
        backend = OpenAIBackend("m", base_url=server.url, capabilities=[GENERATE, SAMPLES_N], max_retries=0)
        (gen,) = backend.generate(["q"], 5, PARAMS, seeds=[7])
        assert len(gen.samples) == 5 and all(s.text.startswith("sample") for s in gen.samples)
        assert SAMPLES_N not in backend.capabilities
        server.sizes.clear()
        backend.generate(["q"], 5, PARAMS, seeds=[7])  # no refused request any more
        assert server.sizes == [1] * 6


def test_a_refusal_about_something_else_is_raised_and_keeps_the_capability() -> None:
    with BoundedChoicesServer(refuse_all=True) as server:
        backend = OpenAIBackend("m", base_url=server.url, capabilities=[GENERATE, SAMPLES_N], max_retries=0)
        with pytest.raises(CandorError, match="answered 400"):
            backend.generate(["q"], 5, PARAMS, seeds=[7])
        assert SAMPLES_N in backend.capabilities


# ---------------------------------------------------------------- an unreachable server


def test_unreachable_server_is_one_error_and_exit_2(tmp_path: Path) -> None:
    from candor.cli import app

    data = tmp_path / "qa.jsonl"
    data.write_text(json.dumps({"question": "Who wrote Hamlet?", "answer": ["Shakespeare"]}) + "\n")
    url = f"http://127.0.0.1:{free_port()}/v1"
    args = [
        "annotate",
        "--data",
        str(data),
        "--out",
        str(tmp_path / "out.jsonl"),
        "--model",
        "m",
        "--backend",
        "openai",
        "--base-url",
        url,
        "--max-retries",
        "1",
        "--template",
        "fewshot",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert f"no generation server answers at {url}" in result.output and "--base-url" in result.output
    assert "Traceback" not in result.output


def ask_candor_serve(model, question: str = "Who wrote the play Romeo and Juliet?") -> tuple[int, dict]:
    """Status and body of one 2-token chat request to a real ``candor serve`` app around ``model``."""
    from candor.serve.http.app import ServeSettings, create_app
    from candor.serve.http.server import serve_in_thread

    with serve_in_thread(create_app(model, ServeSettings(max_tokens=2))) as url:
        body = {"model": "candor", "max_tokens": 2, "messages": [{"role": "user", "content": question}]}
        request = urllib.request.Request(
            f"{url}/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=300) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())
