"""The documented deployment on vLLM: one vLLM server generates, one serves the exported head
(``--runner pooling``), ``candor serve --backend openai --confidence-url`` sits in front.

On the embedded model (vLLM's CPU attention has no kernel for the tiny model's head size 16).
Needs vLLM, which lives in its own venv (docs/development.md "Development"); elsewhere
the module skips.
"""

from __future__ import annotations

import os
import sys
import threading
from http.server import ThreadingHTTPServer

import numpy as np
import pytest

pytest.importorskip("vllm", reason="vllm is not importable here; run these tests in the vllm venv (see README)")
openai = pytest.importorskip("openai")

from helpers import free_port, wait_healthy  # noqa: E402
from test_elical_export import embedded_head  # noqa: E402
from test_serve_classify import SRC, CountingProxy, start, stop  # noqa: E402

from candor.train.elical.export import export_seq_cls  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.server, pytest.mark.integration]

QUESTIONS = [
    "Who wrote Hamlet?",
    "What is the boiling point of water at sea level in degrees Celsius?",
    "Name the longest river in Africa, which flows through Egypt and Sudan?",
    "Which planet is known as the Red Planet?",
    "In what year did the Berlin Wall fall?",
    "What is the chemical symbol for gold?",
]


def test_the_chain_on_vllm_generation_and_vllm_classify(smollm_dir, tmp_path):
    head = embedded_head("head", tmp_path / "head")
    result = export_seq_cls(tmp_path / "head", tmp_path / "cls")
    expected = head.predict(QUESTIONS)
    threshold = float(np.median(expected))
    env = {
        **os.environ,
        "PYTHONPATH": SRC,
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
    }
    gen_port, cls_port, candor_port = free_port(), free_port(), free_port()
    vllm = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--max-model-len", "2048", "--dtype", "float32"]
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), CountingProxy)
    proxy.target, proxy.seen = f"http://127.0.0.1:{gen_port}", []  # type: ignore[attr-defined]
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    procs = []
    try:
        procs.append(start([*vllm, "--model", str(smollm_dir), "--port", str(gen_port)], tmp_path / "gen.log", env))
        # the exact flags the export prints: the pooling runner, float32, the head's bias added back
        procs.append(
            start(
                [
                    *vllm,
                    "--model",
                    result.folder,
                    "--port",
                    str(cls_port),
                    "--runner",
                    "pooling",
                    "--pooler-config",
                    result.vllm_pooler_config(),
                ],
                tmp_path / "cls.log",
                env,
            )
        )
        wait_healthy(f"http://127.0.0.1:{gen_port}/health", procs[0], log=tmp_path / "gen.log", limit=900)
        wait_healthy(f"http://127.0.0.1:{cls_port}/health", procs[1], log=tmp_path / "cls.log", limit=900)
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
                    str(smollm_dir),
                    "--base-url",
                    f"http://127.0.0.1:{proxy.server_address[1]}/v1",
                    "--confidence-url",
                    f"http://127.0.0.1:{cls_port}",
                    "--head",
                    result.folder,
                    "--threshold",
                    str(threshold),
                    "--max-new-tokens",
                    "8",
                    "--port",
                    str(candor_port),
                ],
                tmp_path / "candor.log",
                env,
            )
        )
        wait_healthy(f"http://127.0.0.1:{candor_port}/health", procs[2], log=tmp_path / "candor.log")
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{candor_port}/v1", api_key="none")
        before = len(proxy.seen)  # the backend's own capability probes
        choices = [
            client.chat.completions.create(model="candor", messages=[{"role": "user", "content": q}]).choices[0]
            for q in QUESTIONS
        ]
        np.testing.assert_allclose([c.model_extra["confidence"]["value"] for c in choices], expected, atol=1e-3)
        abstained = [c.model_extra["confidence"]["abstained"] for c in choices]
        assert any(abstained) and not all(abstained)
        sent = proxy.seen[before:]
        for q, choice, declined in zip(QUESTIONS, choices, abstained, strict=True):
            asked = [b for b in sent if q in str(b.get("prompt", b))]
            assert len(asked) == (0 if declined else 1), q
            if not declined:
                assert choice.message.content, q  # the embedded model answers something
    finally:
        for proc in reversed(procs):
            stop(proc)
        proxy.shutdown()
