"""Issue 53, the operator's loop: an atomic reload (a request whose body arrives across a reload is answered),
the deployment's options kept by every reload, and the operator key (tiny real model, real HTTP, raw sockets;
SIGHUP on a real ``candor serve`` process)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from urllib.parse import urlsplit

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from candor.annotation.served_labels import read_served  # noqa: E402
from candor.serve import HonestModel  # noqa: E402
from candor.serve.claim_answers import ClaimPolicy  # noqa: E402
from candor.serve.deployment import Deployment  # noqa: E402
from candor.serve.http.app import ServeSettings, create_app  # noqa: E402
from candor.serve.http.server import serve_in_thread  # noqa: E402
from candor.util.errors import CandorError  # noqa: E402
from tests.test_serve_app import KEY, post  # noqa: E402
from tests.test_serve_feedback import QUESTIONS, SRC, ask, free_port, honest_model, save, wait_ready  # noqa: E402

ADMIN = "operator-key-not-secret"


@pytest.fixture(scope="module")
def backend(tiny_model, tokenizer):
    from candor.backends.hf import HFBackend

    return HFBackend(tiny_model, tokenizer, batch_size=8)


def chat_body(question: str, stream: bool = False) -> bytes:
    body = {"model": "candor", "messages": [{"role": "user", "content": question}], "max_tokens": 4}
    return json.dumps({**body, "stream": stream}).encode()


def half_sent(url: str, body: bytes) -> tuple[socket.socket, bytes]:
    """A chat request whose headers and first half of the body are sent; returns the socket and the rest."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=120)
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\n"
        f"Host: {parts.hostname}\r\n"
        f"Authorization: Bearer {KEY}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    half = len(body) // 2
    sock.sendall(head + body[:half])
    return sock, body[half:]


def finish(sock: socket.socket, rest: bytes) -> tuple[int, str]:
    """Send the rest of the body; the status and the whole response text (the server closes the connection)."""
    sock.sendall(rest)
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    sock.close()
    text = b"".join(chunks).decode()
    return int(text.split(" ", 2)[1]), text.split("\r\n\r\n", 1)[1]


def versions_in(text: str) -> set[str]:
    found = set()
    for marker in ('"model_version":"', '"model_version": "'):
        for piece in text.split(marker)[1:]:
            found.add(piece.split('"', 1)[0])
    return found


def wait_closed(engine) -> None:
    """Until ``engine`` takes no work (a retired generation's engine closes once nothing is counted on it)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            engine.call(lambda: None).result(30)
        except CandorError:
            return
        time.sleep(0.05)
    raise AssertionError("the retired engine did not close")


# ---------------------------------------------------------------- defect 1: atomic reload


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_request_whose_body_arrives_across_a_reload_is_answered_by_one_generation(backend, tmp_path, stream):
    folder = tmp_path / "honest"
    save(honest_model(backend, 0.0), folder, "v1")
    settings = ServeSettings(api_key=KEY, admin_key=ADMIN, honest_folder=folder, honest_root=tmp_path)
    app = create_app(HonestModel.from_pretrained(folder, backend=backend), settings)
    with serve_in_thread(app) as url:
        sockets = [half_sent(url, chat_body(q, stream)) for q in QUESTIONS[:3]]
        old = app.state.service.current
        save(honest_model(backend, 1.0), folder, "v2")
        status, body = post(f"{url}/admin/reload", b"", key=ADMIN)
        assert status == 200 and body["model_version"] == "v2", body
        wait_closed(old.engine)  # the old engine closes: no request was counted on it
        for sock, rest in sockets:
            status, text = finish(sock, rest)
            assert status == 200, text
            assert '"error"' not in text, text
            assert versions_in(text) == {"v2"}, text  # wholly the generation it was admitted to
            if stream:
                assert "data: [DONE]" in text, text


def test_requests_in_flight_keep_the_old_engine_open_until_they_are_done(backend, tmp_path):
    folder = tmp_path / "honest"
    save(honest_model(backend, 0.0), folder, "v1")
    settings = ServeSettings(api_key=KEY, admin_key=ADMIN, honest_folder=folder, honest_root=tmp_path)
    app = create_app(HonestModel.from_pretrained(folder, backend=backend), settings)
    with serve_in_thread(app) as url:
        service = app.state.service
        with service.admitted() as held:  # a request admitted and counted, its body parsed, its flow not started
            save(honest_model(backend, 1.0), folder, "v2")
            assert post(f"{url}/admin/reload", b"", key=ADMIN)[0] == 200
            assert held.version == "v1" and service.current.version == "v2"
            held.engine.call(lambda: None).result(30)  # still open for the request it admitted
            assert not held.admit()  # a retired generation admits nothing more
            with service.admitted() as moved:
                assert moved is service.current  # a request that reaches it moves to the current one
        wait_closed(held.engine)


# ---------------------------------------------------------------- defect 2: the deployment's options


def test_a_deployment_names_its_options_in_the_version():
    plain = Deployment()
    assert plain.version("v1") == "v1" and plain.options() == {}
    chosen = Deployment(threshold=0.3, claims=ClaimPolicy("claim-prob"))
    digest = chosen.digest
    assert len(digest) == 8 and int(digest, 16) >= 0
    assert chosen.version("v1") == f"v1+opts.{digest}" and chosen.version("v2") == f"v2+opts.{digest}"
    assert Deployment(threshold=0.3).digest != digest != Deployment(threshold=0.4, claims=chosen.claims).digest
    assert Deployment(threshold=0.3, claims=ClaimPolicy("claim-prob")).digest == digest  # a value, not an identity
    with pytest.raises(CandorError, match="threshold"):
        Deployment(threshold=1.5)


def test_a_reload_keeps_the_operators_threshold_and_claims_and_names_the_new_folder(backend, tmp_path):
    folder = tmp_path / "honest"
    save(honest_model(backend, 0.9), folder, "v1")
    deployment = Deployment(
        threshold=0.0, claims=ClaimPolicy(method="claim-prob", refine="mark", threshold=0.4), max_new_tokens=3
    )
    settings = ServeSettings(api_key=KEY, admin_key=ADMIN, honest_folder=folder, honest_root=tmp_path)
    app = create_app(HonestModel.from_pretrained(folder, backend=backend), settings, deployment)
    with serve_in_thread(app) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
        first = ask(client, QUESTIONS[0]).choices[0].model_extra["confidence"]
        assert first["model_version"] == f"v1+opts.{deployment.digest}" and first["threshold"] == 0.0
        save(honest_model(backend, 1.0), tmp_path / "next", "v2")  # a folder whose own threshold abstains on all
        status, body = post(f"{url}/admin/reload", {"honest": "next"}, key=ADMIN)
        assert status == 200 and body["model_version"] == f"v2+opts.{deployment.digest}", body
        after = ask(client, QUESTIONS[1]).choices[0]
        conf = after.model_extra["confidence"]
        assert conf["model_version"] == f"v2+opts.{deployment.digest}" and conf["threshold"] == 0.0
        assert after.finish_reason != "abstained"
        served = app.state.service.current.model
        assert served.claims is not None and served.claims.policy == deployment.claims
        assert served.decoding.max_new_tokens == 3
        metrics = urlopen_text(f"{url}/metrics")
        assert f'candor_model_info{{version="v2+opts.{deployment.digest}"}} 1.0' in metrics


def urlopen_text(url: str) -> str:
    import urllib.request

    return urllib.request.urlopen(url, timeout=30).read().decode()


@pytest.mark.slow  # a real `candor serve` process: about 20 s
def test_sighup_and_admin_reload_keep_a_running_candor_serves_options(tiny_model_dir, tmp_path):
    from candor.backends import load_backend

    generator = load_backend(tiny_model_dir, "hf")
    folder = tmp_path / "honest"
    save(honest_model(generator, 0.9), folder, "first")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", "CANDOR_API_KEY": KEY, "CANDOR_ADMIN_KEY": ADMIN}
    options = ["--threshold", "0.0", "--claims", "claim-prob"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "candor.cli", "serve", "--honest", str(folder), "--port", str(port), *options],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    digest = Deployment(threshold=0.0, claims=ClaimPolicy("claim-prob")).digest
    try:
        wait_ready(url, proc)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=120)
        conf = ask(client, QUESTIONS[0]).choices[0].model_extra["confidence"]
        assert conf["model_version"] == f"first+opts.{digest}" and conf["threshold"] == 0.0
        slow = half_sent(url, chat_body(QUESTIONS[1]))  # a body still arriving when the signal comes
        save(honest_model(generator, 1.0), folder, "second")
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            conf = ask(client, QUESTIONS[2]).choices[0].model_extra["confidence"]
            if conf["model_version"] != f"first+opts.{digest}":
                break
            time.sleep(0.2)
        assert conf["model_version"] == f"second+opts.{digest}" and conf["threshold"] == 0.0
        status, text = finish(*slow)
        assert status == 200 and versions_in(text) == {f"second+opts.{digest}"}, text
        save(honest_model(generator, 1.0), folder, "third")
        status, body = post(f"{url}/admin/reload", b"", key=ADMIN)
        assert status == 200 and body["model_version"] == f"third+opts.{digest}", body
        conf = ask(client, QUESTIONS[3]).choices[0].model_extra["confidence"]
        assert conf["threshold"] == 0.0 and not conf["abstained"]
        assert f'candor_model_info{{version="third+opts.{digest}"}} 1.0' in urlopen_text(f"{url}/metrics")
    finally:
        proc.terminate()
        proc.wait(timeout=60)


# ---------------------------------------------------------------- defect 3: the operator key


@pytest.fixture()
def operator_server(backend, tmp_path):
    """A server with both keys, a record log, and a root holding its folder, a plain file and a way out."""
    root = tmp_path / "root"
    folder = root / "honest"
    save(honest_model(backend, 0.0), folder, "v1")
    (root / "file.txt").write_text("not a folder")
    outside = tmp_path / "outside"
    save(honest_model(backend, 0.0), outside, "evil")
    (root / "escape").symlink_to(outside, target_is_directory=True)
    log = tmp_path / "served.jsonl"
    settings = ServeSettings(api_key=KEY, admin_key=ADMIN, honest_folder=folder, honest_root=root, log_records=log)
    app = create_app(HonestModel.from_pretrained(folder, backend=backend), settings)
    with serve_in_thread(app) as url:
        yield url, app, log, tmp_path


def test_admin_routes_take_the_operator_key_only(operator_server):
    url, app, _, _ = operator_server
    assert post(f"{url}/admin/reload", b"", key=KEY)[0] == 403  # the inference key is not the operator's
    assert post(f"{url}/admin/reload", b"", key=None)[0] == 401
    assert post(f"{url}/admin/reload", b"", key="wrong")[0] == 401
    status, body = post(f"{url}/admin/reload", b"", key=ADMIN)
    assert status == 200 and body["model_version"] == "v1", body


def test_without_an_operator_key_the_admin_routes_are_off_and_say_how_to_turn_them_on(backend, tmp_path):
    folder = tmp_path / "honest"
    save(honest_model(backend, 0.0), folder, "v1")
    settings = ServeSettings(api_key=KEY, honest_folder=folder)
    with serve_in_thread(create_app(HonestModel.from_pretrained(folder, backend=backend), settings)) as url:
        status, body = post(f"{url}/admin/reload", b"", key=KEY)
        assert status == 403 and body["error"]["code"] == "operator_routes_off"
        assert "CANDOR_ADMIN_KEY" in body["error"]["message"] and "--admin-key-env" in body["error"]["message"]
    with pytest.raises(CandorError, match="differ"):
        ServeSettings(api_key=KEY, admin_key=KEY)


def test_a_reload_names_a_folder_inside_the_root_and_its_errors_name_no_file_outside(operator_server):
    url, app, _, tmp_path = operator_server
    refused = [
        {"honest": 5},
        {"honest": ["honest"]},
        {"honest": ""},
        {"honest": "/etc/passwd"},
        {"honest": "/etc"},
        {"honest": "../outside"},
        {"honest": str(tmp_path / "outside")},
        {"honest": "escape"},  # a symlink out of the root
        {"honest": "file.txt"},
        {"honest": "missing"},
        {"honest": "."},
        {"honest": "honest", "threshold": 0},
    ]
    for body in refused:
        status, answer = post(f"{url}/admin/reload", body, key=ADMIN)
        assert status == 400, (body, answer)
        message = answer["error"]["message"]
        assert answer["error"]["param"] in ("honest", "threshold"), answer
        assert "Errno" not in message and str(tmp_path) not in message and "/etc" not in message[:12], message
    assert post(f"{url}/admin/reload", b"[1]", key=ADMIN)[0] == 400
    assert app.state.service.current.version == "v1"  # nothing was loaded
    broken = tmp_path / "root" / "broken"
    broken.mkdir()
    (broken / "honest.json").write_text('{\n  "generator": {"model": "x"}\n  "confidence": {}\n}\n')
    status, answer = post(f"{url}/admin/reload", {"honest": "broken"}, key=ADMIN)
    assert status == 400 and answer["error"]["code"] == "reload_failed"
    assert answer["error"]["message"] == (
        "the reload failed and the running model stays: broken/honest.json:3: malformed JSON "
        "(Expecting ',' delimiter at column 3)"
    )
    save(honest_model(app.state.service.current.model.backend, 1.0), tmp_path / "root" / "next", "v2")
    status, answer = post(f"{url}/admin/reload", {"honest": "next"}, key=ADMIN)
    assert status == 200 and answer["model_version"] == "v2"


def test_feedback_with_the_inference_key_is_the_users_and_trusted_sources_need_the_operator_key(operator_server):
    url, app, log, _ = operator_server
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    first, second = ask(client, QUESTIONS[0]).id, ask(client, QUESTIONS[1]).id
    status, body = post(f"{url}/v1/feedback", {"id": first, "correct": True}, key=KEY)
    assert status == 200 and body["label_source"] == "user", body
    status, body = post(f"{url}/v1/feedback", {"id": first, "correct": True, "label_source": "human"}, key=KEY)
    assert status == 403 and body["error"]["param"] == "label_source", body
    assert post(f"{url}/v1/feedback", {"id": first, "correct": True, "label_source": "user"}, key=KEY)[0] == 200
    for source in ("human", "audit", "judge:gpt"):
        status, body = post(f"{url}/v1/feedback", {"id": second, "correct": False, "label_source": source}, key=ADMIN)
        assert status == 200 and body["label_source"] == source, body
    assert post(f"{url}/v1/feedback", {"id": second, "correct": False}, key=ADMIN)[1]["label_source"] == "human"
    for wrong, field in (
        ({"id": second, "correct": False, "label_source": "judge:"}, "label_source"),
        ({"id": second, "correct": False, "label_source": 5}, "label_source"),
        ({"id": 5, "correct": False}, "id"),
        ({"id": second, "index": "0", "correct": False}, "index"),
        ({"id": second, "correct": "yes"}, "correct"),
    ):
        status, body = post(f"{url}/v1/feedback", wrong, key=ADMIN)
        assert status == 400 and field in body["error"]["message"], (wrong, body)
    assert post(f"{url}/v1/feedback", b"[1]", key=KEY)[0] == 400
    assert post(f"{url}/v1/feedback", {"id": first, "correct": True}, key="wrong")[0] == 401
    labels = {a.id: a.label_source for a in read_served(log).labelled()}
    assert labels == {first: "user", second: "human"}


def test_user_feedback_on_an_abstained_choice_is_refused(backend, tmp_path):
    folder = tmp_path / "honest"
    save(honest_model(backend, 1.0), folder, "v1")  # abstains on every question
    settings = ServeSettings(api_key=KEY, admin_key=ADMIN, honest_folder=folder, log_records=tmp_path / "log.jsonl")
    with serve_in_thread(create_app(HonestModel.from_pretrained(folder, backend=backend), settings)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
        refused = ask(client, QUESTIONS[0])
        assert refused.choices[0].finish_reason == "stop" and refused.choices[0].model_extra["confidence"]["abstained"]
        status, body = post(f"{url}/v1/feedback", {"id": refused.id, "correct": False}, key=KEY)
        assert status == 400 and body["error"]["code"] == "abstained" and body["error"]["param"] == "index", body
        # An operator's audit labels the withheld answer the record keeps.
        status, body = post(f"{url}/v1/feedback", {"id": refused.id, "correct": False, "label_source": "audit"}, ADMIN)
        assert status == 200, body


def test_the_cli_refuses_a_root_that_is_not_a_folder(tmp_path):
    from candor.cli.serving import reload_root

    with pytest.raises(CandorError, match="--honest-root"):
        reload_root(None, tmp_path / "missing")
    assert reload_root(tmp_path / "a" / "honest", None) == (tmp_path / "a").resolve()
    assert reload_root(None, None) is None


def test_serve_help_names_the_operator_options():
    out = subprocess.run(
        [sys.executable, "-m", "candor.cli", "serve", "--help"],
        env={**os.environ, "PYTHONPATH": SRC, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    for option in ("--admin-key-env", "--honest-root", "--max-new-tokens"):
        assert option in out
