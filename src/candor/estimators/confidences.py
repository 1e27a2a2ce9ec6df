"""The confidences file, and how estimator columns get into it.

**The file** is what ``candor score`` writes and ``candor eval`` reads, one
JSON line per record::

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

**Columns get in** two ways. :func:`score_records` runs several estimators
over records into a table in memory. :func:`score_into` adds columns to a
file incrementally: re-scoring pre-generated records is the default workflow
(docs/architecture.md "Conventions"), so a column already in the file is kept only when what
produced it matches this run exactly (:func:`column_key`: estimator, options
with path-valued ones hashed by content, model, adapter and weights for
estimators that run a model, the records' content and the candor version);
anything else is recomputed, with one INFO line naming what changed. The file
is rewritten atomically after each method so a killed run keeps what it
finished. Before scoring, every trained folder involved (the backend's
adapter, a head given as an option) that carries a training-questions manifest
is checked against the records, and an overlap is warned about with a count
and an example (:mod:`candor.annotation.contamination`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from candor.annotation.contamination import trained_folders, warn_contamination
from candor.annotation.records import Record
from candor.backends.base import Backend
from candor.estimators.base import Estimator, get_estimator
from candor.util.digests import backend_identity, canonical, records_digest
from candor.util.errors import CandorError, at_line
from candor.util.files import atomic_write_text
from candor.util.jsonl import iter_json_lines, write_json_lines
from candor.util.version import __version__

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
    return ConfidenceTable([ConfidenceRow(r.id, r.item.dataset, r.greedy_correct, {}) for r in records])


# Records per backend call when scoring with a model: progress updates, bounded memory.
CHUNK_SIZE = 32


def score_records(
    records: Sequence[Record],
    names: Sequence[str],
    backend: Backend | None = None,
    progress: bool = True,
    options: Mapping[str, Mapping[str, Any]] | None = None,
    chunk_size: int = CHUNK_SIZE,
) -> ConfidenceTable:
    """Score ``records`` with each named estimator into one table (methods are columns).

    ``options`` maps an estimator name to its constructor keywords, e.g.
    ``{"verbal-10": {"examples": train_records}}``. Every estimator is built
    and its backend checked before any work starts, so a missing model fails
    at once. Each column's ``table.columns`` entry holds the estimator's
    :meth:`~Estimator.describe` and, for estimators that parse replies, the
    number of replies that fell back (``parse_fallbacks``).
    """
    _check_unique_ids(records)
    options = options or {}
    estimators = [(name, get_estimator(name, **dict(options.get(name, {})))) for name in names]
    for _, est in estimators:
        est.check_backend(backend)
    table = table_from_records(records)
    ids = [r.id for r in records]
    for name, est in estimators:
        values, fallbacks = _run(est, records, backend, progress and est.needs_backend, chunk_size)
        table.add(name, ids, values)
        table.columns[name] = {"estimator": est.describe()}
        if hasattr(est, "last_fallbacks"):
            table.columns[name]["parse_fallbacks"] = fallbacks
    return table


def _run(
    est: Estimator, records: Sequence[Record], backend: Backend | None, progress: bool, chunk_size: int
) -> tuple[list[float], int]:
    """The estimator's values over ``records`` (in chunks when it runs a model), and its fallback count."""
    if not est.needs_backend:
        return est.estimate(records, backend).tolist(), 0
    values: list[float] = []
    fallbacks = 0
    with tqdm(total=len(records), desc=est.name, unit="rec", disable=not progress) as bar:
        for start in range(0, len(records), chunk_size):
            chunk = records[start : start + chunk_size]
            values.extend(est.estimate(chunk, backend).tolist())
            fallbacks += getattr(est, "last_fallbacks", 0)
            bar.update(len(chunk))
    if fallbacks:
        logger.warning("%s: %d of %d records used the fallback confidence", est.name, fallbacks, len(records))
    return values, fallbacks


def _check_unique_ids(records: Sequence[Record]) -> None:
    counts = Counter(r.id for r in records)
    dupes = [rid for rid, n in counts.items() if n > 1]
    if dupes:
        raise CandorError(
            f"record id {dupes[0]!r} occurs more than once ({len(dupes)} duplicated ids); ids must be unique"
        )


def column_key(
    name: str, options: Mapping[str, Any], backend_id: Mapping[str, Any] | None, records_sha: str
) -> dict[str, Any]:
    """What determines a column's values: the cache key stored as its ``produced_by``.

    ``backend_id`` (from :func:`candor.util.digests.backend_identity`) is given
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
        "candor_version": __version__,
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


def check_nothing_lost(out: str | Path, records: Sequence[Record], force: bool = False) -> None:
    """Refuse to score ``records`` into an ``out`` that holds only other records' confidences (unless ``force``).

    Scoring rewrites ``out`` over ``records``' ids, so a file about other
    records (test confidences, when dev records are scored) would lose every
    column. Rows partly shared lose the others' rows, with a warning.
    """
    out = Path(out)
    if not out.exists():
        return
    old = read_confidences(out)
    ids = {r.id for r in records}
    shared = sum(row.id in ids for row in old.rows)
    if not old.rows or shared == len(old.rows):
        return
    if shared == 0 and not force:
        raise CandorError(
            f"{out} holds confidences of {len(old.rows)} other records (no id in common with these records); "
            f"scoring into it would lose its columns {', '.join(old.methods)}. Write to another --out, "
            "or pass --force to replace it"
        )
    logger.warning(
        "%s: %d of its %d records are not among these records and are dropped from it",
        out,
        len(old.rows) - shared,
        len(old.rows),
    )


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
    in ``out`` are kept when they belong to the same records. An ``out`` about
    other records only is refused (:func:`check_nothing_lost`); ``force``
    replaces it, and recomputes every method asked for.
    """
    out = Path(out)
    options = options or {}
    check_nothing_lost(out, records, force)
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
