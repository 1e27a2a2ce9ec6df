"""Answer-level verbalized confidence estimators: one per format × variant (DESIGN.md §4.3, §4.5).

They score a given answer; the question-level ``verbal-0``/``verbal-10`` live
in :mod:`candor.estimators.verbal_question`.

``verbal-letter``, ``verbal-number``, ``verbal-text``, ``verbal-float`` and
``verbal-percent`` use the Default prompt; each has a ``…-prompting`` twin
with the Prompting sentence. They score the record's greedy answer (its option
letter for multiple choice) with μ = Σ_c P(c | q, a)·value(c); see
:mod:`candor.verbal.formats`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from candor.annotation.records import Record
from candor.backends.base import Backend
from candor.estimators.answers import record_answer
from candor.estimators.base import ESTIMATORS, Estimator
from candor.verbal.formats import (
    FORMATS,
    VARIANTS,
    distribution_from_prompts,
    expected_confidence,
    format_prompt,
    get_format,
)


class VerbalizedConfidence(Estimator):
    """μ of the format's confidence distribution after ``Answer: {a}\\nConfidence:``.

    On a black-box backend the confidence is generated and parsed; replies
    that state none count in ``last_fallbacks`` and get μ = 0.5.
    """

    needs_backend = True
    level = "answer"

    def __init__(self, fmt: str = "letter", variant: str = "default") -> None:
        self.fmt = get_format(fmt)
        VARIANTS.get(variant)  # an unknown variant fails here, not at scoring time
        self.variant = variant
        suffix = "" if variant == "default" else f"-{variant}"
        self.name = f"verbal-{self.fmt.key}{suffix}"
        self.last_fallbacks = 0
        self.last_distribution: np.ndarray | None = None

    def _estimate(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        assert backend is not None  # checked by estimate()
        prompts = [format_prompt(backend, r.item, record_answer(r), self.fmt, self.variant) for r in records]
        dist, self.last_fallbacks = distribution_from_prompts(backend, prompts, self.fmt)
        self.last_distribution = dist
        return expected_confidence(dist, self.fmt)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "format": self.fmt.name, "variant": self.variant}


for _key in FORMATS.names():
    for _variant in VARIANTS.names():
        _name = f"verbal-{_key}" + ("" if _variant == "default" else f"-{_variant}")
        ESTIMATORS.register(_name)(functools.partial(VerbalizedConfidence, fmt=_key, variant=_variant))
