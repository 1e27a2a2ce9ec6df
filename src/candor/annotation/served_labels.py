"""Labels on served answers: one appended line each, in the records file ``candor serve --log-records`` writes.

A served log holds two kinds of JSON lines:

- a **served record** (a :class:`~candor.annotation.records.Record` line): the
  question, the greedy answer the confidence was computed for, and in
  ``provenance.served`` the OpenAI response ``id`` (``"chatcmpl-…"``) and the
  choice ``indexes`` this record's answers occupy in that response (normally
  ``[0]``);
- a **label**, appended later by ``POST /v1/feedback``, ``candor label`` or a judge::

      {"label": {"id": "chatcmpl-…", "index": 0, "correct": true,
                 "label_source": "human", "time": 1764770000.0}}

The file is append-only: a label never rewrites a record, and the later label
for the same ``(id, index)`` wins. A label says whether the text returned at
that choice is correct; every label of an answer is kept (``ServedAnswer.labels``),
so a reader that trusts only some sources (``candor adapt --label-sources``,
:mod:`candor.annotation.label_selection`) is not misled by a later label from
another source.

A record with no ``provenance.served.id`` (a log written before ids, or any
records file from ``candor annotate``) is addressed by its item id, index 0,
so every records file can be labelled.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from candor.annotation.records import LABEL_LINE_KEY, Record
from candor.util.errors import CandorError

logger = logging.getLogger(__name__)

LABEL_SOURCE_HUMAN = "human"  # a person who read the answer (candor label, or the operator key)
LABEL_SOURCE_AUDIT = "audit"  # a label of a uniformly drawn audit sample, sent with the operator key
LABEL_SOURCE_USER = "user"  # end-user feedback (POST /v1/feedback with the inference key); set by the server


@dataclass(frozen=True)
class Label:
    """One verdict on one served answer."""

    id: str
    index: int
    correct: bool
    label_source: str
    time: float

    def to_line(self) -> str:
        body = {
            "id": self.id,
            "index": self.index,
            "correct": self.correct,
            "label_source": self.label_source,
            "time": self.time,
        }
        return json.dumps({LABEL_LINE_KEY: body}, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Label:
        """A label line's body; raises ``ValueError`` naming the bad field."""
        if not isinstance(d, dict):
            raise ValueError("'label' must be an object")
        check_label(d.get("id"), d.get("index"), d.get("correct"), d.get("label_source"))
        stamp = d.get("time", 0.0)
        if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or not math.isfinite(stamp):
            raise ValueError(f"'time' must be unix seconds, got {stamp!r}")
        return cls(
            id=d["id"], index=d["index"], correct=d["correct"], label_source=d["label_source"], time=float(stamp)
        )


@dataclass(frozen=True)
class ServedAnswer:
    """One served answer (a record at one choice index) with its latest label, if any."""

    record: Record
    id: str
    index: int
    label: bool | None = None
    label_source: str | None = None
    label_time: float | None = None
    label_line: int | None = None  # the label's line in the log: the later line is the later label
    labels: tuple[tuple[int, Label], ...] = ()  # every label of this answer with its line, in log order
    answered: bool | None = None  # False: the client saw the refusal (None: the log does not say)
    returned: str | None = None  # the text this choice returned (None: abstained, or the log does not say)
    scored: bool | None = None  # the returned text is the text the confidence scored (None: not said)

    @property
    def key(self) -> tuple[str, int]:
        return (self.id, self.index)


@dataclass
class ServedLog:
    """What :func:`read_served` found: the answers, and how many lines it could not use."""

    answers: list[ServedAnswer]
    bad_lines: int = 0
    orphan_labels: int = 0  # labels naming no (id, index) in the file

    def labelled(self) -> list[ServedAnswer]:
        return [a for a in self.answers if a.label is not None]

    def unlabelled(self) -> list[ServedAnswer]:
        return [a for a in self.answers if a.label is None]


MAX_ID_CHARS = 256  # a response id (OpenAI's are about 40 characters) or an item id
MAX_SOURCE_CHARS = 128  # a label source, ``judge:NAME`` included


class LabelError(ValueError):
    """A label that cannot be stored: ``field`` names the bad field (the ``param`` of a 400)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def check_label(response_id: Any, index: Any, correct: Any, label_source: Any) -> None:
    """Refuse a label that could not be stored or read back (:class:`LabelError`, a ``ValueError`` naming the field).

    Texts are refused when empty, longer than their limit, holding a NUL (PostgreSQL's text cannot)
    or not valid Unicode (a lone surrogate from JSON ``\\ud800``); a refusal never echoes the text back.
    """
    check_label_text("id", response_id, MAX_ID_CHARS)
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < 2**31:
        raise LabelError("index", f"'index' must be an integer from 0 to {2**31 - 1}, got {shown(index)}")
    if not isinstance(correct, bool):
        raise LabelError("correct", f"'correct' must be true or false, got {shown(correct)}")
    check_label_text("label_source", label_source, MAX_SOURCE_CHARS)


def check_label_text(field: str, value: Any, limit: int) -> None:
    """One of a label's texts: a non-empty string of at most ``limit`` characters, no NUL, valid Unicode."""
    if not isinstance(value, str) or not value.strip():
        raise LabelError(field, f"'{field}' must be a non-empty string, got {shown(value)}")
    if len(value) > limit:
        raise LabelError(field, f"'{field}' is longer than {limit} characters ({len(value)})")
    if "\x00" in value:
        raise LabelError(field, f"'{field}' holds a NUL character")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise LabelError(field, f"'{field}' is not valid Unicode (a lone surrogate at character {exc.start})") from None


def shown(value: Any) -> str:
    """A wrong value as an error names it: short ones as JSON, long ones by their type and length."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = type(value).__name__
    return text if len(text) <= 40 else f"a {type(value).__name__} of {len(text)} characters"


def append_label(path: str | Path, response_id: str, index: int, correct: bool, label_source: str) -> None:
    """Append one label line to ``path`` with a single ``O_APPEND`` write, flushed to disk.

    One ``write`` of one whole line on a file opened with ``O_APPEND`` lands
    whole at the end, so threads and processes (the server, ``candor label``)
    can append to the same log at once. A file whose last line was cut short
    gets a newline first, so the label stays a line of its own.
    """
    try:
        check_label(response_id, index, correct, label_source)
    except ValueError as exc:
        raise CandorError(f"{path}: bad label: {exc}") from None
    line = Label(
        id=response_id, index=index, correct=correct, label_source=label_source, time=round(time.time(), 3)
    ).to_line()
    data = line.encode("utf-8")
    if not _ends_with_newline(Path(path)):
        data = b"\n" + data
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _ends_with_newline(path: Path) -> bool:
    """True for a missing or empty file too (nothing to close off)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            if fh.tell() == 0:
                return True
            fh.seek(-1, os.SEEK_END)
            return fh.read(1) == b"\n"
    except FileNotFoundError:
        return True


def served_key(record: Record) -> tuple[str, list[int]]:
    """The response id and choice indexes a label names this record by (its item id and [0] without an id)."""
    served = record.provenance.get("served")
    served = served if isinstance(served, dict) else {}
    response_id = served.get("id") or record.id
    indexes = served.get("indexes") or [0]
    return str(response_id), [int(i) for i in indexes]


def read_served(path: str | Path) -> ServedLog:
    """The served answers of a log, each with its latest label; bad lines are skipped, counted and logged.

    A record line yields one :class:`ServedAnswer` per choice index it
    occupies; a label applies to the answer with its ``(id, index)``, the
    later line winning.
    """
    path = Path(path)
    if not path.exists():
        raise CandorError(f"{path}: no such file")
    answers: dict[tuple[str, int], ServedAnswer] = {}
    labels: dict[tuple[str, int], list[tuple[int, Label]]] = {}
    bad = 0
    with path.open(encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                _read_line(json.loads(line), lineno, answers, labels)
            except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
                bad += 1
                logger.warning("%s:%d: skipped, not a served record or label (%s)", path, lineno, exc)
    orphans = 0
    for key, history in labels.items():
        if key not in answers:
            orphans += len(history)
            continue
        lineno, label = history[-1]  # the later line wins
        answers[key] = replace(
            answers[key],
            label=label.correct,
            label_source=label.label_source,
            label_time=label.time,
            label_line=lineno,
            labels=tuple(history),
        )
    if bad or orphans:
        logger.warning("%s: %d bad lines skipped, %d labels name no served answer", path, bad, orphans)
    return ServedLog(list(answers.values()), bad, orphans)


def _read_line(
    obj: Any,
    lineno: int,
    answers: dict[tuple[str, int], ServedAnswer],
    labels: dict[tuple[str, int], list[tuple[int, Label]]],
) -> None:
    if not isinstance(obj, dict):
        raise ValueError("expected a JSON object")
    if LABEL_LINE_KEY in obj and "item" not in obj:
        label = Label.from_dict(obj[LABEL_LINE_KEY])
        labels.setdefault((label.id, label.index), []).append((lineno, label))
        return
    record = Record.from_dict(obj)
    response_id, indexes = served_key(record)
    for position, index in enumerate(indexes):
        answered, returned, scored = served_choice(record, position)
        answers[(response_id, index)] = ServedAnswer(
            record=record, id=response_id, index=index, answered=answered, returned=returned, scored=scored
        )


def served_choice(record: Record, position: int) -> tuple[bool | None, str | None, bool | None]:
    """(answered, returned text, scored) of the record's choice at ``position`` of its indexes, as the log says.

    ``scored`` is the confidence object's ``scores_returned_text``: the returned text is
    the answer the confidence was computed for. A record without ``provenance.served``
    (any records file) returned its greedy answer, the scored one.
    """
    served = record.provenance.get("served")
    if not isinstance(served, dict):
        return True, record.greedy.text, True
    described = served.get("confidence") or []
    returned = served.get("returned") or []
    conf = described[position] if position < len(described) and isinstance(described[position], dict) else {}
    abstained = conf.get("abstained")
    scored = conf.get("scores_returned_text")
    text = returned[position] if position < len(returned) else None
    return (
        None if not isinstance(abstained, bool) else not abstained,
        text if isinstance(text, str) else None,
        scored if isinstance(scored, bool) else None,
    )


def served_records(log: ServedLog) -> list[Record]:
    """Every served question's record once, in file order (the traffic stage 1 learns from)."""
    seen: dict[int, Record] = {}
    for answer in log.answers:
        seen.setdefault(id(answer.record), answer.record)
    return list(seen.values())
