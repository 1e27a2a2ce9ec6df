"""Scores for a model that may abstain (docs/methods.md "Abstention-aware scores").

A thresholded method answers a question when its confidence is at least the
threshold and abstains otherwise. Over ``n`` questions that gives three counts,
*correct* (answered and right), *incorrect* (answered and wrong) and
*abstained*, and from them:

- ``overall_correct`` = correct / n and ``correct_given_attempted`` =
  correct / (correct + incorrect): SimpleQA's pair (Wei et al., 2024,
  arXiv 2411.04368); the second is undefined (NaN) when nothing is attempted;
- ``simpleqa_f``: their harmonic mean, SimpleQA's F-score (0 when nothing is
  correct, as in the official ``simple-evals`` code);
- ``overall_incorrect`` = incorrect / n: how often the model asserts something wrong, over all
  questions (the mirror of ``overall_correct``; candor called it "hallucination rate" before issue 56);
- ``omniscience_hallucination_rate`` = incorrect / (incorrect + abstained): AA-Omniscience's
  "hallucination rate" (Artificial Analysis, 2025), how often the model answers wrong where it does
  not answer right, i.e. over the questions it did not get right; undefined (NaN) when all are correct;
- ``penalized_score`` = (correct − incorrect) / n, in [−1, 1]: a wrong answer
  costs as much as a right one earns and an abstention costs nothing, as in
  the Omniscience Index of AA-Omniscience (Artificial Analysis, 2025), which reports it ×100.

:func:`abstention_scores` computes them with percentile bootstrap intervals
(rows resampled with replacement), per dataset and pooled over all rows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from candor.estimators.confidences import ConfidenceTable
from candor.evaluation.aggregate import json_number, percentile_interval
from candor.evaluation.metrics import check_arrays

COUNTS = ("correct", "incorrect", "abstained")
SCORES = (
    "overall_correct",
    "correct_given_attempted",
    "simpleqa_f",
    "overall_incorrect",
    "omniscience_hallucination_rate",
    "penalized_score",
)
LABELS = {
    "overall_correct": "correct (overall)",
    "correct_given_attempted": "correct | attempted",
    "simpleqa_f": "SimpleQA F",
    "overall_incorrect": "incorrect (overall)",
    "omniscience_hallucination_rate": "hallucination rate (AA-Omniscience)",
    "penalized_score": "penalized score",
}
DEFAULT_BOOTSTRAP = 1000
ALL = "all"


@dataclass(frozen=True)
class Counts:
    """What a thresholded method did on ``n`` questions."""

    correct: int
    incorrect: int
    abstained: int

    @property
    def n(self) -> int:
        return self.correct + self.incorrect + self.abstained


def abstention_counts(confidence: ArrayLike, correct: ArrayLike, threshold: float) -> Counts:
    """Answer when ``confidence >= threshold``: how many answered right, answered wrong, abstained."""
    conf, y = check_arrays(confidence, correct)
    answered = conf >= threshold
    right = int((answered & (y == 1)).sum())
    return Counts(right, int(answered.sum()) - right, int((~answered).sum()))


def scores_from_counts(correct: ArrayLike, incorrect: ArrayLike, n: int) -> dict[str, np.ndarray]:
    """Every score of the module docstring from counts (arrays: one value per bootstrap draw)."""
    c = np.asarray(correct, dtype=float)
    i = np.asarray(incorrect, dtype=float)
    overall = c / n
    with np.errstate(invalid="ignore", divide="ignore"):
        given = np.where(c + i > 0, c / np.maximum(c + i, 1), np.nan)
        f = np.where(c > 0, 2 * overall * given / (overall + given), 0.0)
    return {
        "overall_correct": overall,
        "correct_given_attempted": given,
        "simpleqa_f": f,
        "overall_incorrect": i / n,
        "omniscience_hallucination_rate": np.where(n - c > 0, i / np.maximum(n - c, 1), np.nan),
        "penalized_score": (c - i) / n,
    }


def abstention_scores(
    confidence: ArrayLike,
    correct: ArrayLike,
    threshold: float,
    *,
    bootstrap: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
) -> dict[str, Any]:
    """Counts and scores at ``threshold``, each score with a 95% percentile bootstrap interval (``ci``)."""
    conf, y = check_arrays(confidence, correct)
    counts = abstention_counts(conf, y, threshold)
    point = {k: float(v) for k, v in scores_from_counts(counts.correct, counts.incorrect, counts.n).items()}
    out: dict[str, Any] = {
        "threshold": float(threshold),
        "n": counts.n,
        "correct": counts.correct,
        "incorrect": counts.incorrect,
        "abstained": counts.abstained,
        **{k: json_number(v) for k, v in point.items()},
        "ci": {},
    }
    if bootstrap > 0:
        answered = conf >= threshold
        right, wrong = (answered & (y == 1)).astype(int), (answered & (y == 0)).astype(int)
        rows = np.random.default_rng(seed).integers(0, y.size, size=(bootstrap, y.size))
        drawn = scores_from_counts(right[rows].sum(axis=1), wrong[rows].sum(axis=1), y.size)
        for name in SCORES:
            (low, high), _ = percentile_interval(drawn[name])
            out["ci"][name] = [json_number(low), json_number(high)]
    return out


def abstention_table(
    table: ConfidenceTable, thresholds: Mapping[str, float], *, bootstrap: int = DEFAULT_BOOTSTRAP, seed: int = 0
) -> dict[str, dict[str, dict[str, Any]]]:
    """method → dataset (and ``"all"``, pooled) → :func:`abstention_scores` at the method's threshold."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for method, threshold in thresholds.items():
        out[method] = {}
        for dataset in [*table.datasets, ALL]:
            conf, y = table.arrays(method, None if dataset == ALL else dataset)
            out[method][dataset] = abstention_scores(conf, y, threshold, bootstrap=bootstrap, seed=seed)
    return out


def format_score(entry: Mapping[str, Any], name: str) -> str:
    """One score ×100 with its interval, e.g. ``-12.0 [-20, -4]`` ("–" when undefined)."""
    value = entry.get(name)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    low, high = entry.get("ci", {}).get(name, [None, None])
    interval = f" [{100 * low:.0f}, {100 * high:.0f}]" if low is not None and high is not None else ""
    return f"{100 * value:.1f}{interval}"
