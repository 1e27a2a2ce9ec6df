"""Run the app under uvicorn: in the foreground (``candor serve``) or in a thread (tests, benchmarks)."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI

logger = logging.getLogger(__name__)


def run(app: FastAPI, host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serve until interrupted."""
    uvicorn.run(app, host=host, port=port, log_level="info")


@contextlib.contextmanager
def serve_in_thread(app: FastAPI, host: str = "127.0.0.1", startup_timeout: float = 60.0) -> Iterator[str]:
    """A real uvicorn server on a free port in a daemon thread; yields its base URL, stops on exit."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
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
