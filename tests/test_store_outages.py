"""The store is never a silent single point of failure (issue 64: defects 2 and 7, part 1). A real PostgreSQL,
stopped, hung behind a TCP proxy that stops forwarding, and slow; a real server (tiny model, real HTTP).

The policy (docs/serving.md, "When the store fails"): while the store does not answer, ``/ready`` is 503 and
questions and feedback are refused with 503 before any generation; ``/health`` and ``/metrics`` never wait on
the database; a stream whose record could not be kept ends with an error event; every acknowledged answer is
in the database once it is back; the server takes traffic again by itself.

On 4132585 one ``/metrics`` scrape with the database hung froze the event loop (every request timed out), a
stream whose record could not be written hung or was cut silently, and with the database stopped ``/ready``
stayed 200 while every chat answered 500 after generating.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest

pytest.importorskip("fastapi")
psycopg = pytest.importorskip("psycopg")

from benchmarks.servers import PostgresServer, PostgresUnavailable, as_user  # noqa: E402
from candor.serve.http.app import ServeSettings, create_app  # noqa: E402
from candor.serve.http.server import serve_in_thread  # noqa: E402
from tests.tcp_proxy import TcpProxy  # noqa: E402
from tests.test_serve_app import KEY, chat, post  # noqa: E402
from tests.test_serve_feedback import ADMIN, QUESTIONS, honest_model, metric  # noqa: E402

TIMEOUT_S = 2.0  # the store timeout these servers run with
PATIENCE_S = 30.0  # the longest a test waits for /ready to change (the probe needs about TIMEOUT_S + 0.5 s)


@pytest.fixture(scope="module")
def backend(tiny_model, tokenizer):
    from candor.backends.hf import HFBackend

    return HFBackend(tiny_model, tokenizer, batch_size=8)


def timed_get(url: str, timeout: float = 10.0) -> tuple[int, float]:
    """``GET url``: its status and how long it took."""
    start = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            resp.read()
            status = resp.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    return status, time.monotonic() - start


def wait_for(check: Callable[[], bool], what: str) -> float:
    """Seconds until ``check()`` holds (sampled every 50 ms); fails after PATIENCE_S."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > PATIENCE_S:
            raise AssertionError(f"{what}: not within {PATIENCE_S} s")
        time.sleep(0.05)
    return time.monotonic() - start


def ready(url: str) -> int:
    return timed_get(f"{url}/ready")[0]


def stream_events(url: str, question: str, timeout: float = 30.0) -> tuple[int, list[str]]:
    """A streamed chat: its status and the data lines of its events (a 503 before streaming: its body)."""
    body = json.dumps(chat(question, stream=True)).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
    req = urllib.request.Request(f"{url}/v1/chat/completions", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            text = resp.read().decode()
            return resp.status, [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    except urllib.error.HTTPError as exc:
        return exc.code, [exc.read().decode()]


def stored_ids(database: str) -> set[str]:
    with psycopg.connect(database) as conn:
        return {row[0] for row in conn.execute("SELECT response_id FROM served")}


def answers_total(url: str) -> float:
    return metric(url, "candor_answers_total") or 0.0


def test_a_hung_database_never_freezes_the_server_and_nothing_acknowledged_is_lost(
    backend, postgres_server, postgres_url
):
    health: list[float] = []
    with TcpProxy("127.0.0.1", postgres_server.port) as proxy:
        via = postgres_url.replace(f":{postgres_server.port}/", f":{proxy.port}/")
        settings = ServeSettings(api_key=KEY, admin_key=ADMIN, store=via, store_timeout_s=TIMEOUT_S)
        with serve_in_thread(create_app(honest_model(backend, 0.0), settings)) as url:
            status, first = post(f"{url}/v1/chat/completions", chat(QUESTIONS[0]))
            assert status == 200, first
            acknowledged = {first["id"]}
            proxy.hang()
            # A stream admitted before the outage is noticed: its record cannot be kept, so it ends with an error.
            status, events = stream_events(url, QUESTIONS[1])
            assert status == 200 and events, events
            errors = [json.loads(e)["error"] for e in events if e != "[DONE]" and "error" in json.loads(e)]
            assert [e["code"] for e in errors] == ["store_unavailable"], events
            # One scrape with the database hung (on 4132585 it froze the event loop, and with it every request).
            status, _ = timed_get(f"{url}/metrics")
            assert status == 200
            health.append(timed_get(f"{url}/health")[1])
            noticed = wait_for(lambda: ready(url) == 503, "/ready 503 while the database hangs")
            assert metric(url, "candor_store_available") == 0.0
            before = answers_total(url)
            status, body = post(f"{url}/v1/chat/completions", chat(QUESTIONS[2]), timeout=10)
            assert (status, body["error"]["code"]) == (503, "store_unavailable"), body
            status, events = stream_events(url, QUESTIONS[3], timeout=10)
            assert status == 503 and "store_unavailable" in events[0]
            assert answers_total(url) == before  # refused before any generation
            label = {"id": first["id"], "index": 0, "correct": True, "label_source": "audit"}
            status, body = post(f"{url}/v1/feedback", label, key=ADMIN, timeout=10)
            assert (status, body["error"]["code"]) == (503, "store_unavailable")
            health += [timed_get(f"{url}/health")[1] for _ in range(5)]
            proxy.heal()
            recovered = wait_for(lambda: ready(url) == 200, "/ready 200 once the database answers")
            status, again = post(f"{url}/v1/chat/completions", chat(QUESTIONS[4]))
            assert status == 200, again
            acknowledged.add(again["id"])
            assert post(f"{url}/v1/feedback", label, key=ADMIN)[0] == 200
    assert acknowledged <= stored_ids(postgres_url)  # every acknowledged answer was kept
    assert max(health) < 5.0  # answered while the database hung (measured: see the printout)
    print(
        f"\nhung: /ready 503 after {noticed:.2f} s, 200 again {recovered:.2f} s after healing; "
        f"/health max {max(health) * 1000:.0f} ms"
    )


def pg_ctl(server: PostgresServer, *args: str) -> None:
    subprocess.run(as_user([server.pg_ctl, "-D", str(server.data), *args]), capture_output=True, timeout=60, check=True)


def test_a_stopped_database_is_refused_up_front_and_its_return_taken_without_an_operator(backend):
    try:
        server = PostgresServer()  # its own: this test stops it
    except PostgresUnavailable as exc:
        pytest.skip(str(exc))
    try:
        database = server.create_database()
        settings = ServeSettings(api_key=KEY, admin_key=ADMIN, store=database, store_timeout_s=TIMEOUT_S)
        with serve_in_thread(create_app(honest_model(backend, 0.0), settings)) as url:
            acknowledged = set()
            for q in QUESTIONS[:3]:
                status, body = post(f"{url}/v1/chat/completions", chat(q))
                assert status == 200, body
                acknowledged.add(body["id"])
            pg_ctl(server, "-m", "fast", "stop")
            status, body = post(f"{url}/v1/chat/completions", chat(QUESTIONS[3]))
            assert status == 503 and body["error"]["code"] == "store_unavailable", body  # never a 500, never kept
            noticed = wait_for(lambda: ready(url) == 503, "/ready 503 while the database is stopped")
            before = answers_total(url)
            status, body = post(f"{url}/v1/chat/completions", chat(QUESTIONS[4]))
            assert (status, body["error"]["code"]) == (503, "store_unavailable")
            assert answers_total(url) == before
            status, _ = timed_get(f"{url}/metrics")
            assert status == 200
            options = f"-p {server.port} -c listen_addresses=127.0.0.1 -k {server.root} -c fsync=off"
            pg_ctl(server, "-o", options, "-l", str(server.root / "log"), "-w", "start")
            recovered = wait_for(lambda: ready(url) == 200, "/ready 200 once the database is back")
            status, body = post(f"{url}/v1/chat/completions", chat(QUESTIONS[5]))
            assert status == 200, body
            acknowledged.add(body["id"])
        assert acknowledged <= stored_ids(database)
        print(f"\nstopped: /ready 503 after {noticed:.2f} s, 200 again {recovered:.2f} s after the restart")
    finally:
        server.stop()


def test_a_slow_database_serves_slower_and_one_slower_than_the_timeout_is_unavailable(
    backend, postgres_server, postgres_url
):
    with TcpProxy("127.0.0.1", postgres_server.port) as proxy:
        via = postgres_url.replace(f":{postgres_server.port}/", f":{proxy.port}/")
        settings = ServeSettings(api_key=KEY, store=via, store_timeout_s=TIMEOUT_S)
        with serve_in_thread(create_app(honest_model(backend, 0.0), settings)) as url:
            proxy.delay_s = 0.05  # every chunk each way: a few hundred ms per transaction
            acknowledged = set()
            for q in QUESTIONS[:3]:
                status, body = post(f"{url}/v1/chat/completions", chat(q))
                assert status == 200, body
                acknowledged.add(body["id"])
            assert ready(url) == 200
            proxy.delay_s = 2 * TIMEOUT_S  # slower than the timeout: as good as down
            noticed = wait_for(lambda: ready(url) == 503, "/ready 503 while the database is slower than the timeout")
            health = timed_get(f"{url}/health")[1]
            proxy.delay_s = 0.0
            recovered = wait_for(lambda: ready(url) == 200, "/ready 200 once the database is fast again")
            status, body = post(f"{url}/v1/chat/completions", chat(QUESTIONS[3]))
            assert status == 200, body
            acknowledged.add(body["id"])
    assert acknowledged <= stored_ids(postgres_url)
    assert health < 5.0
    print(
        f"\nslow: /ready 503 after {noticed:.2f} s, 200 again {recovered:.2f} s later; /health {health * 1000:.0f} ms"
    )
