"""The built-in starter set: factual questions written for candor.

It ships inside the package (``starter.jsonl``), so ``candor demo`` and the
tests run offline with no benchmark data. Each item carries its
``difficulty`` (easy, medium, hard) and ``topic`` in ``meta``, which lets a
demo show that confidence should drop as questions get harder.
"""

from __future__ import annotations

from collections import Counter

from candor.data.datasets import get_dataset
from candor.data.items import QAItem
from candor.data.loaders import load_named

STARTER = "starter"
DIFFICULTIES = ("easy", "medium", "hard")


def load_starter(limit: int | None = None) -> list[QAItem]:
    """The starter items (dataset ``starter``, split ``test``), in file order."""
    return load_named(STARTER, limit=limit)


def starter_path() -> str:
    """Where the starter file is installed."""
    return str(get_dataset(STARTER).resolve())


def count_by(items: list[QAItem], key: str) -> dict[str, int]:
    """How many items have each value of ``meta[key]`` (e.g. ``difficulty``)."""
    return dict(sorted(Counter(str(item.meta.get(key)) for item in items).items()))
