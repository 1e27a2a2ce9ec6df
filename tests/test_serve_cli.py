"""``candor ask`` and ``candor serve`` end to end on the tiny model (a real subprocess for the server)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from typer.testing import CliRunner

from candor.cli import app

SRC = str(Path(__file__).resolve().parents[1] / "src")


def test_ask_prints_an_answer_with_its_confidence(tiny_model_dir):
    result = CliRunner().invoke(
        app,
        [
            "ask",
            "Who wrote Hamlet?",
            "--model",
            tiny_model_dir,
            "--json",
            "--max-new-tokens",
            "4",
            "--threshold",
            "1.0",
        ],
    )
    assert result.exit_code == 0, result.output
    # The runner mixes stderr (logging, progress bars) into the output; the answer is the JSON line.
    line = next(x for x in result.output.splitlines() if '{"answer"' in x)
    out = json.loads(line[line.index('{"answer"') :])
    assert out["method"] == "n-prob" and out["threshold"] == 1.0
    assert out["abstained"] is (out["confidence"] < 1.0) and out["answer"] is None


def test_ask_with_conflicting_sources_is_a_one_line_error(tiny_model_dir, tmp_path):
    result = CliRunner().invoke(
        app, ["ask", "q", "--model", tiny_model_dir, "--head", str(tmp_path), "--method", "n-prob"]
    )
    assert result.exit_code == 2 and "not both" in result.output


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _call(url: str, body: dict | None, key: str) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, data=data, headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.slow  # over a minute on 2 shared cores (make test-slow)
def test_candor_serve_runs_with_a_key_from_the_environment(tiny_model_dir):
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": SRC, "MY_SERVE_KEY": "s3cret", "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "candor.cli",
        "serve",
        "--model",
        tiny_model_dir,
        "--port",
        str(port),
        "--api-key-env",
        "MY_SERVE_KEY",
        "--max-new-tokens",
        "4",
        "--threshold",
        "0.0",
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"candor serve did not start: {proc.stderr.read().decode()[-2000:]}")
                time.sleep(0.5)
        body = {"model": "candor", "messages": [{"role": "user", "content": "Who wrote Hamlet?"}]}
        assert _call(f"{base}/v1/chat/completions", body, "wrong")[0] == 401
        status, resp = _call(f"{base}/v1/chat/completions", body, "s3cret")
        assert status == 200 and resp["choices"][0]["confidence"]["threshold"] == 0.0
        assert resp["choices"][0]["finish_reason"] in ("stop", "length")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_ask_loads_a_saved_honest_model(tiny_model_dir, tmp_path):
    from candor.backends.hf import HFBackend
    from candor.serve import Decoding, HonestModel, Threshold

    backend = HFBackend.from_pretrained(tiny_model_dir, device="cpu")
    folder = HonestModel(
        backend, "min-prob", threshold=Threshold(0.0, expected_coverage=1.0), decoding=Decoding(max_new_tokens=3)
    ).save_pretrained(tmp_path / "honest")
    result = CliRunner().invoke(app, ["ask", "Who wrote Hamlet?", "--honest", str(folder), "--json"])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if '{"answer"' in x)
    out = json.loads(line[line.index('{"answer"') :])
    assert out["method"] == "min-prob" and out["threshold"] == 0.0 and out["abstained"] is False
    assert out["completion_tokens"] <= 3


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["serve", "--method", "probe"], "needs a trained probe"),
        (["serve", "--method", "semantic-entropy", "--samples", "0"], "reads sampled answers"),
        (["serve", "--method", "elical"], "--head"),
        (["serve", "--threshold", "1.5"], "--threshold must be a confidence in [0, 1]"),
        (["serve", "--threshold", "nan"], "--threshold must be a confidence in [0, 1]"),
        (["serve", "--abstain-as", "hidden", "--port", "0"], "--abstain-as must be one of text, refusal"),
        (["serve", "--stream", "live", "--port", "0"], "--stream live needs --abstain-as refusal"),
        (["serve", "--store-max-rows", "10", "--port", "0"], "need --store or --log-records"),
        (["ask", ""], "the question is empty"),
        (["ask", "   "], "the question is empty"),
    ],
)
def test_bad_choices_are_refused_in_one_line_before_the_model_loads(args, says, tmp_path):
    """Issue 23, defects 3 and 11: a model path that does not exist proves nothing was loaded first."""
    result = CliRunner().invoke(app, [*args, "--model", str(tmp_path / "no-such-model")])
    assert result.exit_code == 2, result.output
    assert says in result.output and "no-such-model" not in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{\n  "generator": {"model": "x"}\n  "confidence": {}\n}\n', ":3: malformed JSON (Expecting ',' delimiter"),
        (
            '{"generator": {"backend": "hf"}, "confidence": {"kind": "estimator", "name": "n-prob"}}',
            ": missing the field 'generator.model'",
        ),
    ],
)
def test_serve_names_the_file_of_a_bad_honest_model(tmp_path, capsys, text, says):
    from candor.cli import run

    folder = tmp_path / "honest"
    folder.mkdir()
    (folder / "honest.json").write_text(text)
    with pytest.raises(SystemExit) as exit_info:
        run(["serve", "--honest", str(folder)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"error: {folder / 'honest.json'}{says}"), err


@pytest.mark.slow  # over a minute on 2 shared cores (make test-slow)
def test_serve_without_a_threshold_warns_at_startup(tiny_model_dir):
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "candor.cli",
        "serve",
        "--model",
        tiny_model_dir,
        "--port",
        str(port),
        "--max-new-tokens",
        "4",
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            if "no threshold" in line or "Uvicorn running" in line:
                break
        assert any("no threshold" in x and "none abstains" in x for x in lines), lines
    finally:
        proc.terminate()
        proc.wait(timeout=30)
