"""Servers the benchmarks start: a free port, and ``candor serve`` run as a user runs it, ready to answer."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_candor_serve(
    serve_args: Sequence[str], port: int, *, threads: int, src: Path = ROOT / "src", limit_s: float = 600.0
) -> subprocess.Popen:
    """``candor serve --port PORT *serve_args`` from the source tree ``src``, once ``/health`` answers.

    ``threads``: the server's OpenMP threads. The API key is unset, so the
    clients need none. Raises RuntimeError with the server's last log lines
    if it exits or does not answer within ``limit_s``.
    """
    env = {**os.environ, "PYTHONPATH": str(Path(src).resolve()), "OMP_NUM_THREADS": str(threads)}
    env.pop("CANDOR_API_KEY", None)
    cmd = [sys.executable, "-m", "candor.cli", "serve", "--port", str(port), *serve_args]
    log = tempfile.TemporaryFile()  # noqa: SIM115  (the server writes to it for its whole life)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log)
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
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    raise RuntimeError(f"/proc/{pid}/status has no VmRSS line")
