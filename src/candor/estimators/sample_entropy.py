"""Entropies over the sampled answers: Monte Carlo sequence entropy, semantic entropy, semantic sets.

Entropies are in nats and become confidences as ``exp(-H)``; with k samples a
discrete entropy lies in [0, log k], so its confidence lies in [1/k, 1].

- ``mc-entropy``: H = -(1/k) Σ_j log p(s_j), the Monte Carlo estimate of the
  sequence entropy from the samples' own log-probs (sums over tokens).
  Confidence exp(-H) is the geometric mean of the samples' probabilities.
- ``semantic-entropy``: the samples are clustered by bidirectional equivalence
  under a consistency judge (:func:`candor.estimators.semantic.semantic_clusters`);
  a cluster's probability is the sum of its members' length-normalized
  sequence probabilities exp(mean token log-prob), normalized over the
  clusters, and H = -Σ_c p(c) log p(c): the Nature-paper estimator (Farquhar
  et al., 2024, whose code length-normalizes by default). lm-polygraph's
  default is instead Kuhn et al.'s (2023) Monte Carlo estimate
  -mean_j log Σ_{i in c(j)} p_i with unnormalized sequence probabilities.
- ``semantic-entropy-discrete``: the same clusters weighted by their share of
  the samples, p(c) = n_c / k (Farquhar et al.'s discrete variant, for
  black-box models).
- ``num-sem-sets``: confidence 1 / (number of semantic clusters).

An answer that is only a stop weighs what its stop token's probability says
(:func:`candor.estimators.semantic.sequence_logprob`), not probability 1.

Published with an NLI model (DeBERTa-MNLI) as the equivalence judge; here the
judge is any consistency judge (``lexical`` by default, ``llm``, or
``embedding`` where installed), named in the estimator's provenance.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from candor.annotation.records import Record
from candor.backends.base import LOGPROBS, Backend
from candor.estimators.base import ESTIMATORS, Estimator
from candor.estimators.semantic import ClusterEstimator, sample_logprobs


def entropy(p: np.ndarray) -> float:
    """Shannon entropy (nats) of a probability vector; zero entries contribute nothing."""
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def cluster_probabilities(logprobs: np.ndarray, clusters: Sequence[int]) -> np.ndarray:
    """Each cluster's share of the samples' total probability mass (log-sum-exp, so long answers do not underflow).

    A sample whose log-prob is unknown (NaN) adds no mass.
    """
    ids = np.asarray(clusters)
    known = ~np.isnan(logprobs)
    shifted = np.where(known, np.exp(logprobs - np.max(logprobs[known])), 0.0)
    mass = np.array([shifted[ids == c].sum() for c in range(ids.max() + 1)])
    return mass / mass.sum()


@ESTIMATORS.register("mc-entropy")
class MonteCarloEntropy(Estimator):
    """exp(-H) with H = -mean over samples of the sample's sequence log-prob."""

    name = "mc-entropy"
    level = "question"
    requires = frozenset({LOGPROBS})
    default_samples = 5

    def _estimate(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        return np.array([float(np.exp(np.nanmean(lps))) for lps in sample_logprobs(records, self.name)])


@ESTIMATORS.register("semantic-entropy")
class SemanticEntropy(ClusterEstimator):
    """exp(-H) over semantic clusters weighted by length-normalized probabilities (normalized over clusters)."""

    name = "semantic-entropy"
    requires = frozenset({LOGPROBS})

    def _estimate(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        logprobs = sample_logprobs(records, self.name, mean=True)
        clusters = self.clusters(records, backend)
        pairs = zip(logprobs, clusters, strict=True)
        return np.array([float(np.exp(-entropy(cluster_probabilities(lps, ids)))) for lps, ids in pairs])


@ESTIMATORS.register("semantic-entropy-discrete")
class DiscreteSemanticEntropy(ClusterEstimator):
    """exp(-H) over semantic clusters weighted by their share of the samples."""

    name = "semantic-entropy-discrete"

    def from_clusters(self, record: Record, clusters: list[int]) -> float:
        counts = np.bincount(clusters).astype(float)
        return float(np.exp(-entropy(counts / counts.sum())))


@ESTIMATORS.register("num-sem-sets")
class NumSemanticSets(ClusterEstimator):
    """1 / the number of semantic clusters among the samples."""

    name = "num-sem-sets"

    def from_clusters(self, record: Record, clusters: list[int]) -> float:
        return 1.0 / (max(clusters) + 1)
