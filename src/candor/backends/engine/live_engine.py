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
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

import torch

from candor.backends.base import DecodeRequest, Generations
from candor.backends.engine.decode_loop import DecodeJob, DecodeLoop
from candor.backends.engine.shared_prefix import SharedPrefix
from candor.util.errors import CandorError

logger = logging.getLogger(__name__)

T = TypeVar("T")

# The engine's KV cache starts small (it holds every slot's tokens, so it costs rows x tokens) and grows by
# half when requests need more: rows at first, and tokens per row beyond the first prompt's.
LIVE_ROWS = 8
LIVE_COLUMNS = 0

_CLOSE = object()  # queued by close(): the engine thread stops when it reads it


class HFLiveEngine:
    """A running decode loop over an :class:`candor.backends.hf.HFBackend` (see the module docstring)."""

    def __init__(self, backend: Any, max_rows: int, shared_prefix: Sequence[int] | None = None) -> None:
        if max_rows < 1:
            raise CandorError(f"max_rows must be at least 1, got {max_rows}")
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
        self._waiting: deque[tuple[DecodeRequest, Future[Generations]]] = deque()
        self._thread = threading.Thread(target=self._run, name="candor-live-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the caller's side

    def submit(self, request: DecodeRequest) -> Future[Generations]:
        """Queue ``request``; it joins the running batch at the next step."""
        self.backend.check_request(request.n, request.params)
        future: Future[Generations] = Future()
        self._put((request, future))
        return future

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
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def __enter__(self) -> HFLiveEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _put(self, item: tuple[Any, Future[Any]]) -> None:
        with self._lock:
            if self._closed:
                raise CandorError("the live engine is closed")
            self._inbox.put(item)

    # ------------------------------------------------------------ the engine thread (the loop's feed)

    @property
    def exhausted(self) -> bool:
        return self._stopping

    def top_up(self, loop: DecodeLoop) -> None:
        self._read_inbox(wait=not loop.live_rows and not self._waiting)
        if self._stopping:
            self._fail_everything(CandorError("the live engine was closed"))
            return
        while self._calls:
            work, future = self._calls.popleft()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(work())
                except BaseException as exc:  # the caller's error, reported through its future
                    future.set_exception(exc)
        while self._waiting and self._fits(loop, self._waiting[0][0]):
            request, future = self._waiting.popleft()
            if future.set_running_or_notify_cancel():
                self._start(loop, request, future)

    def _read_inbox(self, wait: bool) -> None:
        """Move what callers queued into the engine's own queues (waiting for something when ``wait``)."""
        while True:
            try:
                item = self._inbox.get(block=wait)
            except queue.Empty:
                return
            wait = False
            if item is _CLOSE:
                self._stopping = True
            elif isinstance(item[0], DecodeRequest):
                self._waiting.append(item)
            else:
                self._calls.append(item)

    def _fits(self, loop: DecodeLoop, request: DecodeRequest) -> bool:
        if not loop.live_rows:
            return True
        needed = int(request.greedy) + request.n
        return loop.mergeable and loop.live_rows + needed <= self.max_rows

    def _start(self, loop: DecodeLoop, request: DecodeRequest, future: Future[Generations]) -> None:
        """Prefill one request alone and let its rows join the loop."""
        try:
            prompt_ids = self.backend.encode([request.prompt])[0]
            job = DecodeJob(
                prompt_ids=prompt_ids,
                n=request.n,
                greedy=request.greedy,
                params=request.params,
                seed=request.seed,
                matcher=self.backend.stop_matcher(request.params.stop),
                on_token=request.on_token,
                on_prefill=request.on_prefill,
                on_done=lambda job: future.set_result(job.result),
                on_error=lambda job, exc: future.set_exception(exc),
            )
            prefix = self._prefix_for(prompt_ids, request.params.max_new_tokens)
            if prefix is not None:
                prefilled = loop.prefill([job], prefix.computed(), len(prefix))
            else:
                prefilled = loop.prefill([job])
            if prefilled is not None:
                loop.admit(prefilled)
        except Exception as exc:  # a prompt the model cannot run fails its own request
            if not future.done():
                future.set_exception(exc)

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
        pending: list[Future[Any]] = [f for _, f in self._waiting] + [f for _, f in self._calls]
        self._waiting.clear()
        self._calls.clear()
        for future in pending:
            if future.set_running_or_notify_cancel():
                future.set_exception(exc)

    def _run(self) -> None:
        # The engine thread holds the packed-linear scope for its lifetime, so every
        # forward on the model (the loop's, and re-reads from other threads) uses it.
        with torch.inference_mode(), self.backend.packed_linears:
            while True:
                try:
                    self.loop.run(self)
                    return
                except Exception as exc:  # a failed step: its jobs fail, the engine goes on
                    logger.exception("live engine step failed; failing the running requests")
                    self.loop.abort(exc)
