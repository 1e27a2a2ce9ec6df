"""The running model and the admission of questions to it: one flow (an asyncio task) per question.

A :class:`Generation` is one honest model with the engine it answers on. The
service answers with the current one; a reload (``SIGHUP``, ``POST /admin/reload``)
loads the next folder beside it, then swaps it in between requests: a request
takes the current generation when it is admitted and keeps it to the end, so it
is answered wholly by the old model or wholly by the new one, and the old engine
closes once its last request is done.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from candor.backends.base import LiveEngine
from candor.serve.answering import Ask, Cancelled, HonestAnswer
from candor.serve.batching import Admission, QueueFull
from candor.serve.honest_folder import read_config
from candor.serve.http.operations import Lifecycle
from candor.serve.http.prometheus_metrics import ServeMetrics
from candor.serve.http.request_checks import APIError
from candor.serve.model import HonestModel
from candor.util.errors import CandorError

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

    def begin(self) -> None:
        with self._lock:
            self._in_flight += 1

    def end(self) -> None:
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
        threading.Thread(target=self.engine.close, daemon=True, name="candor-retire-engine").start()


def load_successor(folder: Path, current: HonestModel, **backend_kwargs: Any) -> HonestModel:
    """The honest model saved in ``folder``; it keeps the current generator when the folder names the same
    one (model, backend, no adapter on either side), so a reload of a new head loads no second model.

    It serves claims as the current model does (``--claims``, ``--refine``); a threshold tuned with a
    factuality guarantee is read from the new folder, and a folder without one for the served alpha is
    refused (the running model stays)."""
    generator = read_config(folder)["generator"]
    same = (
        generator.get("model") == current.backend.model_name
        and not generator.get("adapter")
        and not getattr(current.backend, "adapter", None)
        and generator.get("backend", "hf") == current.backend_name
    )
    if same:
        model = HonestModel.from_pretrained(folder, backend=current.backend)
    else:
        model = HonestModel.from_pretrained(folder, **backend_kwargs)
    model.serve_claims(None if current.claims is None else current.claims.policy)
    return model


class Service:
    """Admits questions to the current generation and swaps generations on reload."""

    def __init__(
        self,
        model: HonestModel,
        admission: Admission,
        metrics: ServeMetrics,
        lifecycle: Lifecycle,
        open_engine: Callable[[HonestModel], LiveEngine],
    ) -> None:
        self.admission = admission
        self.metrics = metrics
        self.lifecycle = lifecycle
        self._open_engine = open_engine
        self._first = model
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

    def generation(self) -> Generation:
        """The generation a new request is answered by (503 before the app starts or while it drains)."""
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
            model = await asyncio.to_thread(load_successor, folder, old.model, **backend_kwargs)
            fresh = Generation(model, await asyncio.to_thread(self._open_engine, model))
            self.current = fresh
            old.retire()
            logger.info("reloaded %s: model version %s (was %s)", folder, fresh.version, old.version)
            for listener in self.on_swap:
                listener(fresh)
            return fresh

    def start(self, asks: list[Ask], generation: Generation) -> list[asyncio.Future[Any]]:
        """Admit every ask (or 503 with nothing started) and start each one's flow on ``generation``."""
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
