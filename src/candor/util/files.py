"""Atomic file writes and keyed cache entries: the one way candor writes a file (docs/architecture.md "Conventions").

Everything is written to a temporary file beside the target, flushed and
fsynced, then renamed over the target, so a killed run leaves either the old
file or the new one, never half of one.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def cache_root() -> Path:
    """candor's own folder for caches and fetched data: ``$CANDOR_CACHE`` or ``~/.cache/candor``."""
    return Path(os.environ.get("CANDOR_CACHE") or Path.home() / ".cache" / "candor")


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


def write_keyed_json(path: str | Path, key: str, payload: dict[str, Any]) -> Path:
    """A whole-result cache entry: ``payload`` stored under the ``key`` of everything that determined it."""
    return atomic_write_json(path, {"key": key, **payload}, indent=None)


def read_keyed_json(path: str | Path | None, key: str) -> dict[str, Any] | None:
    """The cache entry at ``path`` if it was written under ``key``; None (recompute) otherwise.

    The one way candor keeps a whole-result cache (diagnose stages, EliCal sweep
    runs): an unreadable entry or one made from other inputs is recomputed, with
    a log line saying which, never trusted.
    """
    if path is None or not Path(path).exists():
        return None
    doc = read_cache_entry(path)
    if doc is None:
        logger.warning("%s: unreadable cache entry, recomputing", path)
        return None
    if doc.get("key") != key:
        logger.info("%s: cached from other inputs (model, weights, settings or data); recomputing", path)
        return None
    return doc


def read_cache_entry(path: str | Path | None) -> dict[str, Any] | None:
    """The cache entry at ``path`` whatever key it was written under; None when there is none or it is
    unreadable (not JSON, not an object): a cache is recomputed, never an error.

    The one parse of :func:`write_keyed_json`'s file; for a caller that checks the key itself
    (the EliCal sweep reuses a run's training when only its test questions changed).
    """
    if path is None or not Path(path).exists():
        return None
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


@contextmanager
def atomic_folder(folder: str | Path) -> Iterator[Path]:
    """Yield a temporary sibling folder to fill; on success it replaces ``folder`` whole.

    A reader never sees half a saved model: either the old folder or the new one.
    On an exception the temporary folder is removed and ``folder`` is left as it was.
    """
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        yield tmp
        if folder.exists():
            shutil.rmtree(folder)
        tmp.rename(folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def check_replaceable(folder: str | Path, marker: str, *, inputs: tuple[str | Path, ...] = ()) -> None:
    """Refuse to let :func:`atomic_folder` replace anything but an earlier output of the same kind.

    ``folder`` may be new, empty, or hold ``marker`` (a file every such output has); it must
    not be, hold or lie inside one of ``inputs``.
    """
    from candor.util.errors import CandorError

    folder = Path(folder).resolve()
    for source in inputs:
        source = Path(source).resolve()
        if folder == source or source.is_relative_to(folder) or folder.is_relative_to(source):
            raise CandorError(f"{folder}: the output folder would overwrite the input {source}; choose another")
    if folder.exists() and (not folder.is_dir() or (any(folder.iterdir()) and not (folder / marker).exists())):
        raise CandorError(f"{folder} exists and is not an earlier output (no {marker}); choose a new folder")


def read_regular_bytes(path: str | Path) -> bytes:
    """``path``'s bytes, only when it is a regular file (symlinks followed); a FIFO, device or socket is refused.

    It is checked before it is opened (a device is never opened) and again once open, without blocking
    (a FIFO swapped in between is refused, never waited on). Raises :class:`NotRegularFile` (an
    ``OSError``) for those, and ``OSError`` as ``open`` does for the rest.
    """
    path = Path(path)
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise NotRegularFile(f"{path}: not a regular file (a FIFO, device or socket is never read)")
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(f"{path}: not a regular file (a FIFO, device or socket is never read)")
        return fh.read()


class NotRegularFile(OSError):
    """A path that names a FIFO, a device, a socket or a folder where a regular file is read."""
