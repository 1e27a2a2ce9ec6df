"""Which part of the scoring prompt each token belongs to: BOS, template, question or answer.

The prompt is the §4.3 format prompt that ends ``Answer: {a}\\nConfidence:``.
Tokens are placed by the character offsets of a fast tokenizer: a token that
overlaps the answer text is an answer token (SmolLM2's " William" starts on
the space before the answer and still counts), one that overlaps the
question text is a question token, the first token of the sequence is "bos"
(the chat template's opening token, where attention sinks; for a prompt
without one, simply the first token), and everything else (system text, chat
markup, "Answer:", "Confidence:") is "template".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from candor.annotation.prompts import question_text
from candor.backends.tokens import encode_with_offsets
from candor.data.items import QAItem
from candor.util.errors import CandorError
from candor.verbal.scorer import build_prompt, token_span

REGIONS = ("bos", "template", "question", "answer")
BOS, TEMPLATE, QUESTION, ANSWER = range(len(REGIONS))


@dataclass(frozen=True)
class PromptRegions:
    """A scoring prompt's token ids and the region index (into :data:`REGIONS`) of each token."""

    prompt: str
    ids: tuple[int, ...]
    roles: np.ndarray

    @property
    def answer_span(self) -> tuple[int, int]:
        """``[start, end)`` token indices of the answer (it is contiguous)."""
        where = np.flatnonzero(self.roles == ANSWER)
        return (int(where[0]), int(where[-1]) + 1) if len(where) else (0, 0)

    def mass(self, weights: np.ndarray) -> dict[str, float]:
        """Sum of ``weights`` (one per token) in each region."""
        weights = np.asarray(weights, dtype=float)
        return {name: float(weights[self.roles == k].sum()) for k, name in enumerate(REGIONS)}


def prompt_regions(tokenizer: Any, item: QAItem, answer: str, fmt: str, variant: str = "default") -> PromptRegions:
    """The scoring prompt for ``(item, answer)`` as token ids, each labelled with its region.

    Ids and the answer's span come from
    :func:`candor.verbal.scorer.build_prompt`, so they are exactly what
    the label scorer reads.
    """
    prompt = build_prompt(tokenizer, item, answer, fmt, variant)
    _, offsets = encode_with_offsets(tokenizer, prompt.text)
    roles = np.full(len(prompt.ids), TEMPLATE, dtype=np.int64)
    question = question_text(item)
    answer_char = offsets[prompt.answer_start][0] if prompt.answer_start < len(offsets) else len(prompt.text)
    q0 = prompt.text.rfind(question, 0, answer_char)
    if q0 < 0:
        raise CandorError(f"the format prompt does not show the question {question[:60]!r}")
    q_start, q_end = token_span(offsets, q0, q0 + len(question))
    roles[q_start:q_end] = QUESTION
    roles[prompt.answer_start : prompt.answer_end] = ANSWER
    roles[0] = BOS
    return PromptRegions(prompt.text, prompt.ids, roles)
