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
