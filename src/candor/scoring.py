"""Incremental scoring: add estimator columns to a confidences file.

Re-scoring pre-generated records is the default workflow (DESIGN.md §6.2):
a column already in the file is kept only when what produced it matches this
run exactly (:func:`column_key`: estimator, options with path-valued ones
hashed by content, model, adapter and weights for estimators that run a
model, the records' content and the candor version); anything else is
recomputed, with one INFO line naming what changed. The file is rewritten
atomically after each method so a killed run keeps what it finished.

Before scoring, every trained folder involved (the backend's adapter, a head
given as an option) that carries a training-questions manifest is checked
against the records, and an overlap is warned about with a count and an
example (:mod:`candor.contamination`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import candor
from candor.backends.base import Backend
from candor.confidences import ConfidenceTable, read_confidences, table_from_records, write_confidences
from candor.contamination import MANIFEST_NAME, Overlap, find_overlap, read_manifest
from candor.digests import backend_identity, canonical, records_digest
from candor.estimators import get_estimator, score_records
from candor.records import Record

logger = logging.getLogger(__name__)


def column_key(
    name: str, options: Mapping[str, Any], backend_id: Mapping[str, Any] | None, records_sha: str
) -> dict[str, Any]:
    """What determines a column's values: the cache key stored as its ``produced_by``.

    ``backend_id`` (from :func:`candor.digests.backend_identity`) is given
    only for estimators that run a model; the others read the records alone.
    """
    backend_id = backend_id or {}
    return {
        "estimator": name,
        "options": canonical(dict(options)),
        "model": backend_id.get("model"),
        "adapter": backend_id.get("adapter"),
        "weights": backend_id.get("weights"),
        "records": records_sha,
        "candor_version": candor.__version__,
    }


def _stale_reason(table: ConfidenceTable, method: str, key: Mapping[str, Any]) -> str | None:
    """Why ``method``'s column in ``table`` cannot stand for ``key`` (None: it can be reused)."""
    missing = sum(method not in row.confidence for row in table.rows)
    if missing:
        return f"missing for {missing} of {len(table.rows)} records"
    entry = table.provenance(method)
    if entry is None or "produced_by" not in entry:
        return "no recorded provenance"
    old = entry["produced_by"]
    changed = [k for k in key if old.get(k) != key[k]]
    return f"changed: {', '.join(changed)}" if changed else None


def _previous(out: Path, records: Sequence[Record]) -> ConfidenceTable:
    """The file's columns over ``records``' ids, in their order, with their provenance (empty without a file)."""
    table = table_from_records(records)
    if not out.exists():
        return table
    old = read_confidences(out)
    by_id = {row.id: row.confidence for row in old.rows}
    for row in table.rows:
        row.confidence = dict(by_id.get(row.id, {}))
    table.columns = old.columns
    return table


def _overlaps(records: Sequence[Record], folders: Mapping[str, Path]) -> Iterator[tuple[str, Overlap]]:
    questions = [r.item.question for r in records]
    for label, folder in folders.items():
        seen = read_manifest(folder)
        if seen is not None:
            yield label, find_overlap(questions, seen)


def trained_folders(options: Mapping[str, Mapping[str, Any]], backend: Backend | None) -> dict[str, Path]:
    """The trained folders a run uses: the backend's adapter and every option naming a folder with a manifest."""
    folders: dict[str, Path] = {}
    adapter = getattr(backend, "adapter", None)
    if adapter:
        folders[f"adapter {adapter}"] = Path(adapter)
    for est, opts in options.items():
        for key, value in opts.items():
            if isinstance(value, (str, Path)) and str(value) and (Path(value) / MANIFEST_NAME).exists():
                folders[f"{est}.{key} {value}"] = Path(value)
    return folders


def warn_contamination(records: Sequence[Record], folders: Mapping[str, Path]) -> dict[str, Overlap]:
    """Warn, with a count and an example, for each folder whose training questions the records overlap."""
    found = {}
    for label, overlap in _overlaps(records, folders):
        if overlap:
            found[label] = overlap
            logger.warning(
                "contamination: %d of %d records being scored are among the training questions of %s, e.g. %r",
                overlap.count, overlap.total, label, overlap.example,
            )
    return found


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
    """Score ``records`` with ``methods`` into ``out``, reusing columns produced exactly as this run would.

    ``options`` maps an estimator name to its constructor keywords (see
    :func:`candor.estimators.score_records`). Columns of other methods already
    in ``out`` are kept when they belong to the same records.
    """
    out = Path(out)
    options = options or {}
    warn_contamination(records, trained_folders(options, backend))
    previous = _previous(out, records)  # even with force: the file's other columns are kept, not lost
    records_sha = records_digest(records)
    table = table_from_records(records)
    _keep_others(previous, table, records_sha, methods)
    stale: dict[str, dict[str, Any]] = {}
    identity: dict[str, Any] | None = None
    for name in methods:  # reusable columns first, so a run killed while scoring keeps them
        opts = options.get(name, {})
        if get_estimator(name, **dict(opts)).needs_backend:
            identity = identity or backend_identity(backend)
            key = column_key(name, opts, identity, records_sha)
        else:
            key = column_key(name, opts, None, records_sha)
        reason = "--force" if force else _stale_reason(previous, name, key)
        if reason is None:
            logger.info("%s: reusing cached confidences", name)
            _copy_column(previous, table, name)
            continue
        if force or name in previous.methods:
            logger.info("%s: recomputing (%s)", name, reason)
        stale[name] = key
    for name, key in stale.items():
        start = time.perf_counter()
        scored = score_records(records, [name], backend, progress=progress, options=options)
        table.add(name, [r.id for r in records], [row.confidence[name] for row in scored.rows])
        table.columns[name] = {**scored.columns[name], "produced_by": key}
        write_confidences(out, _ordered(table, methods))
        logger.info("%s: scored %d records in %.1f s", name, len(records), time.perf_counter() - start)
    write_confidences(out, _ordered(table, methods))
    return table


def _ordered(table: ConfidenceTable, methods: Sequence[str]) -> ConfidenceTable:
    """Requested methods first, in the order asked, then any others the file held (in place)."""
    for row in table.rows:
        row.confidence = {m: row.confidence[m] for m in [*methods, *row.confidence] if m in row.confidence}
    return table


def _copy_column(src: ConfidenceTable, dst: ConfidenceTable, method: str) -> None:
    dst.add(method, [r.id for r in src.rows], [r.confidence[method] for r in src.rows])
    dst.columns[method] = src.columns[method]


def _keep_others(previous: ConfidenceTable, table: ConfidenceTable, records_sha: str, methods: Sequence[str]) -> None:
    """Carry over, after the requested methods, the file's other columns that describe these same records."""
    for method in previous.methods:
        if method in methods:
            continue
        produced_by = (previous.provenance(method) or {}).get("produced_by", {})
        if produced_by.get("records") == records_sha and all(method in r.confidence for r in previous.rows):
            _copy_column(previous, table, method)
        else:
            logger.info("%s: dropped from the file (not produced from these records, or provenance unknown)", method)
