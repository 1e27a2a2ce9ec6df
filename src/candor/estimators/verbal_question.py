"""Question-level verbal confidence: ``verbal-0`` and ``verbal-10`` (docs/methods.md "Training-free estimators").

Asked before any answer exists; the answer-level formats (``verbal-letter``
and the rest) live in :mod:`candor.estimators.verbal_answer`.

The model is asked, before answering, whether it can answer the question
correctly, and states a score between 0 and 1. The reply is parsed by
:func:`parse_verbal_score`:

- the *last* number in the reply that lies in [0, 1] is the score
  ("0.8" → 0.8, "Score: 1" → 1.0, "I'd say 0.35." → 0.35);
- a number followed by "%" is a percentage ("70%" → 0.7), since a model asked
  for a probability often answers in percent;
- numbers outside [0, 1] ("8 out of 10") are ignored, as is a number glued to
  a letter, a dot or a minus sign;
- a reply with no usable number gets :data:`FALLBACK_SCORE` (0.5). Each
  estimate logs how many replies fell back and keeps the count in
  ``last_fallbacks``.

``verbal-10`` shows 10 fixed in-context examples whose scores are their sample
accuracies. Given training records (``examples=``), it draws 10 of them with a
fixed seed; otherwise it uses :data:`BUILTIN_EXAMPLES`, 10 questions written
for candor with scores a small model might plausibly earn on them.
"""

from __future__ import annotations

import logging
import random
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from candor.annotation.prompts import question_text
from candor.annotation.records import Record
from candor.backends.base import Backend, SamplingParams
from candor.estimators.base import ESTIMATORS, Estimator
from candor.util.errors import CandorError
from candor.verbal.formats import render_turns

logger = logging.getLogger(__name__)

FALLBACK_SCORE = 0.5

INSTRUCTION = (
    "Judge whether you can provide a correct answer to the question below. "
    "Do not answer the question. Output a score between 0 and 1 that measures how likely your answer "
    "would be correct: 1 means you are sure to answer it correctly, 0 means you are sure you cannot."
)
EXAMPLES_HEADER = "Here are some questions with the scores they deserve:"
SCORE_CUE = "Score:"

# Written for candor: easy to hard, scored as a small model's sample accuracy might be.
BUILTIN_EXAMPLES: tuple[tuple[str, float], ...] = (
    ("What is the capital of France?", 1.0),
    ("How many legs does a spider have?", 0.9),
    ("Who wrote the novel Pride and Prejudice?", 0.8),
    ("What is the chemical symbol for gold?", 0.7),
    ("In which year did humans first land on the Moon?", 0.6),
    ("What is the highest mountain in Africa?", 0.5),
    ("Who was the first woman to win a Nobel Prize?", 0.4),
    ("What is the capital city of Burkina Faso?", 0.3),
    ("Who directed the 1962 film Lawrence of Arabia?", 0.2),
    ("In which year was the Peace of Westphalia signed?", 0.1),
)
N_EXAMPLES = 10

_NUMBER = re.compile(r"(?<![\w.\-])(\d+(?:\.\d+)?|\.\d+)(\s*%)?")


def parse_verbal_score(text: str) -> float | None:
    """The last number in [0, 1] in ``text`` (percentages divided by 100), or None."""
    score = None
    for m in _NUMBER.finditer(text):
        value = float(m.group(1)) / (100.0 if m.group(2) else 1.0)
        if 0.0 <= value <= 1.0:
            score = value
    return score


def _format_score(score: float) -> str:
    return f"{round(score, 2):g}" if score not in (0.0, 1.0) else f"{score:.1f}"


class _VerbalScore(Estimator):
    """Ask for a 0-1 score with the chat template (plain text for models without one)."""

    needs_backend = True
    level = "question"
    max_new_tokens = 16

    def __init__(self) -> None:
        self.last_fallbacks = 0
        self.total_fallbacks = 0

    def examples(self) -> Sequence[tuple[str, float]]:
        return ()

    def prompt(self, backend: Backend, record: Record) -> str:
        parts = [INSTRUCTION]
        shots = self.examples()
        if shots:
            block = "\n\n".join(f"Question: {q}\n{SCORE_CUE} {_format_score(s)}" for q, s in shots)
            parts.append(f"{EXAMPLES_HEADER}\n\n{block}")
        parts.append(f"Question: {question_text(record.item)}")
        return render_turns(backend, None, "\n\n".join(parts), SCORE_CUE)

    def _estimate(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        assert backend is not None  # checked by estimate()
        prompts = [self.prompt(backend, r) for r in records]
        params = SamplingParams(max_new_tokens=self.max_new_tokens, stop=("\n",))
        gens = backend.generate(prompts, 0, params, greedy=True)
        scores = [parse_verbal_score(g.greedy.text if g.greedy is not None else "") for g in gens]
        self.last_fallbacks = sum(s is None for s in scores)
        self.total_fallbacks += self.last_fallbacks
        if self.last_fallbacks:
            logger.warning(
                "%s: %d of %d replies had no score in [0, 1]; they get %.1f",
                self.name,
                self.last_fallbacks,
                len(records),
                FALLBACK_SCORE,
            )
        return np.array([FALLBACK_SCORE if s is None else s for s in scores])


@ESTIMATORS.register("verbal-0")
class VerbalZeroShot(_VerbalScore):
    """``verbal-0``: the question and the instruction, no examples."""

    name = "verbal-0"


@ESTIMATORS.register("verbal-10")
class VerbalTenShot(_VerbalScore):
    """``verbal-10``: 10 in-context examples scored by their sample accuracy (see the module docstring)."""

    name = "verbal-10"

    def __init__(self, examples: Sequence[Record] | None = None, seed: int = 0) -> None:
        super().__init__()
        self.seed = seed
        self._shots = BUILTIN_EXAMPLES if examples is None else self._draw(examples, seed)

    @staticmethod
    def _draw(records: Sequence[Record], seed: int) -> tuple[tuple[str, float], ...]:
        scored = [r for r in records if r.sample_correct]
        if len(scored) < N_EXAMPLES:
            raise CandorError(
                f"verbal-10 needs {N_EXAMPLES} example records with sample correctness, got {len(scored)}"
            )
        chosen = random.Random(seed).sample(scored, N_EXAMPLES)
        return tuple((question_text(r.item), r.sample_accuracy) for r in chosen)

    def examples(self) -> Sequence[tuple[str, float]]:
        return self._shots

    def describe(self) -> dict[str, Any]:
        builtin = self._shots is BUILTIN_EXAMPLES
        return {**super().describe(), "examples": "builtin" if builtin else "records", "seed": self.seed}
