"""A fleet of generation servers that hands out work by availability and survives a lost server.

Each server has ``slots`` worker threads; every thread takes the next job from
one shared queue, so a fast server takes more jobs and a slow one fewer (no
fixed split). A job that fails with a server's error (:class:`UpstreamError`:
the server is unreachable, timed out, or answered 5xx/429) takes that server
out and goes back on the queue for the others, up to ``attempts`` tries in
all. A server taken out is probed (``probe``: one cheap request, not a job)
after ``backoff`` seconds, doubling up to ``max_backoff``, and put back in
when a probe answers; after ``probes`` failed probes in a row it is out for
good. When every server is out for good, the jobs left fail at once, naming
why. An error that is the job's own (a request the server refused as
invalid, bad settings: any other :class:`CandorError`) is not retried.

A job's result is set once, by the one try that succeeded, so a job whose
first server died mid-request is counted once.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from candor.util.errors import CandorError, UpstreamError

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Statuses with which a server refuses a request's content: the job's fault, not the server's.
REFUSED = frozenset({400, 404, 413, 422})


@dataclass(frozen=True)
class RetryPolicy:
    """How often a job is tried, and how a failed server is backed off and probed back in."""

    attempts: int = 4
    backoff: float = 1.0
    max_backoff: float = 30.0
    probes: int = 6

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.probes < 1:
            raise CandorError(f"a fleet needs at least one try per job and one probe per server, got {self}")
        if self.backoff <= 0 or self.max_backoff < self.backoff:
            raise CandorError(f"a fleet's backoff must be > 0 and at most max_backoff, got {self}")

    def delay(self, failures: int) -> float:
        """Seconds out of rotation after ``failures`` failures in a row (1, 2, 4, … up to max_backoff)."""
        return min(self.max_backoff, self.backoff * 2 ** max(0, failures - 1))


class JobFailed(CandorError):
    """A job the fleet could not complete: every try failed, or it failed in a way no retry would mend."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


def is_server_fault(exc: BaseException) -> bool:
    """Whether ``exc`` says the server failed (retry elsewhere), not that the job itself is wrong."""
    if not isinstance(exc, UpstreamError):
        return False
    status = getattr(exc, "status", None)
    return status is None or status not in REFUSED


@dataclass
class Server:
    """One server of the fleet: its name (URL), what the jobs call, and its state."""

    name: str
    handle: Any
    failures: int = 0
    probes_failed: int = 0
    retry_at: float = 0.0
    retired: bool = False
    last_error: str = ""
    done: int = 0
    probing: bool = field(default=False, repr=False)

    @property
    def up(self) -> bool:
        return self.failures == 0 and not self.retired


@dataclass
class _Job(Generic[T]):
    key: str
    run: Callable[[Any], T]
    future: Future = field(default_factory=Future)
    errors: list[str] = field(default_factory=list)


class Fleet:
    """Servers, ``slots`` threads each, pulling jobs from one queue; ``submit`` returns each job's future."""

    def __init__(
        self,
        servers: Sequence[tuple[str, Any]],
        *,
        slots: int,
        probe: Callable[[Any], object],
        policy: RetryPolicy | None = None,
    ) -> None:
        if not servers:
            raise CandorError("a fleet needs at least one server")
        if slots < 1:
            raise CandorError(f"a fleet needs at least one request slot per server, got {slots}")
        self.servers = [Server(name=name, handle=handle) for name, handle in servers]
        self.policy = policy or RetryPolicy()
        self.probe = probe
        self._queue: queue.Queue[_Job[Any]] = queue.Queue()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._threads = [
            threading.Thread(target=self._work, args=(server,), name=f"fleet-{i}-{s}", daemon=True)
            for i, server in enumerate(self.servers)
            for s in range(slots)
        ]
        for thread in self._threads:
            thread.start()

    # ------------------------------------------------------------ callers

    def submit(self, key: str, run: Callable[[Any], T]) -> Future:
        """Queue a job (``run(handle)`` on whichever server takes it); its future holds the result or a JobFailed."""
        job: _Job[T] = _Job(key, run)
        if self._all_retired():
            job.future.set_exception(self._gone(job))
        else:
            self._queue.put(job)
        return job.future

    def run(self, jobs: Sequence[tuple[str, Callable[[Any], T]]]) -> list[T | JobFailed]:
        """Every job's result, in order, or its :class:`JobFailed` (other exceptions propagate)."""
        futures = [self.submit(key, fn) for key, fn in jobs]
        out: list[T | JobFailed] = []
        for future in futures:
            try:
                out.append(future.result())
            except JobFailed as exc:
                out.append(exc)
        return out

    def close(self) -> None:
        self._closed.set()

    def report(self) -> list[dict[str, Any]]:
        """Each server's state: jobs done, whether it is up or out for good, and its last error."""
        with self._lock:
            return [
                {"server": s.name, "done": s.done, "up": s.up, "retired": s.retired, "last_error": s.last_error}
                for s in self.servers
            ]

    # ------------------------------------------------------------ worker threads

    def _work(self, server: Server) -> None:
        while not self._closed.is_set():
            if not self._ready(server):
                continue
            try:
                job = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            if not server.up:  # taken out while this thread waited: leave the job to the others
                self._queue.put(job)
                continue
            self._try(server, job)

    def _ready(self, server: Server) -> bool:
        """Whether this thread may take a job; a server out of rotation is probed here when its time comes."""
        with self._lock:
            if server.retired:
                gone = self._all_retired_locked()
            elif server.up:
                return True
            else:
                wait = server.retry_at - time.monotonic()
                due = wait <= 0 and not server.probing
                server.probing = server.probing or due
        if server.retired:
            if gone:
                self._fail_queued()  # a job put back while the last server went out
            self._closed.wait(0.5)
            return False
        if not due:
            self._closed.wait(min(max(wait, 0.05), 0.5))
            return False
        try:
            self.probe(server.handle)
        except Exception as exc:  # noqa: BLE001  (any failure keeps it out; the count bounds the probing)
            self._probe_failed(server, exc)
        else:
            with self._lock:
                logger.warning("%s answers again: back in the fleet", server.name)
                server.failures, server.probes_failed = 0, 0
        finally:
            with self._lock:
                server.probing = False
        return False

    def _probe_failed(self, server: Server, exc: BaseException) -> None:
        with self._lock:
            server.probes_failed += 1
            server.last_error = str(exc)
            if server.probes_failed >= self.policy.probes:
                server.retired = True
                logger.warning(
                    "%s: out of the fleet for good after %d failed probes", server.name, server.probes_failed
                )
            else:
                server.retry_at = time.monotonic() + self.policy.delay(server.failures + server.probes_failed)
            gone = self._all_retired_locked()
        if gone:
            self._fail_queued()

    def _try(self, server: Server, job: _Job[Any]) -> None:
        try:
            result = job.run(server.handle)
        except Exception as exc:  # noqa: BLE001  (sorted below: the server's fault is retried, others end the job)
            if not is_server_fault(exc):
                message = f"{job.key}: {exc}"
                job.future.set_exception(JobFailed(message, retryable=False))
                return
            self._server_failed(server, exc)
            job.errors.append(f"{server.name}: {exc}")
            if len(job.errors) >= self.policy.attempts:
                tries = "; ".join(job.errors[-2:])
                message = f"{job.key}: failed {len(job.errors)} tries ({tries})"
                job.future.set_exception(JobFailed(message, retryable=True))
            elif self._all_retired():
                job.future.set_exception(self._gone(job))
            else:
                self._queue.put(job)
            return
        with self._lock:
            server.done += 1
            if server.failures:  # a request sent before it failed came back: it answers again
                server.failures, server.probes_failed = 0, 0
        job.future.set_result(result)

    def _server_failed(self, server: Server, exc: BaseException) -> None:
        with self._lock:
            if server.up:
                logger.warning("%s failed (%s): out of the fleet, its work goes to the others", server.name, exc)
            server.failures += 1
            server.last_error = str(exc)
            server.retry_at = time.monotonic() + self.policy.delay(server.failures)

    def _all_retired(self) -> bool:
        with self._lock:
            return self._all_retired_locked()

    def _all_retired_locked(self) -> bool:
        return all(s.retired for s in self.servers)

    def _gone(self, job: _Job[Any]) -> JobFailed:
        why = "; ".join(f"{s.name}: {s.last_error}" for s in self.servers)
        return JobFailed(f"{job.key}: no server of the fleet answers ({why})", retryable=True)

    def _fail_queued(self) -> None:
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            job.future.set_exception(self._gone(job))


__all__ = ["Fleet", "JobFailed", "RetryPolicy", "Server", "is_server_fault"]
