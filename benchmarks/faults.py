"""Faults injected into a running ``candor serve`` under load (issue 64): what a client sees, what ``/ready``
says, what was lost, and how long until it serves again. Results: ``benchmarks/results/faults.json``, the
"Faults survived" table of docs/serving.md.

    python -m benchmarks.faults                  # every fault, the embedded SmolLM2, the scales below
    python -m benchmarks.faults --only pg-hung   # one fault (the others keep their stored rows)

Each fault runs against real servers on 127.0.0.1 (uvicorn, the app, a real store: PostgreSQL from
:class:`benchmarks.servers.PostgresServer`, or SQLite), with client threads asking questions (and the
operator labelling their answers) in a loop and a probe reading ``/health`` and ``/ready`` every 0.1 s,
before, during and after the fault. Every fault is bounded in time. For each:

- **client sees**: the answers' statuses (and error codes) while the fault lasts;
- **/ready**: what it said once the fault had been noticed, against what is true (503 while the store
  cannot keep an answer; 200 while the server can serve);
- **lost**: answers and labels the server acknowledged (a 200) that the database does not hold afterwards;
- **recovery**: seconds from the fault's end (the database started again, the network healed, the disk freed,
  the slow senders gone) to ``/ready`` 200 and an answered question, with no operator action.

tests/faults/ runs the same functions at a small scale with the tiny test model (CI).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "faults.json"
KEY = "faults-inference-key"
ADMIN = "faults-operator-key"
PROBE_S = 0.1
STORE_TIMEOUT_S = 5.0  # candor serve's store timeout (ServeSettings.store_timeout_s)


# ---------------------------------------------------------------- HTTP


def request(url: str, body: dict | None = None, key: str | None = KEY, timeout: float = 30.0) -> tuple[Any, dict]:
    """One request: ``(status, JSON body)``; a status of ``"refused"`` or ``"timeout"`` when no HTTP answer came."""
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers, method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw.strip().startswith(b"{") else {}
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, {}
    except TimeoutError:
        return "timeout", {}
    except (urllib.error.URLError, ConnectionError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return ("timeout" if isinstance(reason, (TimeoutError, socket.timeout)) else "refused"), {}


def outcome(status: Any, body: dict) -> str:
    """How a client saw an answer: ``200``, ``503 store_unavailable``, ``refused`` (no connection)…"""
    code = (body.get("error") or {}).get("code") if isinstance(body, dict) else None
    return f"{status} {code}" if code else str(status)


def chat_body(question: str) -> dict:
    return {"model": "candor", "messages": [{"role": "user", "content": question}], "max_tokens": 4}


# ---------------------------------------------------------------- load and probe


@dataclass
class Watch:
    """Questions (and audit labels on their answers) in a loop, and ``/health`` + ``/ready`` probed, on ``urls``."""

    urls: list[str]
    clients: int = 2
    label: bool = True
    fault_started: float | None = None
    fault_ended: float | None = None
    answers: list[tuple[float, str, str | None]] = field(default_factory=list)  # (time, outcome, acknowledged id)
    labels: list[tuple[float, str, tuple[str, int] | None]] = field(default_factory=list)
    health: list[tuple[float, float, Any]] = field(default_factory=list)  # (time, seconds, status)
    ready: list[tuple[float, Any]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __enter__(self) -> Watch:
        for i in range(self.clients):
            self._threads.append(threading.Thread(target=self._ask, args=(i,), daemon=True))
        self._threads.append(threading.Thread(target=self._probe, daemon=True))
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def warm(self, limit_s: float = 300.0) -> Watch:
        """Wait for a first answer (and its label) acknowledged: the model warmed up, the load running."""
        wait_until(
            lambda: bool(self.acknowledged()) and (not self.label or bool(self.labels)), limit_s, "a first answer"
        )
        return self

    def begin_fault(self) -> None:
        self.fault_started = time.monotonic()

    def end_fault(self) -> None:
        self.fault_ended = time.monotonic()

    def _ask(self, client: int) -> None:
        n = 0
        while not self._stop.is_set():
            url = self.urls[(client + n) % len(self.urls)]
            n += 1
            status, body = request(f"{url}/v1/chat/completions", chat_body(f"Question {client}-{n}: what is {n} + 1?"))
            now = time.monotonic()
            rid = body.get("id") if status == 200 else None
            with self._lock:
                self.answers.append((now, outcome(status, body), rid))
            if status in ("refused", "timeout"):
                time.sleep(0.2)  # a dead replica: a client backs off before asking again
            if rid and self.label:
                label = {"id": rid, "index": 0, "correct": n % 2 == 0, "label_source": "audit"}
                status, body = request(f"{url}/v1/feedback", label, key=ADMIN)
                with self._lock:
                    self.labels.append((time.monotonic(), outcome(status, body), (rid, 0) if status == 200 else None))

    def _probe(self) -> None:
        while not self._stop.is_set():
            for url in self.urls:
                start = time.monotonic()
                status, _ = request(f"{url}/health", timeout=10)
                took = time.monotonic() - start
                ready, _ = request(f"{url}/ready", timeout=10)
                with self._lock:
                    self.health.append((start, took, status))
                    self.ready.append((start, ready))
            time.sleep(PROBE_S)

    # ------------------------------------------------------------ what it saw

    def during(self) -> Counter:
        """The answers' outcomes while the fault lasted."""
        return Counter(o for t, o, _ in self.answers if self.fault_started <= t <= (self.fault_ended or t))

    def acknowledged(self) -> set[str]:
        return {rid for _, _, rid in self.answers if rid}

    def acknowledged_labels(self) -> set[tuple[str, int]]:
        return {key for _, _, key in self.labels if key}

    def ready_during(self, url_index: int = 0) -> list[tuple[float, Any]]:
        every = self.ready[url_index :: len(self.urls)]
        return [(t, s) for t, s in every if self.fault_started <= t <= (self.fault_ended or t)]

    def recovery_s(self) -> float | None:
        """From the fault's end to ``/ready`` 200 (every replica's probe) and an answered question."""
        if self.fault_ended is None:
            return None
        ready = [t for t, s in self.ready if t >= self.fault_ended and s == 200]
        answered = [t for t, o, _ in self.answers if t >= self.fault_ended and o == "200"]
        if not ready or not answered:
            return None
        return round(max(min(ready), min(answered)) - self.fault_ended, 2)

    def health_max_s(self, url_index: int | None = None) -> float:
        """The slowest ``/health`` answer (of one replica's probe, or of all)."""
        probes = self.health if url_index is None else self.health[url_index :: len(self.urls)]
        return round(max((took for _, took, _ in probes), default=0.0), 3)


def wait_until(check: Callable[[], bool], limit_s: float, what: str) -> float:
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > limit_s:
            raise RuntimeError(f"{what}: not within {limit_s} s")
        time.sleep(0.05)
    return time.monotonic() - start


def stored(database: str) -> tuple[set[str], set[tuple[str, int]]]:
    """The response ids and labelled choices the database holds (a fresh connection, after the fault)."""
    import sqlalchemy as sa

    from candor.annotation.served_store import engine_url

    engine = sa.create_engine(engine_url(database))
    try:
        with engine.connect() as conn:
            served = {row[0] for row in conn.execute(sa.text("SELECT response_id FROM served"))}
            labels = {(r[0], int(r[1])) for r in conn.execute(sa.text("SELECT response_id, idx FROM labels"))}
    finally:
        engine.dispose()
    return served, labels


def row(
    name: str,
    injected: str,
    watch: Watch,
    database: str,
    *,
    ready_truth: int,
    recovery: float | None,
    extra: dict[str, Any] | None = None,
    ready_url: int = 0,
) -> dict[str, Any]:
    """One fault's row of faults.json (see the module docstring for what each field means)."""
    served, labels = stored(database)
    answers, acked_labels = watch.acknowledged(), watch.acknowledged_labels()
    during = watch.ready_during(ready_url)
    said = Counter(str(s) for _, s in during)
    noticed = next((t for t, s in during if s == ready_truth), None)
    after_noticed = [s for t, s in during if noticed is not None and t >= noticed]
    return {
        "fault": name,
        "injected": injected,
        "client_sees": dict(watch.during().most_common()),
        "ready_during": dict(said.most_common()),
        "ready_truth": ready_truth,
        "ready_noticed_s": None if noticed is None else round(noticed - watch.fault_started, 2),
        "ready_truthful": noticed is not None and all(s == ready_truth for s in after_noticed),
        "health_max_s": watch.health_max_s(ready_url if len(watch.urls) > 1 else None),
        "acknowledged_answers": len(answers),
        "acknowledged_labels": len(acked_labels),
        "lost_answers": len(answers - served),
        "lost_labels": len(acked_labels - labels),
        "recovery_s": recovery,
        "operator_needed": False,
        **(extra or {}),
    }


# ---------------------------------------------------------------- the servers


@dataclass(frozen=True)
class Scale:
    """How long each phase lasts and how hard each fault pushes (the benchmark's, or the tests' smaller one)."""

    phase_s: float = 6.0  # before the fault, and after it ends
    fault_s: float = 10.0  # how long the fault lasts
    store_timeout_s: float = 5.0
    slow_headers: int = 1000
    header_timeout_s: float = 10.0
    flood_labels: int = 2000
    pg_delay_s: float = 0.1  # per forwarded chunk, each way (PostgreSQL slow)
    tmpfs_bytes: int = 8 << 20


@contextlib.contextmanager
def app_server(
    model_factory: Callable[[], Any], scale: Scale, store_fault: bool = False, **settings: Any
) -> Iterator[tuple[str, Any]]:
    """``candor serve``'s app on a free port, in this process, with both keys and ``settings``.

    ``store_fault``: the fault is the store's, and the server runs with the scale's store timeout.
    """
    from candor.serve.http.app import ServeSettings, create_app
    from candor.serve.http.connections import ConnectionLimits
    from candor.serve.http.server import serve_in_thread

    options = {"api_key": KEY, "admin_key": ADMIN, "store_timeout_s": scale.store_timeout_s, **settings}
    if not store_fault:
        options["store_timeout_s"] = STORE_TIMEOUT_S  # the store is not the fault here: candor serve's own timeout
    app = create_app(model_factory(), ServeSettings(**options))
    limits = ConnectionLimits(header_timeout_s=scale.header_timeout_s)
    with serve_in_thread(app, limits=limits) as url:
        yield url, app


def via_proxy(database: str, pg_port: int, proxy_port: int) -> str:
    return database.replace(f":{pg_port}/", f":{proxy_port}/")


# ---------------------------------------------------------------- the faults


def pg_stopped(model_factory: Callable[[], Any], scale: Scale) -> dict[str, Any]:
    from benchmarks.servers import PostgresServer, as_user

    pg = PostgresServer()
    try:
        database = pg.create_database()
        with app_server(model_factory, scale, True, store=database) as (url, _), Watch([url]) as watch:
            watch.warm()
            time.sleep(scale.phase_s)
            watch.begin_fault()
            pg_ctl = [pg.pg_ctl, "-D", str(pg.data)]
            subprocess.run(as_user([*pg_ctl, "-m", "fast", "stop"]), capture_output=True, timeout=60, check=True)
            time.sleep(scale.fault_s)
            # The fault ends when the database is started again: from then on a /ready of 200 is the truth, and
            # recovery counts the database's own start.
            watch.end_fault()
            options = f"-p {pg.port} -c listen_addresses=127.0.0.1 -k {pg.root} -c fsync=off"
            start = [*pg_ctl, "-o", options, "-l", str(pg.root / "log"), "-w", "start"]
            subprocess.run(as_user(start), capture_output=True, timeout=60, check=True)
            time.sleep(scale.phase_s)
        return row(
            "PostgreSQL stopped",
            f"pg_ctl stop -m fast for {scale.fault_s:g} s, then start",
            watch,
            database,
            ready_truth=503,
            recovery=watch.recovery_s(),
        )
    finally:
        pg.stop()


def _proxied(model_factory: Callable[[], Any], scale: Scale, name: str, injected: str, fault: str) -> dict:
    from benchmarks.servers import PostgresServer
    from tests.tcp_proxy import TcpProxy

    pg = PostgresServer()
    try:
        database = pg.create_database()
        with TcpProxy("127.0.0.1", pg.port) as proxy:
            store = via_proxy(database, pg.port, proxy.port)
            with app_server(model_factory, scale, True, store=store) as (url, _), Watch([url]) as watch:
                watch.warm()
                time.sleep(scale.phase_s)
                watch.begin_fault()
                if fault == "hang":
                    proxy.hang()
                else:
                    proxy.delay_s = scale.pg_delay_s
                time.sleep(scale.fault_s)
                proxy.heal()
                proxy.delay_s = 0.0
                watch.end_fault()
                time.sleep(scale.phase_s)
        truth = 503 if fault == "hang" else 200
        return row(name, injected, watch, database, ready_truth=truth, recovery=watch.recovery_s())
    finally:
        pg.stop()


def pg_hung(model_factory: Callable[[], Any], scale: Scale) -> dict[str, Any]:
    injected = f"a TCP proxy between server and database stops forwarding for {scale.fault_s:g} s"
    return _proxied(model_factory, scale, "PostgreSQL hung", injected, "hang")


def pg_slow(model_factory: Callable[[], Any], scale: Scale) -> dict[str, Any]:
    injected = f"the proxy delays every chunk by {scale.pg_delay_s * 1000:g} ms, each way, for {scale.fault_s:g} s"
    return _proxied(model_factory, scale, "PostgreSQL slow", injected, "slow")


def mount_tmpfs(size: int) -> Path:
    """A fresh tmpfs of ``size`` bytes (needs the right to mount: root, or CAP_SYS_ADMIN); RuntimeError if refused."""
    where = Path(tempfile.mkdtemp(prefix="candor-full-"))
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        where.rmdir()
        raise RuntimeError(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode})")
    return where


def fill(folder: Path) -> Path:
    """Write a file in ``folder`` until the file system says ENOSPC; the file (to delete, to free the space)."""
    filler = folder / "filler"
    with filler.open("wb") as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
                fh.flush()
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise
    return filler


def sqlite_full(model_factory: Callable[[], Any], scale: Scale) -> dict[str, Any]:
    disk = mount_tmpfs(scale.tmpfs_bytes)
    try:
        database = f"sqlite:///{disk / 'served.db'}"
        with app_server(model_factory, scale, True, store=database) as (url, _), Watch([url]) as watch:
            watch.warm()
            time.sleep(scale.phase_s)
            watch.begin_fault()
            filler = fill(disk)
            time.sleep(scale.fault_s)
            filler.unlink()
            watch.end_fault()
            time.sleep(scale.phase_s)
        return row(
            "SQLite on a full disk",
            f"a {scale.tmpfs_bytes >> 20} MiB tmpfs filled to ENOSPC for {scale.fault_s:g} s, then freed",
            watch,
            database,
            ready_truth=503,
            recovery=watch.recovery_s(),
        )
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True, check=False)
        with contextlib.suppress(OSError):
            disk.rmdir()


def replica_killed(serve_args: list[str], scale: Scale, threads: int = 1) -> dict[str, Any]:
    """Two ``candor serve`` processes on one PostgreSQL; one is killed with -9 under load, then started again."""
    from benchmarks.servers import PostgresServer, free_port, start_candor_serve

    pg = PostgresServer()
    procs: list[subprocess.Popen] = []
    try:
        database = pg.create_database()
        env = {"CANDOR_API_KEY": KEY, "CANDOR_ADMIN_KEY": ADMIN}
        ports = [free_port(), free_port()]
        args = [*serve_args, "--store", database]
        procs = [start_candor_serve(args, port, threads=threads, env=env) for port in ports]
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        with Watch(urls) as watch:
            watch.warm()
            time.sleep(scale.phase_s)
            watch.begin_fault()
            procs[0].send_signal(signal.SIGKILL)
            procs[0].wait(timeout=30)
            time.sleep(scale.fault_s)
            watch.end_fault()  # a supervisor (systemd, Kubernetes) starts it again
            procs[0] = start_candor_serve(args, ports[0], threads=threads, env=env)
            time.sleep(scale.phase_s)
        survivor = [s for t, s in watch.ready_during(1)]
        return row(
            "a replica killed -9",
            f"kill -9 of one of two replicas on one PostgreSQL, restarted after {scale.fault_s:g} s",
            watch,
            database,
            ready_truth=200,
            recovery=watch.recovery_s(),
            ready_url=1,
            extra={
                "ready_during": {
                    "killed": dict(Counter(str(s) for _, s in watch.ready_during(0)).most_common()),
                    "survivor": dict(Counter(str(s) for s in survivor).most_common()),
                },
                "recovery_note": "the killed replica's restart until it is ready; the survivor served throughout",
            },
        )
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=60)
        pg.stop()


PARTIAL = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


def slow_headers(model_factory: Callable[[], Any], scale: Scale) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        database = f"sqlite:///{Path(tmp) / 'served.db'}"
        with app_server(model_factory, scale, store=database) as (url, _), Watch([url]) as watch:
            watch.warm()
            time.sleep(scale.phase_s)
            watch.begin_fault()
            port = int(url.rsplit(":", 1)[1])
            slow = []
            for _ in range(scale.slow_headers):
                sock = socket.create_connection(("127.0.0.1", port), timeout=5)
                sock.sendall(PARTIAL)
                slow.append(sock)
            shed = wait_until(
                lambda: all(closed(s) for s in slow), scale.header_timeout_s + 30, "the slow senders shed"
            )
            for sock in slow:
                sock.close()
            watch.end_fault()
            time.sleep(scale.phase_s)
            recovery = watch.recovery_s()
        return row(
            f"{scale.slow_headers:,} slow-header connections",
            f"{scale.slow_headers:,} connections send half a request's headers and wait "
            f"(--header-timeout {scale.header_timeout_s:g})",
            watch,
            database,
            ready_truth=200,
            recovery=recovery,
            extra={"slow_connections_shed_after_s": round(shed, 2)},
        )


def closed(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (its end of file read, or a reset), without waiting."""
    sock.setblocking(False)
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def label_flood(model_factory: Callable[[], Any], scale: Scale) -> dict[str, Any]:
    """End-user feedback in a flood (repeats on a few answers): one label per choice and key, the operator's stay."""

    with tempfile.TemporaryDirectory() as tmp:
        database = f"sqlite:///{Path(tmp) / 'served.db'}"
        with app_server(model_factory, scale, store=database) as (url, _), Watch([url]) as watch:
            watch.warm()
            time.sleep(scale.phase_s)
            watch.begin_fault()
            targets = [rid for rid in sorted(watch.acknowledged())[:3]]
            flood: Counter = Counter()
            start = time.monotonic()
            for i in range(scale.flood_labels):
                body = {"id": targets[i % len(targets)], "index": 0, "correct": i % 2 == 0}
                status, answer = request(f"{url}/v1/feedback", body)
                flood[outcome(status, answer)] += 1
            rate = scale.flood_labels / (time.monotonic() - start)
            watch.end_fault()
            time.sleep(scale.phase_s)
        result = row(
            "a flood of labels",
            f"{scale.flood_labels:,} inference-key labels, as fast as one client sends them, on {len(targets)} answers",
            watch,
            database,
            ready_truth=200,
            recovery=watch.recovery_s(),
            extra={
                "flood_outcomes": dict(flood.most_common()),
                "flood_per_s": round(rate, 1),
                "user_labels_stored": user_labels(database),
            },
        )
        return result


def user_labels(database: str) -> int:
    """Rows of end-user labels the database holds (one per choice and key is the rule)."""
    import sqlalchemy as sa

    from candor.annotation.served_store import engine_url

    engine = sa.create_engine(engine_url(database))
    try:
        with engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT count(*) FROM labels WHERE label_source = 'user'")).scalar())
    finally:
        engine.dispose()


def root_symlink_fifo(model_factory: Callable[[], Any], scale: Scale, save_folder: Callable[[Path, str], None]) -> dict:
    """Reloads naming a folder whose honest.json is a symlink out of the root, and one whose honest.json is a FIFO."""
    with tempfile.TemporaryDirectory() as tmp:
        root, outside = Path(tmp) / "root", Path(tmp) / "outside"
        save_folder(root / "honest", "v1")
        save_folder(outside, "outside")
        (root / "link").mkdir()
        (root / "link" / "honest.json").symlink_to(outside / "honest.json")
        (root / "pipe").mkdir()
        os.mkfifo(root / "pipe" / "honest.json")
        save_folder(root / "next", "v2")
        database = f"sqlite:///{Path(tmp) / 'served.db'}"
        settings = {"store": database, "honest_folder": root / "honest", "honest_root": root}
        with app_server(model_factory, scale, **settings) as (url, app), Watch([url]) as watch:
            watch.warm()
            time.sleep(scale.phase_s)
            watch.begin_fault()
            reloads = {}
            serving = app.state.service.current.version
            for name in ("link", "pipe"):
                start = time.monotonic()
                status, body = request(f"{url}/admin/reload", {"honest": name}, key=ADMIN, timeout=60)
                message = (body.get("error") or {}).get("message", "")
                reloads[name] = {
                    "outcome": outcome(status, body),
                    "seconds": round(time.monotonic() - start, 3),
                    "names_outside": str(outside) in message or tmp in message.replace(str(root), ""),
                }
            kept = app.state.service.current.version == serving
            time.sleep(max(0.0, scale.fault_s - (time.monotonic() - watch.fault_started)))
            watch.end_fault()
            status, body = request(f"{url}/admin/reload", {"honest": "next"}, key=ADMIN, timeout=120)
            reloads["next"] = {"outcome": outcome(status, body), "version": body.get("model_version")}
            time.sleep(scale.phase_s)
        with contextlib.suppress(OSError):  # a reader blocked on the FIFO (none, after the fix) gets its end of file
            os.close(os.open(root / "pipe" / "honest.json", os.O_WRONLY | os.O_NONBLOCK))
        return row(
            "a symlink or FIFO in the root",
            "POST /admin/reload of a folder whose honest.json is a symlink out of --honest-root, then of one "
            "whose honest.json is a FIFO",
            watch,
            database,
            ready_truth=200,
            recovery=watch.recovery_s(),
            extra={"reloads": reloads, "model_kept": kept},
        )


FAULTS = ("pg-stopped", "pg-hung", "pg-slow", "sqlite-full", "replica-kill9", "slow-headers", "label-flood", "root")


# ---------------------------------------------------------------- the benchmark


def embedded_factory() -> tuple[Callable[[], Any], Callable[[Path, str], None]]:
    """The embedded SmolLM2 answering everything (no threshold): a new honest model per server, one backend."""
    from candor.backends import load_backend
    from candor.serve import HonestModel
    from candor.serve.answering import Decoding

    backend = load_backend()

    def make() -> Any:
        return HonestModel(backend, confidence="n-prob", decoding=Decoding(max_new_tokens=4))

    def save(folder: Path, version: str) -> None:
        model = make()
        model.version = version
        model.save_pretrained(folder)

    return make, save


def run_fault(
    name: str, scale: Scale, make: Callable[[], Any], save: Callable[[Path, str], None], serve_args: list[str]
) -> dict:
    """One fault by name; a fault this machine cannot inject is a row saying why."""
    runners: dict[str, Callable[[], dict[str, Any]]] = {
        "pg-stopped": lambda: pg_stopped(make, scale),
        "pg-hung": lambda: pg_hung(make, scale),
        "pg-slow": lambda: pg_slow(make, scale),
        "sqlite-full": lambda: sqlite_full(make, scale),
        "replica-kill9": lambda: replica_killed(serve_args, scale),
        "slow-headers": lambda: slow_headers(make, scale),
        "label-flood": lambda: label_flood(make, scale),
        "root": lambda: root_symlink_fifo(make, scale, save),
    }
    return {"key": name, **runners[name]()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--only", choices=FAULTS, action="append", help="run only these faults (repeatable)")
    args = parser.parse_args(argv)
    scale = Scale()
    make, save = embedded_factory()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "honest"
        save(folder, "faults")
        serve_args = ["--honest", str(folder), "--max-batch", "4"]
        previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"faults": []}
        rows = {r["key"]: r for r in previous.get("faults", [])}
        for name in args.only or FAULTS:
            print(f"fault {name} …", flush=True)
            rows[name] = run_fault(name, scale, make, save, serve_args)
            print(json.dumps(rows[name]), flush=True)
            write_results(rows, scale)  # after each fault: a run cut short keeps what it measured
    print(f"wrote {RESULTS}")
    return 0


def write_results(rows: dict[str, dict[str, Any]], scale: Scale) -> None:
    result = {
        "command": "python -m benchmarks.faults",
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "load_average": [round(x, 1) for x in os.getloadavg()],
        },
        "model": "smollm2-135m (embedded), no threshold, max_new_tokens 4",
        "scale": scale.__dict__,
        "faults": [rows[name] for name in FAULTS if name in rows],
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
