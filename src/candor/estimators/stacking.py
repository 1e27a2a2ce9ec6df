"""A logistic regression on standardized scores, fitted on dev records (docs/methods.md "Ensembles and debiasing").

The ``ensemble`` estimator stacks its members' confidences with it, and the
``debias`` option maps a length-debiased residual back to [0, 1] with it (a
Platt-style calibrator). Each column is standardized by its dev mean and
standard deviation first, so the coefficients compare across columns (a
member's weight is its pull per dev standard deviation) and the L2 penalty
(scikit-learn's default, C = 1) treats every column alike.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from candor.util.errors import CandorError


@dataclass(frozen=True)
class LogisticFit:
    """``sigmoid(intercept + Σ coef_j · (x_j − mean_j) / scale_j)``."""

    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray
    intercept: float

    def predict(self, features: np.ndarray) -> np.ndarray:
        z = (np.asarray(features, dtype=float) - self.mean) / self.scale
        return 1.0 / (1.0 + np.exp(-(self.intercept + z @ self.coef)))


def fit_logistic(features: np.ndarray, labels: np.ndarray, what: str) -> LogisticFit:
    """Fit on dev ``features`` (rows × columns) against 0/1 ``labels``; ``what`` names the fit in errors."""
    from sklearn.linear_model import LogisticRegression  # here: importing the registry stays light

    x = np.asarray(features, dtype=float)
    y = np.asarray(labels, dtype=int)
    if y.size == 0 or y.min() == y.max():
        raise CandorError(
            f"{what}: the dev records need both correct and wrong greedy answers to fit "
            f"({y.size} labelled, {int(y.sum())} correct)"
        )
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale = np.where(scale > 0, scale, 1.0)  # a constant column gets weight ~0 rather than a division by zero
    model = LogisticRegression(C=1.0).fit((x - mean) / scale, y)
    return LogisticFit(mean, scale, model.coef_[0].astype(float), float(model.intercept_[0]))
