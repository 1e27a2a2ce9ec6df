"""The trainers' guard: refuse to train on questions of the test files a run is given.

``candor train --test FILE`` and ``candor sweep --test FILE`` name the files
the trained head or adapter will be evaluated on. Before any training, every
file the trainer learns from (the pool, the dev file) is compared with them by
question fingerprint (:mod:`candor.contamination`): one shared question is a
:class:`CandorError` that names the file, the count and an example, because a
score on questions the model was trained on is not a test score.

A test file may be a records file (``candor annotate``, imported HonestyBench)
or a QA file or dataset name (what ``candor annotate --data`` reads).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from candor.contamination import find_overlap, fingerprints
from candor.errors import CandorError

logger = logging.getLogger(__name__)

# Fields whose presence on a JSONL file's first object mark it as records, not QA items.
RECORD_FIELDS = ("item", "greedy_response")


def read_questions(source: str | Path, data_dir: str | Path | None = None) -> list[str]:
    """The questions of a records file, a QA file, or a registered dataset name."""
    if _is_records_file(Path(source)):
        from candor.records import read_records

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

    def refuse_overlap(self, questions: Iterable[str], what: str) -> None:
        """Raise when any of ``questions`` (the ``what`` set, e.g. a file name) is a test question."""
        if not self.prints:
            return
        overlap = find_overlap(questions, self.prints)
        if overlap:
            tests = f"the test files ({', '.join(self.sources)})" if self.sources else "the test set"
            raise CandorError(
                f"{what}: {overlap.count} of {overlap.total} questions are also in {tests}, "
                f"e.g. {overlap.example!r}; training on test questions would make their scores meaningless"
            )
