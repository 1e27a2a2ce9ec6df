"""A TCP proxy for fault tests: forwards 127.0.0.1:port to a target, and can stop forwarding (a hung network:
connections stay open, bytes go nowhere) or delay every chunk (a slow network), then heal.

Each connection is two threads copying bytes; ``hang()`` makes them hold what they read (and new connections
are accepted but not forwarded) until ``heal()``; ``delay_s`` sleeps before each forwarded chunk.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time


class TcpProxy:
    """Forward ``127.0.0.1:self.port`` to ``(host, port)`` until closed."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.delay_s = 0.0
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True, name="proxy-accept").start()

    def hang(self) -> None:
        """Stop forwarding: every byte is held, connections stay open (what a dead route looks like)."""
        self._flowing.clear()

    def heal(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()
        with self._lock:
            for s in [self._listener, *self._sockets]:
                with contextlib.suppress(OSError):
                    s.close()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._open, args=(client,), daemon=True, name="proxy-conn").start()

    def _open(self, client: socket.socket) -> None:
        self._flowing.wait()  # a hung route does not even reach the server
        try:
            server = socket.create_connection(self.target)
        except OSError:
            client.close()
            return
        with self._lock:
            self._sockets += [client, server]
        for a, b in ((client, server), (server, client)):
            threading.Thread(target=self._pipe, args=(a, b), daemon=True, name="proxy-pipe").start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                self._flowing.wait()
                if self.delay_s:
                    time.sleep(self.delay_s)
                if self._closed.is_set():
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
