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

Published with an NLI model (DeBERTa-MNLI) as the equivalence judge; here the
judge is any consistency judge (``lexical`` by default, ``llm``, or
``embedding`` where installed), named in the estimator's provenance.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from candor.annotation.records import Record
from candor.backends.base import Backend
from candor.estimators.base import ESTIMATORS, Estimator
from candor.estimators.semantic import ClusterEstimator, require_samples, sequence_logprob


def entropy(p: np.ndarray) -> float:
    """Shannon entropy (nats) of a probability vector; zero entries contribute nothing."""
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def cluster_probabilities(logprobs: np.ndarray, clusters: Sequence[int]) -> np.ndarray:
    """Each cluster's share of the samples' total probability mass (log-sum-exp, so long answers do not underflow)."""
    ids = np.asarray(clusters)
    shifted = np.exp(logprobs - logprobs.max())
    mass = np.array([shifted[ids == c].sum() for c in range(ids.max() + 1)])
    return mass / mass.sum()


@ESTIMATORS.register("mc-entropy")
class MonteCarloEntropy(Estimator):
    """exp(-H) with H = -mean over samples of the sample's sequence log-prob."""

    name = "mc-entropy"
    level = "question"
    default_samples = 5

    def _estimate(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        out = []
        for rec in records:
            require_samples(rec, self.name)
            h = -np.mean([sequence_logprob(rec, j) for j in range(rec.k)])
            out.append(float(np.exp(-h)))
        return np.array(out)


@ESTIMATORS.register("semantic-entropy")
class SemanticEntropy(ClusterEstimator):
    """exp(-H) over semantic clusters weighted by length-normalized probabilities (normalized over clusters)."""

    name = "semantic-entropy"

    def from_clusters(self, record: Record, clusters: list[int]) -> float:
        logprobs = np.array([sequence_logprob(record, j, mean=True) for j in range(record.k)])
        return float(np.exp(-entropy(cluster_probabilities(logprobs, clusters))))


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
