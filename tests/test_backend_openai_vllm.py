"""The openai backend, and ``candor serve`` over it, against a real vLLM OpenAI-compatible server.

vLLM is the grey-box case that transformers serve is not: server-side ``n``,
log-probs, top log-probs and echoed prompt log-probs. The server runs the
embedded model on 127.0.0.1; its numbers are compared with the hf backend's
in process. Needs vLLM, which lives in its own venv (docs/development.md
"Development"); elsewhere the module skips.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("vllm", reason="vllm is not importable here; run these tests in the vllm venv (see README)")
pytest.importorskip("fastapi")

from helpers import free_port, wait_healthy  # noqa: E402
from test_backend_openai import PROMPTS, ask_candor_serve  # noqa: E402

from candor.backends.base import (  # noqa: E402
    GENERATE,
    LOGPROBS,
    NEXT_TOKEN_LOGPROBS,
    SCORE,
    TOKENIZER,
    TOP_LOGPROBS,
    SamplingParams,
)
from candor.backends.openai import SAMPLES_N, OpenAIBackend  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.server, pytest.mark.integration]

# vLLM's kernels and the hf backend's float32 forward differ in the last digits; a misread token differs by far more.
TOLERANCE = 1e-2


@pytest.fixture(scope="module")
def vllm_url(smollm_dir, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("vllm-serve") / "serve.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(smollm_dir),
        "--port",
        str(port),
        "--max-model-len",
        "2048",
    ]
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc, limit=600.0)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


@pytest.fixture(scope="module")
def remote(vllm_url, smollm_dir) -> OpenAIBackend:
    return OpenAIBackend(str(smollm_dir), base_url=vllm_url, tokenizer=str(smollm_dir), max_concurrency=2)


@pytest.fixture(scope="module")
def local(smollm_dir):
    from candor.backends.hf import HFBackend

    return HFBackend.from_pretrained(str(smollm_dir))


def test_the_probe_finds_a_grey_box_server(remote) -> None:
    assert {GENERATE, TOKENIZER, SAMPLES_N, LOGPROBS, TOP_LOGPROBS, NEXT_TOKEN_LOGPROBS, SCORE} <= remote.capabilities


def test_usage_is_split_over_choices_by_their_own_tokens(remote) -> None:
    gen = remote.generate(PROMPTS[:1], 3, SamplingParams(max_new_tokens=4), greedy=True, seeds=[5])[0]
    for completion in (gen.greedy, *gen.samples):
        assert completion.completion_tokens is not None and completion.completion_tokens >= len(completion.tokens)
        assert completion.finish_reason in ("stop", "length")
    assert gen.prompt_tokens is not None and gen.prompt_tokens > 10


def test_scores_equal_the_in_process_backend(remote, local) -> None:
    continuations = [" William Shakespeare", " Paris"]
    theirs, mine = remote.score(PROMPTS, continuations), local.score(PROMPTS, continuations)
    assert [len(t) for t in theirs] == [len(m) for m in mine] and all(mine)
    for t, m in zip(theirs, mine, strict=True):
        assert t == pytest.approx(m, abs=TOLERANCE)


def test_next_token_logprobs_equal_the_in_process_backend(remote, local) -> None:
    paris = local.tokenize(" Paris")
    theirs = remote.next_token_logprobs(PROMPTS[1:], paris)
    assert remote.last_fallbacks == 0
    np.testing.assert_allclose(theirs, local.next_token_logprobs(PROMPTS[1:], paris), atol=TOLERANCE)


def test_candor_serve_over_vllm_reports_the_servers_usage(vllm_url, smollm_dir) -> None:
    from candor.serve import Decoding, HonestModel

    backend = OpenAIBackend(str(smollm_dir), base_url=vllm_url, max_concurrency=2)  # no local tokenizer
    model = HonestModel(
        backend, confidence="n-prob", template="fewshot", decoding=Decoding(max_new_tokens=2), backend_name="openai"
    )
    status, answer = ask_candor_serve(model)
    assert status == 200, answer
    assert answer["usage"]["completion_tokens"] > 0
    assert answer["choices"][0]["finish_reason"] == "length"
    assert 0.0 <= answer["choices"][0]["confidence"]["value"] <= 1.0
