"""tests/data/served_log.jsonl: four answers a real `candor serve --log-records` wrote, shared by the label tests."""

from __future__ import annotations

import shutil
from pathlib import Path

FIXTURE = Path(__file__).parent / "data" / "served_log.jsonl"
IDS = [
    "chatcmpl-be173b099cf84cc8be9a1038e399f7a0",
    "chatcmpl-680ec088410140ddbd52492169ef3e7f",
    "chatcmpl-b0d71d3a3d6148d38b2a3ce733877af3",
    "chatcmpl-9d33b97de9ee4688b3e46ea7fb147f14",
]


def copy_served_log(tmp_path: Path) -> Path:
    """A copy of the served log, free to append labels to."""
    path = tmp_path / "served.jsonl"
    shutil.copy(FIXTURE, path)
    return path
