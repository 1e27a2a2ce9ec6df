"""Where a served answer's confidence comes from: a trained EliCal head or any registered estimator.

Two kinds, in a registry so a saved model names its kind and reloads it:

- ``head``: an EliCal confidence head (DESIGN.md §4.4). It reads the question
  alone, so it decides *before* generating: a question it declines costs no
  generation at all.
- ``estimator``: any estimator of :mod:`candor.estimators` (``n-prob``,
  ``consis-lex``, ``p-true``, ``verbal-letter`` …). It scores an answer once it
  exists; a verbalized format on a backend that carries an ADVICE adapter is
  the answer-level confidence of ADVICE (§4.3, §4.5).
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from candor.annotation.records import Record
from candor.backends.base import Backend, Completion
from candor.data.items import QAItem
from candor.estimators import get_estimator
from candor.serve.classify_client import ClassifySource
from candor.train.elical.estimator import EliCalEstimator
from candor.util.errors import CandorError
from candor.util.registry import Registry

logger = logging.getLogger(__name__)

HEAD_DIR = "head"


def question_item(question: str, index: int = 0) -> QAItem:
    return QAItem(id=f"q{index}", dataset="", split="", question=question, answers=())


class ConfidenceSource(Protocol):
    """``before_generation`` sources score questions; the others score answered records."""

    kind: str
    name: str
    before_generation: bool
    samples: int  # sampled answers per question the source reads (0: none)

    def check(self, backend: Backend) -> None:
        """Raise :class:`CandorError` (one line) when the source cannot serve on ``backend``."""
        ...

    def score_questions(self, questions: Sequence[str]) -> np.ndarray: ...

    def score_records(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray: ...

    def save(self, folder: Path) -> dict[str, Any]: ...


class HeadSource:
    """An EliCal head: confidence from the question alone, before any answer."""

    kind = "head"
    name = "elical"
    before_generation = True
    samples = 0

    def __init__(self, head: str | Path | Any, batch_size: int = 16, device: str | None = None) -> None:
        self.estimator = EliCalEstimator(head=head, batch_size=batch_size, device=device)

    def check(self, backend: Backend) -> None:
        return None  # the head carries its own backbone

    def score_questions(self, questions: Sequence[str]) -> np.ndarray:
        return self.estimator.score_questions(list(questions))

    def score_records(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        return self.estimator.estimate(records)

    def save(self, folder: Path) -> dict[str, Any]:
        source = self.estimator.head_source
        target = folder / HEAD_DIR
        if isinstance(source, (str, Path)):
            shutil.copytree(source, target)
        else:
            source.save_pretrained(target)
        return {"kind": self.kind, "head": HEAD_DIR}

    @classmethod
    def load(cls, config: dict[str, Any], folder: Path) -> HeadSource:
        return cls(folder / config["head"])


class EstimatorSource:
    """A registered estimator applied to the generated answer (and ``samples`` sampled ones).

    ``samples`` defaults to the estimator's own ``default_samples`` (0 for one
    that reads no samples); an estimator that reads samples refuses 0.
    """

    kind = "estimator"
    before_generation = False

    def __init__(self, name: str, samples: int | None = None, options: dict[str, Any] | None = None) -> None:
        self.name = name
        self.options = dict(options or {})
        self.estimator = get_estimator(name, **self.options)
        wanted = int(getattr(self.estimator, "default_samples", 0))
        self.samples = wanted if samples is None else samples
        if self.samples < 0:
            raise CandorError(f"samples must be >= 0, got {self.samples}")
        if wanted and not self.samples:
            raise CandorError(
                f"estimator {name!r} reads sampled answers: give --samples of at least 1 (default {wanted})"
            )
        if not wanted and self.samples:
            raise CandorError(f"estimator {name!r} reads no sampled answers: drop --samples")
        needed = self.estimator.min_samples
        if self.samples and self.samples < needed:  # e.g. k = 1 for an estimator comparing samples pairwise
            raise CandorError(f"estimator {name!r} compares samples with each other: give --samples {needed} or more")

    def check(self, backend: Backend) -> None:
        self.estimator.check_backend(backend)

    def score_questions(self, questions: Sequence[str]) -> np.ndarray:
        raise CandorError(f"estimator {self.name!r} scores answers; generate first")

    def score_records(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        return self.estimator.estimate(records, backend)

    def save(self, folder: Path) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "samples": self.samples, "options": self.options}

    @classmethod
    def load(cls, config: dict[str, Any], folder: Path) -> EstimatorSource:
        return cls(config["name"], samples=config.get("samples"), options=config.get("options"))


SOURCES: Registry[Callable[[dict[str, Any], Path], ConfidenceSource]] = Registry("confidence source")
SOURCES.register("head")(HeadSource.load)
SOURCES.register("estimator")(EstimatorSource.load)
SOURCES.register("classify")(ClassifySource.load)  # an exported head on a classify server


def load_source(config: dict[str, Any], folder: Path) -> ConfidenceSource:
    return SOURCES.get(str(config.get("kind")))(config, folder)


def as_source(confidence: str | ConfidenceSource) -> ConfidenceSource:
    """A source from an estimator name (``"n-prob"``) or a source object as it is."""
    if isinstance(confidence, str):
        return EstimatorSource(confidence)
    return confidence


def answer_records(
    questions: Sequence[str],
    answers: Sequence[Completion],
    samples: Sequence[list[Completion]],
    provenance: dict[str, Any] | None = None,
) -> list[Record]:
    """Unlabelled records for an estimator: each answer as the record's greedy answer.

    ``provenance`` (model, template, decoding) travels with each record, so an
    estimator that re-reads the prompt renders the one the answer was made with.
    """
    return [
        Record(item=served_item(q), greedy=a, samples=list(s), provenance=dict(provenance or {}))
        for q, a, s in zip(questions, answers, samples, strict=True)
    ]


def served_item(question: str) -> QAItem:
    """A served question as a QA item whose id comes from its text, never from its place in a batch."""
    return QAItem(id="q-" + hashlib.sha256(question.encode("utf-8")).hexdigest()[:16], dataset="served", split="",
                  question=question, answers=())  # fmt: skip
