"""``candor serve`` starts fast or fails fast: the generation server checked in seconds, the port before the model.

Real servers on 127.0.0.1 throughout: ``http.server`` servers written here (one
listing another model, one that never answers), a closed port, and for the
serving-on-engines recipe of docs/serving.md the real ``transformers serve`` and
``candor serve-head`` processes, run from the page's own text.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers import free_port, saved_elical_head, stop_group, wait_healthy

from candor.util.errors import UpstreamError

ROOT = Path(__file__).resolve().parents[1]
SRC = str(ROOT / "src")
SERVING = ROOT / "docs" / "serving.md"  # the recipe's page


class ListsOneModel(BaseHTTPRequestHandler):
    """``GET /v1/models`` lists ``served-model``; a generation request waits ``server.hang`` seconds, then 404."""

    def do_GET(self) -> None:
        self._send(200, {"object": "list", "data": [{"id": "served-model", "object": "model"}]})

    def do_POST(self) -> None:
        self.server.posts += 1  # type: ignore[attr-defined]
        time.sleep(self.server.hang)  # type: ignore[attr-defined]
        self._send(404, {"detail": "no such route"})

    def _send(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture()
def lister():
    server = ThreadingHTTPServer(("127.0.0.1", 0), ListsOneModel)
    server.posts, server.hang, server.daemon_threads = 0, 0.0, True  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


def openai_backend(model: str, url: str):
    pytest.importorskip("openai")
    from candor.backends.openai import OpenAIBackend

    return OpenAIBackend(model, base_url=url)


def test_no_server_at_the_address_is_one_line_in_seconds_saying_how_to_fix_it():
    backend = openai_backend("m", f"http://127.0.0.1:{free_port()}/v1")
    start = time.monotonic()
    with pytest.raises(UpstreamError) as caught:
        _ = backend.capabilities
    assert time.monotonic() - start < 5  # the client's retries alone took over 15 s
    message = str(caught.value)
    assert "no generation server answers at http://127.0.0.1:" in message and "--base-url" in message
    assert "transformers serve" in message and "\n" not in message


def test_a_server_serving_another_model_names_it_and_the_fix(lister):
    backend = openai_backend("HuggingFaceTB/SmolLM2-135M-Instruct", f"http://127.0.0.1:{lister.server_port}/v1")
    with pytest.raises(UpstreamError) as caught:
        _ = backend.capabilities
    message = str(caught.value)
    assert "serves 'served-model', not 'HuggingFaceTB/SmolLM2-135M-Instruct'" in message, message
    assert "--model" in message
    assert lister.posts == 0  # refused before any generation request


def test_a_server_that_never_answers_is_refused_after_the_listing_timeout():
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()  # accepts connections, answers nothing
    try:
        backend = openai_backend("m", f"http://127.0.0.1:{silent.getsockname()[1]}/v1")
        start = time.monotonic()
        with pytest.raises(UpstreamError, match="did not list its models within 5 s"):
            _ = backend.capabilities
        assert time.monotonic() - start < 12
    finally:
        silent.close()


def test_a_busy_port_is_refused_before_the_model_loads():
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        port = busy.getsockname()[1]
        env = {**os.environ, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1"}
        for command in (["serve"], ["serve-head", "no-such-folder"]):
            done = subprocess.run(
                [sys.executable, "-m", "candor.cli", *command, "--port", str(port)],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 2, done.stderr
            # the one error line and nothing before it: no model load, no engine (before: exit 3 after the load)
            assert done.stderr.strip().splitlines() == [
                f"error: cannot listen on 127.0.0.1:{port} (Address already in use): another process holds it; "
                "stop it or pass another --port"
            ], done.stderr
    finally:
        busy.close()


def start(cmd: list[str], log: Path, env: dict[str, str], **kwargs) -> subprocess.Popen:
    with log.open("w") as sink:
        return subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True, **kwargs)


def test_sigterm_during_a_slow_startup_ends_the_process_at_once(lister, tiny_model_dir, tmp_path):
    """The generation server lists the model but its probe never returns: SIGTERM must not wait for it."""
    pytest.importorskip("fastapi")
    from candor.serve.http.classify_server import load_classify_app
    from candor.serve.http.server import serve_in_thread
    from candor.train.elical.export import export_seq_cls

    saved_elical_head(tiny_model_dir, tmp_path / "head")
    export_seq_cls(tmp_path / "head", tmp_path / "seq-cls")
    lister.hang = 600.0
    env = {**os.environ, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    with serve_in_thread(load_classify_app(tmp_path / "seq-cls")) as classify_url:
        proc = start(
            [
                sys.executable,
                "-m",
                "candor.cli",
                "serve",
                "--backend",
                "openai",
                "--model",
                "served-model",
                "--base-url",
                f"http://127.0.0.1:{lister.server_port}/v1",
                "--confidence-url",
                classify_url,
                "--head",
                str(tmp_path / "seq-cls"),
                "--port",
                str(free_port()),
            ],
            tmp_path / "candor.log",
            env,
        )
        try:
            deadline = time.monotonic() + 240
            while lister.posts == 0:  # the probe request is in flight
                assert proc.poll() is None, (tmp_path / "candor.log").read_text()
                assert time.monotonic() < deadline, "candor serve never sent its probe"
                time.sleep(0.2)
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)  # before: "draining…", then over a minute blocked in the probe
        finally:
            stop_group(proc, grace=30)


# ---------------------------------------------------------------- the docs recipe, as written


def serving_engine_recipe() -> list[str]:
    """The commands of docs/serving.md's "Without vLLM" block, continuation lines joined, comments dropped."""
    section = SERVING.read_text().split("Without vLLM", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "docs/serving.md's serving-on-engines section has no bash block after 'Without vLLM'"
    text = block.group(1).replace("\\\n", " ")
    return [line.split("  #", 1)[0].strip() for line in text.splitlines() if line.strip()]


def test_the_docs_recipe_names_the_model_the_same_way_on_both_sides():
    lines = serving_engine_recipe()
    assert lines[1] == "MODEL=$(candor model-path)"
    assert lines[2].startswith('transformers serve "$MODEL" ') and '--model "$MODEL"' in lines[4]


def command_wrappers(folder: Path) -> Path:
    """``candor`` and ``transformers`` on PATH, running this checkout and this interpreter."""
    folder.mkdir()
    for name, module in (("candor", "candor.cli"), ("transformers", "transformers.cli.transformers")):
        script = folder / name
        script.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m {module} "$@"\n')
        script.chmod(0o755)
    return folder


@pytest.mark.server
@pytest.mark.integration
def test_the_docs_serving_on_engines_recipe_runs_as_written(smollm_dir, tmp_path):
    """Every line of the docs block, in a shell, on the embedded default; only the ports are made free ones."""
    openai = pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    ports = {"8000": str(free_port()), "8001": str(free_port()), "8080": str(free_port())}
    lines = [re.sub(r"\b(8000|8001|8080)\b", lambda m: ports[m.group(1)], line) for line in serving_engine_recipe()]
    saved_elical_head(str(smollm_dir), tmp_path / "runs" / "elical")  # "a head trained on it in runs/elical"
    path = f"{command_wrappers(tmp_path / 'bin')}:{os.environ['PATH']}"
    env = {**os.environ, "PATH": path, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    shell = ["bash", "-c"]
    subprocess.run([*shell, lines[0]], cwd=tmp_path, env=env, check=True, capture_output=True)  # candor export
    model = subprocess.run(
        [*shell, lines[1] + ' && echo "$MODEL"'], cwd=tmp_path, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()
    assert model == str(smollm_dir)
    procs: list[subprocess.Popen] = []
    try:
        for i, (line, ready) in enumerate(zip(lines[2:], ("/v1/models", "/health", "/ready"), strict=True)):
            log = tmp_path / f"step{i}.log"
            procs.append(start([*shell, f"{lines[1]} && exec {line}"], log, env, cwd=tmp_path))
            port = re.search(r"--port (\d+)", line).group(1)
            wait_healthy(f"http://127.0.0.1:{port}{ready}", procs[-1], log=log)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{ports['8080']}/v1", api_key="none")
        reply = client.chat.completions.create(model="candor", messages=[{"role": "user", "content": "2+2?"}])
        confidence = reply.choices[0].model_extra["confidence"]
        assert 0.0 <= confidence["value"] <= 1.0 and confidence["threshold"] == 0.42
        assert confidence["abstained"] == (confidence["value"] < 0.42)
        assert reply.choices[0].finish_reason in ("stop", "length")  # an abstention ends with "stop" too
        with urllib.request.urlopen(f"http://127.0.0.1:{ports['8000']}/v1/models") as listing:
            assert [m["id"] for m in json.loads(listing.read())["data"]] == [model]
    finally:
        for proc in reversed(procs):
            stop_group(proc, grace=30)
