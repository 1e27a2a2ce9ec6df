"""``kle``: kernel language entropy (Nikitin et al., 2024) on a sample-similarity matrix.

W is the k×k similarity matrix of the samples (``similarity=`` option), and
L = D - W its graph Laplacian. The heat kernel K = expm(-t L) (``t`` = 0.3 by
default) is scaled to unit diagonal and divided by k, so it is a density
matrix (positive semi-definite, unit trace). Its von Neumann entropy
VNE = -Σ λ log λ over K's eigenvalues lies in [0, log k]; confidence exp(-VNE).

With a finite ``t`` even identical samples keep a little entropy: the kernel
only tends to the all-equal matrix as t grows. The paper builds W from NLI
entailment; here W is any similarity (lexical ROUGE-L by default).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from candor.estimators.base import ESTIMATORS
from candor.estimators.semantic import SimilarityEstimator
from candor.util.errors import CandorError


def heat_kernel_density(w: np.ndarray, t: float) -> np.ndarray:
    """expm(-t (D - W)) scaled to unit diagonal, divided by k: unit trace."""
    laplacian = np.diag(w.sum(axis=1)) - w
    from scipy.linalg import expm  # lazy: scipy.linalg costs a second to import the registry with

    kernel = expm(-t * laplacian)
    d = np.sqrt(np.diag(kernel))
    return kernel / (d[:, None] * d[None, :]) / len(w)


def von_neumann_entropy(rho: np.ndarray) -> float:
    eigenvalues = np.linalg.eigvalsh((rho + rho.T) / 2)
    eigenvalues = eigenvalues[eigenvalues > 1e-12]
    return float(-(eigenvalues * np.log(eigenvalues)).sum())


@ESTIMATORS.register("kle")
class KernelLanguageEntropy(SimilarityEstimator):
    """exp(-von Neumann entropy) of the normalized heat kernel over the samples' similarity graph."""

    name = "kle"

    def __init__(self, similarity: str = "lexical", judge: str = "lexical", t: float = 0.3) -> None:
        super().__init__(similarity, judge)
        if t <= 0:
            raise CandorError(f"kle: the heat kernel's t must be positive, got {t}")
        self.t = float(t)

    def from_matrix(self, similarity: np.ndarray) -> float:
        return float(np.exp(-von_neumann_entropy(heat_kernel_density(similarity, self.t))))

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "t": self.t}
