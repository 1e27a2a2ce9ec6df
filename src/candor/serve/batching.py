"""The engine a served question runs on: the backend's live decode loop, or micro-batches of ``generate``.

Every served question is one flow over a :class:`~candor.backends.base.LiveEngine`
(:meth:`candor.serve.model.HonestModel.answer_one`): it submits decode
requests and runs its scoring as ``call`` work in the engine's thread.
:func:`open_engine` gives a backend's own live engine when it declares
:data:`~candor.backends.base.LIVE_DECODE` (continuous batching: a request joins
the running batch at the next step), and otherwise a :class:`MicroBatchEngine`,
which gives the same interface over ``backend.generate``:

- one worker thread owns the backend (the model is not thread-safe); it takes
  the first waiting request, gathers more for up to ``max_wait_ms`` or until
  ``max_batch`` are in hand, and runs each group of requests that decode alike
  (same samples, parameters and greedy row, and whether it asks for the
  prompt's hidden states) as one ``generate`` call;
- a ``generate`` call that raises is run again request by request, so a
  failure reaches only its own request's future;
- a request whose future was cancelled before its batch ran is skipped, and a
  request's ``on_token`` streams its rows and ends them (with the backend's
  ``token_hook`` capability);
- ``call`` work runs in the same thread between batches;
- a backend whose server batches for itself (``concurrent_calls``, the
  ``openai`` backend) gets each group in a thread of its own, so a request
  never waits for another group's answers to end.

:class:`Admission` bounds the questions in flight (503 beyond it); it is used
from the event loop only.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from candor.backends.base import (
    LIVE_DECODE,
    PROMPT_HIDDEN_STATES,
    TOKEN_HOOK,
    Backend,
    DecodeRequest,
    Generations,
    LiveEngine,
    SamplingParams,
    backend_capabilities,
)
from candor.util.errors import CandorError

logger = logging.getLogger(__name__)

T = TypeVar("T")


class EngineClosed(CandorError):
    """The engine was closed before this work ran."""


class QueueFull(Exception):
    """As many questions as the service takes are already being answered; the caller should answer 503."""


class Admission:
    """Bounds the questions in flight (being answered or waiting), so memory never grows with load.

    A request's questions are admitted together or not at all, so a request
    refused part-way never leaves work behind.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("the admission limit must be >= 1")
        self.limit = limit
        self.in_flight = 0
        self.admitted = 0  # questions admitted since start (tests and /health)

    def admit(self, count: int) -> None:
        """Take ``count`` questions in, or raise :class:`QueueFull` taking none."""
        if self.in_flight + count > self.limit:
            raise QueueFull(f"{self.in_flight} questions are already in flight (the limit is {self.limit})")
        self.in_flight += count
        self.admitted += count

    def release(self) -> None:
        """One admitted question finished (answered, failed or cancelled)."""
        self.in_flight -= 1


def open_engine(
    backend: Backend,
    *,
    max_batch: int = 16,
    max_wait_ms: float = 5.0,
    rows_per_request: int = 1,
    shared_prefix: Sequence[int] | None = None,
) -> LiveEngine:
    """The backend's live engine (continuous batching) when it has one, else a :class:`MicroBatchEngine`.

    ``max_batch`` requests decode together: a live engine holds up to
    ``max_batch * rows_per_request`` rows (a request takes one per answer it
    decodes), a micro-batch gathers up to ``max_batch`` requests for up to
    ``max_wait_ms``. ``max_batch=1`` turns batching off. ``shared_prefix``:
    the token ids the template's prompts start with, which a live engine runs
    once (a micro-batch's ``generate`` finds the prefix its prompts share itself).
    """
    if max_batch < 1 or rows_per_request < 1:
        raise CandorError("max_batch and rows_per_request must be at least 1")
    if LIVE_DECODE in backend_capabilities(backend):
        rows = max_batch * rows_per_request
        if shared_prefix:
            return backend.live_engine(max_rows=rows, shared_prefix=shared_prefix)  # type: ignore[attr-defined,no-any-return]
        return backend.live_engine(max_rows=rows)  # type: ignore[attr-defined,no-any-return]
    return MicroBatchEngine(backend, max_batch=max_batch, max_wait_ms=max_wait_ms)


@dataclass
class _Decode:
    request: DecodeRequest
    future: Future[Generations]

    def key(self) -> tuple[int, bool, SamplingParams, bool, Any]:
        """Requests decoded together share all of these (a constraint is one ``generate`` argument for its batch)."""
        r = self.request
        return (r.n, r.greedy, r.params, r.prompt_states, r.constraint)


@dataclass
class _Call:
    work: Callable[[], Any]
    future: Future[Any]


class MicroBatchEngine:
    """A :class:`~candor.backends.base.LiveEngine` over ``backend.generate`` (see the module docstring)."""

    def __init__(
        self,
        backend: Backend,
        *,
        max_batch: int = 16,
        max_wait_ms: float = 5.0,
    ) -> None:
        if max_batch < 1 or max_wait_ms < 0:
            raise ValueError("max_batch must be >= 1 and max_wait_ms >= 0")
        self.backend = backend
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000.0
        self.batches = 0  # generate calls made, for tests and the load benchmark
        self._hooks = TOKEN_HOOK in backend_capabilities(backend)
        # A backend whose server batches for itself (``concurrent_calls``) gets each gathered group in a
        # thread of its own, so requests arriving while a group decodes start at once instead of after it.
        self._pool = (
            ThreadPoolExecutor(max_workers=max_batch, thread_name_prefix="candor-generate")
            if getattr(backend, "concurrent_calls", False)
            else None
        )
        self._count = threading.Lock()
        self._inbox: queue.SimpleQueue[_Decode | _Call | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="candor-engine", daemon=True)
        self._thread.start()

    def submit(self, request: DecodeRequest) -> Future[Generations]:
        if request.on_prefill is not None:
            raise CandorError("reading a confidence from the prefill needs a backend with a live engine")
        if request.prompt_states and PROMPT_HIDDEN_STATES not in backend_capabilities(self.backend):
            raise CandorError("this backend gives no prompt hidden states from its generation pass")
        return self._put(_Decode(request, Future()))  # type: ignore[return-value]

    def call(self, work: Callable[[], T]) -> Future[T]:
        return self._put(_Call(work, Future()))

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._inbox.put(None)
        self._thread.join()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        while True:  # whatever is still queued fails
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if item is not None and item.future.set_running_or_notify_cancel():
                item.future.set_exception(EngineClosed("the engine was closed"))

    def _put(self, item: _Decode | _Call) -> Future[Any]:
        with self._lock:
            if self._closed:
                raise EngineClosed("the engine is closed")
            self._inbox.put(item)
        return item.future

    # ------------------------------------------------------------ the worker thread

    def _run(self) -> None:
        while True:
            first = self._inbox.get()
            if first is None:
                return
            decodes, calls, closing = self._gather(first)
            for c in calls:
                _resolve(c.future, c.work)
            self._decode(decodes)
            if closing:
                return

    def _gather(self, first: _Decode | _Call) -> tuple[list[_Decode], list[_Call], bool]:
        """The first item and those arriving within the wait, up to ``max_batch`` decode requests."""
        decodes: list[_Decode] = []
        calls: list[_Call] = []
        item: _Decode | _Call | None = first
        deadline = time.monotonic() + self.max_wait
        while True:
            if isinstance(item, _Call):
                calls.append(item)
            elif item is not None:
                decodes.append(item)
            if not decodes or len(decodes) >= self.max_batch:
                return decodes, calls, False  # a lone call runs at once
            remaining = deadline - time.monotonic()
            try:
                item = self._inbox.get(timeout=remaining) if remaining > 0 else self._inbox.get_nowait()
            except queue.Empty:
                return decodes, calls, False
            if item is None:
                return decodes, calls, True

    def _decode(self, decodes: list[_Decode]) -> None:
        live = [d for d in decodes if d.future.set_running_or_notify_cancel()]  # a departed client cancelled
        groups: dict[tuple[int, bool, SamplingParams, bool, Any], list[_Decode]] = {}
        for d in live:
            groups.setdefault(d.key(), []).append(d)
        for group in groups.values():
            if self._pool is not None:
                self._pool.submit(self._generate, group)
            else:
                self._generate(group)

    def _generate(self, group: list[_Decode]) -> None:
        n, greedy, params, prompt_states, constraint = group[0].key()
        requests = [d.request for d in group]
        extra: dict[str, Any] = {"prompt_states": True} if prompt_states else {}  # only a backend that has it sees it
        if constraint is not None:  # structured output, passed on to the upstream (candor.backends.constraints)
            extra["constraint"] = constraint
        try:
            gens = self.backend.generate(
                [r.prompt for r in requests],
                n,
                params,
                greedy=greedy,
                seeds=[r.seed for r in requests],
                **self._hook(requests),
                **extra,
            )
        except Exception as exc:
            if len(group) > 1:  # never hand one request's failure to the others: run each alone
                logger.warning("a batch of %d failed (%s); running its requests one by one", len(group), exc)
                for d in group:
                    self._generate([d])
                return
            if not isinstance(exc, CandorError):
                logger.exception("generation failed")
            group[0].future.set_exception(exc)
            return
        with self._count:
            self.batches += 1
        for d, g in zip(group, gens, strict=True):
            d.future.set_result(g)

    def _hook(self, requests: Sequence[DecodeRequest]) -> dict[str, Any]:
        if not self._hooks or all(r.on_token is None for r in requests):
            return {}

        def on_token(prompt: int, sample: int, token: int) -> bool:
            hook = requests[prompt].on_token
            return True if hook is None else hook(sample, token)

        return {"on_token": on_token}


def _resolve(future: Future[T], work: Callable[[], T]) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(work())
    except Exception as exc:
        future.set_exception(exc)


async def done(future: Future[T]) -> T:
    """Await an engine future; cancelling the awaiting task cancels the work if it has not started."""
    return await asyncio.wrap_future(future)


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to its end from synchronous code, also where an event loop already runs (a notebook)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="candor-answer") as pool:
        return pool.submit(asyncio.run, coro).result()
