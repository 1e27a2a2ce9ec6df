"""The connections a server holds: how long a request's headers may take, how many there may be, and logs
that a flood cannot fill.

uvicorn waits for a request's headers for ever and accepts connections until the process runs out of
file descriptors (then asyncio logs each refused ``accept``, thousands of tracebacks a second).
:class:`ConnectionLimits` puts three bounds on that, for every server :mod:`candor.serve.http.server` runs:

- **a header deadline** (``header_timeout_s``): a connection whose request line and headers are not all in
  within the deadline of the connection opening (or of its previous response, on a kept-alive one) is
  closed, with a ``408`` when it had sent part of them. A slow body is the app's own limit
  (``--body-timeout``, 408 as well).
- **a cap on connections** (``max_connections``), lowered to fit the descriptors the process may open
  (its soft ``RLIMIT_NOFILE``, raised to the hard limit first, less what is open and a reserve). At the
  cap, a new connection evicts the oldest one still waiting for its headers (an idle kept-alive one, or
  one sending them slowly); when every connection is inside a request, the new one gets ``503`` with
  ``Retry-After`` and is closed. A client that sends its request at once is thus served whatever number
  of slow senders hold connections.
- **repeated log records** (:class:`RepeatedRecords`): a warning or error logged again within
  ``log_interval_s`` is held back and counted; the next one after the interval carries the count.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from candor.util.errors import CandorError

logger = logging.getLogger(__name__)

FD_RESERVE = 64  # descriptors kept for what is not a connection (the store, model files, logs)
TIMEOUT_408 = b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
BUSY_503 = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n"


@dataclass(frozen=True)
class ConnectionLimits:
    """The bounds of :mod:`candor.serve.http.connections` (``candor serve --header-timeout``, ``--max-connections``)."""

    header_timeout_s: float = 10.0
    max_connections: int = 2048
    log_interval_s: float = 10.0

    def __post_init__(self) -> None:
        if not self.header_timeout_s > 0:
            raise CandorError(f"--header-timeout must be > 0 seconds, got {self.header_timeout_s}")
        if self.max_connections < 1:
            raise CandorError(f"--max-connections must be at least 1, got {self.max_connections}")
        if not self.log_interval_s > 0:
            raise CandorError(f"the log interval must be > 0 seconds, got {self.log_interval_s}")


@dataclass(frozen=True)
class Sizing:
    """What the limits come to on this process: the connection cap and the accept backlog, within its descriptors."""

    max_connections: int
    backlog: int
    descriptors: int  # the soft RLIMIT_NOFILE they were fitted to


def fit_to_descriptors(limits: ConnectionLimits) -> Sizing:
    """Raise the soft descriptor limit to the hard one, then fit the cap and the backlog beneath it.

    asyncio accepts up to ``backlog`` sockets before any of them is seen, so cap + backlog stays under what is free.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    free = max(soft - open_descriptors() - FD_RESERVE, 8)
    backlog = max(4, min(2048, free // 4))
    return Sizing(
        max_connections=max(1, min(limits.max_connections, free - backlog)), backlog=backlog, descriptors=soft
    )


def open_descriptors() -> int:
    """How many descriptors this process holds now (Linux ``/proc``; elsewhere a guess of 32)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 32


# The connections of each server still waiting for a request's headers, oldest first (keyed by uvicorn's state).
_waiting: weakref.WeakKeyDictionary[Any, dict[LimitedH11Protocol, None]] = weakref.WeakKeyDictionary()


class LimitedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header deadline and a connection cap (:func:`protocol_for` sets them)."""

    header_timeout_s: float = ConnectionLimits.header_timeout_s
    max_connections: int = ConnectionLimits.max_connections

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        if len(self.connections) > self.max_connections:
            waiting = self._waiting_list()
            if waiting:
                oldest = next(iter(waiting))
                logger.warning(
                    "at the cap of %d connections: closed the oldest one still waiting for its headers",
                    self.max_connections,
                )
                oldest._close(None)
            else:
                logger.warning("at the cap of %d connections, all inside a request: refused one", self.max_connections)
                self._close(BUSY_503)
                return
        self._await_headers()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:
            self._headers_in()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._await_headers()  # a kept-alive connection waits for its next request's headers

    def connection_lost(self, exc: Exception | None) -> None:
        self._headers_in()
        super().connection_lost(exc)

    def _waiting_list(self) -> dict[LimitedH11Protocol, None]:
        return _waiting.setdefault(self.server_state, {})

    def _await_headers(self) -> None:
        self._headers_in()
        self._waiting_list()[self] = None
        self._deadline = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _headers_in(self) -> None:
        deadline = getattr(self, "_deadline", None)
        if deadline is not None:
            deadline.cancel()
            self._deadline = None
        self._waiting_list().pop(self, None)

    def _headers_late(self) -> None:
        self._deadline = None
        if self.conn.their_state is not h11.IDLE:
            return
        partial = bool(self.conn.trailing_data[0])
        if partial:
            logger.warning(
                "a request's headers did not arrive within %g s: closed its connection (408)", self.header_timeout_s
            )
        self._close(TIMEOUT_408 if partial else None)

    def _close(self, answer: bytes | None) -> None:
        self._headers_in()
        if self.transport.is_closing():
            return
        if answer is not None:
            self.transport.write(answer)
        self.transport.close()


def protocol_for(limits: ConnectionLimits, sizing: Sizing) -> type[LimitedH11Protocol]:
    """The protocol class uvicorn runs (``uvicorn.Config(http=...)``) with these limits."""
    return type(
        "LimitedH11Protocol",
        (LimitedH11Protocol,),
        {"header_timeout_s": limits.header_timeout_s, "max_connections": sizing.max_connections},
    )


class RepeatedRecords(logging.Filter):
    """Lets a warning or error through once per ``interval_s`` per kind (logger, level, first line, exception type);
    the next one let through after the interval says how many like it were held back."""

    MAX_KINDS = 1024

    def __init__(self, interval_s: float) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._kinds: dict[tuple[Any, ...], list[float]] = {}  # kind -> [last let through, held back since]
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        first_line = str(record.msg).split("\n", 1)[0][:200]
        kind = (record.name, record.levelno, first_line, record.exc_info[0] if record.exc_info else None)
        now = time.monotonic()
        with self._lock:
            seen = self._kinds.get(kind)
            if seen is not None and now - seen[0] < self.interval_s:
                seen[1] += 1
                return False
            held = 0 if seen is None else int(seen[1])
            if len(self._kinds) >= self.MAX_KINDS:
                self._kinds.pop(next(iter(self._kinds)))
            self._kinds.pop(kind, None)
            self._kinds[kind] = [now, 0]
        if held:
            record.msg = f"{record.msg} (and {held} more like it in the {self.interval_s:g} s before)"
        return True


def hold_back_repeats(interval_s: float) -> RepeatedRecords:
    """Put one :class:`RepeatedRecords` on every handler of the root logger and of uvicorn's loggers."""
    repeated = RepeatedRecords(interval_s)
    for name in (None, "uvicorn", "uvicorn.error", "asyncio"):
        for handler in logging.getLogger(name).handlers:
            if not any(isinstance(f, RepeatedRecords) for f in handler.filters):
                handler.addFilter(repeated)
    return repeated
