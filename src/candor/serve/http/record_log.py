"""Every served question into the store (``--store URL``), and as one JSONL line with ``--log-records FILE``.

The store (:class:`~candor.annotation.served_store.ServedStore`) is what feedback,
``candor label`` and ``candor adapt`` read; the file is an export. Each line (and
each stored record) is a :class:`~candor.annotation.records.Record` (``read_records``
reads the file back): the question, the greedy answer the confidence was
computed for, the method's samples, and in ``provenance`` the model, template
and decoding they were made with plus ``served``: the confidence object each
choice got, the texts returned and, with ``--claims``, each claim's text
(a removed claim's too, which no client is sent). Such a file can be re-scored, judged
against gold answers later (``candor rejudge``) and used as a calibration set.
``served.id`` is the response id a client saw and ``served.indexes`` the choices
the record's answers fill in it, so a label sent later (``POST /v1/feedback``)
finds its record. Per choice the store also keeps whether it was answered, the
text it returned, and whether that text is the one the confidence scored
(``scores_returned_text``).

**The store is never a silent single point of failure** (docs/serving.md, "When the store fails"). Every
store call runs off the event loop, on threads of its own, within :data:`STORE_TIMEOUT_S`
(:meth:`RecordLog.call`); one that fails or runs past it marks the store unavailable, and the server then:

- answers ``/ready`` 503 (a load balancer sends traffic elsewhere) while ``/health`` still answers;
- refuses questions and feedback with 503 ``store_unavailable`` before any generation (an answer the
  store could not keep is never given: a stored record is what feedback and ``candor adapt`` need);
- ends a stream whose record could not be stored with an error event, never silently;
- probes the store every :data:`PROBE_INTERVAL_S` (the probe is the audit poll, :class:`FeedbackDesk
  <candor.serve.http.operator_routes.FeedbackDesk>`) and takes traffic again once one succeeds. After a failed
  write (a full disk answers reads) the probe is also a write as large as the largest record and more
  (:meth:`ServedStore.write_probe <candor.annotation.served_store.ServedStore.write_probe>`): ``/ready`` stays 503
  while a record's write would fail, and turns 200 by itself once the disk has room.

A response or label is acknowledged (200, or a stream's last chunk) only after its transaction committed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import sqlalchemy as sa

from candor.annotation.records import Record
from candor.annotation.served_store import RememberedChoice, ServedChoice, ServedStore
from candor.backends.base import Completion
from candor.serve.answering import Ask, HonestAnswer
from candor.serve.http.request_checks import APIError

logger = logging.getLogger(__name__)

STORE_TIMEOUT_S = 5.0  # a store call not done in this time fails (its request answers 503)
PROBE_INTERVAL_S = 0.5  # how often the store is probed (and the audit labels polled)
STORE_THREADS = 16  # store calls at once, each on its own thread; more wait for a slot (within the timeout)
# What an unreachable, hung, full or broken store raises (a pool with no free connection: sa.exc.TimeoutError).
OUTAGES = (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.TimeoutError, sa.exc.DisconnectionError, OSError)
T = TypeVar("T")


class StoreUnavailable(APIError):
    """503: the store cannot take or give what this request needs now (nothing was generated, or it is not kept)."""

    def __init__(self, why: str) -> None:
        super().__init__(
            503,
            f"the store of served answers is unavailable ({why}); nothing was kept: retry shortly",
            "server_error",
            None,
            "store_unavailable",
        )


class RecordLog:
    """Writes served records to the store (and its JSONL export); finds and labels them for feedback."""

    def __init__(self, store: ServedStore, timeout_s: float = STORE_TIMEOUT_S) -> None:
        self.store = store
        self.timeout_s = timeout_s
        self.problem: str | None = None  # why the store is unavailable now (None: it answers)
        self.writes_failed = False  # the last outage failed a write: only a write (not a read) shows it is over
        self.failures = 0  # store calls that failed or timed out
        self._slots = asyncio.Semaphore(STORE_THREADS)  # store calls running at once (a hung database holds them)
        self._logged_at = -float("inf")

    @property
    def available(self) -> bool:
        return self.problem is None

    def unready_because(self) -> str | None:
        """Why ``/ready`` is 503 because of the store, or None (a readiness condition)."""
        return None if self.problem is None else f"the store of served answers is unavailable ({self.problem})"

    def require_available(self) -> None:
        """Before any work: a 503 while the store is unavailable (the probe says when it answers again)."""
        if self.problem is not None:
            raise StoreUnavailable(self.problem)

    async def call(self, fn: Callable[..., T], *args: Any, writes: bool | None = None) -> T:
        """``fn(*args)`` on a thread of its own within :attr:`timeout_s` (waiting for one of the
        :data:`STORE_THREADS` slots included); an outage is a :class:`StoreUnavailable`.

        A call that fails or times out marks the store unavailable; one that succeeds marks it available. A call
        stuck on a hung database keeps its slot until it returns, so a hung database fills the slots and later
        calls time out waiting for one, without starting more threads.
        """
        loop = asyncio.get_running_loop()
        writes = is_write(fn) if writes is None else writes
        try:
            async with asyncio.timeout(self.timeout_s):
                await self._slots.acquire()
                work: asyncio.Future[T] = loop.create_future()
                thread = threading.Thread(target=self._run, args=(loop, work, fn, args), daemon=True)
                thread.start()
                result = await work
        except TimeoutError:
            self._fail(f"no answer within {self.timeout_s:g} s", writes)
            raise StoreUnavailable(self.problem or "timeout") from None
        except OUTAGES as exc:
            self._fail(type(exc).__name__, writes)
            raise StoreUnavailable(self.problem or "error") from None
        except sa.exc.DBAPIError as exc:  # the database refused this call (not an outage): the store stays up
            logger.error("the store refused a call: %s", exc)
            raise StoreUnavailable(f"the database refused the call ({type(exc.orig).__name__})") from None
        if self.writes_failed and not writes:
            return result  # a read answered, but the outage failed writes (a full disk): still unavailable
        if self.problem is not None:
            logger.warning("the store answers again: taking traffic")
        self.problem, self.writes_failed = None, False
        return result

    async def watch(self, poll: Callable[[], Any], interval_s: float = PROBE_INTERVAL_S) -> None:
        """Probe the store every ``interval_s`` by calling ``poll`` (the audit poll), until cancelled."""
        while True:
            with contextlib.suppress(StoreUnavailable):  # logged by call(); /ready says so until a probe succeeds
                await self.call(poll)
                if self.writes_failed:  # a full disk answers reads: a record-sized write shows it takes them again
                    await self.call(self.store.write_probe, writes=True)
            await asyncio.sleep(interval_s)

    def _run(self, loop: asyncio.AbstractEventLoop, work: asyncio.Future[T], fn: Callable[..., T], args: tuple) -> None:
        """One store call on its own daemon thread (a call stuck on a hung database never holds the process's exit);
        its slot is given back when it returns, whether or not anyone still waits for it."""
        try:
            outcome: tuple[Any, BaseException | None] = (fn(*args), None)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, whatever it is
            outcome = (None, exc)
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits for it
            loop.call_soon_threadsafe(_settle, work, self._slots, *outcome)

    def _fail(self, why: str, writes: bool = False) -> None:
        self.failures += 1
        self.writes_failed = self.writes_failed or writes
        if self.problem is None or time.monotonic() - self._logged_at > 60:  # once a minute while it lasts
            logger.error("the store is unavailable (%s): /ready is 503 and requests are refused until it answers", why)
            self._logged_at = time.monotonic()
        self.problem = why

    def write(
        self,
        ask: Ask,
        answers: Sequence[HonestAnswer],
        provenance: dict[str, Any],
        describe: Callable[[HonestAnswer], dict[str, Any]],
        response_id: str = "",
        indexes: Sequence[int] = (0,),
    ) -> None:
        record = next((a.record for a in answers if a.record is not None), None)
        if record is None:  # a head source: nothing was scored, the returned text stands as the answer
            greedy = next((a.completion for a in answers if a.completion is not None), None) or Completion("")
            record = Record(item=ask.prompted.item(), greedy=greedy, samples=[], provenance=dict(provenance))
        out = record.to_dict()
        out["provenance"] = {
            **out["provenance"],
            "served": {
                "id": response_id,
                "indexes": list(indexes),
                "confidence": [describe(a) for a in answers],
                "returned": [a.answer for a in answers],
                # --claims: each claim's text, removed ones included; the operator's alone (a client gets spans)
                "claims": [None if a.claims is None else a.claims.for_record() for a in answers],
                "reply": {
                    "n": ask.reply.n,
                    "max_tokens": ask.reply.max_new_tokens,
                    "temperature": ask.reply.temperature,
                    "top_p": ask.reply.top_p,
                    "stop": list(ask.reply.stop),
                    "seed": ask.reply.seed,
                },
            },
        }
        choices = [
            ServedChoice(index=i, answered=not a.abstained, returned=a.answer, scored=a.scores_returned_text)
            for i, a in zip(indexes, answers, strict=True)
        ]
        self.store.record(out, response_id, choices, str(provenance.get("model_version", "")))

    def find(self, response_id: str, index: int) -> RememberedChoice | None:
        """The served choice a label names, while the store remembers it (any replica may have served it)."""
        return self.store.find(response_id, index)

    def label(self, response_id: str, index: int, correct: bool, label_source: str, who: str = "") -> None:
        self.store.add_label(response_id, index, correct, label_source, who)

    def close(self) -> None:
        self.store.close()


def is_write(fn: Callable[..., Any]) -> bool:
    """Whether a store call writes (an answer's records, a label): its failure is cleared only by a write."""
    return getattr(fn, "__func__", None) in (RecordLog.write, RecordLog.label)


def _settle(work: asyncio.Future[Any], slots: asyncio.Semaphore, result: Any, exc: BaseException | None) -> None:
    """Give the call's slot back and hand its outcome to its waiter (gone when it timed out: then nothing)."""
    slots.release()
    if work.done():
        return
    if exc is not None:
        work.set_exception(exc)
    else:
        work.set_result(result)
