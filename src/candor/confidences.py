"""Confidences file: what ``candor score`` writes and ``candor eval`` reads.

One JSON line per record::

    {"id": "nq:12", "dataset": "nq", "correct": 1, "confidence": {"n-prob": 0.41, "consis-sem": 0.8}}

``correct`` is the greedy answer's correctness (the evaluation label). Methods
are columns, so estimators scored at different times merge by ``id``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from candor.errors import CandorError, at_line
from candor.jsonl import iter_json_lines, write_json_lines


@dataclass
class ConfidenceRow:
    id: str
    dataset: str
    correct: int | None
    confidence: dict[str, float] = field(default_factory=dict)


@dataclass
class ConfidenceTable:
    """Rows of confidences, with helpers to pull out one method as arrays."""

    rows: list[ConfidenceRow]

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


def write_confidences(path: str | Path, table: ConfidenceTable) -> None:
    write_json_lines(
        path, ({"id": r.id, "dataset": r.dataset, "correct": r.correct, "confidence": r.confidence} for r in table.rows)
    )


def read_confidences(path: str | Path) -> ConfidenceTable:
    rows = []
    for lineno, obj in iter_json_lines(path):
        try:
            conf = {str(k): float(v) for k, v in obj["confidence"].items()}
            rows.append(ConfidenceRow(str(obj["id"]), str(obj.get("dataset", "")), obj.get("correct"), conf))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise at_line(path, lineno, f"not a confidences row ({exc})") from None
    return ConfidenceTable(rows)


def table_from_records(records: Iterable) -> ConfidenceTable:
    """An empty table (no methods yet) keyed by the records' ids and labels."""
    return ConfidenceTable(
        [ConfidenceRow(r.id, r.item.dataset, r.greedy_correct, {}) for r in records]
    )
