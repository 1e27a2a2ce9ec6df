"""A real PostgreSQL for the tests: initdb and pg_ctl in a temporary folder, on 127.0.0.1 and a free port.

The binaries are looked up on PATH, in /usr/local/bin and in Debian's /usr/lib/postgresql/*/bin
(CI installs the ``postgresql`` package, .ci/run). initdb refuses to run as root, so as root the
cluster belongs to an unprivileged user (``nobody``, through ``runuser`` or ``su``). Without the
binaries, or psycopg, the tests that need the server skip and say why.

``postgres_server`` (one per session) is the server; ``postgres_url`` a fresh database on it per test.
"""

from __future__ import annotations

import glob
import os
import shlex
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

UNPRIVILEGED = "nobody"


def find_binary(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for candidate in [f"/usr/local/bin/{name}", *sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)]:
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def as_user(command: list[str]) -> list[str]:
    """``command`` run as the unprivileged user when this process is root (initdb refuses root)."""
    if os.geteuid() != 0:
        return command
    if shutil.which("runuser"):
        return ["runuser", "-u", UNPRIVILEGED, "--", *command]
    if shutil.which("su"):
        return ["su", "-s", "/bin/sh", UNPRIVILEGED, "-c", shlex.join(command)]
    pytest.skip("running as root without runuser or su: initdb refuses root, so no PostgreSQL can start")


class PostgresServer:
    """One PostgreSQL cluster in a temporary folder, trusting local connections, listening on 127.0.0.1."""

    def __init__(self) -> None:
        initdb, pg_ctl = find_binary("initdb"), find_binary("pg_ctl")
        if initdb is None or pg_ctl is None:
            pytest.skip("PostgreSQL's initdb/pg_ctl not found (PATH, /usr/local/bin, /usr/lib/postgresql/*/bin)")
        pytest.importorskip("psycopg", reason="psycopg 3 is not installed (pip install 'candor-honesty[store]')")
        self.pg_ctl = pg_ctl
        self.root = Path(tempfile.mkdtemp(prefix="candor-pg-"))  # under /tmp: the unprivileged user reaches it
        self.data = self.root / "data"
        self.port = free_port()
        if os.geteuid() == 0:
            import pwd

            user = pwd.getpwnam(UNPRIVILEGED)
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self._run([initdb, "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"])
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off"
        self._run([pg_ctl, "-D", str(self.data), "-o", options, "-l", str(self.root / "log"), "-w", "start"])

    def _run(self, command: list[str]) -> None:
        done = subprocess.run(as_user(command), capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            log = self.root / "log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{command[0]} failed ({done.returncode}): {done.stderr[-2000:]}{tail}")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)

    def stop(self) -> None:
        subprocess.run(
            as_user([self.pg_ctl, "-D", str(self.data), "-m", "immediate", "stop"]),
            capture_output=True,
            timeout=60,
            check=False,
        )
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """A fresh, empty database on the session's server."""
    return postgres_server.create_database()
