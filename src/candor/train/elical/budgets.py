"""The label budget: how many labelled questions EliCal's stage 2 trains on.

See docs/methods.md "EliCal", "HonestyBench-mini".

- :class:`Budget` is parsed once, where the user typed it (``--set budget=``,
  ``--budgets``, ``EliCal(budget=...)``), and travels typed from there.
- A budget N is drawn from the labelled pool by a seeded shuffle, so budgets
  of one seed are nested (the 100 labels are among the 250) and the same seed
  gives the same labels on every machine. ``all`` is the whole pool; a budget
  larger than the pool is an error, never a silent clip.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from candor.data.splits import seeded_shuffle
from candor.util.errors import CandorError

ALL = "all"
T = TypeVar("T")


@dataclass(frozen=True)
class Budget:
    """A number of labelled questions, or the whole pool (``count`` None); printed as ``1000`` or ``all``."""

    count: int | None = None

    def __post_init__(self) -> None:
        if self.count is not None and self.count < 1:
            raise CandorError(f"a label budget must be at least 1, got {self.count}")

    @classmethod
    def parse(cls, text: str | int) -> Budget:
        """``"all"`` (any case) or a positive integer."""
        if isinstance(text, int) or str(text).strip().isdigit():
            return cls(int(text))
        if str(text).strip().lower() == ALL:
            return cls(None)
        raise CandorError(f"a label budget is a positive number or 'all', got {text!r}")

    @property
    def is_all(self) -> bool:
        return self.count is None

    def as_json(self) -> int | str:
        """What results and metadata files store: the count, or ``"all"``."""
        return ALL if self.count is None else self.count

    def __str__(self) -> str:
        return str(self.as_json())

    def size(self, pool: int) -> int:
        """How many records this budget takes from a pool of ``pool``."""
        if self.count is None:
            return pool
        if self.count > pool:
            raise CandorError(
                f"label budget {self.count} is larger than the labelled pool ({pool} records); "
                f"use a budget of at most {pool}, or 'all'"
            )
        return self.count

    def draw(self, pool: Sequence[T], seed: int = 0) -> list[T]:
        """This budget's records of ``pool`` (or the claim head's labelled claims) by a seeded shuffle (nested
        across budgets for one seed)."""
        n = self.size(len(pool))
        return seeded_shuffle(list(pool), f"elical-budget:{seed}")[:n]


WHOLE_POOL = Budget(None)
