"""The live engine: requests that join the ``hf`` decode loop while it runs (capability ``live_decode``).

One thread owns the model and runs :class:`candor.backends.engine.decode_loop.DecodeLoop`
with this engine as its feed. Before every step it runs the queued ``call``
work, then admits queued requests in order while their rows fit in
``max_rows`` (a request that needs more rows than that runs when the batch is
empty). Each request's prompt is prefilled alone, unpadded, so its hidden
states, logits and tokens never depend on which other requests run; its
future resolves when its last row ends. A request whose hook raises fails
its own future; its rows leave and the others go on.

An engine opened with a ``shared_prefix`` (the token ids its template's
prompts all start with: the few-shot block) runs that prefix once, alone, on
first use (:class:`candor.backends.engine.shared_prefix.SharedPrefix`), and prefills
only the rest of each prompt that starts with it, over a copy of its KV
cache; a prompt that does not is prefilled in full. The prefix is the
engine's, never derived from the requests queued together, so a prompt's
split, and what the request gets, is still the same whatever else runs.

A prompt longer than ``prefill_chunk`` tokens (past the prefix) is prefilled
in chunks (where the engine's first act, :func:`~candor.backends.engine.chunked_prefill.chunking_agrees`,
finds them to give the bits of one piece) (:mod:`candor.backends.engine.chunked_prefill`), to the bits of one
piece, while the running rows decode: one chunk between two steps, and only
once the engine has run other work for :data:`DECODE_SHARE` times as long as
that chunk since it ended, so a long prompt takes a third of the engine while
others run (and all of it when nothing else runs, after waiting
:data:`FOLLOW_UP_S` for the call that a request whose decoding or call just
ended is about to queue, its answer's re-read and scoring). Prompts are
admitted in order; a short prompt queued behind a long one that is still
prefilling joins at once.

A request's stop strings are matched by a matcher built from the whole
vocabulary (:mod:`candor.backends.engine.stops`); a stop list the backend has
no matcher for yet is built on the engine's own builder thread, never on the
engine thread, and the request is queued once it is ready. A pending build
delays only the requests that wait for a matcher (they are built in the order
submitted): a request whose matcher is kept, or that has no stop string, is
queued at once. A request's ``constraint`` whose grammar the backend has not
compiled yet is compiled there too (a schema that cannot be compiled fails
that request's future with a ``CandorError``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from candor.backends.base import DecodeRequest, Generations
from candor.backends.engine.chunked_prefill import DEFAULT_PREFILL_CHUNK, ChunkedPrefill, check_chunk, chunking_agrees
from candor.backends.engine.decode_loop import DecodeJob, DecodeLoop
from candor.backends.engine.shared_prefix import SharedPrefix
from candor.backends.engine.stops import StopMatcher
from candor.util.errors import CandorError
from candor.util.memory import IdleTrimmer

logger = logging.getLogger(__name__)

T = TypeVar("T")

# The engine's KV cache starts small (it holds every slot's tokens, so it costs rows x tokens) and grows by
# half when requests need more: rows at first, and tokens per row beyond the first prompt's.
LIVE_ROWS = 8
LIVE_COLUMNS = 0

# While other work runs (decode steps, calls), a long prompt's next chunk runs once this many times as long as its
# last chunk took has passed since that chunk: a long prompt gets a third of the engine, everything else two thirds.
DECODE_SHARE = 2.0

# A request whose rows just ended (or whose call just ran) queues its next engine call (its answer's re-read and
# scoring) within milliseconds, once its coroutine wakes: a long prompt's next chunk, which can hold the engine for
# a second on a CPU, waits this long for that call first, rather than run in the gap.
FOLLOW_UP_S = 0.05

# After going idle, the engine looks at its memory once more this long after (what the last requests held is freed
# by their callers once their last engine call is done) before it waits for work without a timeout.
SETTLE_S = 0.5

_CLOSE = object()  # queued by close(): the engine thread stops when it reads it


@dataclass(eq=False)
class _Admission:
    """A submitted request, its future, and its stop matcher (built before the engine sees it)."""

    request: DecodeRequest
    future: Future[Generations]
    matcher: StopMatcher


@dataclass(eq=False)
class _Prefilling:
    """A long prompt being prefilled chunk by chunk, its rows held back until the last chunk."""

    job: DecodeJob
    prefill: ChunkedPrefill
    future: Future[Generations]
    shared: int  # the prefix columns its cache starts with (kept apart by a split slot cache)
    on_done: Callable[[ChunkedPrefill], None] | None = None  # the request's on_chunked_prefill


class HFLiveEngine:
    """A running decode loop over an :class:`candor.backends.hf.HFBackend` (see the module docstring)."""

    def __init__(
        self,
        backend: Any,
        max_rows: int,
        shared_prefix: Sequence[int] | None = None,
        prefill_chunk: int | None = DEFAULT_PREFILL_CHUNK,
    ) -> None:
        if max_rows < 1:
            raise CandorError(f"max_rows must be at least 1, got {max_rows}")
        try:
            self.prefill_chunk = None if prefill_chunk is None else check_chunk(prefill_chunk)
        except ValueError as exc:
            raise CandorError(str(exc)) from None
        self.backend = backend
        self.max_rows = max_rows
        self.prefix = SharedPrefix(backend, shared_prefix) if shared_prefix else None
        # Rows keep the prefix once where the lean step can attend to it split (kv_slots), as in generate.
        split = self.prefix is not None and backend.split_prefix and backend.lean_step is not None
        self.loop = DecodeLoop(backend, rows=min(max_rows, LIVE_ROWS), columns=LIVE_COLUMNS, split_prefix=split)
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False  # no new work accepted (set by close())
        self._stopping = False  # the engine thread has read the close marker
        self._calls: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        self._waiting: deque[_Admission] = deque()
        self._prefilling: deque[_Prefilling] = deque()
        self._chunk_s = 0.0  # how long the last chunk of a long prompt took
        self._chunk_ended_at = 0.0
        self._others_at = 0.0  # when a request's decoding or call last ended (its next call follows soon)
        self._trimmer = IdleTrimmer()
        self._idle_since: float | None = None  # when the engine last went idle (None while it works)
        # Stop matchers the backend does not have yet are built here, not on the engine thread (a vocabulary scan).
        self._builder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="candor-stop-matchers")
        self._thread = threading.Thread(target=self._run, name="candor-live-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the caller's side

    def submit(self, request: DecodeRequest) -> Future[Generations]:
        """Queue ``request``; it joins the running batch at the next step (once its stop matcher is built)."""
        self.backend.check_request(request.n, request.params)
        future: Future[Generations] = Future()
        matcher = self.backend.stop_matchers.cached(request.params.stop)
        if not self.backend.grammar_ready(request.constraint):
            matcher = None  # its grammar is compiled on the builder thread too
        with self._lock:
            if self._closed:
                raise CandorError("the live engine is closed")
            if matcher is not None:  # kept (or no stop string): queued now, whatever is being built
                self._inbox.put(_Admission(request, future, matcher))
            else:  # built first, on the builder thread, in the order submitted
                self._builder.submit(self._build_then_queue, request, future)
        return future

    def _build_then_queue(self, request: DecodeRequest, future: Future[Generations]) -> None:
        """The builder thread's work: the request's stop matcher and grammar, then the request into the engine's
        inbox."""
        matcher: StopMatcher | None = None
        error: Exception = CandorError("the live engine is closed")
        try:
            matcher = self.backend.stop_matchers.get(request.params.stop)
            if request.constraint is not None:
                self.backend.grammars.get(request.constraint)
        except Exception as exc:  # stops the tokenizer cannot take, a schema that cannot compile: the request's own
            matcher, error = None, exc
        with self._lock:
            if matcher is not None and not self._closed:
                self._inbox.put(_Admission(request, future, matcher))
                return
        if future.set_running_or_notify_cancel():
            future.set_exception(error)

    def call(self, work: Callable[[], T]) -> Future[T]:
        """Run ``work()`` in the engine thread between two steps."""
        future: Future[T] = Future()
        self._put((work, future))
        return future

    def close(self) -> None:
        """Fail what is queued or running, and stop the engine thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._inbox.put(_CLOSE)
        self._builder.shutdown(wait=False)  # a matcher still building fails its request (closed)
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def __enter__(self) -> HFLiveEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _put(self, item: _Admission | tuple[Any, Future[Any]]) -> None:
        with self._lock:
            if self._closed:
                raise CandorError("the live engine is closed")
            self._inbox.put(item)

    @property
    def memory_trims(self) -> int:
        """How many times the idle engine has given freed memory back to the system."""
        return self._trimmer.trims

    # ------------------------------------------------------------ the engine thread (the loop's feed)

    @property
    def exhausted(self) -> bool:
        return self._stopping

    def top_up(self, loop: DecodeLoop) -> None:
        idle = not loop.live_rows and not self._waiting
        # Nothing to do: give back what long requests freed and wait for work (until a put-off trim is due);
        # only a long prompt's chunks: wait a moment for a follow-up call first.
        wait: bool | float = False
        if idle and self._prefilling:
            wait = self._follow_up_wait()
        elif idle:
            wait = self._idle_wait()
        self._read_inbox(wait=wait)
        if not idle or self._prefilling or self._calls or self._waiting:
            self._idle_since = None  # working: the next idle moment starts a new idle period
        if self._stopping:
            self._fail_everything(CandorError("the live engine was closed"))
            return
        self._run_calls()
        while self._waiting and self._fits(loop, self._waiting[0].request):
            admission = self._waiting.popleft()
            if admission.future.set_running_or_notify_cancel():
                self._start(loop, admission)
        if self._prefilling and self._chunk_due(loop):
            self._next_chunk(loop)

    def _idle_wait(self) -> bool | float:
        """Nothing to do: give back what long requests freed, then wait for work (True), or for the seconds until
        the memory is looked at again: a put-off trim, or once :data:`SETTLE_S` after going idle, when the callers
        have dropped what the last requests held (their caches are freed in the callers' threads, after the engine's
        last work for them)."""
        if not self._inbox.empty():
            return False
        now = time.perf_counter()
        if self._idle_since is None:
            self._idle_since = now
        due = self._trimmer.on_idle()
        settling = SETTLE_S - (now - self._idle_since)
        if due is None and settling > 0:
            return settling
        return True if due is None else due

    def _run_calls(self) -> None:
        """Run the queued ``call`` work, in order."""
        if not self._calls:
            return
        while self._calls:
            work, future = self._calls.popleft()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(work())
                except BaseException as exc:  # the caller's error, reported through its future
                    future.set_exception(exc)
        self._others_at = time.perf_counter()

    def _read_inbox(self, wait: bool | float) -> None:
        """Move what callers queued into the engine's own queues.

        ``wait``: True waits for something; a number of seconds waits that long at most (none when not positive).
        """
        timeout = None if wait is True else max(0.0, float(wait))
        while True:
            try:
                item = self._inbox.get(block=timeout != 0.0, timeout=timeout)
            except queue.Empty:
                return
            timeout = 0.0
            if item is _CLOSE:
                self._stopping = True
            elif isinstance(item, _Admission):
                self._waiting.append(item)
            else:
                self._calls.append(item)

    def _fits(self, loop: DecodeLoop, request: DecodeRequest) -> bool:
        held = sum(p.job.rows_needed for p in self._prefilling)  # rows of long prompts still prefilling
        if not loop.live_rows and not held:
            return True
        needed = int(request.greedy) + request.n
        return loop.mergeable and loop.live_rows + held + needed <= self.max_rows

    def _start(self, loop: DecodeLoop, admission: _Admission) -> None:
        """Prefill one request alone and let its rows join the loop (a long prompt: start its chunks)."""
        request, future = admission.request, admission.future
        try:
            prompt_ids = self.backend.encode([request.prompt])[0]
            job = DecodeJob(
                prompt_ids=prompt_ids,
                n=request.n,
                greedy=request.greedy,
                params=request.params,
                seed=request.seed,
                matcher=admission.matcher,
                on_token=request.on_token,
                on_prefill=request.on_prefill,
                constraint=request.constraint,
                on_done=lambda job: self._ended(future, job),
                on_error=lambda job, exc: self._ended(future, job, exc),
            )
            prefix = self._prefix_for(prompt_ids, request.params.max_new_tokens)
            start = len(prefix) if prefix is not None else 0
            if self._chunks(loop, len(prompt_ids) - start) and job.rows_needed > 0:
                cache = prefix.computed() if prefix is not None else None  # read, not written
                states = request.on_prefill is not None
                chunked = ChunkedPrefill.start(self.backend, prompt_ids, self.prefill_chunk, cache, start, states)
                self._prefilling.append(
                    _Prefilling(
                        job=job, prefill=chunked, future=future, shared=start, on_done=request.on_chunked_prefill
                    )
                )
                return
            if prefix is not None:
                prefilled = loop.prefill([job], prefix.computed(), len(prefix))
            else:
                prefilled = loop.prefill([job])
            if prefilled is not None:
                loop.admit(prefilled)
        except Exception as exc:  # a prompt the model cannot run fails its own request
            if not future.done():
                future.set_exception(exc)

    def _chunks(self, loop: DecodeLoop, tokens: int) -> bool:
        """Whether a prompt with ``tokens`` to prefill is prefilled in chunks."""
        return self.prefill_chunk is not None and tokens > self.prefill_chunk and loop.partial_admission

    def _follow_up_wait(self) -> float:
        """How much longer a chunk waits for the call that work just ended may bring (0 or less: none).

        No wait once the others have had their share since the last chunk: a long prompt is never starved.
        """
        if self._others_had_their_share():
            return 0.0
        return self._others_at + FOLLOW_UP_S - time.perf_counter()

    def _others_had_their_share(self) -> bool:
        return time.perf_counter() - self._chunk_ended_at >= DECODE_SHARE * self._chunk_s

    def _chunk_due(self, loop: DecodeLoop) -> bool:
        """A long prompt's next chunk runs now: everything else has had its share of the engine since the
        last chunk, or nothing else runs (and no follow-up call is awaited)."""
        return self._others_had_their_share() or (not loop.live_rows and self._follow_up_wait() <= 0)

    def _ended(self, future: Future[Generations], job: DecodeJob, exc: BaseException | None = None) -> None:
        """A job's rows have all ended (or it failed): resolve its future; its caller's next call follows soon."""
        self._others_at = time.perf_counter()
        if exc is None:
            future.set_result(job.result)
        else:
            future.set_exception(exc)

    def _next_chunk(self, loop: DecodeLoop) -> None:
        """Run the oldest long prompt's next chunk; after its last one, its rows join the loop."""
        current = self._prefilling[0]
        started = time.perf_counter()
        try:
            done = current.prefill.step()
        except Exception as exc:  # the prompt's own failure
            self._prefilling.popleft()
            current.job.fail(exc)
            return
        finally:
            self._chunk_ended_at = time.perf_counter()
            self._chunk_s = self._chunk_ended_at - started
        if not done:
            return
        self._prefilling.popleft()
        chunked = current.prefill
        assert chunked.logits is not None
        mask = torch.ones((1, len(chunked.ids)), dtype=torch.long, device=chunked.logits.device)
        prefilled = loop.prefilled([current.job], chunked.cache, mask, chunked.logits, chunked.states, current.shared)
        if prefilled is not None:
            loop.admit(prefilled)  # (copies the cache into the rows' slots: the prefill stays the prompt's own)
        if current.on_done is not None:
            current.on_done(chunked)

    def _prefix_for(self, prompt_ids: list[int], max_new_tokens: int) -> SharedPrefix | None:
        """The prefix this prompt is prefilled past: None unless it starts with it and fits the model's window."""
        if self.prefix is None or not self.prefix.starts(prompt_ids):
            return None
        window = getattr(self.backend.model.config, "sliding_window", None)
        if window is not None and len(prompt_ids) + max_new_tokens > window:
            return None  # a sliding-window cache stays on the plain path, as generate() decides
        return self.prefix

    def _fail_everything(self, exc: BaseException) -> None:
        self.loop.abort(exc)
        for partial in self._prefilling:
            partial.job.fail(exc)
        pending: list[Future[Any]] = [a.future for a in self._waiting] + [f for _, f in self._calls]
        self._waiting.clear()
        self._calls.clear()
        self._prefilling.clear()
        for future in pending:
            if future.set_running_or_notify_cancel():
                future.set_exception(exc)

    def _check_chunking(self) -> None:
        """Before the first request: prefill in chunks only where that gives the bits of one piece here."""
        if self.prefill_chunk is None or not self.loop.partial_admission:
            return
        if not chunking_agrees(self.backend, self.prefill_chunk):  # (also where the chunked cache cannot run)
            self.prefill_chunk = None

    def _run(self) -> None:
        # The engine thread holds the packed-linear scope for its lifetime, so every
        # forward on the model (the loop's, and re-reads from other threads) uses it.
        with torch.inference_mode(), self.backend.packed_linears:
            self._check_chunking()
            while True:
                try:
                    self.loop.run(self)
                    return
                except Exception as exc:  # a failed step: its jobs fail, the engine goes on
                    logger.exception("live engine step failed; failing the running requests")
                    self.loop.abort(exc)
