"""The token prefix every prompt of a template shares (its few-shot block, a chat's system turn), run once.

A template renders every question inside the same text, so its prompts start
with the same tokens. :class:`SharedPrefix` holds those tokens, found once
from two renderings of the template (:meth:`SharedPrefix.of`), and their KV
cache, computed once, alone (a batch of one), on first use. Whoever runs a
prompt that :meth:`~SharedPrefix.starts` with them runs only the rest over a
copy of that cache.

The prefix is fixed by the template, never by which prompts happen to run
together, so a prompt's split (and so every number computed from it) is the
same whatever else runs: the live engine's prefill
(:mod:`candor.backends.engine.live_engine`) and serving's re-read of answers
(:mod:`candor.serve.rescoring`) both rely on that.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from typing import Any

import torch

from candor.backends.tokens import prefill_shared_prefix, usable_prefix_length


class SharedPrefix:
    """The tokens every prompt of a template starts with, and their KV cache (run once, alone, on first use).

    ``backend`` is an in-process model backend (``hf``): its ``encode`` and ``model`` are used.
    """

    def __init__(self, backend: Any, ids: Sequence[int]) -> None:
        self.backend = backend
        self.ids = list(ids)
        self._cache: Any = None
        self._lock = threading.Lock()

    @classmethod
    def of(cls, backend: Any, prompts: Sequence[str]) -> SharedPrefix | None:
        """The prefix ``prompts`` (the template around different questions) share, when worth reusing."""
        encoded = backend.encode(list(prompts))
        length = usable_prefix_length(backend.model, encoded)
        return cls(backend, encoded[0][:length]) if length else None

    def __len__(self) -> int:
        return len(self.ids)

    def starts(self, ids: Sequence[int]) -> bool:
        """Whether ``ids`` start with the prefix and go on past it (at least one token of their own)."""
        return len(ids) > len(self.ids) and list(ids[: len(self.ids)]) == self.ids

    @torch.inference_mode()
    def computed(self) -> Any:
        """The prefix's KV cache itself (computed on the first call): copy it before running over it."""
        with self._lock:
            if self._cache is None:
                self._cache = prefill_shared_prefix(self.backend.model, self.ids)
            return self._cache

    def cache(self) -> Any:
        """A fresh copy of the prefix's KV cache."""
        return copy.deepcopy(self.computed())
