"""Estimators from agreement among the sampled answers: ``consis-lex`` and ``consis-sem`` (§4.2)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from candor.backends.base import Backend
from candor.errors import CandorError
from candor.estimators.base import ESTIMATORS, Estimator
from candor.judges import CONSISTENCY_JUDGES, get_consistency_judge, rouge_l_f1
from candor.records import Record

logger = logging.getLogger(__name__)


def _require_samples(record: Record, name: str) -> None:
    if not record.samples:
        raise CandorError(f"record {record.id!r} has no sampled answers; {name} needs them")


@ESTIMATORS.register("consis-lex")
class LexicalConsistency(Estimator):
    """Mean ROUGE-L F1 between the greedy answer and each sampled answer."""

    name = "consis-lex"
    level = "question"

    def _estimate(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        out = []
        for rec in records:
            _require_samples(rec, self.name)
            out.append(np.mean([rouge_l_f1(rec.greedy.text, s.text) for s in rec.samples]))
        return np.array(out)


@ESTIMATORS.register("consis-sem")
class SemanticConsistency(Estimator):
    """Mean consistency verdict over the k samples (the consistency rate).

    Uses ``record.consistency`` when the annotation has it; otherwise runs the
    consistency judge named by ``judge`` (``lexical`` by default; ``llm`` asks
    the backend passed to :meth:`estimate`) on every record that lacks it, in
    one batched call.
    """

    name = "consis-sem"
    level = "question"

    def __init__(self, judge: str = "lexical", **judge_options: Any) -> None:
        CONSISTENCY_JUDGES.get(judge)  # an unknown judge fails now, even when the records carry verdicts
        self.judge_name = judge
        self.judge_options = judge_options
        self.needs_backend = judge == "llm"
        self.judged = 0  # records whose verdicts were computed here, not read from the annotation

    def _estimate(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        verdicts: list[list[int] | None] = [list(r.consistency) if r.consistency else None for r in records]
        missing = [i for i, v in enumerate(verdicts) if v is None]
        if missing:
            for i, v in zip(missing, self._judge([records[i] for i in missing], backend), strict=True):
                verdicts[i] = v
        self.judged = len(missing)
        if missing:
            logger.info(
                "consis-sem: judged %d records without consistency verdicts (%s)", len(missing), self.judge_name
            )
        return np.array([float(np.mean(v)) for v in verdicts])

    def _judge(self, records: Sequence[Record], backend: Backend | None) -> list[list[int]]:
        options = dict(self.judge_options)
        if self.judge_name == "llm":
            options.setdefault("backend", backend)
        judge = get_consistency_judge(self.judge_name, **options)
        greedy, samples, questions, owner = [], [], [], []
        for j, rec in enumerate(records):
            _require_samples(rec, self.name)
            for s in rec.samples:
                greedy.append(rec.greedy.text)
                samples.append(s.text)
                questions.append(rec.item.question)
                owner.append(j)
        flat = judge.judge(samples, greedy, questions)
        out: list[list[int]] = [[] for _ in records]
        for j, v in zip(owner, flat, strict=True):
            out[j].append(int(v))
        return out

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "judge": self.judge_name}
