"""Which labels on served answers a calibration may learn from and certify with (``candor adapt``).

A label counts only when it says something about the text the served confidence
was computed for, from a source the operator trusts:

- **Trusted sources.** ``--label-sources`` is a comma list of source names, each
  a shell-style pattern (``human,judge:*``). A label from any other source is
  ignored, and does not hide an earlier label from a trusted source on the same
  answer: every label of an answer is read, not just its latest.
- **The scored text.** A choice's label is used only when that choice returned
  the text its confidence scored: its served confidence object says
  ``scores_returned_text: true`` and the text returned there is the record's
  greedy answer. A label on an abstained choice (the client saw a refusal) or on
  a sampled or longer reply is ignored.
- **One label per served response.** A response with ``n`` choices is one served
  question: of its usable labels the latest (the later line of the log) stands
  for it, and the others are counted as superseded.

A record with no served confidence (a records file from ``candor annotate``, a
log written before the confidence was logged) is addressed by its greedy answer,
so a label on it is a label on the scored text.

Everything here works on a list of :class:`~candor.annotation.served_labels.ServedAnswer`
(a record, a choice index, and that choice's labels with their order), whatever store
they were read from.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from typing import Any

from candor.annotation.records import Record
from candor.annotation.served_labels import LABEL_SOURCE_AUDIT, LABEL_SOURCE_HUMAN, Label, ServedAnswer
from candor.util.errors import CandorError

# Trusted unless the operator says otherwise: labels a person made. An audit label is one, made on a
# uniform draw (the draw the guarantee assumes), so it is trusted like a human label.
DEFAULT_LABEL_SOURCES = (LABEL_SOURCE_HUMAN, LABEL_SOURCE_AUDIT)

USED = "used"
SUPERSEDED = "superseded"  # a usable label that a later usable label of the same response replaced
UNTRUSTED = "untrusted_source"
ABSTAINED = "abstained_choice"
NOT_SCORED = "not_the_scored_text"
OUTCOMES = (USED, SUPERSEDED, UNTRUSTED, ABSTAINED, NOT_SCORED)


def parse_label_sources(text: str | Iterable[str]) -> tuple[str, ...]:
    """``"human,judge:*"`` (or its parts) as a tuple of patterns; refuses an empty list or an empty name."""
    parts = text.split(",") if isinstance(text, str) else list(text)
    patterns = tuple(p.strip() for p in parts)
    if not patterns or any(not p for p in patterns):
        raise CandorError(f"--label-sources must be a comma list of source names or patterns, got {text!r}")
    return patterns


def trusted(source: str, patterns: Sequence[str]) -> bool:
    """Whether a label source matches one of the patterns (shell-style: ``judge:*``)."""
    return any(fnmatchcase(source, p) for p in patterns)


def unscored_reason(answer: ServedAnswer) -> str | None:
    """None when a label on this choice is about the text the confidence scored, else the outcome that says why not."""
    served = answer.record.provenance.get("served")
    if not isinstance(served, dict):
        return None  # a records file: the answer is the greedy answer
    indexes = served.get("indexes") or [0]
    if answer.index not in indexes:
        return NOT_SCORED
    position = indexes.index(answer.index)
    described = served.get("confidence") or []
    confidence = described[position] if position < len(described) and isinstance(described[position], dict) else {}
    returned = served.get("returned") or []
    text = returned[position] if position < len(returned) else answer.record.greedy.text
    if confidence.get("abstained") is True or text is None:
        return ABSTAINED
    if confidence.get("scores_returned_text") is False or text != answer.record.greedy.text:
        return NOT_SCORED
    return None


@dataclass
class LabelSelection:
    """The labelled records a calibration uses (one per served response) and what became of every label, by source."""

    records: list[Record]
    sources: tuple[str, ...]
    by_source: dict[str, dict[str, int]] = field(default_factory=dict)

    def count(self, outcome: str) -> int:
        return sum(c.get(outcome, 0) for c in self.by_source.values())

    @property
    def ignored(self) -> int:
        return sum(self.count(o) for o in OUTCOMES if o != USED)

    def to_dict(self) -> dict[str, Any]:
        return {
            "trusted_sources": list(self.sources),
            "used": len(self.records),
            "ignored": self.ignored,
            "by_source": {s: dict(c) for s, c in sorted(self.by_source.items())},
        }


def select_labels(answers: Sequence[ServedAnswer], sources: Sequence[str] = ("*",)) -> LabelSelection:
    """One labelled record per served response whose trusted labels are on the scored text (see the module docstring).

    The record's ``greedy_correct`` is its latest usable label; ``sources`` are patterns (``("*",)``: every source).
    """
    sources = parse_label_sources(sources)
    tally: dict[str, dict[str, int]] = {}
    usable: dict[str, list[tuple[int, Label, Record]]] = {}

    def note(source: str, outcome: str) -> None:
        counts = tally.setdefault(source, {})
        counts[outcome] = counts.get(outcome, 0) + 1

    for answer in answers:
        reason = unscored_reason(answer)
        for order, label in answer.labels:
            if not trusted(label.label_source, sources):
                note(label.label_source, UNTRUSTED)
            elif reason is not None:
                note(label.label_source, reason)
            else:
                usable.setdefault(answer.id, []).append((order, label, answer.record))
    records = []
    for candidates in usable.values():
        *earlier, (_, latest, record) = sorted(candidates, key=lambda c: c[0])
        for _, label, _ in earlier:
            note(label.label_source, SUPERSEDED)
        note(latest.label_source, USED)
        records.append(replace(record, greedy_correct=int(latest.correct)))
    return LabelSelection(records=records, sources=sources, by_source=tally)


def labelled_records(answers: Sequence[ServedAnswer], sources: Sequence[str] = ("*",)) -> list[Record]:
    """The records of :func:`select_labels`: one per labelled served response, ``greedy_correct`` set."""
    return select_labels(answers, sources).records
