"""An exported EliCal head served on vLLM's classify API, and ``candor serve`` reading its confidence from there.

Real servers on 127.0.0.1 throughout: ``candor serve-head`` (in a thread, or as
a process), ``transformers serve`` for generation, small ``http.server``
servers written here for the wrong answers (a 500, another shape), and a
closed port.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest
from helpers import free_port, saved_elical_head, wait_healthy
from typer.testing import CliRunner

from candor.cli import app
from candor.serve.classify_client import ClassifyClient, ClassifyServerError, ClassifySource, server_root
from candor.serve.http.classify_server import load_classify_app
from candor.serve.http.server import serve_in_thread
from candor.train.elical.export import export_seq_cls, read_export
from candor.util.errors import CandorError
from tests.http_replies import send_json

SRC = str(Path(__file__).resolve().parents[1] / "src")
QUESTIONS = [
    "Who wrote Hamlet?",
    "What is the boiling point of water at sea level in degrees Celsius?",
    "Name the longest river in Africa, which flows through Egypt and Sudan?",
    "2+2?",
    "Which planet is known as the Red Planet?",
    "In what year did the Berlin Wall fall?",
]


@pytest.fixture(scope="module")
def exported(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("classify")
    head = saved_elical_head(tiny_model_dir, root / "head", weight_scale=0.5, bias=0.4)
    export_seq_cls(root / "head", root / "seq-cls")
    return head, root / "seq-cls"


@pytest.fixture(scope="module")
def head_server(exported):
    _, out = exported
    with serve_in_thread(load_classify_app(out)) as url:
        yield url


def post(url: str, body: object) -> tuple[int, dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


# ---------------------------------------------------------------- the export's probe


def test_the_export_writes_a_probe_with_the_heads_confidence(exported):
    head, out = exported
    probe = read_export(out)["probe"]
    assert probe["prompt"] == head.prompts([probe["question"]])[0]
    assert probe["confidence"] == pytest.approx(float(head.predict([probe["question"]])[0]), abs=1e-9)


# ---------------------------------------------------------------- candor serve-head: vLLM's classify shapes


def test_serve_head_answers_vllms_classify_shape_with_the_heads_confidence(exported, head_server):
    head, out = exported
    prompts = head.prompts(QUESTIONS)
    status, body = post(f"{head_server}/classify", {"model": str(out), "input": prompts})
    assert status == 200, body
    assert body["object"] == "list" and body["model"] == str(out) and body["id"].startswith("classify-")
    assert [d["index"] for d in body["data"]] == list(range(len(prompts)))
    assert all(d["num_classes"] == 1 and d["label"] == "confident" and len(d["probs"]) == 1 for d in body["data"])
    np.testing.assert_allclose([d["probs"][0] for d in body["data"]], head.predict(QUESTIONS), atol=1e-5)
    assert body["usage"]["prompt_tokens"] == sum(len(head.tokenizer(p)["input_ids"]) for p in prompts)
    # one string, no model: as vLLM takes it
    status, one = post(f"{head_server}/classify", {"input": prompts[0]})
    assert status == 200 and one["data"][0]["probs"][0] == pytest.approx(body["data"][0]["probs"][0], abs=1e-6)
    models = json.loads(urllib.request.urlopen(f"{head_server}/v1/models").read())
    assert [m["id"] for m in models["data"]] == [str(out)]


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ({"model": "other", "input": ["x"]}, 404, "does not exist"),
        ({"input": []}, 400, "non-empty"),
        ({"input": [1, 2, 3]}, 400, "strings"),
        ({"input": ["x"], "use_activation": False}, 400, "probabilities only"),
        (["x"], 400, "JSON object"),
    ],
)
def test_serve_head_refuses_bad_requests_in_the_openai_error_shape(head_server, body, status, says):
    got, answer = post(f"{head_server}/classify", body)
    assert got == status and says in answer["error"]["message"]


def test_serve_head_refuses_a_folder_that_is_not_an_export(exported, tmp_path):
    head, _ = exported
    result = CliRunner().invoke(app, ["serve-head", str(tmp_path)])
    assert result.exit_code == 2 and "not a candor export" in result.output and "Traceback" not in result.output


# ---------------------------------------------------------------- the client: a confidence source


def test_the_classify_source_equals_the_heads_predict(exported, head_server):
    from candor.serve.confidence_sources import question_item

    head, out = exported
    source = ClassifySource(head_server + "/v1", out)  # a /v1 address is the same server
    assert source.url == head_server and source.model == str(out)
    expected = head.predict(QUESTIONS)
    np.testing.assert_allclose(source.score_questions(QUESTIONS), expected, atol=1e-5)
    assert expected.max() - expected.min() > 0.05  # spread out, so the median splits them (tests below)
    from candor.annotation.records import Record
    from candor.backends.base import Completion

    records = [
        Record(item=question_item(q, i), greedy=Completion(text="an answer"), samples=[])
        for i, q in enumerate(QUESTIONS[:2])
    ]
    np.testing.assert_allclose(source.score_records(records, None), expected[:2], atol=1e-5)


def test_a_server_without_the_heads_bias_is_refused_at_startup(exported, tmp_path):
    """vLLM without --pooler-config: the sigmoid of the raw logit. The probe catches it."""
    _, out = exported
    biasless = tmp_path / "biasless"
    shutil.copytree(out, biasless)
    config = json.loads((biasless / "config.json").read_text())
    config["candor_logit_bias"] = 0.0
    (biasless / "config.json").write_text(json.dumps(config))
    with (
        serve_in_thread(load_classify_app(biasless, name="head")) as url,
        pytest.raises(ClassifyServerError, match="probe question.*pooler-config"),
    ):
        ClassifySource(url, out)


def test_an_unreachable_server_is_one_clear_error(exported):
    _, out = exported
    with pytest.raises(ClassifyServerError, match="unreachable"):
        ClassifySource(f"http://127.0.0.1:{free_port()}", out)
    with pytest.raises(CandorError, match="http"):
        server_root("127.0.0.1:8001")


class _Canned(BaseHTTPRequestHandler):
    """Answers every request with the server's canned status and body."""

    def do_GET(self) -> None:
        self._answer(200, {"data": [{"id": "head"}]})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._answer(*self.server.canned)  # type: ignore[attr-defined]

    def _answer(self, status: int, body: object) -> None:
        send_json(self, status, body)

    def log_message(self, *args: object) -> None:
        return None


@pytest.mark.parametrize(
    ("canned", "says"),
    [
        ((500, {"error": {"message": "engine dead"}}), "answered 500.*engine dead"),
        ((200, {"data": [{"index": 0, "probs": [0.2, 0.8]}]}), "2 probabilities per input"),
        ((200, {"data": []}), "expected 'data' with 1 entries"),
        ((200, {"data": [{"index": 0, "probs": [1.5]}]}), "outside"),
        ((200, {"data": [{"index": 3, "probs": [0.5]}]}), "without 'index'"),
        ((200, b"<html>"), "not JSON"),
    ],
)
def test_a_server_answering_otherwise_is_refused(canned, says):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Canned)
    server.canned = canned  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = ClassifyClient(f"http://127.0.0.1:{server.server_address[1]}")
        assert client.models() == ["head"]
        with pytest.raises(ClassifyServerError, match=says):
            client.classify("head", ["a prompt"])
    finally:
        server.shutdown()


# ---------------------------------------------------------------- wiring: HonestModel, the saved folder, the CLI


def test_an_honest_model_declines_before_generating_and_reloads_from_its_folder(
    exported, head_server, tiny_backend, tmp_path
):
    from candor.serve import HonestModel
    from candor.serve.model import HonestModel as Reloaded

    head, out = exported
    expected = head.predict(QUESTIONS)
    threshold = float(np.median(expected))
    model = HonestModel(tiny_backend, ClassifySource(head_server, out), threshold=threshold)
    answers = [a[0] for a in model.answer_batch(QUESTIONS)]
    np.testing.assert_allclose([a.confidence for a in answers], expected, atol=1e-5)
    assert [a.abstained for a in answers] == [bool(c < threshold) for c in expected]
    assert any(a.abstained for a in answers) and not all(a.abstained for a in answers)
    folder = model.save_pretrained(tmp_path / "honest")
    assert not list(folder.rglob("*.safetensors"))  # no weights in the folder: the head stays on its server
    again = Reloaded.from_pretrained(folder, backend=tiny_backend)
    assert again.source.kind == "classify" and again.threshold.value == threshold
    np.testing.assert_allclose(again.source.score_questions(QUESTIONS), expected, atol=1e-5)


def test_a_classify_server_that_goes_away_fails_the_questions_it_hits_with_its_message(exported, tiny_backend):
    from candor.serve import HonestModel

    _, out = exported
    with serve_in_thread(load_classify_app(out)) as url:
        model = HonestModel(tiny_backend, ClassifySource(url, out), threshold=0.5)
    with pytest.raises(ClassifyServerError, match="unreachable"):
        model.answer("Who wrote Hamlet?")


def test_a_client_gets_502_not_400_when_the_classify_server_behind_candor_fails(exported, tiny_backend):
    """The client's request is not at fault when a server candor relies on goes away: 502, OpenAI error shape."""
    openai = pytest.importorskip("openai")
    from candor.serve import HonestModel
    from candor.serve.http.app import ServeSettings, create_app

    _, out = exported
    with serve_in_thread(load_classify_app(out)) as url:
        model = HonestModel(tiny_backend, ClassifySource(url, out), threshold=0.5)
    with serve_in_thread(create_app(model, ServeSettings(max_tokens=8))) as served:
        client = openai.OpenAI(base_url=f"{served}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.APIStatusError) as failed:
            client.chat.completions.create(model="candor", messages=[{"role": "user", "content": "Who wrote Hamlet?"}])
        assert failed.value.status_code == 502
        assert failed.value.body["type"] == "server_error" and failed.value.body["code"] == "upstream_error"
        assert "unreachable" in failed.value.body["message"]
        status, health = 0, {}
        with urllib.request.urlopen(f"{served}/health") as r:  # the service itself is still up
            status, health = r.status, json.load(r)
        assert status == 200 and health


def test_the_cli_refuses_a_dead_classify_server_and_wrong_combinations(exported, tmp_path):
    _, out = exported
    dead = f"http://127.0.0.1:{free_port()}"
    missing = str(tmp_path / "no-such-model")
    cases = [
        (["serve", "--confidence-url", dead, "--head", str(out)], "unreachable"),
        (["ask", "Who?", "--confidence-url", dead, "--head", str(out)], "unreachable"),
        (["serve", "--confidence-url", dead], "give --head OUT"),
        (["serve", "--confidence-url", dead, "--head", str(out), "--method", "n-prob"], "give --head OUT"),
        (["serve", "--confidence-url", dead, "--head", str(tmp_path)], "not a candor export"),
    ]
    for args, says in cases:
        result = CliRunner().invoke(app, [*args, "--model", missing])
        assert result.exit_code == 2, (args, result.output)
        assert says in result.output and "Traceback" not in result.output, (args, result.output)


# ---------------------------------------------------------------- the whole chain, real processes


class CountingProxy(BaseHTTPRequestHandler):
    """Forwards to the generation server and records every request body it passes on."""

    def do_GET(self) -> None:
        self._forward(None)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.seen.append(json.loads(body))  # type: ignore[attr-defined]
        self._forward(body)

    def _forward(self, body: bytes | None) -> None:
        req = urllib.request.Request(
            self.server.target + self.path,
            data=body,  # type: ignore[attr-defined]
            headers={"Content-Type": "application/json"},
            method=self.command,
        )
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                status, data = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, data = exc.code, exc.read()
        send_json(self, status, data)

    def log_message(self, *args: object) -> None:
        return None


def start(cmd: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    with log.open("w") as sink:
        return subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.mark.server
@pytest.mark.slow  # over a minute on 2 shared cores (make test-slow)
def test_the_chain_candor_in_front_of_a_generation_server_and_a_classify_server(exported, tiny_model_dir, tmp_path):
    """transformers serve (generation) + candor serve-head (the exported head) + candor serve --backend openai."""
    openai = pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    from candor.backends.base import SamplingParams
    from candor.backends.openai import OpenAIBackend

    head, out = exported
    expected = head.predict(QUESTIONS)
    threshold = float(np.median(expected))
    env = {**os.environ, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    gen_port, cls_port, candor_port = free_port(), free_port(), free_port()
    procs = []
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), CountingProxy)
    proxy.target, proxy.seen = f"http://127.0.0.1:{gen_port}", []  # type: ignore[attr-defined]
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        procs.append(
            start(
                [
                    sys.executable,
                    "-m",
                    "transformers.cli.transformers",
                    "serve",
                    tiny_model_dir,
                    "--port",
                    str(gen_port),
                    "--device",
                    "cpu",
                ],
                tmp_path / "gen.log",
                env,
            )
        )
        procs.append(
            start(
                [sys.executable, "-m", "candor.cli", "serve-head", str(out), "--port", str(cls_port)],
                tmp_path / "cls.log",
                env,
            )
        )
        wait_healthy(f"http://127.0.0.1:{gen_port}/health", procs[0], log=tmp_path / "gen.log")
        wait_healthy(f"http://127.0.0.1:{cls_port}/health", procs[1], log=tmp_path / "cls.log")
        procs.append(
            start(
                [
                    sys.executable,
                    "-m",
                    "candor.cli",
                    "serve",
                    "--backend",
                    "openai",
                    "--model",
                    tiny_model_dir,
                    "--base-url",
                    f"http://127.0.0.1:{proxy.server_address[1]}/v1",
                    "--confidence-url",
                    f"http://127.0.0.1:{cls_port}",
                    "--head",
                    str(out),
                    "--threshold",
                    str(threshold),
                    "--max-new-tokens",
                    "6",
                    "--port",
                    str(candor_port),
                ],
                tmp_path / "candor.log",
                env,
            )
        )
        wait_healthy(f"http://127.0.0.1:{candor_port}/health", procs[2], log=tmp_path / "candor.log")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{candor_port}/v1", api_key="none")
        before = len(proxy.seen)  # the backend's own capability probe ("Hello")
        choices = []
        for q in QUESTIONS:
            reply = client.chat.completions.create(model="candor", messages=[{"role": "user", "content": q}])
            choices.append(reply.choices[0])
        confidences = [c.model_extra["confidence"]["value"] for c in choices]
        np.testing.assert_allclose(confidences, expected, atol=1e-5)
        abstained = [c.model_extra["confidence"]["abstained"] for c in choices]
        assert abstained == [bool(c < threshold) for c in expected] and any(abstained) and not all(abstained)
        sent = proxy.seen[before:]
        direct = OpenAIBackend(tiny_model_dir, base_url=f"http://127.0.0.1:{gen_port}/v1")
        for q, choice, declined in zip(QUESTIONS, choices, abstained, strict=True):
            asked = [b for b in sent if q in str(b.get("prompt", b))]
            if declined:
                assert asked == [], q  # no generation request at all for a declined question
                continue
            assert len(asked) == 1, q
            # the generation server's own greedy answer to the same prompt, asked directly
            params = SamplingParams(max_new_tokens=asked[0]["max_tokens"], stop=tuple(asked[0].get("stop") or ()))
            own = direct.generate([asked[0]["prompt"]], 0, params, greedy=True)[0].greedy.text
            assert choice.message.content == own.strip() or choice.message.content == own, (q, own)
    finally:
        for proc in reversed(procs):
            stop(proc)
        proxy.shutdown()
