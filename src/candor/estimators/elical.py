"""``elical``: question-level confidence from a trained EliCal head (DESIGN.md §4.4).

The head reads each record's QA prompt (the template it was trained with) and
needs no answer, samples or backend: it loads its own backbone by the name it
saved. Give the head folder (or a loaded :class:`~candor.elical.ConfidenceHead`)::

    get_estimator("elical", head="heads/elical").estimate(records)

torch and transformers are imported only when a head is loaded, so importing
the estimator registry stays fast.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from candor.backends.base import Backend
from candor.errors import CandorError
from candor.estimators.base import ESTIMATORS, Estimator
from candor.records import Record


@ESTIMATORS.register("elical")
class EliCalEstimator(Estimator):
    """Scores records (or, through :meth:`score_questions`, raw questions) with a trained head."""

    name = "elical"
    level = "question"

    def __init__(self, head: str | Path | Any = None, batch_size: int = 16, device: str | None = None) -> None:
        self.head_source = head
        self.batch_size = batch_size
        self.device = device
        self._head: Any = None

    @property
    def head(self) -> Any:
        """The loaded :class:`~candor.elical.ConfidenceHead` (loaded on first use)."""
        if self._head is None:
            if self.head_source is None:
                raise CandorError(
                    "estimator 'elical' needs a trained head: pass head=<folder> (train one with `candor train elical`)"
                )
            if isinstance(self.head_source, (str, Path)):
                from candor.elical import ConfidenceHead

                self._head = ConfidenceHead.from_pretrained(self.head_source, device=self.device)
            else:
                self._head = self.head_source
        return self._head

    def _estimate(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        return self.head.predict(records, batch_size=self.batch_size)

    def score_questions(self, questions: Sequence[str]) -> np.ndarray:
        """One confidence per raw question string, before any answer exists."""
        if not questions:
            return np.zeros(0, dtype=float)
        return self._checked(np.asarray(self.head.predict(questions, batch_size=self.batch_size)), len(questions))

    def describe(self) -> dict[str, Any]:
        out = {**super().describe()}
        if isinstance(self.head_source, (str, Path)):
            out["head"] = str(self.head_source)
        return out
