"""Contamination guard: which questions a trained head or adapter has seen.

A trainer writes a manifest of its training questions' fingerprints into the
folder it saves (``training_questions.json``); ``candor score`` reads it back and
warns when the records it scores overlap. Trainers also refuse a pool or dev
file that shares questions with the test files they are given (DESIGN.md §6.7).

A fingerprint is a SHA-256 of the normalized question text, so the same question
with other casing, punctuation or spacing still matches, and the manifest holds
no question text.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from candor.errors import CandorError
from candor.files import atomic_write_json
from candor.judges import normalize

MANIFEST_NAME = "training_questions.json"


def question_fingerprint(question: str) -> str:
    """A stable hex fingerprint of a question, insensitive to case, punctuation and spacing."""
    return hashlib.sha256(normalize(question).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Overlap:
    """Questions of one collection that another collection also holds."""

    count: int
    total: int
    example: str | None

    def __bool__(self) -> bool:
        return self.count > 0


def find_overlap(questions: Iterable[str], seen: set[str]) -> Overlap:
    """How many of ``questions`` have a fingerprint in ``seen``, with the first one as an example."""
    count = total = 0
    example = None
    for question in questions:
        total += 1
        if question_fingerprint(question) in seen:
            count += 1
            example = example if example is not None else question
    return Overlap(count, total, example)


def fingerprints(questions: Iterable[str]) -> set[str]:
    return {question_fingerprint(q) for q in questions}


def write_manifest(
    folder: str | Path, questions: Iterable[str], sources: Iterable[str] = (), inherited: Iterable[str] = ()
) -> Path:
    """Write the fingerprints of the training questions into ``folder``.

    ``inherited`` adds fingerprints already hashed, e.g. the manifest of a
    saved model that this training resumed.
    """
    path = Path(folder) / MANIFEST_NAME
    prints = sorted(fingerprints(questions) | set(inherited))
    payload = {"hash": "sha256(normalize(question))", "count": len(prints), "sources": list(sources),
               "fingerprints": prints}
    return atomic_write_json(path, payload, indent=None)


def read_manifest(folder: str | Path) -> set[str] | None:
    """The training fingerprints stored in ``folder``, or None when it has no manifest."""
    path = Path(folder) / MANIFEST_NAME
    if not path.exists():
        return None
    try:
        return set(json.loads(path.read_text(encoding="utf-8"))["fingerprints"])
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise CandorError(f"{path}: not a training-questions manifest ({exc})") from None
