"""The contamination guard: which questions a trained head or adapter has seen, and refusing test questions.

Two checks share one fingerprint (docs/architecture.md "Conventions"):

- **Trainers refuse test questions.** ``candor train --test FILE`` and
  ``candor sweep --test FILE`` name the files the trained head or adapter will
  be evaluated on. Before any training, every file the trainer learns from
  (the pool, the dev file) is compared with them (:class:`HeldOutQuestions`):
  one shared question is a :class:`CandorError` that names the file, the
  count and an example, because a score on questions the model was trained on
  is not a test score. A test file may be a records file (``candor
  annotate``, imported HonestyBench) or a QA file or dataset name.
- **Scoring warns about seen questions.** A trainer writes a manifest of its
  training questions' fingerprints into the folder it saves
  (``training_questions.json``, :func:`write_manifest`); before ``candor
  score`` runs, :func:`warn_contamination` reads back the manifest of every
  trained folder involved (:func:`trained_folders`: the backend's adapter, a
  head given as an option) and warns, with a count and an example, when the
  records overlap.

A fingerprint is a SHA-256 of the normalized question text, so the same question
with other casing, punctuation or spacing still matches, and the manifest holds
no question text.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from candor.annotation.records import Record, read_records
from candor.annotation.text_matching import normalize
from candor.backends.base import Backend
from candor.util.errors import CandorError
from candor.util.files import atomic_write_json

logger = logging.getLogger(__name__)

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
    payload = {
        "hash": "sha256(normalize(question))",
        "count": len(prints),
        "sources": list(sources),
        "fingerprints": prints,
    }
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


# Fields whose presence on a JSONL file's first object mark it as records, not QA items.
RECORD_FIELDS = ("item", "greedy_response")


def read_questions(source: str | Path, data_dir: str | Path | None = None) -> list[str]:
    """The questions of a records file, a QA file, or a registered dataset name."""
    if _is_records_file(Path(source)):
        return [r.item.question for r in read_records(source)]
    from candor.data import load_items

    return [item.question for item in load_items(str(source), data_dir=data_dir)]


def _is_records_file(path: Path) -> bool:
    if path.suffix.lower() != ".jsonl" or not path.is_file():
        return False
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                try:
                    first = json.loads(line)
                except json.JSONDecodeError:
                    return False  # the QA loader reports the bad line with its number
                return isinstance(first, dict) and any(key in first for key in RECORD_FIELDS)
    return False


@dataclass
class HeldOutQuestions:
    """The fingerprints of every question in the test files a trainer was given."""

    sources: list[str] = field(default_factory=list)
    prints: set[str] = field(default_factory=set)

    @classmethod
    def read(cls, sources: Sequence[str | Path], data_dir: str | Path | None = None) -> HeldOutQuestions:
        prints: set[str] = set()
        for source in sources:
            prints |= fingerprints(read_questions(source, data_dir))
        return cls([str(s) for s in sources], prints)

    @classmethod
    def of(cls, questions: Iterable[str], sources: Sequence[str] = ()) -> HeldOutQuestions:
        return cls(list(sources), fingerprints(questions))

    def refuse_overlap(
        self,
        questions: Iterable[str],
        what: str,
        *,
        held_out: str | None = None,
        why: str = "training on test questions would make their scores meaningless",
    ) -> None:
        """Raise when any of ``questions`` (the ``what`` set, e.g. a file name) is a held-out question.

        ``held_out`` names what this set is (default: the test files, or the test set when no file is
        named; ``the scored records`` for a dev file's check) and ``why``
        says what sharing a question would break; the message names the files on both sides.
        """
        if not self.prints:
            return
        overlap = find_overlap(questions, self.prints)
        if overlap:
            if held_out is None:  # the trainers' test files
                tests = f"the test files ({', '.join(self.sources)})" if self.sources else "the test set"
            else:
                tests = f"{held_out} ({', '.join(self.sources)})" if self.sources else held_out
            raise CandorError(
                f"{what}: {overlap.count} of {overlap.total} questions are also in {tests}, "
                f"e.g. {overlap.example!r}; {why}"
            )


def refuse_dev_overlap(
    dev: Iterable[str], dev_source: str, scored: Iterable[str], scored_source: str | None = None
) -> None:
    """Raise when a dev file a confidence is fitted on (``ensemble.dev``, ``debias_dev``) shares a question with
    the records it scores: the same refusal as the trainers' (:meth:`HeldOutQuestions.refuse_overlap`).

    ``dev_source`` names the dev file (or the option that gave it), ``scored_source`` the scored file
    when known.
    """
    held_out = HeldOutQuestions.of(scored, [scored_source] if scored_source else [])
    held_out.refuse_overlap(
        dev,
        dev_source,
        held_out="the scored records",
        why="a confidence fitted on the questions it scores would make their scores meaningless",
    )


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
                overlap.count,
                overlap.total,
                label,
                overlap.example,
            )
    return found
