"""The store of served answers: records, per-choice facts, labels and the remembered-response index, in one database.

``candor serve --store URL`` writes here, ``POST /v1/feedback`` checks and
labels here, ``candor label --store URL`` and ``candor adapt --store URL``
read here. **SQLite** (``sqlite:///served.db``: one file in WAL mode) is the
embedded default; **PostgreSQL** (``postgresql://user@host/db``, through
psycopg 3) lets several replicas share one store, so a label posted to any
replica finds the response another one served. Both through SQLAlchemy 2, one
schema:

- ``served``: one row per served question (the :class:`~candor.annotation.records.Record`
  as JSON, its response id and choice indexes, the model version, when, and
  whether any of its choices is labelled), in insertion order (``seq``);
- ``choices``: per ``(response id, index)``: answered or abstained, the text it
  returned, and ``scored``: whether that text is the one the confidence scored
  (the confidence object's ``scores_returned_text``);
- ``labels``: append-only; the latest per choice (by ``seq``, insertion order) wins;
- ``remembered``: the index ``POST /v1/feedback`` checks a label against, bounded
  in bytes (:attr:`Retention.remembered_bytes`; the oldest entries are evicted), its
  size kept in ``usage``;
- ``schema_version``: the migrations applied (:data:`MIGRATIONS`, in order, each
  once, under a lock, so replicas starting together migrate once).

Retention is bounded (:class:`Retention`): served rows past ``max_rows`` or older
than ``max_age_s`` are deleted with their choices, as are labels of that age;
end-user labels (``user``) are also capped at ``max_rows`` apart, so user volume
never removes the operator's labels, and one key holds one label per choice (a
repeat replaces it). A label on a choice whose record is gone is refused
(:class:`RecordGone`). ``export`` (``--log-records FILE``) mirrors every record and label
as a JSONL line (:mod:`candor.annotation.served_labels`' format); the store, not
the file, is what the server and the commands read.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from candor.annotation.records import Record
from candor.annotation.served_labels import (
    LABEL_SOURCE_AUDIT,
    LABEL_SOURCE_USER,
    Label,
    ServedAnswer,
    ServedLog,
    append_label,
    check_label,
    read_served,
)
from candor.util.errors import CandorError

DEFAULT_MAX_ROWS = 1_000_000  # served questions kept (and labels)
DEFAULT_REMEMBERED_BYTES = 64 * 2**20  # the remembered-response index, in bytes
ENTRY_OVERHEAD = 64  # bytes an index entry costs beyond its text (row header, seq, size)
MIGRATION_LOCK = 53_530_001  # PostgreSQL advisory lock held while migrating
AUDIT_LOCK = 53_530_002  # PostgreSQL advisory lock an audit label's transaction holds: audit labels commit in order
USER_LABELS = "user_labels"  # the usage row counting end-user labels (their own cap)
CONNECT_TIMEOUT_S = 5  # PostgreSQL: a connection not made in this time fails
STATEMENT_TIMEOUT_MS = 10_000  # PostgreSQL: a statement running longer is cancelled by the server
POOL_TIMEOUT_S = 10.0  # waiting for a pooled connection
IN_CHUNK = 500  # keys per IN (...) query
PROBE_TABLE = "write_probe"  # one row, rewritten whole by the write probe
PROBE_MARGIN_BYTES = 64 * 1024  # the probe writes this much beyond the largest record (its tables' and indexes' pages)
DEFAULT_RECORD_BYTES = 16 * 1024  # the record size the probe assumes before any record was written
MEMORY_URLS = ("sqlite://", "sqlite:///:memory:")


@dataclass(frozen=True)
class Retention:
    """How much the store keeps: served rows (count, age), labels (age; end-user labels also by count) and the
    remembered index (bytes).

    ``max_rows`` caps served rows and, apart, end-user labels (``label_source: "user"``): the operator's
    labels (``audit``, ``human``, ``judge:…``) are never removed because of user volume, only by age.
    """

    max_rows: int | None = DEFAULT_MAX_ROWS
    max_age_s: float | None = None
    remembered_bytes: int = DEFAULT_REMEMBERED_BYTES

    def __post_init__(self) -> None:
        if self.max_rows is not None and self.max_rows < 1:
            raise CandorError(f"the store's max rows must be at least 1, got {self.max_rows}")
        if self.max_age_s is not None and not self.max_age_s > 0:
            raise CandorError(f"the store's max age must be positive, got {self.max_age_s}")
        if self.remembered_bytes < ENTRY_OVERHEAD:
            raise CandorError(
                f"the remembered-response index needs at least {ENTRY_OVERHEAD} bytes, got {self.remembered_bytes}"
            )


@dataclass(frozen=True)
class ServedChoice:
    """One choice of a served question, as the client received it."""

    index: int
    answered: bool
    returned: str | None
    scored: bool


@dataclass(frozen=True)
class RememberedChoice:
    """What feedback checks a label against: the choice was served, answered or not, scored or not, by which model."""

    answered: bool
    scored: bool
    model_version: str


class RecordGone(CandorError):
    """A label names a choice whose served record the store no longer holds (retention deleted it, or never had)."""


def is_store_url(source: str | Path) -> bool:
    """A database URL (``sqlite:///…``, ``postgresql://…``), not a file path."""
    return isinstance(source, str) and "://" in source


def engine_url(url: str) -> str:
    """``postgresql://`` and ``postgres://`` through psycopg 3 (SQLAlchemy's default driver is psycopg2)."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def _tables() -> tuple[Any, dict[str, Any]]:
    meta = sa.MetaData()
    served = sa.Table(
        "served",
        meta,
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("response_id", sa.Text, nullable=False),
        sa.Column("indexes", sa.Text, nullable=False),
        sa.Column("question", sa.Text, nullable=False),
        sa.Column("record", sa.Text, nullable=False),
        sa.Column("model_version", sa.Text, nullable=False),
        sa.Column("created", sa.Float, nullable=False),
        sa.Column("labelled", sa.Boolean, nullable=False, default=False),
        sa.Index("served_by_created", "created"),
        sa.Index("served_open", "labelled", "seq"),  # the label page: unlabelled, in order
    )
    choices = sa.Table(
        "choices",
        meta,
        sa.Column("response_id", sa.Text, primary_key=True),
        sa.Column("idx", sa.Integer, primary_key=True),
        sa.Column("served_seq", sa.Integer, nullable=False),
        sa.Column("answered", sa.Boolean, nullable=False),
        sa.Column("returned", sa.Text, nullable=True),
        sa.Column("scored", sa.Boolean, nullable=False),
        sa.Index("choices_of_served", "served_seq"),
    )
    labels = sa.Table(
        "labels",
        meta,
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("response_id", sa.Text, nullable=False),
        sa.Column("idx", sa.Integer, nullable=False),
        sa.Column("correct", sa.Boolean, nullable=False),
        sa.Column("label_source", sa.Text, nullable=False),
        sa.Column("who", sa.Text, nullable=False),
        sa.Column("created", sa.Float, nullable=False),
        sa.Index("labels_latest", "response_id", "idx", "seq"),  # the latest label of a choice
        sa.Index("labels_by_created", "created"),
    )
    remembered = sa.Table(
        "remembered",
        meta,
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("response_id", sa.Text, nullable=False),
        sa.Column("choices", sa.Text, nullable=False),  # [[index, answered, scored], ...]
        sa.Column("model_version", sa.Text, nullable=False),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Index("remembered_by_id", "response_id"),
    )
    usage = sa.Table(
        "usage",
        meta,
        sa.Column("name", sa.String(50), primary_key=True),
        sa.Column("bytes", sa.BigInteger, nullable=False),
    )
    return meta, {"served": served, "choices": choices, "labels": labels, "remembered": remembered, "usage": usage}


METADATA, TABLES = _tables()


def _migration_1(conn: Any) -> None:
    """The first schema: the five tables and their indexes, and the index's usage row."""
    METADATA.create_all(conn)
    conn.execute(TABLES["usage"].insert().values(name="remembered", bytes=0))


def _migration_2(conn: Any) -> None:
    """Labels by class: an index by source (retention and the audit read one class), at most one end-user label per
    choice and key (``who``), and the count of end-user labels (their cap) in ``usage``."""
    labels = TABLES["labels"]
    # Plain DDL (SQLite and PostgreSQL alike): an sa.Index would attach to the shared table and come with migration 1.
    conn.execute(sa.text("CREATE INDEX labels_by_source ON labels (label_source, seq)"))
    conn.execute(
        sa.text(
            "CREATE UNIQUE INDEX labels_one_per_key ON labels (response_id, idx, who) "
            f"WHERE label_source = '{LABEL_SOURCE_USER}' AND who <> ''"
        )
    )
    users = conn.execute(
        sa.select(sa.func.count()).select_from(labels).where(labels.c.label_source == LABEL_SOURCE_USER)
    ).scalar_one()
    conn.execute(TABLES["usage"].insert().values(name=USER_LABELS, bytes=int(users)))


def _migration_3(conn: Any) -> None:
    """The write probe's one row (:meth:`ServedStore.write_probe` rewrites it whole to see whether the database takes
    writes as large as a served record's)."""
    conn.execute(sa.text(f"CREATE TABLE {PROBE_TABLE} (id INTEGER PRIMARY KEY, payload {_blob(conn)} NOT NULL)"))
    conn.execute(sa.text(f"INSERT INTO {PROBE_TABLE} (id, payload) VALUES (1, :p)"), {"p": b""})


def _blob(conn: Any) -> str:
    return "BYTEA" if conn.dialect.name == "postgresql" else "BLOB"


# Ordered: MIGRATIONS[i] takes the schema from version i to i + 1. Append, never edit.
MIGRATIONS: tuple[Callable[[Any], None], ...] = (_migration_1, _migration_2, _migration_3)


class ServedStore:
    """Served answers and their labels in a SQLite or PostgreSQL database (thread-safe; processes may share it)."""

    def __init__(self, url: str, retention: Retention | None = None, export: str | Path | None = None) -> None:
        self.url = url
        self.retention = retention or Retention()
        self.export = Path(export) if export is not None else None
        self.records_read = 0  # served records decoded from the store (the label page reads one per view)
        self.largest_record = DEFAULT_RECORD_BYTES  # bytes of the largest record written (the write probe's size)
        self._export_lock = threading.Lock()
        self._engine = _create_engine(engine_url(url))
        # An in-memory database is one connection: its transactions take turns (files and servers lock themselves).
        self._local: Any = threading.RLock() if url in MEMORY_URLS else nullcontext()
        self.dialect = self._engine.dialect.name
        try:
            self.migrate()
        except sa.exc.OperationalError as exc:
            self._engine.dispose()
            shown = sa.engine.make_url(engine_url(url)).render_as_string(hide_password=True)
            raise CandorError(f"{shown}: cannot open the store ({str(exc.orig).strip()})") from None

    # ------------------------------------------------------------------ plumbing

    @contextmanager
    def _write(self) -> Iterator[Any]:
        """A write transaction (SQLite: ``BEGIN IMMEDIATE``, so writers queue instead of failing)."""
        with self._local, self._engine.connect() as conn:
            conn.execution_options(candor_write=True)
            with conn.begin():
                yield conn

    @contextmanager
    def _read(self) -> Iterator[Any]:
        with self._local, self._engine.connect() as conn, conn.begin():
            yield conn

    def migrate(self) -> int:
        """Apply the migrations this database lacks, under a lock; returns the schema version."""
        with self._write() as conn:
            if self.dialect == "postgresql":
                conn.execute(sa.text("SET LOCAL statement_timeout = 0"))  # an index on a large table takes long
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK})
            conn.execute(sa.text("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)"))
            row = conn.execute(sa.text("SELECT version FROM schema_version")).first()
            version = 0 if row is None else int(row[0])
            if version > len(MIGRATIONS):
                raise CandorError(
                    f"{self.url}: the store's schema is version {version}, newer than this candor "
                    f"knows ({len(MIGRATIONS)}); upgrade candor"
                )
            for step in MIGRATIONS[version:]:
                step(conn)
            if row is None:
                conn.execute(sa.text("INSERT INTO schema_version (version) VALUES (:v)"), {"v": len(MIGRATIONS)})
            else:
                conn.execute(sa.text("UPDATE schema_version SET version = :v"), {"v": len(MIGRATIONS)})
        return len(MIGRATIONS)

    def write_probe(self) -> int:
        """Whether the database takes a served record's write now: raises as :meth:`record` would; returns the bytes
        written.

        A full disk still answers reads, so only a write tells that it takes writes again, and only one as large as
        a record's: the probe rewrites its row (:data:`PROBE_TABLE`) with fresh random bytes, as many as the largest
        record written yet plus :data:`PROBE_MARGIN_BYTES` (the pages a record's other tables and indexes take),
        in one committed transaction. Random, so PostgreSQL cannot compress them; fresh, because SQLite writes
        nothing for an update that changes nothing (the probe was once ``UPDATE … SET version = version``: it
        succeeded on a full disk while every record failed, and ``/ready`` said 200). In SQLite's WAL mode each
        changed page is a new frame, so the probe needs as much new space as a record does, and more.
        """
        size = self.largest_record + PROBE_MARGIN_BYTES
        with self._write() as conn:
            conn.execute(sa.text(f"UPDATE {PROBE_TABLE} SET payload = :p WHERE id = 1"), {"p": os.urandom(size)})
        return size

    def schema_version(self) -> int:
        with self._read() as conn:
            return int(conn.execute(sa.text("SELECT version FROM schema_version")).scalar_one())

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> ServedStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ writing

    def record(
        self,
        record: dict[str, Any],
        response_id: str,
        choices: Sequence[ServedChoice],
        model_version: str,
        export: bool = True,
    ) -> None:
        """One served question (its record as a dict) and its choices; remembered for feedback; retention applied."""
        t = TABLES
        now = time.time()
        indexes = [c.index for c in choices]
        entry = json.dumps([[c.index, c.answered, c.scored] for c in choices])
        size = len(response_id.encode()) + len(entry) + len(model_version.encode()) + ENTRY_OVERHEAD
        question = _storable(str(record.get("item", {}).get("question", "")))
        stored = json.dumps(record, ensure_ascii=False)
        texts = [stored, question, *(c.returned for c in choices if c.returned is not None)]
        written = sum(len(text.encode("utf-8", "surrogatepass")) for text in texts) + size
        with self._write() as conn:
            seq = conn.execute(
                t["served"]
                .insert()
                .values(
                    response_id=response_id,
                    indexes=json.dumps(indexes),
                    question=question,
                    record=stored,
                    model_version=model_version,
                    created=now,
                    labelled=False,
                )
                .returning(t["served"].c.seq)
            ).scalar_one()
            keys = t["choices"].c
            conn.execute(t["choices"].delete().where(keys.response_id == response_id, keys.idx.in_(indexes)))
            conn.execute(
                t["choices"].insert(),
                [
                    {
                        "response_id": response_id,
                        "idx": c.index,
                        "served_seq": seq,
                        "answered": c.answered,
                        "returned": None if c.returned is None else _storable(c.returned),
                        "scored": c.scored,
                    }
                    for c in choices
                ],
            )
            self._remember(conn, response_id, entry, model_version, size)
            self._retain(conn, now)
        self.largest_record = max(self.largest_record, written)
        if export and self.export is not None:
            self._export_line(stored + "\n")

    def _remember(self, conn: Any, response_id: str, entry: str, version: str, size: int) -> None:
        """Add an index entry and evict the oldest until the index fits its bytes (the usage row serializes this)."""
        t = TABLES["remembered"]
        usage = TABLES["usage"]
        total = conn.execute(
            usage.update()
            .where(usage.c.name == "remembered")
            .values(bytes=usage.c.bytes + size)
            .returning(usage.c.bytes)
        ).scalar_one()
        conn.execute(t.insert().values(response_id=response_id, choices=entry, model_version=version, size=size))
        excess = int(total) - self.retention.remembered_bytes
        freed, last = 0, None
        while excess > freed:
            rows = conn.execute(
                sa.select(t.c.seq, t.c.size)
                .where(t.c.seq > (last if last is not None else -1))
                .order_by(t.c.seq)
                .limit(256)
            ).all()
            if not rows:
                break
            for seq, row_size in rows:
                if freed >= excess:
                    break
                freed += int(row_size)
                last = seq
        if last is not None:
            conn.execute(t.delete().where(t.c.seq <= last))
            conn.execute(usage.update().where(usage.c.name == "remembered").values(bytes=usage.c.bytes - freed))

    def _retain(self, conn: Any, now: float) -> None:
        """Delete served rows (with their choices) beyond the retention, and labels past its age (indexed, cheap
        when none). End-user labels are capped apart (:meth:`_retain_user_labels`)."""
        served, choices, labels = TABLES["served"], TABLES["choices"], TABLES["labels"]
        keep = self.retention
        cut_seq = None
        if keep.max_rows is not None:
            top = conn.execute(sa.select(sa.func.max(served.c.seq))).scalar()
            if top is not None and top > keep.max_rows:
                cut_seq = top - keep.max_rows  # seq gaps (other writers' rollbacks) only keep fewer
        if keep.max_age_s is not None:
            cutoff = now - keep.max_age_s
            old = conn.execute(sa.select(sa.func.max(served.c.seq)).where(served.c.created < cutoff)).scalar()
            if old is not None:
                cut_seq = old if cut_seq is None else max(cut_seq, old)
            users = conn.execute(
                labels.delete().where(labels.c.created < cutoff, labels.c.label_source == LABEL_SOURCE_USER)
            ).rowcount
            conn.execute(labels.delete().where(labels.c.created < cutoff))
            if users:
                self._count_user_labels(conn, -users)
        if cut_seq is not None:
            conn.execute(choices.delete().where(choices.c.served_seq <= cut_seq))
            conn.execute(served.delete().where(served.c.seq <= cut_seq))

    def _count_user_labels(self, conn: Any, change: int) -> int:
        """Add ``change`` to the count of end-user labels; the new count."""
        usage = TABLES["usage"]
        return int(
            conn.execute(
                usage.update()
                .where(usage.c.name == USER_LABELS)
                .values(bytes=usage.c.bytes + change)
                .returning(usage.c.bytes)
            ).scalar_one()
        )

    def _retain_user_labels(self, conn: Any, count: int) -> None:
        """Delete the oldest end-user labels beyond ``max_rows`` (``count``: how many there are now)."""
        labels = TABLES["labels"]
        excess = count - (self.retention.max_rows or count)
        if excess <= 0:
            return
        oldest = (
            sa.select(labels.c.seq)
            .where(labels.c.label_source == LABEL_SOURCE_USER)
            .order_by(labels.c.seq)
            .limit(excess)
            .subquery()
        )
        last = conn.execute(sa.select(sa.func.max(oldest.c.seq))).scalar()
        if last is None:
            return
        gone = conn.execute(
            labels.delete().where(labels.c.label_source == LABEL_SOURCE_USER, labels.c.seq <= last)
        ).rowcount
        self._count_user_labels(conn, -gone)

    def add_label(self, response_id: str, index: int, correct: bool, label_source: str, who: str = "") -> None:
        """Add a label (the latest per choice wins); mirrored to the export file when there is one.

        - A choice whose served record the store no longer holds is refused (:class:`RecordGone`).
        - An end-user label (``label_source: "user"``) with ``who`` (the key that sent it) replaces that key's
          earlier label of the choice: one per choice and key. End-user labels are capped by count apart from
          the operator's (:class:`Retention`).
        - An audit label's transaction holds a lock on PostgreSQL, so audit labels commit in the order of
          their numbers and a reader that follows them by number never passes one over
          (:meth:`audit_labels_after`).
        """
        try:
            check_label(response_id, index, correct, label_source)
        except ValueError as exc:
            raise CandorError(f"bad label: {exc}") from None
        for attempt in range(3):
            try:
                self._add_label(response_id, index, correct, label_source, who)
                break
            except sa.exc.IntegrityError:  # the same key's label of the same choice, committed meanwhile: replace it
                if attempt == 2:
                    raise
        if self.export is not None:
            with self._export_lock:
                append_label(self.export, response_id, index, correct, label_source)

    def _add_label(self, response_id: str, index: int, correct: bool, label_source: str, who: str) -> None:
        labels = TABLES["labels"]
        with self._write() as conn:
            if self.dialect == "postgresql" and label_source == LABEL_SOURCE_AUDIT:
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": AUDIT_LOCK})
            if not self._mark_labelled(conn, response_id, index):
                raise RecordGone(
                    f"the store no longer holds the served answer {response_id[:80]!r} (index {index}): "
                    "retention deleted its record, so it cannot be labelled"
                )
            user = label_source == LABEL_SOURCE_USER
            replaced = 0
            if user and who:
                replaced = conn.execute(
                    labels.delete().where(
                        labels.c.response_id == response_id,
                        labels.c.idx == index,
                        labels.c.label_source == LABEL_SOURCE_USER,
                        labels.c.who == who,
                    )
                ).rowcount
            conn.execute(
                labels.insert().values(
                    response_id=response_id,
                    idx=index,
                    correct=correct,
                    label_source=label_source,
                    who=who,
                    created=time.time(),
                )
            )
            if user and not replaced:  # a repeat replaced its earlier label: the count stays
                self._retain_user_labels(conn, self._count_user_labels(conn, 1))

    def _mark_labelled(self, conn: Any, response_id: str, index: int) -> bool:
        """Mark the served row holding the choice as labelled; False when the store holds no such choice."""
        served, choices = TABLES["served"], TABLES["choices"]
        owner = sa.select(choices.c.served_seq).where(choices.c.response_id == response_id, choices.c.idx == index)
        return bool(conn.execute(served.update().where(served.c.seq.in_(owner)).values(labelled=True)).rowcount)

    def _export_line(self, line: str) -> None:
        with self._export_lock:
            self.export.parent.mkdir(parents=True, exist_ok=True)  # type: ignore[union-attr]
            with self.export.open("a", encoding="utf-8") as fh:  # type: ignore[union-attr]
                fh.write(line)

    # ------------------------------------------------------------------ reading

    def find(self, response_id: str, index: int) -> RememberedChoice | None:
        """The remembered choice ``(response_id, index)``: None when never served or evicted from the index."""
        t = TABLES["remembered"]
        with self._read() as conn:
            rows = conn.execute(
                sa.select(t.c.choices, t.c.model_version).where(t.c.response_id == response_id).order_by(t.c.seq)
            ).all()
        for entry, version in reversed(rows):
            for i, answered, scored in json.loads(entry):
                if i == index:
                    return RememberedChoice(answered=bool(answered), scored=bool(scored), model_version=version)
        return None

    def remembered_bytes(self) -> int:
        """The index's size as the store counts it (the sum of its entries' sizes)."""
        usage = TABLES["usage"]
        with self._read() as conn:
            return int(conn.execute(sa.select(usage.c.bytes).where(usage.c.name == "remembered")).scalar_one())

    def count(self, unlabelled: bool = False) -> int:
        """Served questions (only those with no labelled choice)."""
        served = TABLES["served"]
        query = sa.select(sa.func.count()).select_from(served)
        if unlabelled:
            query = query.where(served.c.labelled.is_(False))
        with self._read() as conn:
            return int(conn.execute(query).scalar_one())

    def first_unlabelled(self) -> int:
        """The position (0-based, in serving order) of the first question with no label; 0 when all are labelled."""
        served = TABLES["served"]
        with self._read() as conn:
            first = conn.execute(sa.select(sa.func.min(served.c.seq)).where(served.c.labelled.is_(False))).scalar()
            if first is None:
                return 0
            return int(conn.execute(sa.select(sa.func.count()).where(served.c.seq < first)).scalar_one())

    def question_at(self, position: int) -> ServedAnswer | None:
        """The served question at ``position`` in serving order, as its labelled choice (else scored, else first)."""
        served = TABLES["served"]
        with self._read() as conn:
            row = conn.execute(
                sa.select(served.c.seq, served.c.response_id, served.c.record)
                .order_by(served.c.seq)
                .limit(1)
                .offset(max(position, 0))
            ).first()
            if row is None:
                return None
            answers = self._answers_of(conn, [row])
        return pick_answer(answers)

    def has_choice(self, response_id: str, index: int) -> bool:
        """Whether the store holds the served choice ``(response_id, index)`` (its record is not read)."""
        choices = TABLES["choices"]
        with self._read() as conn:
            found = conn.execute(
                sa.select(choices.c.idx).where(choices.c.response_id == response_id, choices.c.idx == index)
            ).first()
        return found is not None

    def answer(self, response_id: str, index: int, label_source: str | None = None) -> ServedAnswer | None:
        """One served choice with its latest label (of ``label_source`` only, when given)."""
        served, choices = TABLES["served"], TABLES["choices"]
        with self._read() as conn:
            row = conn.execute(
                sa.select(served.c.seq, served.c.response_id, served.c.record)
                .join(choices, choices.c.served_seq == served.c.seq)
                .where(choices.c.response_id == response_id, choices.c.idx == index)
            ).first()
            if row is None:
                return None
            answers = self._answers_of(conn, [row], label_source)
        return next((a for a in answers if a.index == index), None)

    def _answers_of(self, conn: Any, rows: Sequence[Any], label_source: str | None = None) -> list[ServedAnswer]:
        """The choices of served rows ``(seq, response_id, record)`` with their latest labels."""
        choices = TABLES["choices"]
        out = []
        for seq, _response_id, record_json in rows:
            record = Record.from_dict(json.loads(record_json))
            self.records_read += 1
            mine = conn.execute(
                sa.select(
                    choices.c.response_id, choices.c.idx, choices.c.answered, choices.c.returned, choices.c.scored
                )
                .where(choices.c.served_seq == seq)
                .order_by(choices.c.idx)
            ).all()
            latest = self._latest_labels(conn, [(r[0], r[1]) for r in mine], label_source)
            for rid, idx, answered, returned, scored in mine:
                answer = ServedAnswer(
                    record=record, id=rid, index=idx, answered=answered, returned=returned, scored=scored
                )
                out.append(_labelled(answer, latest.get((rid, idx))))
        return out

    def _latest_labels(
        self, conn: Any, keys: Sequence[tuple[str, int]], label_source: str | None = None
    ) -> dict[tuple[str, int], list[tuple[Label, int]]]:
        """Each of ``keys``' labels in the order they were added (of ``label_source`` only, when given)."""
        labels = TABLES["labels"]
        found: dict[tuple[str, int], list[tuple[Label, int]]] = {}
        ids = sorted({k[0] for k in keys})
        wanted = set(keys)
        for start in range(0, len(ids), IN_CHUNK):
            query = (
                sa.select(
                    labels.c.seq,
                    labels.c.response_id,
                    labels.c.idx,
                    labels.c.correct,
                    labels.c.label_source,
                    labels.c.created,
                )
                .where(labels.c.response_id.in_(ids[start : start + IN_CHUNK]))
                .order_by(labels.c.seq)
            )
            if label_source is not None:
                query = query.where(labels.c.label_source == label_source)
            for seq, rid, idx, correct, source, created in conn.execute(query):
                if (rid, idx) in wanted:
                    label = Label(id=rid, index=idx, correct=bool(correct), label_source=source, time=float(created))
                    found.setdefault((rid, idx), []).append((label, int(seq)))  # ordered by seq: the later wins
        return found

    def served_log(self) -> ServedLog:
        """Every served choice with its labels, the latest first among equals (what ``candor adapt`` and a judge run
        read), in serving order."""
        served, choices, labels = TABLES["served"], TABLES["choices"], TABLES["labels"]
        with self._read() as conn:
            latest: dict[tuple[str, int], list[tuple[Label, int]]] = {}
            for seq, rid, idx, correct, source, created in conn.execute(
                sa.select(
                    labels.c.seq,
                    labels.c.response_id,
                    labels.c.idx,
                    labels.c.correct,
                    labels.c.label_source,
                    labels.c.created,
                ).order_by(labels.c.seq)
            ):
                label = Label(id=rid, index=idx, correct=bool(correct), label_source=source, time=float(created))
                latest.setdefault((rid, idx), []).append((label, int(seq)))
            per_row: dict[int, list[Any]] = {}
            for row in conn.execute(
                sa.select(
                    choices.c.served_seq,
                    choices.c.response_id,
                    choices.c.idx,
                    choices.c.answered,
                    choices.c.returned,
                    choices.c.scored,
                ).order_by(choices.c.served_seq, choices.c.idx)
            ):
                per_row.setdefault(int(row[0]), []).append(row[1:])
            answers: list[ServedAnswer] = []
            result = conn.execution_options(yield_per=500).execute(
                sa.select(served.c.seq, served.c.record).order_by(served.c.seq)
            )
            for seq, record_json in result:
                record = Record.from_dict(json.loads(record_json))
                self.records_read += 1
                for rid, idx, answered, returned, scored in per_row.get(int(seq), []):
                    answer = ServedAnswer(
                        record=record, id=rid, index=idx, answered=answered, returned=returned, scored=scored
                    )
                    answers.append(_labelled(answer, latest.get((rid, idx))))
        known = {a.key for a in answers}
        orphans = sum(key not in known for key in latest)
        return ServedLog(answers, 0, orphans)

    def answered_keys(self) -> list[tuple[str, int]]:
        """Every answered choice's ``(response id, index)``, in serving order."""
        choices = TABLES["choices"]
        with self._read() as conn:
            rows = conn.execute(
                sa.select(choices.c.response_id, choices.c.idx)
                .where(choices.c.answered.is_(True))
                .order_by(choices.c.served_seq, choices.c.idx)
            ).all()
        return [(str(r), int(i)) for r, i in rows]

    def audit_sample(self, n: int, seed: int) -> list[tuple[str, int]]:
        """A uniformly random sample of ``n`` answered choices (all of them when fewer), seeded."""
        if n < 1:
            raise CandorError(f"an audit draws at least 1 answer, got {n}")
        keys = self.answered_keys()
        return random.Random(f"audit:{seed}").sample(keys, min(n, len(keys)))

    def audit_labels_after(self, seq: int) -> list[tuple[int, str, str, bool]]:
        """Audit labels of answered choices added after the label numbered ``seq``, in the order they were added:
        ``(label seq, model version, response id, correct)``, as the drift alarm reads them.

        Every process on the store sees the same labels (another replica's, ``candor label --audit``'s,
        those made before a restart), in the same order. On PostgreSQL an audit label's transaction holds
        :data:`AUDIT_LOCK` from before its number is drawn to its commit (:meth:`add_label`), so audit
        labels commit in the order of their numbers: a reader that has seen label ``seq`` has seen every
        earlier one, and the last number read is a safe watermark. (SQLite writers take turns.)
        """
        labels, choices, served = TABLES["labels"], TABLES["choices"], TABLES["served"]
        joined = labels.join(
            choices, sa.and_(choices.c.response_id == labels.c.response_id, choices.c.idx == labels.c.idx)
        ).join(served, served.c.seq == choices.c.served_seq)
        query = (
            sa.select(labels.c.seq, served.c.model_version, labels.c.response_id, labels.c.correct)
            .select_from(joined)
            .where(labels.c.seq > seq, labels.c.label_source == LABEL_SOURCE_AUDIT, choices.c.answered.is_(True))
            .order_by(labels.c.seq)
        )
        with self._read() as conn:
            return [(int(n), str(v), str(r), bool(c)) for n, v, r, c in conn.execute(query).all()]

    def labelled_keys(self, keys: Sequence[tuple[str, int]], label_source: str | None = None) -> set[tuple[str, int]]:
        """Which of ``keys`` have a label (of ``label_source`` only, when given)."""
        with self._read() as conn:
            return set(self._latest_labels(conn, keys, label_source))

    # ------------------------------------------------------------------ other sources

    @classmethod
    def from_jsonl(cls, path: str | Path) -> ServedStore:
        """A served log file read once into an in-memory store; labels added to it are appended to the file too."""
        log = read_served(path)
        store = cls("sqlite://", Retention(max_rows=None), export=None)
        by_record: dict[int, list[ServedAnswer]] = {}
        for answer in log.answers:
            by_record.setdefault(id(answer.record), []).append(answer)
        for answers in by_record.values():
            record = answers[0].record
            choices = [
                ServedChoice(
                    index=a.index,
                    answered=a.answered is not False,
                    returned=a.returned,
                    scored=a.scored is not False,
                )
                for a in answers
            ]
            version = str(record.provenance.get("model_version", ""))
            store.record(record.to_dict(), answers[0].id, choices, version, export=False)
        for answer in sorted(log.labelled(), key=lambda a: a.label_line or 0):
            store.add_label(answer.id, answer.index, bool(answer.label), answer.label_source or "?")
        store.export = Path(path)
        return store


def open_store(source: str | Path, retention: Retention | None = None) -> ServedStore:
    """A store URL opened, or a served log file read into memory (its labels appended to the file)."""
    if is_store_url(source):
        return ServedStore(str(source), retention)
    return ServedStore.from_jsonl(source)


def pick_answer(answers: Sequence[ServedAnswer]) -> ServedAnswer | None:
    """A question's entry on the label page: its latest-labelled choice, else its first scored one, else its first."""
    if not answers:
        return None
    labelled = [a for a in answers if a.label is not None]
    if labelled:
        return max(labelled, key=lambda a: a.label_line or 0)
    return next((a for a in answers if a.scored), answers[0])


def _labelled(answer: ServedAnswer, labels: Sequence[tuple[Label, int]] | None) -> ServedAnswer:
    """``answer`` with its labels (in the order they were added) and the latest of them as its label."""
    if not labels:
        return answer
    label, seq = labels[-1]
    return replace(
        answer,
        label=label.correct,
        label_source=label.label_source,
        label_time=label.time,
        label_line=seq,
        labels=tuple((n, each) for each, n in labels),
    )


def _storable(text: str) -> str:
    """Text a column can hold on both databases: a NUL (which PostgreSQL's text refuses) as U+FFFD.

    Questions with a NUL are refused before any work (:func:`candor.serve.answering.check_text`); this keeps
    a generated NUL from failing a record after its answer was made. The record's JSON keeps the text exactly.
    """
    return text.replace("\x00", "\ufffd")


def _create_engine(url: str) -> Any:
    """The engine: SQLite in WAL mode with a busy timeout, its transactions begun by candor; PostgreSQL as is."""
    if not url.startswith("sqlite"):
        try:
            return sa.create_engine(
                url,
                pool_pre_ping=True,
                pool_timeout=POOL_TIMEOUT_S,
                connect_args={
                    "connect_timeout": CONNECT_TIMEOUT_S,
                    "options": f"-c statement_timeout={STATEMENT_TIMEOUT_MS}",
                    # A peer that vanished (no ACKs): the kernel gives the connection up instead of waiting forever.
                    "keepalives": 1,
                    "keepalives_idle": 10,
                    "keepalives_interval": 5,
                    "keepalives_count": 3,
                    "tcp_user_timeout": 30_000,
                },
            )
        except ImportError as exc:
            raise CandorError(
                f"a PostgreSQL store needs psycopg 3 ({exc}): pip install 'candor-honesty[store]'"
            ) from None
        except sa.exc.ArgumentError as exc:
            raise CandorError(f"--store {url!r}: not a database URL ({exc})") from None
    memory = url in MEMORY_URLS
    if not memory:
        database = url.split("///", 1)[1] if "///" in url else ""
        if not database:
            raise CandorError(f"--store {url!r}: a SQLite store names a file, e.g. sqlite:///served.db")
        Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    kwargs: dict[str, Any] = {"connect_args": {"check_same_thread": False, "timeout": 30}}
    if memory:
        kwargs["poolclass"] = sa.pool.StaticPool  # one connection: the database lives in it
    engine = sa.create_engine(url, **kwargs)

    @sa.event.listens_for(engine, "connect")
    def _connect(dbapi_conn: Any, _: Any) -> None:
        dbapi_conn.isolation_level = None  # candor issues BEGIN itself (below), so DDL is transactional too
        cursor = dbapi_conn.cursor()
        if not memory:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        write = conn.get_execution_options().get("candor_write")
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine
