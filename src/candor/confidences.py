"""Confidences file: what ``candor score`` writes and ``candor eval`` reads.

One JSON line per record::

    {"id": "nq:12", "dataset": "nq", "correct": 1, "confidence": {"n-prob": 0.41, "consis-sem": 0.8}}

``correct`` is the greedy answer's correctness (the evaluation label). Methods
are columns, so estimators scored at different times merge by ``id``.

What produced each column sits beside the table in ``<file>.columns.json``
(:func:`columns_path`)::

    {"columns": {"verbal-number": {"produced_by": {"model": …, "adapter": …, "options": …,
                                                   "records": "<sha256>", …},
                                   "parse_fallbacks": 3, "sha256": "<digest of the column's values>"}}}

A sidecar rather than a field on every row keeps the rows as small and plain
as before (any JSONL reader, ``candor eval`` included, reads them unchanged)
and states each column's provenance once. The two files cannot be replaced
in one step, so each entry carries the digest of the values it describes:
:func:`read_confidences` keeps an entry only when the table still holds
exactly those values, and a run killed between the two writes, or a
hand-edited column, leaves a column with no provenance (which ``candor score``
recomputes) rather than a wrong one.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from candor.errors import CandorError, at_line
from candor.files import atomic_write_text
from candor.jsonl import iter_json_lines, write_json_lines

logger = logging.getLogger(__name__)


@dataclass
class ConfidenceRow:
    id: str
    dataset: str
    correct: int | None
    confidence: dict[str, float] = field(default_factory=dict)


@dataclass
class ConfidenceTable:
    """Rows of confidences, with helpers to pull out one method as arrays.

    ``columns`` maps a method to what produced it (see the module docstring);
    a method without an entry has no known provenance.
    """

    rows: list[ConfidenceRow]
    columns: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def methods(self) -> list[str]:
        seen: dict[str, None] = {}
        for row in self.rows:
            seen.update(dict.fromkeys(row.confidence))
        return list(seen)

    @property
    def datasets(self) -> list[str]:
        return list(dict.fromkeys(r.dataset for r in self.rows))

    def arrays(self, method: str, dataset: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(confidence, correct)`` for one method, optionally one dataset."""
        rows = [r for r in self.rows if dataset is None or r.dataset == dataset]
        missing = [r.id for r in rows if method not in r.confidence]
        if missing:
            raise CandorError(f"method {method!r} has no confidence for {len(missing)} rows, e.g. {missing[0]}")
        unlabeled = [r.id for r in rows if r.correct is None]
        if unlabeled:
            raise CandorError(f"{len(unlabeled)} rows have no correctness label, e.g. {unlabeled[0]}")
        conf = np.array([r.confidence[method] for r in rows], dtype=float)
        correct = np.array([r.correct for r in rows], dtype=int)
        return conf, correct

    def add(self, method: str, ids: Sequence[str], values: Sequence[float]) -> None:
        """Set one method's confidences by record id."""
        by_id = {r.id: r for r in self.rows}
        for rid, v in zip(ids, values, strict=True):
            by_id[rid].confidence[method] = float(v)

    def provenance(self, method: str) -> dict[str, Any] | None:
        """What produced ``method``'s column (``produced_by``, ``parse_fallbacks``), or None when unknown."""
        return self.columns.get(method)

    def parse_fallbacks(self, method: str) -> int | None:
        """How many replies of a verbalized method stated no confidence and got the fallback value.

        0 for a verbalized method read from log-probs (no replies to parse);
        None for methods that parse nothing (log-prob, consistency) and for
        columns whose provenance is unknown.
        """
        value = (self.columns.get(method) or {}).get("parse_fallbacks")
        return None if value is None else int(value)

    def column_digest(self, method: str) -> str:
        """SHA-256 of one column's ``(id, value)`` pairs in row order (rows without the method skipped)."""
        h = hashlib.sha256()
        for r in self.rows:
            if method in r.confidence:
                h.update(f"{r.id}\0{float(r.confidence[method])!r}\n".encode())
        return h.hexdigest()


def columns_path(path: str | Path) -> Path:
    """The provenance sidecar of a confidences file: ``conf.jsonl`` → ``conf.jsonl.columns.json``."""
    path = Path(path)
    return path.with_name(path.name + ".columns.json")


def write_confidences(path: str | Path, table: ConfidenceTable) -> None:
    """Write the rows, then the provenance of every column that has one (each file atomically)."""
    write_json_lines(
        path, ({"id": r.id, "dataset": r.dataset, "correct": r.correct, "confidence": r.confidence} for r in table.rows)
    )
    present = set(table.methods)
    columns = {m: {**entry, "sha256": table.column_digest(m)} for m, entry in table.columns.items() if m in present}
    atomic_write_text(columns_path(path), json.dumps({"columns": columns}, indent=1, sort_keys=True) + "\n")


def read_confidences(path: str | Path) -> ConfidenceTable:
    """Read the rows and, where the sidecar vouches for a column's current values, its provenance."""
    rows = []
    for lineno, obj in iter_json_lines(path):
        try:
            conf = {str(k): float(v) for k, v in obj["confidence"].items()}
            rows.append(ConfidenceRow(str(obj["id"]), str(obj.get("dataset", "")), obj.get("correct"), conf))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise at_line(path, lineno, f"not a confidences row ({exc})") from None
    table = ConfidenceTable(rows)
    table.columns = _verified_columns(path, table)
    return table


def _verified_columns(path: str | Path, table: ConfidenceTable) -> dict[str, dict[str, Any]]:
    sidecar = columns_path(path)
    if not sidecar.exists():
        return {}
    try:
        columns = json.loads(sidecar.read_text(encoding="utf-8"))["columns"]
        if not isinstance(columns, dict):
            raise TypeError("'columns' is not an object")
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as exc:
        logger.warning("%s: unreadable column provenance (%s); every column counts as unknown", sidecar, exc)
        return {}
    kept = {}
    for method, entry in columns.items():
        if isinstance(entry, dict) and entry.get("sha256") == table.column_digest(method):
            kept[method] = {k: v for k, v in entry.items() if k != "sha256"}
        else:
            logger.info("%s: %s's values are not the ones its provenance describes; provenance unknown", path, method)
    return kept


def table_from_records(records: Iterable) -> ConfidenceTable:
    """An empty table (no methods yet) keyed by the records' ids and labels."""
    return ConfidenceTable(
        [ConfidenceRow(r.id, r.item.dataset, r.greedy_correct, {}) for r in records]
    )
