"""Giving freed memory back to the operating system."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import time
from typing import Any

logger = logging.getLogger(__name__)


@functools.cache
def _libc() -> Any:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "malloc_trim") else None


def give_back_memory() -> bool:
    """Return the C heap's free pages to the system (glibc's ``malloc_trim``); False where there is none.

    Freed tensors of a few megabytes stay in the heap that served them, so a
    process's resident size keeps the peak of its largest request unless the
    heap is trimmed.
    """
    libc = _libc()
    if libc is None:
        return False
    return bool(libc.malloc_trim(0))


def resident_bytes() -> int | None:
    """This process's resident size in bytes (Linux's ``/proc/self/statm``); None where it cannot be read."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


class IdleTrimmer:
    """Gives freed memory back when a server goes idle and holds ``growth`` bytes more than at rest.

    A long prompt's chunked prefill and re-read free hundreds of megabytes of
    KV cache when they end; glibc keeps them in its heaps until trimmed. The
    resident size does not fall when memory is freed, only when it is
    trimmed, so the rest level is the lowest size seen right after a trim, and
    a trim runs when the process is that much above it. A trim walks the heap
    and the next large request faults its pages back in, so trims are at
    least ``interval_s`` apart; a trim put off by that is due later, and
    :meth:`on_idle` says when to ask again.
    """

    def __init__(self, growth: int = 64 * 2**20, interval_s: float = 1.0) -> None:
        self.growth = growth
        self.interval_s = interval_s
        self.rest: int | None = None  # the lowest resident size right after a trim
        self.trimmed_at: float | None = None
        self.trims = 0

    def on_idle(self) -> float | None:
        """Trim if the process is ``growth`` above its rest level; None, or the seconds until a put-off trim is due."""
        now = resident_bytes()
        if now is None or (self.rest is not None and now < self.rest + self.growth):
            return None
        clock = time.monotonic()
        if self.trimmed_at is not None and clock - self.trimmed_at < self.interval_s:
            return self.interval_s - (clock - self.trimmed_at)
        give_back_memory()
        self.trims += 1
        self.trimmed_at = clock
        after = resident_bytes()
        if after is not None:
            self.rest = after if self.rest is None else min(self.rest, after)
        return None
