"""The running model and the admission of questions to it: one flow (an asyncio task) per question.

A :class:`Generation` is one honest model with the engine it answers on. The
service answers with the current one; a reload (``SIGHUP``, ``POST /admin/reload``)
loads the next folder beside it, with the deployment's options
(:class:`~candor.serve.deployment.Deployment`), then swaps it in between requests.

A request is admitted to a generation and counted in flight in one step
(:meth:`Service.admitted`, under the generation's lock), once its body has
arrived; it keeps that generation to the end, so it is answered wholly by the
old model or wholly by the new one. A retired generation admits nothing: a
request that reaches it moves to the current one. The old engine closes once the
last request counted on it is done, so no request meets a closed engine because
of a reload.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from candor.backends.base import LiveEngine
from candor.serve.answering import Ask, Cancelled, HonestAnswer
from candor.serve.batching import Admission, QueueFull
from candor.serve.deployment import Deployment
from candor.serve.http.operations import Lifecycle
from candor.serve.http.prometheus_metrics import ServeMetrics
from candor.serve.http.request_checks import APIError
from candor.serve.model import HonestModel
from candor.util.errors import CandorError
from candor.util.memory import give_back_memory

logger = logging.getLogger(__name__)


class Generation:
    """One honest model, its engine, and how many of its questions are in flight."""

    def __init__(self, model: HonestModel, engine: LiveEngine) -> None:
        self.model = model
        self.engine = engine
        self._in_flight = 0
        self._retired = False
        self._lock = threading.Lock()

    @property
    def version(self) -> str:
        return self.model.version

    def admit(self) -> bool:
        """Count one request in flight, unless this generation is retired (then it admits nothing: False)."""
        with self._lock:
            if self._retired:
                return False
            self._in_flight += 1
            return True

    def begin(self) -> None:
        """Count one more piece of work of a request already admitted (so never on a closed engine)."""
        with self._lock:
            self._in_flight += 1

    def end(self) -> None:
        """One admitted request or piece of work is done; the last one on a retired generation closes its engine."""
        with self._lock:
            self._in_flight -= 1
            close = self._retired and self._in_flight == 0
        if close:
            self._close()

    def retire(self) -> None:
        """No new questions come; the engine closes when the last one in flight is done."""
        with self._lock:
            self._retired = True
            close = self._in_flight == 0
        if close:
            self._close()

    def _close(self) -> None:
        threading.Thread(target=self._close_and_trim, daemon=True, name="candor-retire-engine").start()

    def _close_and_trim(self) -> None:
        """Close the engine, then hand its freed memory back to the system: glibc keeps freed heap pages
        until a trim, so without one each reload's old caches stayed resident until the engine next idled."""
        self.engine.close()
        gc.collect()
        give_back_memory()


class Service:
    """Admits questions to the current generation and swaps generations on reload."""

    def __init__(
        self,
        model: HonestModel,
        admission: Admission,
        metrics: ServeMetrics,
        lifecycle: Lifecycle,
        open_engine: Callable[[HonestModel], LiveEngine],
        deployment: Deployment | None = None,
    ) -> None:
        self.admission = admission
        self.metrics = metrics
        self.lifecycle = lifecycle
        self._open_engine = open_engine
        self.deployment = deployment or Deployment()
        self._first = self.deployment.apply(model)
        self.current: Generation | None = None  # opened when the app starts
        self._reloading = asyncio.Lock()
        self.on_swap: list[Callable[[Generation], None]] = []  # told of each new generation (metrics, feedback)

    def open(self) -> None:
        self.current = Generation(self._first, self._open_engine(self._first))
        for listener in self.on_swap:
            listener(self.current)

    def close_now(self) -> None:
        """At shutdown, after draining: close the current engine (retired ones close as their last request ends)."""
        if self.current is not None:
            self.current.engine.close()

    @contextlib.contextmanager
    def admitted(self) -> Iterator[Generation]:
        """The current generation, with this request counted in flight on it until the block ends.

        Work the block starts (:meth:`start`) is counted on its own, so a request may leave the
        block while its flows go on. A generation retired between reading ``current`` and counting
        admits nothing, and the request moves to the one that replaced it.
        """
        while True:
            generation = self.generation()
            if generation.admit():
                break
        try:
            yield generation
        finally:
            generation.end()

    def generation(self) -> Generation:
        """The generation new requests are admitted to (503 before the app starts or while it drains)."""
        if self.current is None:
            raise APIError(503, "the server is not started", "server_error", None, "not_ready")
        if self.lifecycle.draining:
            raise APIError(
                503,
                "the server is draining (shutting down); retry on another instance",
                "server_error",
                None,
                "draining",
            )
        return self.current

    async def reload(self, folder: Path, **backend_kwargs: Any) -> Generation:
        """Load ``folder`` beside the running model, then swap it in; requests in flight finish on the old one."""
        async with self._reloading:
            old = self.generation()
            model = await asyncio.to_thread(self.deployment.successor, folder, old.model, **backend_kwargs)
            fresh = Generation(model, await asyncio.to_thread(self._open_engine, model))
            self.current = fresh
            self._first = model  # the model a (re)open starts from: never the retired one, whose memory goes
            old.retire()
            logger.info("reloaded %s: model version %s (was %s)", folder, fresh.version, old.version)
            for listener in self.on_swap:
                listener(fresh)
            return fresh

    def start(self, asks: list[Ask], generation: Generation) -> list[asyncio.Future[Any]]:
        """Admit every ask (or 503 with nothing started) and start each one's flow on ``generation``.

        ``generation`` is the one this request was admitted to (:meth:`admitted`), still counting it.
        """
        try:
            self.admission.admit(len(asks))
        except QueueFull as exc:
            raise APIError(
                503, f"the server is busy ({exc}); retry later", "server_error", None, "queue_full"
            ) from None
        for _ in asks:  # each question is answered together with those in flight (itself included)
            self.metrics.observe_batch(self.admission.in_flight)
            generation.begin()
        tasks = [asyncio.ensure_future(self._flow(ask, generation)) for ask in asks]
        for task in tasks:
            task.add_done_callback(lambda _: self._finished(generation))
        return tasks  # type: ignore[return-value]

    def _finished(self, generation: Generation) -> None:
        self.admission.release()
        generation.end()

    async def _flow(self, ask: Ask, generation: Generation) -> list[HonestAnswer]:
        try:
            return await generation.model.answer_one(ask, generation.engine)
        except (CandorError, Cancelled, asyncio.CancelledError):
            raise
        except Exception:
            logger.exception("answering failed")
            raise
