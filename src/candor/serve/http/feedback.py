"""What the service remembers of the responses it served, so labels (``POST /v1/feedback``) can be checked.

:class:`ServedIndex` remembers the last :data:`REMEMBERED_RESPONSES` responses (their id,
choices, whether each was answered, the model version), bounded so that traffic cannot grow
it without limit; feedback on an id it does not hold is a 404. The accuracy audit labels
show, and the drift alarm, are :mod:`candor.serve.audit_monitor`'s.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

REMEMBERED_RESPONSES = 100_000  # responses whose ids feedback can name (older ones: `candor label` the log)


@dataclass(frozen=True)
class ServedChoice:
    """What feedback needs to know about one served choice."""

    answered: bool
    model_version: str


class ServedIndex:
    """The last :data:`REMEMBERED_RESPONSES` responses' choices, by ``(response id, index)`` (thread-safe)."""

    def __init__(self, limit: int = REMEMBERED_RESPONSES) -> None:
        self._limit = limit
        self._responses: OrderedDict[str, dict[int, ServedChoice]] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, response_id: str, indexes: Sequence[int], answered: Sequence[bool], version: str) -> None:
        with self._lock:
            choices = self._responses.setdefault(response_id, {})
            choices.update({i: ServedChoice(a, version) for i, a in zip(indexes, answered, strict=True)})
            self._responses.move_to_end(response_id)
            while len(self._responses) > self._limit:
                self._responses.popitem(last=False)

    def find(self, response_id: str, index: int) -> ServedChoice | None:
        with self._lock:
            return self._responses.get(response_id, {}).get(index)
