"""Run the app under uvicorn: in the foreground (``candor serve``) or in a thread (tests, benchmarks).

In the foreground, ``SIGTERM`` (and a first ``Ctrl-C``) drains: the server keeps
listening while in-flight requests finish, answering ``/ready`` and new work
with 503 (so a load balancer sees it leave instead of a refused connection),
then uvicorn stops, the app shuts down, and the process exits 0 on ``SIGTERM``.
A second signal stops at once.

Every server here holds its connections within :class:`~candor.serve.http.connections.ConnectionLimits`
(a header deadline, a connection cap fitted to the process's descriptors, repeated log records held back).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI

from candor.serve.http.connections import ConnectionLimits, fit_to_descriptors, hold_back_repeats, protocol_for
from candor.util.errors import CandorError

logger = logging.getLogger(__name__)


DEFAULT_LIMITS = ConnectionLimits()
DRAIN_LIMIT_S = 60.0  # the longest a drain keeps listening before uvicorn stops anyway


class DrainingServer(uvicorn.Server):
    """A uvicorn server that drains before it stops listening (see the module docstring).

    ``on_signal`` marks the app as draining; ``in_flight`` says how much work is left.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        on_signal: Callable[[], None] | None = None,
        in_flight: Callable[[], int] | None = None,
    ) -> None:
        super().__init__(config)
        self.on_signal = on_signal
        self.in_flight = in_flight
        self._draining = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._draining or self.in_flight is None:  # a second signal, or nothing to wait for: stop now
            self._stop(sig, frame)
            return
        self._draining = True
        threading.Thread(target=self._drain_then_stop, args=(sig, frame), daemon=True, name="candor-drain").start()

    def _drain_then_stop(self, sig: int, frame: FrameType | None) -> None:
        if self.on_signal is not None:
            self.on_signal()
        deadline = time.monotonic() + DRAIN_LIMIT_S
        while self.in_flight is not None and self.in_flight() > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        self._stop(sig, frame)

    def _stop(self, sig: int, frame: FrameType | None) -> None:
        if self.on_signal is not None:
            self.on_signal()
        super().handle_exit(sig, frame)


def bind_listener(host: str, port: int) -> socket.socket:
    """The listening socket, bound now: a busy port is refused before any model loads, not after."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise CandorError(
            f"cannot listen on {host}:{port} ({exc.strerror}): another process holds it; stop it or pass another --port"
        ) from None
    return sock


def run(
    app: FastAPI,
    host: str = "127.0.0.1",
    port: int = 8000,
    on_signal: Callable[[], None] | None = None,
    in_flight: Callable[[], int] | None = None,
    sock: socket.socket | None = None,
    access_log: bool = False,
    limits: ConnectionLimits = DEFAULT_LIMITS,
) -> None:
    """Serve until SIGTERM or Ctrl-C, then drain (``in_flight``: the work left, which draining waits for).

    ``sock`` is a socket :func:`bind_listener` bound earlier (``host`` and ``port`` are then its own).
    ``access_log`` turns on uvicorn's line per request, for an app that writes none of its own
    (``candor serve`` writes its JSON lines; ``serve-head`` does not). ``limits``: the connections' bounds.
    """
    config = limited_config(app, limits, host=host, port=port, log_level="info", access_log=access_log)
    hold_back_repeats(limits.log_interval_s)  # after uvicorn.Config, which puts uvicorn's handlers in place
    server = DrainingServer(config, on_signal, in_flight)
    # After draining, uvicorn re-raises the signal it stopped on to the handler that was in place
    # before it; for SIGTERM that handler is this no-op, so a requested stop ends with exit 0.
    previous = signal.signal(signal.SIGTERM, _drained)
    try:
        server.run(sockets=[sock] if sock is not None else None)
    finally:
        signal.signal(signal.SIGTERM, previous)


def limited_config(app: FastAPI, limits: ConnectionLimits, **options: Any) -> uvicorn.Config:
    """uvicorn's config for ``app`` with ``limits``: its protocol, and a backlog that fits the descriptors."""
    sizing = fit_to_descriptors(limits)
    if sizing.max_connections < limits.max_connections:
        logger.warning(
            "at most %d connections (not %d): %d file descriptors may be open (ulimit -n)",
            sizing.max_connections,
            limits.max_connections,
            sizing.descriptors,
        )
    return uvicorn.Config(app, http=protocol_for(limits, sizing), backlog=sizing.backlog, **options)


def _drained(sig: int, frame: FrameType | None) -> None:
    logger.info("stopped on SIGTERM after finishing in-flight requests")


@contextlib.contextmanager
def serve_in_thread(
    app: FastAPI,
    host: str = "127.0.0.1",
    startup_timeout: float = 60.0,
    limits: ConnectionLimits = DEFAULT_LIMITS,
) -> Iterator[str]:
    """A real uvicorn server on a free port in a daemon thread, within ``limits``; yields its URL, stops on exit."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(limited_config(app, limits, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="candor-uvicorn")
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
