"""``length``: confidence from the greedy answer's token count, a baseline every method must beat.

With an LLM judge labelling correctness, answer length alone can rank answers
about as well as semantic entropy (long answers hedge, ramble, or get marked
wrong more often), so a confidence method earns its keep only by beating it.

The confidence is a monotone map of the token count ``n``:

- ``shorter`` (the default when no dev set is given): ``1 / (1 + n)``;
- ``longer``: ``n / (1 + n)``.

Given ``dev`` records (a list, or a records JSONL path) with greedy
correctness labels, the direction is fitted there: ``shorter`` when shorter
answers are correct more often (Mann–Whitney AUROC of ``-n`` against the
labels ≥ 0.5), else ``longer``. Nothing is fitted on the records being scored.

The count is ``len(greedy.token_ids)`` (or the stored ``tokens`` when ids are
missing); a record with neither has no token count and raises
:class:`CandorError` naming it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from candor.annotation.records import Record, read_records
from candor.backends.base import Backend
from candor.estimators.base import ESTIMATORS, Estimator
from candor.util.errors import CandorError

logger = logging.getLogger(__name__)

DIRECTIONS = ("shorter", "longer")


def answer_length(record: Record) -> int:
    """The greedy answer's token count."""
    n = len(record.greedy.token_ids) or len(record.greedy.tokens)
    if n == 0 and record.greedy.text.strip():
        raise CandorError(
            f"record {record.id!r}: the greedy answer {record.greedy.text!r} carries no tokens "
            "(token_ids), so its length in tokens is unknown"
        )
    return n


def shorter_is_better_auroc(lengths: np.ndarray, correct: np.ndarray) -> float:
    """AUROC of ``-length`` for telling correct from wrong answers (Mann–Whitney, ties count half)."""
    from scipy.stats import rankdata  # lazy: scipy.stats costs seconds to import the registry with

    ranks = rankdata(-lengths)
    n_pos = int(correct.sum())
    n_neg = correct.size - n_pos
    return float((ranks[correct == 1].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def fit_direction(dev: Sequence[Record]) -> tuple[str, float, int]:
    """``(direction, AUROC of -length on dev, labelled dev records)``; see the module docstring."""
    labelled = [r for r in dev if r.greedy_correct is not None]
    correct = np.array([int(r.greedy_correct) for r in labelled], dtype=int)  # type: ignore[arg-type]
    if correct.size == 0 or correct.min() == correct.max():
        raise CandorError(
            f"length: the dev records need both correct and wrong greedy answers to fit a direction "
            f"({correct.size} labelled, {int(correct.sum())} correct)"
        )
    lengths = np.array([answer_length(r) for r in labelled], dtype=float)
    auroc = shorter_is_better_auroc(lengths, correct)
    return ("shorter" if auroc >= 0.5 else "longer"), auroc, int(correct.size)


@ESTIMATORS.register("length")
class AnswerLength(Estimator):
    """Confidence from the greedy answer's token count; direction from dev, or shorter-is-surer."""

    name = "length"
    level = "question"

    def __init__(self, dev: Sequence[Record] | str | Path | None = None) -> None:
        self.direction = "shorter"
        self.dev_auroc: float | None = None
        self.dev_size = 0
        if dev is not None:
            records = read_records(dev) if isinstance(dev, (str, Path)) else list(dev)
            self.direction, self.dev_auroc, self.dev_size = fit_direction(records)
            logger.info(
                "length: direction %r fitted on %d dev records (AUROC of -length %.3f)",
                self.direction,
                self.dev_size,
                self.dev_auroc,
            )

    def _estimate(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        n = np.array([answer_length(r) for r in records], dtype=float)
        shorter = 1.0 / (1.0 + n)
        return shorter if self.direction == "shorter" else 1.0 - shorter

    def describe(self) -> dict[str, Any]:
        fit = (
            {"fit": "default"}
            if self.dev_auroc is None
            else {"fit": "dev", "dev_size": self.dev_size, "dev_auroc_shorter": round(self.dev_auroc, 4)}
        )
        return {**super().describe(), "direction": self.direction, **fit}
