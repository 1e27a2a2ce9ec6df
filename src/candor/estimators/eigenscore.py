"""``eigenscore``: INSIDE's EigenScore (Chen et al., 2024) from the samples' hidden states.

Each sample j is embedded as the hidden state z_j of the last token of
``prompt + sample`` at a middle layer (see :mod:`candor.estimators.hidden_layers`);
the ``hf`` backend runs each record's prompt once for all its samples
(:func:`candor.backends.base.continuation_hidden_states`).
With Z the k×d matrix of embeddings and J_d = I_d - (1/d) 1 1ᵀ the centring
matrix over features, Σ = Z J_d Zᵀ is the k×k covariance between samples
(the paper's Eq. 4, unscaled), and

    E = (1/k) log det(Σ + α I) = (1/k) Σ_i ln λ_i(Σ + α I),  α = 1e-3.

Agreeing samples give a near-singular Σ and a low E. Confidence
``1 / (1 + exp(E))`` (a sigmoid of -E): identical samples give a confidence
near 1, widely spread ones a confidence near 0. The paper's released code
differs from its equation: it divides Σ by d - 1 (``torch.cov``) and uses
log10; candor follows the equation, as lm-polygraph does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from candor.annotation.prompts import record_prompts
from candor.annotation.records import Record
from candor.backends.base import Backend, continuation_hidden_states
from candor.estimators.base import ESTIMATORS, Estimator
from candor.estimators.hidden_layers import middle_layer
from candor.estimators.semantic import require_samples
from candor.util.errors import CandorError


def eigenscore(embeddings: np.ndarray, alpha: float = 1e-3) -> float:
    """(1/k) log det(Z J_d Zᵀ + alpha·I): the mean log eigenvalue of the samples' regularized covariance."""
    z = np.asarray(embeddings, dtype=float)
    centred = z - z.mean(axis=1, keepdims=True)  # Z J_d: each embedding centred over its features
    eigenvalues = np.linalg.eigvalsh(centred @ centred.T + alpha * np.eye(len(z)))
    return float(np.mean(np.log(eigenvalues)))


@ESTIMATORS.register("eigenscore")
class EigenScore(Estimator):
    """1 / (1 + exp(EigenScore)) over the samples' middle-layer sentence embeddings."""

    name = "eigenscore"
    level = "question"
    default_samples = 5
    needs_backend = True
    needs_hidden_states = True

    def __init__(self, layer: int | None = None, alpha: float = 1e-3) -> None:
        if alpha <= 0:
            raise CandorError(f"eigenscore: alpha must be positive, got {alpha}")
        self.layer = layer
        self.alpha = float(alpha)

    def _estimate(self, records: Sequence[Record], backend: Backend | None) -> np.ndarray:
        assert backend is not None  # checked by estimate()
        layer = self.layer if self.layer is not None else middle_layer(backend)
        prompts, _ = record_prompts(records, backend)
        samples = [require_samples(rec, self.name) for rec in records]
        # Each record's prompt runs once for all its samples (backends that can share it).
        states = continuation_hidden_states(backend, prompts, samples, layer=layer)
        scores = [eigenscore(s, self.alpha) for s in states]
        return 1.0 / (1.0 + np.exp(np.array(scores)))

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "layer": self.layer if self.layer is not None else "middle", "alpha": self.alpha}
