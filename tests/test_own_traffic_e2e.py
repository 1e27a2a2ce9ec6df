"""Calibrating on your own traffic, end to end (issue 43's acceptance), on the tiny model:

a real ``candor serve --honest DIR --log-records LOG`` → questions through the official client →
``POST /v1/feedback`` for some answers → ``candor label`` in Chromium (its keys) for others →
``candor adapt`` → ``POST /admin/reload`` of its folder while requests are in flight → every in-flight
request succeeds, and later responses carry the new version and its confidence.

Issue 64: the served head already ranks the two kinds of question apart, so the adapted one is not
shown to rank better: ``candor adapt`` refuses to write it over the served folder (exit 1), writes it
elsewhere marked kept, and the reload is refused (409) until the operator forces it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from browser import browser_context, watched  # noqa: F401  (fixtures)

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from candor.annotation.labelling import LabelServer  # noqa: E402
from candor.annotation.served_labels import read_served  # noqa: E402
from candor.backends.hf import HFBackend  # noqa: E402
from candor.cli.commands import run  # noqa: E402
from candor.serve import Decoding, HonestModel  # noqa: E402
from candor.serve.confidence_sources import HeadSource  # noqa: E402
from candor.train.common import load_causal_lm  # noqa: E402
from candor.train.elical import ConfidenceHead, HeadConfig  # noqa: E402
from tests.test_serve_app import post  # noqa: E402
from tests.test_serve_feedback import free_port, wait_ready  # noqa: E402

KEY = "e2e-key-not-secret"
ADMIN = "e2e-operator-key-not-secret"
RIGHT = [f"What is the capital of country number {i}?" for i in range(14)]
WRONG = [f"How many legs does the animal in picture {i} have, counting twice?" for i in range(14)]
QUESTIONS = [q for pair in zip(RIGHT, WRONG, strict=True) for q in pair]
SRC = str(Path(__file__).resolve().parents[1] / "src")


def version_of(choice) -> str:
    return choice.model_extra["confidence"]["model_version"]


def test_serve_feedback_label_adapt_reload(tiny_model_dir, tmp_path, watched):  # noqa: F811
    lm, tokenizer = load_causal_lm(tiny_model_dir, device="cpu")
    head = ConfidenceHead.create(lm, tokenizer, HeadConfig(backbone=tiny_model_dir, template="fewshot"), seed=3)
    backend = HFBackend.from_pretrained(tiny_model_dir, device="cpu")
    folder = tmp_path / "honest"
    HonestModel(
        backend, HeadSource(head), threshold=0.5, template="fewshot", decoding=Decoding(max_new_tokens=3)
    ).save_pretrained(folder)
    first_version = json.loads((folder / "honest.json").read_text())["version"]
    log, port = tmp_path / "served.jsonl", free_port()
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", "CANDOR_API_KEY": KEY, "CANDOR_ADMIN_KEY": ADMIN}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "candor.cli",
            "serve",
            "--honest",
            str(folder),
            "--port",
            str(port),
            "--log-records",
            str(log),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=300)
        served = {}
        for q in QUESTIONS:
            resp = client.chat.completions.create(model="candor", messages=[{"role": "user", "content": q}])
            assert version_of(resp.choices[0]) == first_version
            served[resp.id] = q
        # Users send feedback on half of the answers...
        ids = list(served)
        for rid in ids[:14]:
            status, body = post(f"{url}/v1/feedback", {"id": rid, "correct": served[rid] in RIGHT}, key=KEY)
            assert status == 200, body
        # ...and a person labels the rest on the `candor label` page, with its keys.
        labeller = LabelServer(log, port=0).start()
        try:
            page = watched.page
            page.goto(labeller.url)
            page.wait_for_selector("body[data-ready]", timeout=60_000)
            for saved in range(1, 15):
                text = page.text_content("#card")
                page.keyboard.press("1" if "capital" in text else "2")
                page.wait_for_selector(f"body[data-saved='{saved}']", timeout=20_000)
        finally:
            labeller.close()
        labels = {a.id: (a.label, a.label_source) for a in read_served(log).labelled()}
        assert len(labels) == len(QUESTIONS)
        assert all(labels[rid] == (served[rid] in RIGHT, "user") for rid in ids[:14])
        assert all(labels[rid] == (served[rid] in RIGHT, "human") for rid in ids[14:])
        # candor adapt: never over the served folder unless promotable; into a new folder beside it, marked.
        adapt = ["adapt", str(log), "--alpha", "0.5", "--k", "2", "--label-sources", "human,user"]
        # 14 labels of each source: the people's alone are too few for α = 0.5
        with pytest.raises(SystemExit) as done:
            run([*adapt, "--honest", str(folder), "-o", str(folder)])
        assert done.value.code == 1  # kept: nothing was written over the served folder
        assert json.loads((folder / "honest.json").read_text())["version"] == first_version
        with pytest.raises(SystemExit) as done:
            run([*adapt, "--honest", str(folder), "-o", str(tmp_path / "v2")])
        assert done.value.code == 0
        adapted = json.loads((tmp_path / "v2" / "adapt.json").read_text())
        assert adapted["promotion"]["status"] == "kept" and adapted["promotion"]["difference"] <= 0
        new_version = json.loads((tmp_path / "v2" / "honest.json").read_text())["version"]
        assert new_version != first_version
        results, errors, stop = [], [], threading.Event()

        def traffic(q: str) -> None:
            while not stop.is_set():
                try:
                    results.append(
                        version_of(
                            client.chat.completions.create(
                                model="candor", messages=[{"role": "user", "content": q}]
                            ).choices[0]
                        )
                    )
                except Exception as exc:  # noqa: BLE001 - every failure is reported below
                    errors.append(exc)

        threads = [threading.Thread(target=traffic, args=(q,)) for q in QUESTIONS[:4]]
        for t in threads:
            t.start()
        time.sleep(1.0)
        status, body = post(f"{url}/admin/reload", {"honest": "v2"}, key=ADMIN)  # kept: refused until forced
        assert status == 409 and body["error"]["code"] == "not_promotable", body
        status, body = post(f"{url}/admin/reload", {"honest": "v2", "force": True}, key=ADMIN)
        assert status == 200 and body["model_version"] == new_version, body
        deadline = time.monotonic() + 180
        while new_version not in results and time.monotonic() < deadline and not errors:
            time.sleep(0.2)
        stop.set()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors[:3]
        assert first_version in results and new_version in results
        assert results.index(new_version) < len(results)  # the new version answers after the reload
        after = client.chat.completions.create(model="candor", messages=[{"role": "user", "content": RIGHT[0]}])
        conf = after.choices[0].model_extra["confidence"]
        assert conf["model_version"] == new_version and conf["method"] == "elical"
        assert conf["threshold"] == pytest.approx(adapted["threshold"]["value"])
        metrics = urllib.request.urlopen(f"{url}/metrics", timeout=30).read().decode()
        assert f'candor_model_info{{version="{new_version}"}} 1.0' in metrics
    finally:
        proc.terminate()
        proc.wait(timeout=60)
