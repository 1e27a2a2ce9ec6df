"""Estimators from agreement among the sampled answers: ``consis-lex`` and ``consis-sem`` (§4.2).

Both read the samples the annotation stored on each record (``record.samples``, and for
``consis-sem`` the stored verdicts when usable); ``self-consistency``
(:mod:`candor.estimators.selfconsistency`) draws fresh samples instead.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from candor.annotation.judges import (
    CONSISTENCY_JUDGES,
    DEFAULT_CONSISTENCY_JUDGE,
    get_consistency_judge,
    judge_consistency,
)
from candor.annotation.records import Record
from candor.annotation.text_matching import rouge_l_f1
from candor.backends.base import Backend
from candor.estimators.base import ESTIMATORS, Estimator
from candor.util.errors import CandorError

logger = logging.getLogger(__name__)


def _require_samples(record: Record, name: str) -> None:
    if not record.samples:
        raise CandorError(f"record {record.id!r} has no sampled answers; {name} needs them")


@ESTIMATORS.register("consis-lex")
class LexicalConsistency(Estimator):
    """Mean ROUGE-L F1 between the greedy answer and each sampled answer."""

    name = "consis-lex"
    level = "question"
    default_samples = 5

    def _estimate(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        out = []
        for rec in records:
            _require_samples(rec, self.name)
            out.append(np.mean([rouge_l_f1(rec.greedy.text, s.text) for s in rec.samples]))
        return np.array(out)


@ESTIMATORS.register("consis-sem")
class SemanticConsistency(Estimator):
    """Mean consistency verdict over the k samples (the consistency rate).

    With no ``judge`` and no judge options given, the verdicts the annotation
    stored are used whichever judge produced them, and records without verdicts
    are judged with the default judge. With ``judge`` named (``lexical``, or
    ``llm``, which asks the backend passed to :meth:`estimate`), stored verdicts
    are used only where the record's provenance says that judge produced them
    (``provenance["consistency_judge"]``). Judge options (``threshold=0.9``)
    always mean judging anew, since the provenance records a judge's name, not
    its settings; without ``judge`` they go to the default judge, and options
    that judge does not take are refused when the estimator is built. Records
    are judged in one batched call. :meth:`describe` names the judges whose
    verdicts went into the scores.
    """

    name = "consis-sem"
    level = "question"
    default_samples = 5

    def __init__(self, judge: str | None = None, **judge_options: Any) -> None:
        if judge is not None:
            CONSISTENCY_JUDGES.get(judge)  # an unknown judge fails now, even when the records carry verdicts
        self.requested = judge
        self.judge_name = judge or DEFAULT_CONSISTENCY_JUDGE  # the judge for records whose verdicts cannot be used
        self.judge_options = judge_options
        self.needs_backend = self.judge_name == "llm"
        self.judged = 0  # records whose verdicts were computed here, not read from the annotation
        self.verdicts_by: set[str] = set()  # judges whose verdicts went into the scores so far
        if judge_options and not self.needs_backend:
            self._check_options()

    def _check_options(self) -> None:
        """Build the judge once so options it does not take fail now, not after the records are read."""
        try:
            get_consistency_judge(self.judge_name, **self.judge_options)
        except CandorError as exc:
            if self.requested is not None:
                raise
            raise CandorError(
                f"consis-sem: judge options {sorted(self.judge_options)} were given without judge=, so they go "
                f"to the default judge {self.judge_name!r}, which does not take them; name the judge they are "
                f"for (e.g. judge=lexical). ({exc})"
            ) from None

    def _usable(self, record: Record) -> bool:
        if not record.consistency or self.judge_options:
            return False
        if self.requested is None:
            return True
        return record.provenance.get("consistency_judge") == self.requested

    def _estimate(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        verdicts: list[list[int] | None] = [list(r.consistency) if self._usable(r) else None for r in records]
        for i, v in enumerate(verdicts):
            if v is not None:
                self.verdicts_by.add(str(records[i].provenance.get("consistency_judge", "unrecorded")))
        missing = [i for i, v in enumerate(verdicts) if v is None]
        if missing:
            for i, v in zip(missing, self._judge([records[i] for i in missing], backend), strict=True):
                verdicts[i] = v
            self.verdicts_by.add(self.judge_name)
            logger.info(
                "consis-sem: judged %d records with the %s judge (no stored verdicts from it)",
                len(missing),
                self.judge_name,
            )
        self.judged = len(missing)
        return np.array([float(np.mean(v)) for v in verdicts])

    def _judge(self, records: Sequence[Record], backend: Backend | None) -> list[list[int]]:
        options = dict(self.judge_options)
        if self.judge_name == "llm":
            options.setdefault("backend", backend)
        judge = get_consistency_judge(self.judge_name, **options)
        for rec in records:
            _require_samples(rec, self.name)
        return judge_consistency(
            judge,
            [rec.greedy.text for rec in records],
            [[s.text for s in rec.samples] for rec in records],
            [rec.item.question for rec in records],
        )

    def describe(self) -> dict[str, Any]:
        judge = self.requested or (self.judge_name if self.judge_options else "as annotated")
        out = {**super().describe(), "judge": judge, "verdicts_by": sorted(self.verdicts_by)}
        if self.judge_options:
            out["judge_options"] = {k: v for k, v in self.judge_options.items() if k != "backend"}
        return out
