"""Measuring what a run cost (:class:`ResourceMeter`): wall time and peak resident memory of a block of work.

Trainers, the diagnostics and the benchmarks all report it, so it lives here,
apart from the training kit: measuring a block needs no torch or transformers.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from dataclasses import dataclass
from pathlib import Path


def current_rss_mib() -> float:
    """Resident memory of this process now (Linux ``/proc``; elsewhere the peak so far)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass
class RunCost:
    """Wall time and peak resident memory of one block of work."""

    wall_s: float = 0.0
    peak_rss_mib: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return {"wall_s": round(self.wall_s, 2), "peak_rss_mib": round(self.peak_rss_mib, 1)}


class ResourceMeter:
    """Measure a block: ``with ResourceMeter() as meter: ...; meter.cost``.

    Peak memory is sampled from a background thread (``interval`` seconds), so
    it is the peak *during* the block, not the process's lifetime peak that
    ``getrusage`` gives.
    """

    def __init__(self, interval: float = 0.2) -> None:
        self.interval = interval
        self.cost = RunCost()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = 0.0

    def __enter__(self) -> ResourceMeter:
        self._start = time.perf_counter()
        self.cost.peak_rss_mib = current_rss_mib()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.cost.peak_rss_mib = max(self.cost.peak_rss_mib, current_rss_mib())
        self.cost.wall_s = time.perf_counter() - self._start

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.cost.peak_rss_mib = max(self.cost.peak_rss_mib, current_rss_mib())
