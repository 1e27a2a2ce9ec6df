"""Servers the benchmarks (and the tests) start: a free port, ``candor serve`` run as a user runs it, ready to
answer, and a real PostgreSQL in a temporary folder.

:class:`PostgresServer` runs ``initdb`` and ``pg_ctl`` in a temporary folder, on 127.0.0.1 and a free
port. The binaries are looked up on PATH, in /usr/local/bin and in Debian's /usr/lib/postgresql/*/bin
(CI installs the ``postgresql`` package, .ci/run). initdb refuses to run as root, so as root the
cluster belongs to an unprivileged user (``nobody``, through ``runuser`` or ``su``). Where none can
start (no binaries, no psycopg, root without either) it raises :class:`PostgresUnavailable` saying
why; the tests' fixtures (tests/postgres.py) skip with that reason.
"""

from __future__ import annotations

import glob
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sampling_model_copy(model_dir: str | Path, dest: str | Path) -> Path:
    """A copy of a model folder whose ``generation_config.json`` has ``do_sample: true``, for a server that
    samples only as its model's config says (``transformers serve``: the embedded model's config has no
    ``do_sample``, so without this every "sample" is the greedy text). Files are linked, not copied; the
    config is the model's own plus ``do_sample``."""
    source, dest = Path(model_dir), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.name != "generation_config.json" and not (dest / path.name).exists():
            (dest / path.name).symlink_to(path.resolve())
    config_path = source / "generation_config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    (dest / "generation_config.json").write_text(json.dumps({**config, "do_sample": True}, indent=2) + "\n")
    return dest


def start_candor_serve(
    serve_args: Sequence[str],
    port: int,
    *,
    threads: int,
    src: Path = ROOT / "src",
    limit_s: float = 600.0,
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen:
    """``candor serve --port PORT *serve_args`` from the source tree ``src``, once ``/health`` answers.

    ``threads``: the server's OpenMP threads. The API key is unset unless ``env`` (variables set for
    the server, such as ``CANDOR_API_KEY`` and ``CANDOR_ADMIN_KEY``) sets it. Raises RuntimeError with
    the server's last log lines if it exits or does not answer within ``limit_s``.
    """
    environ = {**os.environ, "PYTHONPATH": str(Path(src).resolve()), "OMP_NUM_THREADS": str(threads)}
    environ.pop("CANDOR_API_KEY", None)
    environ.update(env or {})
    cmd = [sys.executable, "-m", "candor.cli", "serve", "--port", str(port), *serve_args]
    log = tempfile.TemporaryFile()  # noqa: SIM115  (the server writes to it for its whole life)
    proc = subprocess.Popen(cmd, env=environ, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + limit_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                log.seek(0)
                tail = log.read().decode(errors="replace")[-2000:]
                raise RuntimeError(f"candor serve did not start:\n{tail}") from None
            time.sleep(0.5)


def resident_mib(pid: int) -> float:
    """Process ``pid``'s resident memory in MiB (Linux ``/proc``), to 0.1 MiB."""
    return resident_parts_mib(pid)["rss"]


def resident_parts_mib(pid: int) -> dict[str, float]:
    """Process ``pid``'s resident memory in MiB, to 0.1 MiB: all of it (``rss``), and its parts: ``anon`` (the
    heap: what the process allocated) and ``file`` (pages of mapped files, such as the weights, which the kernel
    drops and reads back under memory pressure from other processes)."""
    fields = {"VmRSS": "rss", "RssAnon": "anon", "RssFile": "file"}
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name = line.split(":", 1)[0]
        if name in fields:
            found[fields[name]] = round(int(line.split()[1]) / 1024, 1)
    if "rss" not in found:
        raise RuntimeError(f"/proc/{pid}/status has no VmRSS line")
    return found


UNPRIVILEGED = "nobody"  # who owns the PostgreSQL cluster when this process is root


class PostgresUnavailable(RuntimeError):
    """No PostgreSQL can start on this machine; the message says why."""


def find_binary(name: str) -> str | None:
    """A PostgreSQL program on PATH, in /usr/local/bin or in Debian's /usr/lib/postgresql/*/bin (newest first)."""
    found = shutil.which(name)
    if found:
        return found
    for candidate in [f"/usr/local/bin/{name}", *sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)]:
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def as_user(command: list[str]) -> list[str]:
    """``command`` run as the unprivileged user when this process is root (initdb refuses root)."""
    if os.geteuid() != 0:
        return command
    if shutil.which("runuser"):
        return ["runuser", "-u", UNPRIVILEGED, "--", *command]
    if shutil.which("su"):
        return ["su", "-s", "/bin/sh", UNPRIVILEGED, "-c", shlex.join(command)]
    raise PostgresUnavailable("running as root without runuser or su: initdb refuses root, so no PostgreSQL can start")


class PostgresServer:
    """One PostgreSQL cluster in a temporary folder, trusting local connections, listening on 127.0.0.1."""

    def __init__(self) -> None:
        initdb, pg_ctl = find_binary("initdb"), find_binary("pg_ctl")
        if initdb is None or pg_ctl is None:
            raise PostgresUnavailable(
                "PostgreSQL's initdb/pg_ctl not found (PATH, /usr/local/bin, /usr/lib/postgresql/*/bin)"
            )
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise PostgresUnavailable("psycopg 3 is not installed (pip install 'candor-honesty[store]')") from None
        as_user([initdb])  # refused here, before any folder is made, when no unprivileged user can run it
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
        """A fresh, empty database on this server; its URL."""
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
