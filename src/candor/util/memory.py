"""Giving freed memory back to the operating system."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
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
    return pages * _page_size()


@functools.cache
def _page_size() -> int:
    import os

    return os.sysconf("SC_PAGE_SIZE")


class IdleTrimmer:
    """Gives freed memory back when a server goes idle, if it holds ``growth`` bytes more than after the last time.

    A long prompt's chunked prefill and re-read free hundreds of megabytes of
    KV cache when they end; glibc keeps them in its heaps until trimmed. A
    trim walks the heap (milliseconds), so it runs only once the process has
    grown by ``growth`` since the last one, and only when nothing is waiting.
    """

    def __init__(self, growth: int = 64 * 2**20) -> None:
        self.growth = growth
        self.rested: int | None = None  # the resident size after the last trim
        self.trims = 0

    def on_idle(self) -> bool:
        """Trim if the process has grown by ``growth`` since the last trim; whether it did."""
        now = resident_bytes()
        if now is None or (self.rested is not None and now < self.rested + self.growth):
            return False
        give_back_memory()
        self.trims += 1
        self.rested = resident_bytes()
        return True
