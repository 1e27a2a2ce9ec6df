"""What a benchmark measures of its own process: wall and CPU seconds of a block, and peak resident memory.

Imports nothing from candor, so the children that run in another project's venv (lm-polygraph's) use it too.
"""

from __future__ import annotations

import resource
import time


class Timer:
    """Wall-clock and process CPU seconds of a block (CPU time is steadier on a shared machine)."""

    def __enter__(self) -> Timer:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.wall
        self.cpu = time.process_time() - self.cpu


def peak_rss_mib() -> float:
    """Peak resident memory of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
