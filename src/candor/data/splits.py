"""Deterministic splits (docs/methods.md "HonestyBench-mini").

A question's side (train or test) comes from a SHA-256 hash of its text, so it
is the same on every machine, in every run and in every Python process
(Python's own ``hash()`` is salted per process). Identical questions always
land on the same side, so a test question never leaks into training.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Literal, TypeVar

from candor.data.items import QAItem
from candor.util.errors import CandorError

T = TypeVar("T")

DEFAULT_SALT = "candor"


def hash_unit(text: str, salt: str = DEFAULT_SALT) -> float:
    """A stable pseudo-random number in [0, 1) for ``text``."""
    digest = hashlib.sha256(f"{salt}\x00{text}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def hash_split(question: str, train_fraction: float = 0.8, salt: str = DEFAULT_SALT) -> Literal["train", "test"]:
    """``"train"`` for about ``train_fraction`` of questions, ``"test"`` for the rest."""
    if not 0.0 <= train_fraction <= 1.0:
        raise CandorError(f"train_fraction must be in [0, 1], got {train_fraction}")
    return "train" if hash_unit(question, salt) < train_fraction else "test"


def split_items(
    items: Iterable[QAItem], train_fraction: float = 0.8, salt: str = DEFAULT_SALT
) -> tuple[list[QAItem], list[QAItem]]:
    """(train, test) by :func:`hash_split` of each question, order kept, ``split`` set."""
    train: list[QAItem] = []
    test: list[QAItem] = []
    for item in items:
        side = hash_split(item.question, train_fraction, salt)
        (train if side == "train" else test).append(replace(item, split=side))
    return train, test


def with_split(items: Iterable[QAItem], split: str) -> list[QAItem]:
    """Copies of ``items`` labelled with ``split``."""
    return [replace(item, split=split) for item in items]


def dedupe_questions(items: Iterable[QAItem]) -> list[QAItem]:
    """Keep the first item of each question text (ParaRel repeats some)."""
    seen: set[str] = set()
    out = []
    for item in items:
        if item.question not in seen:
            seen.add(item.question)
            out.append(item)
    return out


def seeded_shuffle(items: Sequence[T], seed: int | str) -> list[T]:
    """A shuffled copy; the same seed gives the same order on every machine.

    ``random.Random`` with an int or str seed is deterministic across
    processes (a str seed is hashed with SHA-512, not ``hash()``).
    """
    out = list(items)
    random.Random(seed).shuffle(out)
    return out
