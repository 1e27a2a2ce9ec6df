"""``cocoa``: confidence × consistency (CoCoA, Vashurin et al., 2025), the MSP variant.

U = u_conf · u_cons with u_conf = -log p(greedy answer) (the sum of its token
log-probs) and u_cons = 1 - mean_j sim(greedy, sample_j), the greedy answer's
mean dissimilarity to the samples under the ``similarity=`` option
(lexical ROUGE-L by default; the paper uses a cross-encoder or NLI).
Confidence exp(-U) = p(greedy)^(1 - mean similarity): an answer all the
samples agree with is fully trusted, and one none agrees with keeps its
sequence probability.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from candor.annotation.records import Record
from candor.backends.base import LOGPROBS, Backend
from candor.estimators.base import ESTIMATORS
from candor.estimators.logprob import greedy_logprobs
from candor.estimators.semantic import SimilarityEstimator, cross_similarities, get_similarity, require_samples


def cocoa_uncertainty(greedy_logprob: float, similarities: np.ndarray) -> float:
    """(-log p(greedy)) × (1 - mean similarity to the samples)."""
    return float(-greedy_logprob * (1.0 - similarities.mean()))


@ESTIMATORS.register("cocoa")
class CoCoA(SimilarityEstimator):
    """exp(-(-log p(greedy)) · (1 - mean similarity of the greedy answer to the samples))."""

    name = "cocoa"
    requires = frozenset({LOGPROBS})
    min_samples = 1  # it compares the samples with the greedy answer, not with each other

    def _estimate(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        groups = [require_samples(r, self.name) for r in records]
        sim = get_similarity(self.similarity, backend, self.judge_name)
        sims = cross_similarities([r.greedy.text for r in records], groups, [r.item.question for r in records], sim)
        out = [cocoa_uncertainty(float(greedy_logprobs(r).sum()), s) for r, s in zip(records, sims, strict=True)]
        return np.exp(-np.array(out))
