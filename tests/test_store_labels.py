"""Labels the store keeps by class and checks before any work; replicas that agree on the audit; gauges that mean
what they say (issue 64: defects 1, 6, 8, 9, 10, 11; parts 2, 6, 7, 8). Real SQLite and PostgreSQL stores, a real
server (tiny model, real HTTP)."""

from __future__ import annotations

import json
import math
import random
import threading
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("fastapi")

from candor.annotation.served_store import RecordGone, Retention, ServedChoice, ServedStore  # noqa: E402
from candor.serve import HonestModel, Threshold  # noqa: E402
from candor.serve.http.app import ServeSettings, create_app  # noqa: E402
from candor.serve.http.operator_routes import AUDIT_SYNC_S  # noqa: E402
from candor.serve.http.server import serve_in_thread  # noqa: E402
from candor.util.errors import CandorError  # noqa: E402
from tests.test_serve_app import KEY, chat, post  # noqa: E402
from tests.test_serve_feedback import ADMIN, QUESTIONS, honest_model, metric, metrics_text  # noqa: E402


@pytest.fixture(scope="module")
def backend(tiny_model, tokenizer):
    from candor.backends.hf import HFBackend

    return HFBackend(tiny_model, tokenizer, batch_size=8)


def served(url: str, question: str) -> str:
    status, body = post(f"{url}/v1/chat/completions", chat(question))
    assert status == 200, body
    return body["id"]


def label_counts(store_url: str) -> dict[str, int]:
    with ServedStore(store_url) as store:
        log = store.served_log()
    counts: dict[str, int] = {}
    for answer in log.answers:
        for _, label in answer.labels:
            counts[label.label_source] = counts.get(label.label_source, 0) + 1
    return counts


def record(store: ServedStore, response_id: str, answered: bool = True) -> None:
    rec = {"item": {"id": response_id, "question": f"q {response_id}", "answers": []}, "greedy": {"text": "x"}}
    store.record(rec | {"samples": []}, response_id, [ServedChoice(0, answered, "x", True)], "v")


# ---------------------------------------------------------------- defect 1: a client cannot delete audit labels


def test_user_feedback_never_removes_the_operators_audit_label(backend, tmp_path):
    """The issue's recipe: --store-max-rows 30, one audit label, 35 inference-key feedbacks on one response, one
    more question. On 4132585 labels went 36 -> 30 and the audit label was gone."""
    store_url = f"sqlite:///{tmp_path / 'served.db'}"
    settings = ServeSettings(api_key=KEY, admin_key=ADMIN, store=store_url, retention=Retention(max_rows=30))
    with serve_in_thread(create_app(honest_model(backend, 0.0), settings)) as url:
        rid = served(url, QUESTIONS[0])
        audit = {"id": rid, "index": 0, "correct": True, "label_source": "audit"}
        assert post(f"{url}/v1/feedback", audit, key=ADMIN)[0] == 200
        for k in range(35):
            status, body = post(f"{url}/v1/feedback", {"id": rid, "index": 0, "correct": k % 2 == 0})
            assert status == 200, body
        served(url, QUESTIONS[1])
    counts = label_counts(store_url)
    assert counts == {"audit": 1, "user": 1}  # one label per choice and key: each repeat replaced the last
    with ServedStore(store_url) as store:
        (answer,) = [a for a in store.served_log().answers if a.id == rid]
    assert [label.correct for _, label in answer.labels if label.label_source == "user"] == [True]  # the 35th


def test_user_labels_are_capped_apart_from_the_operators(tmp_path):
    """End-user labels past max_rows go, oldest first; audit, human and judge labels stay."""
    store_url = f"sqlite:///{tmp_path / 'served.db'}"
    with ServedStore(store_url, Retention(max_rows=30)) as store:
        for i in range(10):
            record(store, f"r{i}")
        store.add_label("r0", 0, True, "audit", "operator")
        store.add_label("r1", 0, True, "human", "operator")
        store.add_label("r2", 0, False, "judge:gold", "operator")
        for k in range(60):  # 60 clients (keys), 6 labels each on 10 responses
            store.add_label(f"r{k % 10}", 0, True, "user", f"key:{k}")
    assert label_counts(store_url) == {"audit": 1, "human": 1, "judge:gold": 1, "user": 30}


# ---------------------------------------------------------------- defect 9: orphan labels


def test_a_label_on_a_response_whose_record_retention_deleted_is_refused(backend, tmp_path):
    settings = ServeSettings(api_key=KEY, admin_key=ADMIN, log_records=tmp_path / "s.jsonl", retention=Retention(2))
    with serve_in_thread(create_app(honest_model(backend, 0.0), settings)) as url:
        first = served(url, QUESTIONS[0])
        for q in QUESTIONS[1:3]:
            served(url, q)  # the first record is gone (max rows 2); the remembered index still names it
        status, body = post(f"{url}/v1/feedback", {"id": first, "index": 0, "correct": True})
        assert (status, body["error"]["code"], body["error"]["param"]) == (404, "record_gone", "id"), body
        status, body = post(f"{url}/v1/feedback", {"id": first, "correct": True, "label_source": "audit"}, key=ADMIN)
        assert status == 404, body
    with ServedStore(f"sqlite:///{tmp_path / 's.db'}") as store, pytest.raises(RecordGone):
        store.add_label(first, 0, True, "human")


# ---------------------------------------------------------------- defects 10 and 11: bad input, small ones

HUGE = "x" * 200_000
BAD_FEEDBACK = [  # (body, key, param): each a 400 naming param, before any work
    ('{"id": "\\ud800", "correct": true}', KEY, "id"),
    ('{"id": "chatcmpl-a\\u0000b", "correct": true}', KEY, "id"),
    (json.dumps({"id": HUGE, "correct": True}), KEY, "id"),
    ('{"id": "chatcmpl-x", "correct": true, "label_source": "judge:\\udc00"}', ADMIN, "label_source"),
    ('{"id": "chatcmpl-x", "correct": true, "label_source": "judge:a\\u0000"}', ADMIN, "label_source"),
    (
        json.dumps({"id": "chatcmpl-x", "correct": True, "label_source": "judge:" + "j" * 100_000}),
        ADMIN,
        "label_source",
    ),
    ('{"id": "chatcmpl-x", "correct": "yes"}', KEY, "correct"),
    ('{"id": "chatcmpl-x", "index": -1, "correct": true}', KEY, "index"),
    ('{"id": 7, "correct": true}', KEY, "id"),
]


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_bad_input_is_a_400_naming_the_field_before_any_work_on_both_stores(backend, tmp_path, kind, request):
    store_url = f"sqlite:///{tmp_path / 's.db'}" if kind == "sqlite" else request.getfixturevalue("postgres_url")
    settings = ServeSettings(api_key=KEY, admin_key=ADMIN, store=store_url)
    with serve_in_thread(create_app(honest_model(backend, 0.0), settings)) as url:
        rid = served(url, QUESTIONS[0])
        for raw, key, param in BAD_FEEDBACK:
            status, body = post(f"{url}/v1/feedback", raw.replace("chatcmpl-x", rid).encode(), key=key)
            assert (status, body["error"]["param"]) == (400, param), (raw[:80], body)
            assert len(json.dumps(body)) < 600, raw[:80]  # never echoes the value back
            assert "Error" not in body["error"]["message"] and "codec" not in body["error"]["message"]
        before = metric(url, "candor_answers_total")
        status, body = post(f"{url}/v1/chat/completions", chat("What is \u0000 this?"))
        assert status == 400 and "NUL" in body["error"]["message"], body  # on PostgreSQL: a 500 after generating
        status, body = post(f"{url}/v1/chat/completions", chat("Which \ud800?"))  # json.dumps escapes it: \ud800
        assert status == 400, body
        assert metric(url, "candor_answers_total") == before
        status, body = post(f"{url}/v1/feedback", {"id": "chatcmpl-" + "9" * 200, "correct": True})
        assert status == 404 and len(body["error"]["message"]) < 400  # a 404 never echoes a long id whole
    assert label_counts(store_url) == {}


def test_feedback_reads_the_charset_it_is_sent_in(backend, tmp_path):
    settings = ServeSettings(api_key=KEY, admin_key=ADMIN, log_records=tmp_path / "s.jsonl")
    with serve_in_thread(create_app(honest_model(backend, 0.0), settings)) as url:
        rid = served(url, QUESTIONS[0])
        body = json.dumps({"id": rid, "correct": True, "label_source": "judge:Zoé"}, ensure_ascii=False)
        headers = {"Content-Type": "application/json; charset=latin-1", "Authorization": f"Bearer {ADMIN}"}
        req = urllib.request.Request(f"{url}/v1/feedback", body.encode("latin-1"), headers, method="POST")
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert json.loads(resp.read())["label_source"] == "judge:Zoé"
        headers["Content-Type"] = "application/json; charset=ebcdic"
        req = urllib.request.Request(f"{url}/v1/feedback", body.encode("latin-1"), headers, method="POST")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(req, timeout=30)
        assert refused.value.code == 400 and json.loads(refused.value.read())["error"]["code"] == "unsupported_charset"


def test_the_reloads_unknown_field_error_has_a_code_and_thresholds_name_no_python_internals(backend):
    with serve_in_thread(create_app(honest_model(backend, 0.0), ServeSettings(admin_key=ADMIN))) as url:
        status, body = post(f"{url}/admin/reload", {"honset": "x"}, key=ADMIN)
        assert (status, body["error"]["code"], body["error"]["param"]) == (400, "unknown_field", "honset")
    with pytest.raises(CandorError) as bad:
        Threshold.from_dict({"value": "0.5"})
    assert "not supported between" not in str(bad.value) and "str" in str(bad.value)


# ---------------------------------------------------------------- defect 8: gauges without a promise


def no_promise(backend) -> HonestModel:
    model = honest_model(backend, 0.0)
    model.threshold = Threshold(0.0, rule="fixed")  # --threshold 0: no dev split, so nothing promised
    return model


def test_without_a_promise_the_drift_gauges_are_nan_and_say_why(backend, tmp_path):
    settings = ServeSettings(admin_key=ADMIN, log_records=tmp_path / "s.jsonl")
    with serve_in_thread(create_app(no_promise(backend), settings)) as url:
        for q in QUESTIONS[:5]:
            rid = served(url, q)
            audit = {"id": rid, "correct": True, "label_source": "audit"}
            assert post(f"{url}/v1/feedback", audit, key=ADMIN)[0] == 200
        assert metric(url, "candor_feedback_audited") == 5.0
        for name in ("candor_calibration_unconfirmed", "candor_calibration_drift", "candor_promised_accuracy"):
            assert math.isnan(metric(url, name)), name  # on 4132585 the alarms read 0: "confirmed, no drift"
        assert metric(url, "candor_promise_stated") == 0.0
        text = metrics_text(url)
        assert "no promise" in next(line for line in text.splitlines() if "HELP candor_calibration_drift" in line)
    with serve_in_thread(create_app(honest_model(backend, 0.0), ServeSettings())) as url:
        assert metric(url, "candor_promise_stated") == 1.0  # risk control at 0.2: promises 0.8


# ---------------------------------------------------------------- defect 6: replicas that agree


def test_audit_labels_commit_in_order_so_a_poller_never_passes_one_over(postgres_url):
    """Deterministic: label r1 draws its number, then waits (another transaction holds its served row); label r2
    is made meanwhile. On 4132585 r2 committed first, a poll took its number as the watermark and r1 was never
    counted; now r2 waits for r1's commit, and a poll sees both."""
    psycopg = pytest.importorskip("psycopg")
    with ServedStore(postgres_url) as store:
        record(store, "r1")
        record(store, "r2")
        blocker = psycopg.connect(postgres_url)
        blocker.execute("SELECT seq FROM served WHERE response_id = 'r1' FOR UPDATE")
        first = threading.Thread(target=store.add_label, args=("r1", 0, True, "audit"))
        first.start()
        with psycopg.connect(postgres_url, autocommit=True) as watch:
            for _ in range(200):  # until the first label waits on the row lock, its number drawn
                waiting = watch.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
                if waiting.fetchone()[0]:
                    break
                time.sleep(0.05)
        second = threading.Thread(target=store.add_label, args=("r2", 0, False, "audit"))
        second.start()
        second.join(timeout=2)
        seen = store.audit_labels_after(0)
        watermark = seen[-1][0] if seen else 0
        blocker.rollback()
        blocker.close()
        first.join(timeout=30)
        second.join(timeout=30)
        seen += store.audit_labels_after(watermark)
    assert sorted(rid for _, _, rid, _ in seen) == ["r1", "r2"]


def database_audit(store_url: str, version: str) -> tuple[int, float]:
    """The audit as the database holds it: responses with an audit label on an answered choice, and the accuracy
    of each one's first such label."""
    with ServedStore(store_url) as store:
        rows = store.audit_labels_after(0)
    first: dict[str, bool] = {}
    for _, v, rid, correct in rows:
        if v == version:
            first.setdefault(rid, correct)
    return len(first), sum(first.values()) / max(len(first), 1)


def test_two_replicas_and_eight_writers_agree_with_the_database_and_after_a_restart(backend, postgres_url):
    model = honest_model(backend, 0.0)
    settings = ServeSettings(api_key=KEY, admin_key=ADMIN, store=postgres_url)
    with serve_in_thread(create_app(model, settings)) as one, serve_in_thread(create_app(model, settings)) as two:
        replicas = (one, two)
        ids = [served(replicas[i % 2], q) for i, q in enumerate(QUESTIONS[:40])]
        failures: list[object] = []

        def writer(w: int) -> None:
            rng = random.Random(w)
            for k in range(20):
                label = {"id": rng.choice(ids), "correct": rng.random() < 0.7, "label_source": "audit"}
                status, body = post(f"{replicas[(w + k) % 2]}/v1/feedback", label, key=ADMIN)
                if status != 200:
                    failures.append(body)

        writers = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
        for t in writers:
            t.start()
        for t in writers:
            t.join(timeout=300)
        assert not failures, failures[:3]
        time.sleep(AUDIT_SYNC_S + 0.5)  # one poll interval after quiescence (and the poll's own time)
        live = [(metric(u, "candor_feedback_audited"), metric(u, "candor_feedback_accuracy")) for u in replicas]
    audited, accuracy = database_audit(postgres_url, model.version)
    assert live[0] == live[1] and live[0][0] == audited and live[0][1] == pytest.approx(accuracy)
    with serve_in_thread(create_app(model, settings)) as one, serve_in_thread(create_app(model, settings)) as two:
        time.sleep(AUDIT_SYNC_S + 0.5)
        restarted = [(metric(u, "candor_feedback_audited"), metric(u, "candor_feedback_accuracy")) for u in (one, two)]
    assert restarted == live
    print(f"\nreplicas: 160 audit labels from 8 writers; both count {live[0][0]:.0f}, the database {audited}")
