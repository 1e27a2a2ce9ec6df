"""What an EliCal run trains and stops on: the labelled pool and its dev slice.

See docs/methods.md "EliCal", "HonestyBench-mini".

:class:`TrainingPool` is the one setup that ``candor train elical``,
``candor sweep`` (and its ``--select``) and :class:`candor.EliCal` share:
the pool and dev records, refused when they share a question with the test
questions, and a dev slice carved from the pool when no dev records were
given. Early stopping watches that dev slice, never test data;
:func:`check_disjoint` refuses a dev or training set that shares a question
with a test set.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from candor.annotation.contamination import HeldOutQuestions
from candor.annotation.records import Record, read_records
from candor.data.splits import seeded_shuffle
from candor.train.common import refuse_test_overlap
from candor.util.errors import CandorError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainingPool:
    """The pool stage 1 trains on and stage 2 draws its budget from, the dev slice, and the files they came from."""

    pool: list[Record]
    dev: list[Record]
    source: str | Path | None = None
    dev_source: str | Path | None = None

    @classmethod
    def of(
        cls,
        pool: Sequence[Record],
        dev: Sequence[Record] | None = None,
        *,
        seed: int = 0,
        tests: HeldOutQuestions | None = None,
        source: str | Path | None = None,
        dev_source: str | Path | None = None,
    ) -> TrainingPool:
        """Refuse test questions in ``pool`` or ``dev``; without ``dev``, carve a seeded slice of ``pool``."""
        if tests is not None:
            refuse_test_overlap(tests, pool, dev, source, dev_source)
        if dev is not None:
            return cls(list(pool), list(dev), source, dev_source)
        rest, carved = carve_dev(pool, seed=seed)
        logger.info("no dev records: carved a dev slice of %d records from the training pool", len(carved))
        carved_from = f"dev slice carved from {source}" if source is not None else None
        return cls(rest, carved, source, carved_from)

    @classmethod
    def read(
        cls, records: Path, dev: Path | None = None, *, seed: int = 0, tests: HeldOutQuestions | None = None
    ) -> TrainingPool:
        """:meth:`of` the records files ``records`` and ``dev``."""
        return cls.of(
            read_records(records),
            read_records(dev) if dev is not None else None,
            seed=seed,
            tests=tests,
            source=records,
            dev_source=dev,
        )


def carve_dev(pool: Sequence[Record], fraction: float = 0.1, seed: int = 0) -> tuple[list[Record], list[Record]]:
    """``(train, dev)``: a seeded ``fraction`` of the pool held out for early stopping."""
    if not 0.0 < fraction < 1.0:
        raise CandorError(f"the dev fraction must be in (0, 1), got {fraction}")
    shuffled = seeded_shuffle(list(pool), f"elical-dev:{seed}")
    n_dev = max(1, round(fraction * len(shuffled)))
    if n_dev >= len(shuffled):
        raise CandorError(f"a training pool of {len(shuffled)} records is too small to carve a dev slice from")
    dev_ids = {r.id for r in shuffled[:n_dev]}
    return [r for r in pool if r.id not in dev_ids], [r for r in pool if r.id in dev_ids]


def check_disjoint(
    records: Iterable[Record], others: Iterable[Record], what: str = "training", against: str = "test"
) -> None:
    """Raise when a ``what`` record shares an id or a question text with one of ``others`` (``against``)."""
    others = list(others)
    ids = {r.id for r in others}
    questions = {r.item.question.strip() for r in others}
    for rec in records:
        if rec.id in ids or rec.item.question.strip() in questions:
            raise CandorError(
                f"{what} record {rec.id!r} is also a {against} question ({rec.item.question[:60]!r}); "
                f"the {what} records must not overlap the {against} set"
            )
