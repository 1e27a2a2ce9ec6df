"""Incremental scoring: add estimator columns to a confidences file.

Re-scoring pre-generated records is the default workflow (DESIGN.md §6.2):
methods already in the file for every record are kept, only the missing ones
are computed, and the file is rewritten atomically after each method so a
killed run keeps what it finished.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from candor.backends.base import Backend
from candor.confidences import ConfidenceTable, read_confidences, table_from_records, write_confidences
from candor.estimators import score_records
from candor.records import Record

logger = logging.getLogger(__name__)


def _reuse_existing(table: ConfidenceTable, path: Path) -> None:
    """Copy into ``table`` the methods that ``path`` already has for every record."""
    if not path.exists():
        return
    old = {row.id: row.confidence for row in read_confidences(path).rows}
    for method in {m for conf in old.values() for m in conf}:
        if all(method in old.get(row.id, {}) for row in table.rows):
            for row in table.rows:
                row.confidence[method] = old[row.id][method]


def score_into(
    records: Sequence[Record],
    methods: Sequence[str],
    out: str | Path,
    backend: Backend | None = None,
    *,
    force: bool = False,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    progress: bool = True,
) -> ConfidenceTable:
    """Score ``records`` with ``methods`` into ``out``, reusing columns already there.

    ``options`` maps an estimator name to its constructor keywords (see
    :func:`candor.estimators.score_records`).
    """
    out = Path(out)
    table = table_from_records(records)
    if not force:
        _reuse_existing(table, out)
    done = set(table.methods)
    for name in methods:
        if name in done:
            logger.info("%s: reusing cached confidences", name)
            continue
        start = time.perf_counter()
        scored = score_records(records, [name], backend, progress=progress, options=options)
        table.add(name, [r.id for r in records], [row.confidence[name] for row in scored.rows])
        write_confidences(out, table)
        logger.info("%s: scored %d records in %.1f s", name, len(records), time.perf_counter() - start)
    # Requested methods first, in the order asked, then any others the file held.
    for row in table.rows:
        row.confidence = {m: row.confidence[m] for m in [*methods, *row.confidence] if m in row.confidence}
    write_confidences(out, table)
    return table
