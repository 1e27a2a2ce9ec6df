"""A micro-batcher: concurrent requests wait a few milliseconds and share one backend call.

Requests enter a bounded asyncio queue (:class:`QueueFull` when it is full, so
memory never grows with load). One worker takes the first waiting job, gathers
more for up to ``max_wait_ms`` or until ``max_batch`` are in hand, and runs the
batch function once in a single worker thread (the model is not thread-safe,
and one thread keeps batches strictly one after another). ``max_batch=1``
turns batching off.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)


class QueueFull(Exception):
    """The request queue is at its limit; the caller should answer 503."""


@dataclass
class _Job:
    payload: Any
    future: asyncio.Future[Any]


class MicroBatcher:
    """Runs ``run_batch(payloads) -> results`` (same length, same order) on gathered batches.

    A result that is an exception fails its own job only; a batch function that
    raises has its jobs run again one by one, so the failure stays with its job.
    """

    def __init__(
        self,
        run_batch: Callable[[Sequence[Any]], Sequence[Any]],
        *,
        max_batch: int = 16,
        max_wait_ms: float = 5.0,
        queue_size: int = 64,
    ) -> None:
        if max_batch < 1 or queue_size < 1 or max_wait_ms < 0:
            raise ValueError("max_batch and queue_size must be >= 1 and max_wait_ms >= 0")
        self.run_batch = run_batch
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000.0
        self.queue_size = queue_size
        self._queue: asyncio.Queue[_Job] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="candor-batch")
        self.batches = 0  # counters for /health and the load benchmark
        self.batched_jobs = 0

    async def start(self) -> None:
        self._queue = asyncio.Queue(maxsize=self.queue_size)
        self._worker = asyncio.create_task(self._run(), name="candor-batcher")

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        self._executor.shutdown(wait=True)

    @property
    def waiting(self) -> int:
        return 0 if self._queue is None else self._queue.qsize()

    async def submit(self, payload: Any) -> Any:
        """Queue one job and wait for its result; raises :class:`QueueFull` at once when full."""
        return await self.enqueue(payload)

    def enqueue(self, payload: Any) -> asyncio.Future[Any]:
        """Queue one job and return its future (cancel it to drop the job); :class:`QueueFull` when full."""
        if self._queue is None:
            raise RuntimeError("the batcher is not started")
        job = _Job(payload, asyncio.get_running_loop().create_future())
        try:
            self._queue.put_nowait(job)
        except asyncio.QueueFull:
            raise QueueFull(f"{self.queue_size} requests are already waiting") from None
        return job.future

    async def _run(self) -> None:
        assert self._queue is not None
        loop = asyncio.get_running_loop()
        while True:
            jobs = [await self._queue.get()]
            deadline = time.monotonic() + self.max_wait
            while len(jobs) < self.max_batch:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    jobs.append(await asyncio.wait_for(self._queue.get(), remaining))
                except TimeoutError:
                    break
            await self._dispatch(loop, jobs)

    async def _dispatch(self, loop: asyncio.AbstractEventLoop, jobs: list[_Job]) -> None:
        live = [j for j in jobs if not j.future.done()]  # a client that went away cancelled its future
        if not live:
            return
        try:
            results = await loop.run_in_executor(self._executor, self.run_batch, [j.payload for j in live])
        except Exception as exc:
            if len(live) > 1:  # never hand one job's failure to the others: run each alone
                logger.warning("batch of %d failed (%s); running its jobs one by one", len(live), exc)
                for j in live:
                    await self._dispatch(loop, [j])
                return
            logger.exception("a job failed")
            results = [exc]
        self.batches += 1
        self.batched_jobs += len(live)
        for j, r in zip(live, results, strict=True):
            if j.future.done():
                continue
            if isinstance(r, BaseException):  # the batch function's per-job failure
                j.future.set_exception(r)
            else:
                j.future.set_result(r)
