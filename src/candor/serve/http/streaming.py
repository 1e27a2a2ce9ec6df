"""Streamed answers: OpenAI chunks as server-sent events, fed by the engine thread.

A :class:`RequestListener` is what a request's questions report to while the
engine thread answers them (:class:`candor.serve.answering.Listener`): the head's
decision, each kept token, and whether anybody still waits. The event loop
reads its queue; :class:`TextDelta` turns token ids into text deltas that never
show a stop string or whitespace the final answer strips.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Sequence
from typing import Any

from candor.serve.answering import HonestAnswer

DONE = "data: [DONE]\n\n"


class RequestListener:
    """One question's ear in the engine thread; events go to the request's queue as ``(kind, ask, ...)``."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        queue: asyncio.Queue[tuple[Any, ...]] | None,
        ask: int,
        streams_tokens: bool = True,
    ) -> None:
        self._loop = loop
        self._queue = queue  # None: nobody streams (a plain request), only cancellation matters
        self._ask = ask
        self._streams_tokens = streams_tokens  # False: tokens are held until the answer is decided (buffered)
        self._gone = threading.Event()

    def alive(self) -> bool:
        return not self._gone.is_set()

    def cancel(self) -> None:
        self._gone.set()

    def decided(self, answer: HonestAnswer) -> None:
        self._put(("decided", self._ask, answer))

    def token(self, choice: int, token_id: int) -> None:
        if self._streams_tokens:
            self._put(("token", self._ask, choice, token_id))

    def done(self) -> None:
        self._put(("done", self._ask))

    def _put(self, event: tuple[Any, ...]) -> None:
        if self._queue is not None:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)


class TextDelta:
    """The text of a growing list of token ids, released only where the final answer is sure to agree."""

    def __init__(self, decode: Callable[[Sequence[int]], str], stops: Sequence[str]) -> None:
        self._decode = decode
        self._stops = [s for s in stops if s]
        self.ids: list[int] = []
        self.sent = ""

    def add(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self._decode(self.ids).lstrip()  # answers are stripped
        cut = [i for i in (text.find(s) for s in self._stops) if i >= 0]
        if cut:
            text = text[: min(cut)]
        safe = len(text.rstrip())  # trailing space may be stripped at the end
        if text.endswith("\ufffd"):  # half a multi-byte character
            safe = min(safe, len(text) - 1)
        for s in self._stops:  # a tail that could start a stop string waits for the next token
            for k in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:k]):
                    safe = min(safe, len(text) - k)
                    break
        return self._release(text[:safe])

    def finish(self, final: str) -> str:
        """The rest of ``final`` (empty when what was sent is not a prefix of it, which the cuts above prevent)."""
        return self._release(final)

    def _release(self, text: str) -> str:
        if not text.startswith(self.sent) or len(text) <= len(self.sent):
            return ""
        delta, self.sent = text[len(self.sent) :], text
        return delta


def sse(payload: dict[str, Any]) -> str:
    """One server-sent event carrying a JSON payload."""
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"
