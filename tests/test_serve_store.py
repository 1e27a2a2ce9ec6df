"""`candor serve` on the store (issue 53, defect 8 and parts 5-6): feedback outlives the process, replicas on one
PostgreSQL share it, `candor label` and `candor adapt` read it (tiny real model, real HTTP, the official client)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from candor.annotation.labelling import LabelServer  # noqa: E402
from candor.annotation.served_labels import read_served  # noqa: E402
from candor.annotation.served_store import ServedStore  # noqa: E402
from candor.cli.commands import run  # noqa: E402
from candor.serve.adaptation import read_served_answers  # noqa: E402
from candor.serve.http.app import ServeSettings, create_app  # noqa: E402
from candor.serve.http.server import serve_in_thread  # noqa: E402
from tests.helpers import post_label  # noqa: E402
from tests.test_serve_app import KEY, post  # noqa: E402
from tests.test_serve_feedback import (  # noqa: E402
    ADMIN,  # noqa: E402
    QUESTIONS,
    SRC,
    ask,
    free_port,
    honest_model,
    save,
    wait_ready,
)


@pytest.fixture(scope="module")
def backend(tiny_model, tokenizer):
    from candor.backends.hf import HFBackend

    return HFBackend(tiny_model, tokenizer, batch_size=8)


def client(url: str):
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)


def test_feedback_finds_a_response_served_before_a_restart(backend, tmp_path):
    """The store, not the process, remembers what was served (on 2358ef5 the index lived in memory: 404)."""
    log = tmp_path / "served.jsonl"
    settings = ServeSettings(api_key=KEY, log_records=log)
    with serve_in_thread(create_app(honest_model(backend, 0.0), settings)) as url:
        served = ask(client(url), QUESTIONS[0])
    assert (tmp_path / "served.db").exists()  # --log-records alone: a SQLite store beside the export
    with serve_in_thread(create_app(honest_model(backend, 0.0), settings)) as url:
        status, body = post(f"{url}/v1/feedback", {"id": served.id, "index": 0, "correct": True})
        assert status == 200, body
    assert [(a.key, a.label) for a in read_served(log).labelled()] == [((served.id, 0), True)]  # the export too
    with ServedStore(f"sqlite:///{tmp_path / 'served.db'}") as store:
        (answer,) = store.served_log().labelled()
        assert answer.returned == served.choices[0].message.content and answer.scored is True


def test_two_replicas_on_one_postgres_take_labels_for_each_others_responses(backend, postgres_url, tmp_path, capsys):
    settings = ServeSettings(api_key=KEY, store=postgres_url, admin_key=ADMIN)
    first = serve_in_thread(create_app(honest_model(backend, 0.0), settings))
    second = serve_in_thread(create_app(honest_model(backend, 0.0), settings))
    with first as one, second as two:
        ids_one = [ask(client(one), q).id for q in QUESTIONS[:3]]
        ids_two = [ask(client(two), q).id for q in QUESTIONS[3:6]]
        for rid in ids_one:  # labelled on the replica that did not serve them
            audit = {"id": rid, "index": 0, "correct": True, "label_source": "audit"}
            status, body = post(f"{two}/v1/feedback", audit, key=ADMIN)
            assert status == 200, body
        for rid in ids_two:
            label = {"id": rid, "index": 0, "correct": False, "label_source": "audit"}
            assert post(f"{one}/v1/feedback", label, key=ADMIN)[0] == 200
        assert post(f"{one}/v1/feedback", {"id": "chatcmpl-never", "index": 0, "correct": True})[0] == 404
        time.sleep(1.1)  # /metrics reads new audit labels from the store at most once a second
        audited = [audit_gauges(url) for url in (one, two)]
    # Both replicas show the same audit: all six labels, whichever replica took them.
    assert audited[0] == audited[1] and audited[0]["candor_feedback_audited"] == 6.0
    assert audited[0]["candor_feedback_accuracy"] == 0.5
    log = read_served_answers(postgres_url)  # what candor adapt --store reads: both replicas' traffic
    assert [a.record.item.question for a in log.answers] == QUESTIONS[:6]
    labels = {a.id: a.label for a in log.labelled()}
    assert labels == {**dict.fromkeys(ids_one, True), **dict.fromkeys(ids_two, False)}
    with pytest.raises(SystemExit) as done:
        run(["adapt", "--store", postgres_url, "--honest", str(tmp_path / "h"), "-o", str(tmp_path / "out")])
    assert done.value.code == 2 and "6 labelled answers" in capsys.readouterr().err


def audit_gauges(url: str) -> dict[str, float]:
    """The audit's gauges on ``/metrics`` (the current model version's)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    names = ("candor_feedback_audited", "candor_feedback_accuracy", "candor_feedback_accuracy_upper")
    return {n: float(line.split()[-1]) for line in text.splitlines() for n in names if line.startswith(n + " ")}


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def test_the_label_page_reads_one_question_per_view_not_the_whole_log(tmp_path):
    """Each view decodes one served record from the store (the old page re-read the whole file per request)."""
    from candor.annotation.served_store import ServedChoice

    url = f"sqlite:///{tmp_path / 'served.db'}"
    with ServedStore(url) as store:
        for i in range(300):
            rec = {
                "item": {"id": f"q{i}", "question": f"question {i}", "answers": []},
                "greedy": {"text": "x"},
                "samples": [],
            }
            store.record(rec, f"chatcmpl-{i}", [ServedChoice(index=0, answered=True, returned="x", scored=True)], "v")
        for i in range(120):
            store.add_label(f"chatcmpl-{i}", 0, True, "human")
    page = LabelServer(url, port=0).start()
    try:
        before = page.store.records_read
        first = get_json(page.url + "api/item")
        assert (first["pos"], first["total"], first["left"]) == (120, 300, 180)
        assert first["item"]["question"] == "question 120"
        far = get_json(page.url + "api/item?pos=299")
        assert far["item"]["id"] == "chatcmpl-299"
        assert page.store.records_read - before == 2
        status, body = post_label(page, {"id": "chatcmpl-120", "index": 0, "correct": False})
        assert (status, body) == (200, {"left": 179})
        assert page.store.records_read - before == 2  # a label reads no record
    finally:
        page.close()


def test_an_audit_page_labels_a_seeded_sample_as_audit(tmp_path):
    from candor.annotation.served_store import ServedChoice

    url = f"sqlite:///{tmp_path / 'served.db'}"
    with ServedStore(url) as store:
        for i in range(30):
            rec = {
                "item": {"id": f"q{i}", "question": f"question {i}", "answers": []},
                "greedy": {"text": "x"},
                "samples": [],
            }
            store.record(
                rec, f"chatcmpl-{i}", [ServedChoice(index=0, answered=i % 3 > 0, returned="x", scored=True)], "v"
            )
        store.add_label("chatcmpl-1", 0, True, "feedback")  # not an audit label: the audit still asks for it
        sample = store.audit_sample(5, seed=7)
    page = LabelServer(url, port=0, audit=5, seed=7).start()
    try:
        shown = [get_json(page.url + f"api/item?pos={i}")["item"]["id"] for i in range(5)]
        assert shown == [rid for rid, _ in sample] and get_json(page.url + "api/item")["left"] == 5
        outside = next(f"chatcmpl-{i}" for i in range(1, 30) if i % 3 and (f"chatcmpl-{i}", 0) not in sample)
        assert post_label(page, {"id": outside, "index": 0, "correct": True})[0] == 404
        assert post_label(page, {"id": shown[0], "index": 0, "correct": True}) == (
            200,
            {"left": 4},
        )
    finally:
        page.close()
    with ServedStore(url) as store:
        audit = [a for a in store.served_log().labelled() if a.label_source == "audit"]
        assert [a.id for a in audit] == [shown[0]]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["label"], "not both or neither"),
        (["label", "x.jsonl", "--store", "sqlite:///x.db"], "not both or neither"),
        (["label", "--store", "served.db"], "must be a database URL"),
        (["label", "--store", "sqlite:///x.db", "--audit", "0"], "at least 1"),
        (["label", "--store", "sqlite:///x.db", "--audit", "3", "--judge-model", "m"], "--audit is a sample"),
        (["adapt", "--store", "sqlite:///x.db"], "needs --honest"),
    ],
)
def test_store_options_that_cannot_work_are_refused(args, message, capsys):
    with pytest.raises(SystemExit) as done:
        run(args)
    assert done.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.slow
def test_two_candor_serve_processes_on_one_postgres(tiny_model_dir, postgres_url, tmp_path, backend):
    """Two real `candor serve` replicas: a label posted to either, for a response the other served, is accepted."""
    from candor.backends import load_backend

    folder = tmp_path / "honest"
    save(honest_model(load_backend(tiny_model_dir, "hf"), 0.0), folder, "v1")
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1", "CANDOR_API_KEY": KEY}
    procs, urls = [], []
    try:
        for _ in range(2):
            port = free_port()
            command = [sys.executable, "-m", "candor.cli", "serve", "--honest", str(folder), "--port", str(port)]
            procs.append(
                subprocess.Popen(
                    [*command, "--store", postgres_url],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
            urls.append(f"http://127.0.0.1:{port}")
        for url, proc in zip(urls, procs, strict=True):
            wait_ready(url, proc)
        served = [ask(client(urls[i % 2]), q).id for i, q in enumerate(QUESTIONS[:4])]
        for i, rid in enumerate(served):
            status, body = post(f"{urls[(i + 1) % 2]}/v1/feedback", {"id": rid, "index": 0, "correct": i % 2 == 0})
            assert status == 200, body
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=60)
    log = read_served_answers(postgres_url)
    assert {a.id: a.label for a in log.answers} == {rid: i % 2 == 0 for i, rid in enumerate(served)}
