"""Feedback on served answers, the accuracy and drift it shows on /metrics, and reloading the model while serving
(tiny real model, real HTTP, the official client; SIGHUP on a real ``candor serve`` process)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from candor.annotation.served_labels import read_served  # noqa: E402
from candor.serve import Decoding, HonestModel, Threshold  # noqa: E402
from candor.serve.http.app import ServeSettings, create_app  # noqa: E402
from candor.serve.http.server import serve_in_thread  # noqa: E402
from tests.test_serve_app import KEY, get, post  # noqa: E402

QUESTIONS = [f"Which river flows through the valley number {i}?" + " Quickly." * (i % 3) for i in range(40)]
SRC = str(Path(__file__).resolve().parents[1] / "src")
ADMIN = "operator-key-not-secret"


def honest_model(backend, threshold: float, rule: str = "risk", target: float = 0.2) -> HonestModel:
    model = HonestModel(backend, confidence="n-prob", template="fewshot", decoding=Decoding(max_new_tokens=4))
    model.threshold = Threshold(
        threshold, rule=rule, target=target, expected_accuracy=0.9, expected_coverage=0.5, n_dev=100, delta=0.1
    )
    return model


@pytest.fixture(scope="module")
def backend(tiny_model, tokenizer):
    from candor.backends.hf import HFBackend

    return HFBackend(tiny_model, tokenizer, batch_size=8)


def metric(url: str, name: str, labels: str = "") -> float | None:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=30).read().decode()
    for line in text.splitlines():
        if line.startswith(f"{name}{labels} ") or (not labels and line.startswith(f"{name} ")):
            return float(line.rsplit(" ", 1)[1])
    return None


def ask(client, question: str):
    return client.chat.completions.create(
        model="candor", messages=[{"role": "user", "content": question}], max_tokens=4
    )


# ---------------------------------------------------------------- feedback


def test_feedback_labels_the_served_record_and_later_labels_win(backend, tmp_path):
    log = tmp_path / "served.jsonl"
    model = honest_model(backend, threshold=0.0)  # answers everything
    with serve_in_thread(create_app(model, ServeSettings(api_key=KEY, admin_key=ADMIN, log_records=log))) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
        first, second = ask(client, QUESTIONS[0]), ask(client, QUESTIONS[1])
        status, body = post(f"{url}/v1/feedback", {"id": first.id, "index": 0, "correct": False})
        assert status == 200 and body["label_source"] == "user" and body["model_version"] == model.version
        relabel = {"id": first.id, "index": 0, "correct": True, "label_source": "human"}
        assert post(f"{url}/v1/feedback", relabel, key=ADMIN)[0] == 200
        assert post(f"{url}/v1/feedback", {"id": second.id, "correct": False})[0] == 200
        status, body = post(f"{url}/v1/feedback", {"id": "chatcmpl-never-served", "index": 0, "correct": True})
        assert status == 404 and body["error"]["code"] == "not_found" and body["error"]["param"] == "id"
        assert post(f"{url}/v1/feedback", {"id": first.id, "index": 3, "correct": True})[0] == 404
        status, body = post(f"{url}/v1/feedback", {"id": first.id, "index": 0, "correct": "yes"})
        assert status == 400 and "correct" in body["error"]["message"]
        assert post(f"{url}/v1/feedback", {"id": first.id, "index": 0, "correct": True}, key=None)[0] == 401
        assert metric(url, "candor_feedback_total", '{answered="true",correct="true"}') == 1.0
        assert metric(url, "candor_feedback_total", '{answered="true",correct="false"}') == 2.0
    served = {a.id: a for a in read_served(log).answers}
    assert served[first.id].label is True and served[first.id].label_source == "human"
    assert served[second.id].label is False
    assert served[first.id].record.item.question == QUESTIONS[0]


def test_feedback_without_a_record_log_says_how_to_get_one(backend):
    with serve_in_thread(create_app(honest_model(backend, 0.0), ServeSettings())) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        status, body = post(f"{url}/v1/feedback", {"id": ask(client, QUESTIONS[0]).id, "correct": True}, key=None)
        assert status == 400 and "--log-records" in body["error"]["message"]


def metrics_text(url: str) -> str:
    return urllib.request.urlopen(f"{url}/metrics", timeout=30).read().decode()


def test_metrics_show_the_audited_accuracy_against_the_promise(backend, tmp_path):
    model = honest_model(backend, threshold=0.0, target=0.2)  # promises 80% accuracy of answered questions
    settings = ServeSettings(log_records=tmp_path / "log.jsonl", admin_key=ADMIN)
    with serve_in_thread(create_app(model, settings)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        ids = [ask(client, q).id for q in QUESTIONS[:30]]
        assert metric(url, "candor_promised_accuracy") != metric(url, "candor_promised_accuracy")  # NaN before
        for rid in ids:  # end-user feedback is not a uniform sample: the audit does not count it
            post(f"{url}/v1/feedback", {"id": rid, "correct": False}, key=None)
        assert metric(url, "candor_feedback_audited") != metric(url, "candor_feedback_audited")
        for k, rid in enumerate(ids):
            audit = {"id": rid, "correct": k % 3 == 0, "label_source": "audit"}
            assert post(f"{url}/v1/feedback", audit, key=ADMIN)[0] == 200  # an audit is the operator's
            assert post(f"{url}/v1/feedback", audit | {"correct": True}, key=ADMIN)[0] == 200  # not counted again
        assert metric(url, "candor_feedback_audited") == 30.0
        assert metric(url, "candor_feedback_accuracy") == pytest.approx(10 / 30)
        assert metric(url, "candor_promised_accuracy") == pytest.approx(0.8)
        assert metric(url, "candor_feedback_accuracy_upper") <= 0.8
        assert metric(url, "candor_calibration_drift") == 1.0
        assert metric(url, "candor_calibration_unconfirmed") == 1.0
        assert metric(url, f'candor_model_info{{version="{model.version}"}}') == 1.0
        help_line = next(line for line in metrics_text(url).splitlines() if "HELP candor_calibration_drift" in line)
        assert 'label_source "audit"' in help_line


def test_labels_on_abstained_choices_are_not_audited(backend, tmp_path):
    model = honest_model(backend, threshold=1.0)  # abstains on everything
    settings = ServeSettings(log_records=tmp_path / "log.jsonl", admin_key=ADMIN)
    with serve_in_thread(create_app(model, settings)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        rid = ask(client, QUESTIONS[0]).id
        status, body = post(f"{url}/v1/feedback", {"id": rid, "correct": True, "label_source": "audit"}, key=ADMIN)
        assert status == 200, body
        assert metric(url, "candor_feedback_audited") != metric(url, "candor_feedback_audited")  # NaN: none


# ---------------------------------------------------------------- reload


def save(model: HonestModel, folder: Path, version: str) -> None:
    model.version = version
    model.save_pretrained(folder)


def test_a_reload_swaps_the_model_without_dropping_or_mixing_requests(backend, tmp_path):
    folder = tmp_path / "honest"
    low, high = honest_model(backend, 0.0), honest_model(backend, 1.0)  # answers all / abstains on all
    save(low, folder, "v1")
    served = HonestModel.from_pretrained(folder, backend=backend)
    settings = ServeSettings(api_key=KEY, admin_key=ADMIN, honest_folder=folder, honest_root=tmp_path)
    with serve_in_thread(create_app(served, settings)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
        assert ask(client, QUESTIONS[0]).choices[0].model_extra["confidence"]["model_version"] == "v1"
        save(high, folder, "v2")
        results, errors = [], []

        def traffic(q: str) -> None:
            try:
                results.append(ask(client, q).choices[0])
            except Exception as exc:  # noqa: BLE001 - every failure is reported below
                errors.append(exc)

        threads = [threading.Thread(target=traffic, args=(q,)) for q in QUESTIONS[:12]]
        for t in threads[:6]:
            t.start()
        status, body = post(f"{url}/admin/reload", b"", key=ADMIN)
        for t in threads[6:]:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert status == 200 and body["model_version"] == "v2", body
        assert not errors and len(results) == 12
        for choice in results:  # each answered wholly by one version: v1 answers, v2 abstains
            conf = choice.model_extra["confidence"]
            assert conf["model_version"] in ("v1", "v2")
            assert conf["abstained"] is (conf["model_version"] == "v2")
            assert conf["threshold"] == (0.0 if conf["model_version"] == "v1" else 1.0)
        after = ask(client, QUESTIONS[20]).choices[0]
        assert after.model_extra["confidence"]["model_version"] == "v2" and after.finish_reason == "stop"
        assert metric(url, 'candor_model_info{version="v2"}') == 1.0
        assert metric(url, 'candor_model_info{version="v1"}') is None
        assert metric(url, "candor_reloads_total", '{outcome="ok"}') == 1.0
        status, body = post(f"{url}/admin/reload", {"honest": str(tmp_path / "missing")}, key=ADMIN)
        assert status == 400 and body["error"]["param"] == "honest"
        assert ask(client, QUESTIONS[21]).choices[0].model_extra["confidence"]["model_version"] == "v2"
        assert post(f"{url}/admin/reload", b"", key=None)[0] == 401


def test_a_reload_of_a_malformed_folder_names_the_file_and_keeps_the_model(backend, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "honest.json").write_text('{\n  "generator": {"model": "x"}\n  "confidence": {}\n}\n')
    settings = ServeSettings(admin_key=ADMIN, honest_root=tmp_path)
    with serve_in_thread(create_app(honest_model(backend, 0.0), settings)) as url:
        status, body = post(f"{url}/admin/reload", {"honest": str(broken)}, key=ADMIN)
        assert status == 400 and body["error"]["code"] == "reload_failed", body
        assert body["error"]["message"] == (
            "the reload failed and the running model stays: broken/honest.json:3: malformed JSON (Expecting ',' "
            "delimiter at column 3)"
        )
        assert metric(url, "candor_reloads_total", '{outcome="failed"}') == 1.0


def test_reload_without_a_folder_says_what_to_pass(backend):
    with serve_in_thread(create_app(honest_model(backend, 0.0), ServeSettings(admin_key=ADMIN))) as url:
        status, body = post(f"{url}/admin/reload", b"", key=ADMIN)
        assert status == 400 and "--honest" in body["error"]["message"]


def test_sighup_reloads_a_running_candor_serve(tiny_model_dir, tmp_path, backend):
    folder = tmp_path / "honest"
    from candor.backends import load_backend

    generator = load_backend(tiny_model_dir, "hf")
    save(honest_model(generator, 0.0), folder, "first")
    port = free_port()
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", "CANDOR_API_KEY": KEY}
    proc = subprocess.Popen(
        [sys.executable, "-m", "candor.cli", "serve", "--honest", str(folder), "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
        assert ask(client, QUESTIONS[0]).choices[0].model_extra["confidence"]["model_version"] == "first"
        save(honest_model(generator, 1.0), folder, "second")
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            version = ask(client, QUESTIONS[1]).choices[0].model_extra["confidence"]["model_version"]
            if version == "second":
                break
            time.sleep(0.5)
        assert version == "second"
        assert get(f"{url}/health")[0] == 200
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"candor serve exited: {proc.stderr.read()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/ready", timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError("candor serve did not become ready")


def test_served_records_carry_the_response_id_and_model_version(backend, tmp_path):
    log = tmp_path / "served.jsonl"
    model = honest_model(backend, 0.0)
    with serve_in_thread(create_app(model, ServeSettings(log_records=log))) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        resp = client.completions.create(model="candor", prompt=QUESTIONS[:2], max_tokens=4, n=2)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [x["provenance"]["served"]["id"] for x in lines] == [resp.id, resp.id]
    assert sorted(tuple(x["provenance"]["served"]["indexes"]) for x in lines) == [(0, 1), (2, 3)]
    assert {x["provenance"]["model_version"] for x in lines} == {model.version}
