"""A real ``hf`` backend that records what it generates, through ``generate`` or its live engine (serve tests).

Not a mock: every token comes from the real decode loop. The record lets a test
count the work done for a prompt (a declined question, a departed client), and
the model passes run inside the engine's ``call``s (a question's scoring) apart
from decoding.
"""

from __future__ import annotations

import time
from dataclasses import replace

from candor.backends.hf import HFBackend


class CountingBackend(HFBackend):
    """Records ``(prompts, tokens generated per prompt)`` per ``generate`` call or live-engine request."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[list[str], list[int]]] = []
        self.token_delay = 0.0  # seconds per generated token: a model slow enough for a client to leave mid-way
        self.scoring_forwards = 0  # model passes (``forward``) run inside live-engine calls, i.e. while scoring
        self._in_call = False  # set by the engine thread while it runs a call, which never overlaps a decode step

    @property
    def generated(self) -> list[str]:
        """Every prompt generated for, in order."""
        return [p for prompts, _ in self.calls for p in prompts]

    def tokens_for(self, marker: str) -> int:
        return sum(r for prompts, rows in self.calls for p, r in zip(prompts, rows, strict=True) if marker in p)

    def _record(self, prompts, gens) -> None:
        rows = [sum(len(c.token_ids) for c in ([g.greedy] if g.greedy else []) + list(g.samples)) for g in gens]
        self.calls.append((list(prompts), rows))

    def generate(self, prompts, *args, **kwargs):
        hook = kwargs.get("on_token")
        if self.token_delay and hook is not None:

            def slow(prompt: int, sample: int, token: int) -> bool:
                time.sleep(self.token_delay)
                return hook(prompt, sample, token)

            kwargs["on_token"] = slow
        gens = super().generate(prompts, *args, **kwargs)
        self._record(prompts, gens)
        return gens

    def forward(self, *args, **kwargs):
        if self._in_call:
            self.scoring_forwards += 1
        return super().forward(*args, **kwargs)

    def live_engine(self, max_rows=None, shared_prefix=None):
        return CountingEngine(self, super().live_engine(max_rows, shared_prefix=shared_prefix))


class CountingEngine:
    """The backend's real live engine, recording each finished request on its backend."""

    def __init__(self, backend: CountingBackend, engine) -> None:
        self.backend, self.engine = backend, engine

    def submit(self, request):
        delay = self.backend.token_delay
        if delay:
            hook = request.on_token

            def slow(sample: int, token: int) -> bool:
                time.sleep(delay)
                return True if hook is None else hook(sample, token)

            request = replace(request, on_token=slow)
        future = self.engine.submit(request)
        future.add_done_callback(
            lambda f: None if f.cancelled() or f.exception() else self.backend._record([request.prompt], [f.result()])
        )
        return future

    def call(self, work):
        backend = self.backend

        def counted():
            backend._in_call = True
            try:
                return work()
            finally:
                backend._in_call = False

        return self.engine.call(counted)

    def close(self) -> None:
        self.engine.close()
