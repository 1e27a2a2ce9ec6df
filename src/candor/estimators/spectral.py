"""The spectral graph family of Lin et al. (2023, "Generating with Confidence") on a sample-similarity matrix.

W is the k×k similarity matrix of the samples (``similarity=`` option, see
:mod:`candor.estimators.semantic`), D its degree matrix and
L = I - D^{-1/2} W D^{-1/2} its normalized Laplacian, eigenvalues λ_1..λ_k.

- ``eigv``: U = Σ_k max(0, 1 - λ_k), a soft count of semantic clusters in
  [1, k]; confidence 1 / U.
- ``degree``: U = trace(k·I - D) / k² = 1 - mean(W); confidence 1 - U = mean(W).
- ``eccentricity``: the samples embedded by the eigenvectors of L whose
  eigenvalues are below ``threshold`` (0.9, lm-polygraph's default), one row
  per sample; U is the Frobenius norm of those rows centred on their mean
  (how far the samples spread from their centre); confidence 1 / (1 + U).

Lin et al. build W from an NLI model's entailment probabilities; here W comes
from any similarity (lexical ROUGE-L by default).
"""

from __future__ import annotations

import numpy as np

from candor.estimators.base import ESTIMATORS
from candor.estimators.semantic import SimilarityEstimator


def normalized_laplacian(w: np.ndarray) -> np.ndarray:
    """I - D^{-1/2} W D^{-1/2}; degrees are at least 1 because W has a unit diagonal."""
    inv_sqrt = 1.0 / np.sqrt(w.sum(axis=1))
    return np.eye(len(w)) - inv_sqrt[:, None] * w * inv_sqrt[None, :]


def eigv_uncertainty(w: np.ndarray) -> float:
    eigenvalues = np.linalg.eigvalsh(normalized_laplacian(w))
    return float(np.clip(1.0 - eigenvalues, 0.0, None).sum())


def degree_uncertainty(w: np.ndarray) -> float:
    m = len(w)
    return float(np.trace(m * np.eye(m) - np.diag(w.sum(axis=1))) / m**2)


def eccentricity_uncertainty(w: np.ndarray, threshold: float = 0.9) -> float:
    eigenvalues, vectors = np.linalg.eigh(normalized_laplacian(w))
    rows = vectors[:, eigenvalues < threshold]  # [samples, kept eigenvectors]
    return float(np.linalg.norm(rows - rows.mean(axis=0, keepdims=True)))


@ESTIMATORS.register("eigv")
class EigV(SimilarityEstimator):
    """1 / Σ max(0, 1 - λ) over the normalized Laplacian's eigenvalues."""

    name = "eigv"

    def from_matrix(self, similarity: np.ndarray) -> float:
        return 1.0 / eigv_uncertainty(similarity)


@ESTIMATORS.register("degree")
class Degree(SimilarityEstimator):
    """Mean similarity, i.e. 1 - Lin et al.'s degree uncertainty."""

    name = "degree"

    def from_matrix(self, similarity: np.ndarray) -> float:
        return 1.0 - degree_uncertainty(similarity)


@ESTIMATORS.register("eccentricity")
class Eccentricity(SimilarityEstimator):
    """1 / (1 + spread of the samples' spectral embeddings)."""

    name = "eccentricity"

    def __init__(self, similarity: str = "lexical", judge: str = "lexical", threshold: float = 0.9) -> None:
        super().__init__(similarity, judge)
        self.threshold = float(threshold)

    def from_matrix(self, similarity: np.ndarray) -> float:
        return 1.0 / (1.0 + eccentricity_uncertainty(similarity, self.threshold))

    def describe(self) -> dict:
        return {**super().describe(), "threshold": self.threshold}
