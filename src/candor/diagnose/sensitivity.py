"""Answer sensitivity: does P(C | q, a) change when the answer changes? (docs/methods.md "ADVICE and ConfTuner")

For every question, P(C | q, a_i) is read for each candidate answer a_i
(inference-time scoring, :func:`candor.verbal.formats.confidence_distribution`)
and the Jensen-Shannon divergence of every pair of candidates is taken, with
the natural log, so it lies in [0, ln 2]. A model whose confidence ignores the
answer gives near-identical distributions: most pairs at JSD ≤ 0.1, which the
ADVICE paper reports for untrained models.

The summary also says whether μ tracks the candidate's correctness: the
Pearson correlation pooled over all candidates (point-biserial, as correctness
is 0/1), its mean within questions that have both correct and wrong
candidates (question difficulty removed), and the pooled AUROC.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from candor.backends.base import Backend
from candor.diagnose.candidates import CandidateSet
from candor.verbal.formats import confidence_distribution, expected_confidence, get_format

logger = logging.getLogger(__name__)

JSD_THRESHOLD = 0.1
CHUNK_QUESTIONS = 10  # questions per scoring call, so progress shows in the log


def jensen_shannon(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """JSD(p ‖ q) in nats along the last axis: ½KL(p‖m) + ½KL(q‖m), m = ½(p + q); 0·log 0 = 0."""
    p, q = np.asarray(p, dtype=float), np.asarray(q, dtype=float)
    m = 0.5 * (p + q)
    return 0.5 * (_kl(p, m) + _kl(q, m))


def _kl(p: np.ndarray, m: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * np.log(p / m), 0.0)
    return terms.sum(axis=-1)


def pairwise_jsd(distributions: np.ndarray) -> np.ndarray:
    """JSD of every unordered pair of rows (i < j), in ``np.triu_indices`` order."""
    dist = np.asarray(distributions, dtype=float)
    i, j = np.triu_indices(len(dist), k=1)
    return jensen_shannon(dist[i], dist[j])


@dataclass
class QuestionSensitivity:
    """One question's candidates: P(C | q, a_i) per row, μ_i, correctness and the pairwise JSDs."""

    item_id: str
    dataset: str
    answers: list[str]
    correct: np.ndarray
    distributions: np.ndarray
    mu: np.ndarray
    jsd: np.ndarray

    def to_dict(self) -> dict[str, Any]:
        return {
            "item_id": self.item_id,
            "dataset": self.dataset,
            "answers": self.answers,
            "correct": self.correct.astype(int).tolist(),
            "distributions": np.round(self.distributions, 6).tolist(),
            "mu": self.mu.tolist(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> QuestionSensitivity:
        dist = np.asarray(d["distributions"], dtype=float)
        return cls(
            item_id=d["item_id"],
            dataset=d["dataset"],
            answers=list(d["answers"]),
            correct=np.asarray(d["correct"], dtype=int),
            distributions=dist,
            mu=np.asarray(d["mu"], dtype=float),
            jsd=pairwise_jsd(dist),
        )


@dataclass
class SensitivityResult:
    """Answer sensitivity of one model over many questions, with its summary numbers."""

    fmt: str
    questions: list[QuestionSensitivity]

    @property
    def all_jsd(self) -> np.ndarray:
        return np.concatenate([q.jsd for q in self.questions]) if self.questions else np.zeros(0)

    def share_jsd_at_most(self, threshold: float = JSD_THRESHOLD) -> float:
        values = self.all_jsd
        return float(np.mean(values <= threshold)) if len(values) else float("nan")

    def summary(self) -> dict[str, Any]:
        values = self.all_jsd
        mu = np.concatenate([q.mu for q in self.questions]) if self.questions else np.zeros(0)
        correct = np.concatenate([q.correct for q in self.questions]) if self.questions else np.zeros(0)
        return {
            "n_questions": len(self.questions),
            "n_candidates": int(len(mu)),
            "n_pairs": int(len(values)),
            "share_jsd_le_0.1": self.share_jsd_at_most(JSD_THRESHOLD),
            "mean_jsd": float(values.mean()) if len(values) else float("nan"),
            "median_jsd": float(np.median(values)) if len(values) else float("nan"),
            "mean_mu": float(mu.mean()) if len(mu) else float("nan"),
            "candidate_accuracy": float(correct.mean()) if len(correct) else float("nan"),
            "corr_mu_correct": pearson(mu, correct),
            "within_question_corr_mu_correct": within_question_correlation(self.questions),
            "auroc_mu_correct": _auroc(mu, correct),
        }

    def to_dict(self) -> dict[str, Any]:
        return {"fmt": self.fmt, "questions": [q.to_dict() for q in self.questions]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SensitivityResult:
        return cls(d["fmt"], [QuestionSensitivity.from_dict(q) for q in d["questions"]])


def pearson(x: np.ndarray, y: np.ndarray) -> float:
    """Pearson r, NaN (with a log line) when either side is constant or there are fewer than 2 points."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        logger.info("correlation undefined: %d points, one side constant", len(x))
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


def within_question_correlation(questions: Sequence[QuestionSensitivity]) -> float:
    """Mean Pearson r of μ and correctness over questions with both classes and varying μ."""
    values = []
    for q in questions:
        if 0 < q.correct.sum() < len(q.correct) and np.ptp(q.mu) > 0:
            values.append(float(np.corrcoef(q.mu, q.correct)[0, 1]))
    return float(np.mean(values)) if values else float("nan")


def _auroc(score: np.ndarray, label: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    if len(np.unique(label)) < 2:
        return float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(roc_auc_score(label, score))


def answer_sensitivity(
    backend: Backend, candidates: Sequence[CandidateSet], fmt: str = "number", variant: str = "default"
) -> SensitivityResult:
    """P(C | q, a_i) for every candidate of every question, and the pairwise JSDs."""
    verbal = get_format(fmt)
    out: list[QuestionSensitivity] = []
    for start in range(0, len(candidates), CHUNK_QUESTIONS):
        chunk = candidates[start : start + CHUNK_QUESTIONS]
        items = [c.item for c in chunk for _ in c.answers]
        answers = [a for c in chunk for a in c.answers]
        dist = confidence_distribution(backend, items, answers, verbal, variant)
        row = 0
        for c in chunk:
            part = dist[row : row + len(c)]
            row += len(c)
            out.append(
                QuestionSensitivity(
                    item_id=c.item.id,
                    dataset=c.item.dataset,
                    answers=list(c.answers),
                    correct=np.asarray(c.correct),
                    distributions=part,
                    mu=expected_confidence(part, verbal),
                    jsd=pairwise_jsd(part),
                )
            )
        logger.info("answer sensitivity: %d/%d questions", len(out), len(candidates))
    return SensitivityResult(verbal.key, out)
