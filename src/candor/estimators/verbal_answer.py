"""Answer-level verbalized confidence estimators: one per format × variant.

See docs/methods.md "Verbalized answer-level confidence", "ADVICE and ConfTuner".

They score a given answer; the question-level ``verbal-0``/``verbal-10`` live
in :mod:`candor.estimators.verbal_question`.

``verbal-letter``, ``verbal-number``, ``verbal-text``, ``verbal-float`` and
``verbal-percent`` use the Default prompt; each has a ``…-prompting`` twin
with the Prompting sentence. They score the record's greedy answer (its option
letter for multiple choice) with μ = Σ_c P(c | q, a)·value(c); see
:mod:`candor.verbal.formats`.

``min_mass`` (opt-in, hf backend): an approximation that reads the labels'
token trie only under nodes of probability ``min_mass`` or more, dropping
the labels below the others (ScorePercent's 101 multi-token labels cost a
fraction of the exact reading). Each record's μ is then within
``last_error_bound`` of the exact μ (see
:func:`candor.verbal.distribution.pruned_candidate_distribution`). Exact
(``min_mass`` 0) is the default.
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
from candor.util.errors import CandorError
from candor.verbal.distribution import pruned_candidate_distribution
from candor.verbal.formats import (
    FORMATS,
    VARIANTS,
    distribution_from_prompts,
    expected_confidence,
    format_prompt,
    get_format,
    mu_error_bound,
)


class VerbalizedConfidence(Estimator):
    """μ of the format's confidence distribution after ``Answer: {a}\\nConfidence:``.

    On a black-box backend the confidence is generated and parsed; replies
    that state none count in ``last_fallbacks`` and get μ = 0.5.
    """

    needs_backend = True
    level = "answer"

    def __init__(self, fmt: str = "letter", variant: str = "default", min_mass: float = 0.0) -> None:
        self.fmt = get_format(fmt)
        if not 0 <= min_mass < 1:
            raise CandorError(f"{fmt}: min_mass must be in [0, 1) (0: exact), got {min_mass}")
        self.min_mass = float(min_mass)
        self.last_error_bound: np.ndarray | None = None  # per record, with min_mass: |μ - exact μ| at most this
        VARIANTS.get(variant)  # an unknown variant fails here, not at scoring time
        self.variant = variant
        suffix = "" if variant == "default" else f"-{variant}"
        self.name = f"verbal-{self.fmt.key}{suffix}"
        self.last_fallbacks = 0
        self.last_distribution: np.ndarray | None = None

    def _estimate(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        assert backend is not None  # checked by estimate()
        prompts = [format_prompt(backend, r.item, record_answer(r), self.fmt, self.variant) for r in records]
        if self.min_mass:
            dist, dropped = pruned_candidate_distribution(backend, prompts, self.fmt.labels, self.min_mass)
            self.last_fallbacks = 0
        else:
            dist, self.last_fallbacks = distribution_from_prompts(backend, prompts, self.fmt)
        self.last_distribution = dist
        mu = expected_confidence(dist, self.fmt)
        self.last_error_bound = mu_error_bound(dropped, mu, self.fmt) if self.min_mass else None
        return mu

    def describe(self) -> dict[str, Any]:
        out = {**super().describe(), "format": self.fmt.name, "variant": self.variant}
        if self.min_mass:  # the approximation; exact columns keep their provenance unchanged
            out["min_mass"] = self.min_mass
        return out


for _key in FORMATS.names():
    for _variant in VARIANTS.names():
        _name = f"verbal-{_key}" + ("" if _variant == "default" else f"-{_variant}")
        ESTIMATORS.register(_name)(functools.partial(VerbalizedConfidence, fmt=_key, variant=_variant))
