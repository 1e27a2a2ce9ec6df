"""``p-true`` (Kadavath et al., 2022): the model's probability that its own answer is true (§4.2).

The model sees the question and its greedy answer as a proposal, is asked
"Is the proposed answer: A. True B. False", and the assistant turn is opened
with "The proposed answer is:". The confidence is P("A") renormalized over
A and B at the next position, each letter read with and without a leading
space (see :func:`candor.verbal.distribution.candidate_distribution`).

It judges the greedy answer, so it is answer-level; for a multiple-choice item
the proposal is the greedy answer's option letter.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from candor.annotation.prompts import question_text
from candor.annotation.records import Record
from candor.backends.base import NEXT_TOKEN_LOGPROBS, Backend
from candor.estimators.answers import record_answer
from candor.estimators.base import ESTIMATORS, Estimator
from candor.verbal.distribution import candidate_distribution
from candor.verbal.formats import render_turns

PTRUE_QUESTION = "Is the proposed answer:\nA. True\nB. False\nAnswer with the letter only."
PTRUE_CUE = "The proposed answer is:"
LABELS = ("A", "B")


def ptrue_prompt(backend: Backend, record: Record) -> str:
    user = f"Question: {question_text(record.item)}\nProposed answer: {record_answer(record)}\n{PTRUE_QUESTION}"
    return render_turns(backend, None, user, PTRUE_CUE)


@ESTIMATORS.register("p-true")
class PTrue(Estimator):
    """P("A" = True) for the greedy answer, from next-token log-probs."""

    name = "p-true"
    needs_backend = True
    requires = frozenset({NEXT_TOKEN_LOGPROBS})
    level = "answer"

    def _estimate(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        assert backend is not None  # checked by estimate()
        prompts = [ptrue_prompt(backend, r) for r in records]
        return candidate_distribution(backend, prompts, LABELS)[:, 0]
