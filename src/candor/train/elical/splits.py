"""Which records each run trains and stops on: label budgets and the dev slice.

See docs/methods.md "EliCal", "HonestyBench-mini".

- A budget N is drawn from the labelled pool by a seeded shuffle, so budgets
  of one seed are nested (the 100 labels are among the 250) and the same seed
  gives the same labels on every machine. ``all`` is the whole pool; a budget
  larger than the pool is an error, never a silent clip.
- Early stopping watches a dev slice carved from the training pool, never
  test data: :func:`check_disjoint` refuses a dev or training set that shares
  a question with the test sets.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from candor.annotation.records import Record
from candor.data.splits import seeded_shuffle
from candor.util.errors import CandorError

ALL = "all"

Budget = int | str  # a number of labelled questions, or "all"


def parse_budget(text: str | int) -> Budget:
    """``"all"`` or a positive integer."""
    if isinstance(text, int) or str(text).strip().isdigit():
        n = int(text)
        if n < 1:
            raise CandorError(f"a label budget must be at least 1, got {n}")
        return n
    if str(text).strip().lower() == ALL:
        return ALL
    raise CandorError(f"a label budget is a positive number or 'all', got {text!r}")


def budget_size(budget: Budget, pool: int) -> int:
    """How many records ``budget`` takes from a pool of ``pool``."""
    budget = parse_budget(budget)
    if budget == ALL:
        return pool
    assert isinstance(budget, int)
    if budget > pool:
        raise CandorError(
            f"label budget {budget} is larger than the labelled pool ({pool} records); "
            f"use a budget of at most {pool}, or 'all'"
        )
    return budget


def draw_budget(pool: Sequence[Record], budget: Budget, seed: int = 0) -> list[Record]:
    """``budget`` records of ``pool`` by a seeded shuffle (nested across budgets for one seed)."""
    n = budget_size(budget, len(pool))
    return seeded_shuffle(list(pool), f"elical-budget:{seed}")[:n]


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
