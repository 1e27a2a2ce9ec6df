"""Small test doubles shared by several test files."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from candor.data.items import QAItem


class BlackBox:
    """The tiny HF model seen through a black-box engine (text in, text out; no hidden states)."""

    white_box = False
    capabilities = frozenset({"generate"})  # declared, so the inner backend's own do not show through

    def __init__(self, inner) -> None:
        self.inner = inner
        self.model_name = inner.model_name

    def __getattr__(self, name):
        return getattr(self.inner, name)


def annotated_records(n: int, start: int = 0, dataset: str = "toy"):
    """``n`` complete records (correctness, samples, consistency) with a fixed, learnable pattern."""
    from candor.annotation.records import Record
    from candor.backends.base import Completion
    from candor.data.items import QAItem

    out = []
    for i in range(start, start + n):
        item = QAItem(
            id=f"{dataset}:{i}",
            dataset=dataset,
            split="train",
            question=f"What is fact number {i} about {dataset}?",
            answers=("x",),
        )
        out.append(
            Record(
                item=item,
                greedy=Completion("x"),
                samples=[Completion("x")] * 4,
                greedy_correct=int(i % 3 == 0),
                sample_correct=[int(i % 3 == 0), 0, 1, 0],
                consistency=[1, i % 2, int(i % 3 == 0), 0],
                provenance={"template": "fewshot"},
            )
        )
    return out


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a server the test starts)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, limit: float = 240.0, log: Path | None = None) -> None:
    """Wait until ``url`` answers 200; fail the test (with the tail of ``log``) if ``proc`` exits or time runs out."""
    tail = (lambda: ": " + log.read_text()[-2000:]) if log is not None else (lambda: "")
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{proc.args[:5]} exited with {proc.returncode}{tail()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"{proc.args[:5]} was not healthy within {limit:.0f} s{tail()}")


def stop_group(proc: subprocess.Popen, grace: float) -> None:
    """End ``proc``'s process group (it was started with ``start_new_session``): SIGTERM, then SIGKILL after
    ``grace`` seconds. A group already gone (a server that died at start) is no error: its test reports that."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@contextlib.contextmanager
def transformers_serve(model_dir: str | Path, log: Path, *extra: str) -> Iterator[str]:
    """``transformers serve`` on ``model_dir``, offline, on a free port of 127.0.0.1: yields its /v1 URL."""
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    cmd = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(model_dir)]
    cmd += ["--port", str(port), "--device", "cpu", *extra]
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc, log=log)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def saved_elical_head(
    model_dir: str,
    folder: Path,
    mode: str = "head",
    layer: int = -1,
    seed: int = 0,
    weight_scale: float = 0.2,
    bias: float = 0.7,
    template: str = "fewshot",
):
    """An EliCal head on ``model_dir`` with a non-trivial standardization, bias and (lora mode) adapter, saved to
    ``folder`` and loaded back."""
    import torch

    from candor.train.common import load_causal_lm
    from candor.train.elical import ConfidenceHead, HeadConfig

    model, tokenizer = load_causal_lm(model_dir, device="cpu")
    lora = {"r": 4, "alpha": 8, "dropout": 0.0, "targets": ["q_proj", "v_proj"]} if mode == "lora" else None
    config = HeadConfig(backbone=model_dir, template=template, layer=layer, mode=mode, lora=lora)
    head = ConfidenceHead.create(model, tokenizer, config, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        if mode == "lora":  # LoRA's B starts at zero; move it so the adapter changes the features
            for name, p in head.backbone.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
        hidden = head.head.mean.shape[0]
        head.head.mean.copy_(torch.randn(hidden, generator=gen) * 0.3)
        head.head.scale.copy_(torch.rand(hidden, generator=gen) + 0.5)
        head.head.linear.weight.copy_(torch.randn(1, hidden, generator=gen) * weight_scale)
        head.head.linear.bias.fill_(bias)
    head.save_pretrained(folder)
    return ConfidenceHead.from_pretrained(folder, device="cpu")


# An open question and a multiple-choice one, for the verbalized-format tests.
OPEN = QAItem(id="o1", dataset="toy", split="test", question="Who wrote Hamlet?", answers=("Shakespeare",))
MC = QAItem(
    id="m1",
    dataset="toy",
    split="test",
    question="Which city is the capital of France?",
    answers=("B", "Paris"),
    choices=("Rome", "Paris", "Berlin", "Madrid"),
    answer_index=1,
    context="A short passage.",
)


def post_label(page, body: object, **headers: str | None) -> tuple[int, dict]:
    """``POST /api/label`` to a ``candor label`` page as its script sends it (JSON, with the page's token).

    ``headers`` replace or add to those (None leaves one out).
    """
    import json
    import urllib.error

    from candor.annotation.labelling import TOKEN_HEADER

    sent = {"Content-Type": "application/json", TOKEN_HEADER: page.token, **headers}
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(page.url + "api/label", data, {k: v for k, v in sent.items() if v is not None})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
