"""A folder a reload loads, held inside ``--honest-root``: what it holds, and what its ``honest.json`` names.

Before a reload reads a byte (:func:`confine`):

- every entry of the folder, at any depth, is looked at without opening it (``lstat``): a folder or
  a regular file is allowed; a symlink is resolved, and allowed when what it reaches is inside the
  root and is itself a folder or a regular file; a FIFO, a device or a socket is refused (reading
  one would hang the reload, and every later one, or read what is no file);
- the paths ``honest.json`` names (the confidence head, the generator's adapter, and a generator
  model given as a local path) resolve inside the root. A generator model that is the one serving
  now is kept, wherever it lies: it is not read again.

A refusal is a :class:`~candor.util.errors.CandorError` naming the entry by its path inside the
root, never a path outside it. The files are then read as regular files only
(:func:`candor.util.files.read_regular_bytes`), so one swapped for a FIFO after the check is
refused, not waited on.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from candor.util.errors import CandorError

MAX_ENTRIES = 100_000  # entries looked at in one folder before the reload is refused (a folder holds a few dozen)


def confine(folder: Path, root: Path, config_reader: Any, serving_model: str | None = None) -> None:
    """Refuse ``folder`` unless all it holds and names stays inside ``root`` (see the module docstring).

    ``config_reader(folder)`` parses ``honest.json`` (called only after the folder's entries passed);
    ``serving_model``: the generator model serving now, which the folder may name wherever it lies.
    """
    root = root.resolve(strict=True)
    check_entries(folder, root)
    config = config_reader(folder)
    named = {
        "confidence.head": (config.get("confidence") or {}).get("head"),
        "generator.adapter": (config.get("generator") or {}).get("adapter"),
    }
    for field, value in named.items():
        if isinstance(value, str) and value:
            inside(folder / value, root, f"honest.json's {field}")
    model = (config.get("generator") or {}).get("model")
    if isinstance(model, str) and model != serving_model and looks_like_a_path(model):
        inside(Path(model) if Path(model).is_absolute() else folder / model, root, "honest.json's generator.model")


def looks_like_a_path(name: str) -> bool:
    """A generator model named as a local path (absolute, ``./``, ``../``, ``~``), not a hub id or a short name."""
    return name.startswith(("/", "./", "../", "~", "\\")) or name in (".", "..") or os.path.isabs(name)


def inside(path: Path, root: Path, what: str) -> Path:
    """``path`` resolved (symlinks followed), when it exists inside ``root``; else a refusal naming ``what``."""
    try:
        resolved = path.expanduser().resolve(strict=True)
    except (OSError, RuntimeError, ValueError):
        raise CandorError(f"{what} names a path that does not exist inside --honest-root") from None
    if not resolved.is_relative_to(root):
        raise CandorError(f"{what} names a path outside --honest-root (a reload reads files inside it only)")
    return resolved


def check_entries(folder: Path, root: Path) -> None:
    """Every entry under ``folder``: a folder or a regular file inside ``root``, symlinks resolved; else refused."""
    start = inside(folder, root, "the folder")
    seen = {start}
    todo = [start]
    count = 0
    while todo:
        current = todo.pop()
        try:
            entries = list(os.scandir(current))
        except OSError:
            raise CandorError(f"{shown(current, root)}: cannot list this folder") from None
        for entry in entries:
            count += 1
            if count > MAX_ENTRIES:
                raise CandorError(f"{shown(start, root)}: more than {MAX_ENTRIES:,} entries; not a saved honest model")
            path = Path(entry.path)
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):
                target = inside(path, root, shown(path, root))
                mode = os.stat(target).st_mode
                path = target
            if stat.S_ISDIR(mode):
                if path not in seen:
                    seen.add(path)
                    todo.append(path)
            elif not stat.S_ISREG(mode):
                raise CandorError(
                    f"{shown(Path(entry.path), root)}: not a regular file or folder (a FIFO, device or socket "
                    "is never read)"
                )


def shown(path: Path, root: Path) -> str:
    """``path`` as a client may read it: its path inside ``root`` (the resolved root or as given)."""
    for base in (root, root.resolve()):
        if path.is_relative_to(base):
            return str(path.relative_to(base)) or "."
    return "(a path outside --honest-root)"
