"""Atomic file writes: the one way candor writes a file (DESIGN.md §6.2).

Everything is written to a temporary file beside the target, flushed and
fsynced, then renamed over the target, so a killed run leaves either the old
file or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def atomic_target(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path to write; on success it is fsynced and renamed to ``path``.

    For writers that want a path rather than a file handle (``savefig``, ``save_file``).
    On an exception the temporary file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        with tmp.open("rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: str | Path, text: str) -> Path:
    path = Path(path)
    with atomic_target(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path


def atomic_write_json(path: str | Path, payload: Any, indent: int | None = 2) -> Path:
    return atomic_write_text(path, json.dumps(payload, indent=indent, ensure_ascii=False) + "\n")
