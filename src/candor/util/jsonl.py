"""JSON-lines files: reading with errors that name the file and line, atomic writing."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from candor.util.errors import CandorError, at_line
from candor.util.files import atomic_target


def iter_json_lines(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for each non-blank line; errors name the line."""
    path = Path(path)
    if not path.exists():
        raise CandorError(f"{path}: no such file")
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise at_line(path, lineno, f"malformed JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise at_line(path, lineno, "expected a JSON object")
            yield lineno, obj


def write_json_lines(path: str | Path, objects: Iterable[dict[str, Any]]) -> None:
    """Write one JSON object per line atomically: a temporary file, fsync, then a rename."""
    with atomic_target(path) as tmp, tmp.open("w", encoding="utf-8") as fh:
        for obj in objects:
            fh.write(json.dumps(obj, ensure_ascii=False) + "\n")
