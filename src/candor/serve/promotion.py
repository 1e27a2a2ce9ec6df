"""Whether an adapted model may replace the one serving: ``candor adapt`` proposes, a held-out check promotes.

``candor adapt`` (:mod:`candor.serve.adaptation`) scores its held-out labels (split from stage 2 by
question, never by record) twice: with the confidence of the model it started from (the one
serving) and with the adapted head. :func:`compare` decides from those paired scores:

- **Statistic**: the held-out AUROC of the adapted head minus the serving one's. The AUROC is what
  the threshold's coverage at a given risk rests on, and it is what an adaptation can lose (a
  calibrator fitted after the fact cannot restore a ranking).
- **Test**: one-sided, paired, **by question**. The held-out questions are resampled with
  replacement (:data:`RESAMPLES` times, seeded); a question brings all its records, both models'
  scores and its labels, so the pairing and the grouping are kept. The p-value is the share of
  resamples where the adapted head is not better, ``(1 + #{Δ* ≤ 0}) / (B + 1)``; a resample with
  one class only (its AUROC undefined) counts as not better. A bootstrap, not a paired t-test,
  because the AUROC is not a mean over questions; its level is approximate at small samples, and
  ``benchmarks/adapt.py`` measures how often a worse head was promoted.
- **Decision** at level δ (``--delta``, the guarantee's δ): **promotable** when p ≤ δ (the null
  "the adapted head ranks no better than the serving one" is rejected), else **kept**. A tie is
  kept: without evidence that the new head is better, the serving one stays.

The decision and its numbers are saved in the new folder's ``adapt.json`` (``promotion``) and
printed. :func:`check_promotable` reads it back for ``POST /admin/reload``, which refuses a folder
marked kept unless the request says ``"force": true``. The comparison is against the model the
folder was adapted from (``adapted_from``), not whatever serves when it is reloaded.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from candor.util.errors import CandorError

PROMOTABLE = "promotable"
KEPT = "kept"
STATUSES = (PROMOTABLE, KEPT)
RESAMPLES = 2000
TEST = (
    "one-sided paired bootstrap over held-out questions of the AUROC difference (adapted minus serving): "
    "promotable when p <= level"
)
SUMMARY_FILE = "adapt.json"  # the folder's adaptation summary (candor.serve.adaptation writes it)
PROMOTION_KEY = "promotion"


class NotPromotable(CandorError):
    """A folder ``candor adapt`` marked kept (or whose mark cannot be read); the message says why."""


@dataclass(frozen=True, kw_only=True)
class Comparison:
    """The held-out comparison of the adapted head with the serving model, and the decision it supports."""

    status: str  # PROMOTABLE or KEPT
    level: float  # the test's level (δ)
    questions: int  # distinct held-out questions (the resampled unit)
    labels: int  # held-out labels (records)
    correct: int  # of them, correct answers
    serving_auroc: float | None
    adapted_auroc: float | None
    difference: float | None  # adapted minus serving
    lower_bound: float | None  # the one-sided (1 − level) bootstrap lower bound of the difference
    p_value: float | None
    resamples: int
    reason: str
    test: str = TEST

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise CandorError(f"promotion status must be one of {', '.join(STATUSES)}, got {self.status!r}")

    @property
    def promotable(self) -> bool:
        return self.status == PROMOTABLE

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def words(self) -> str:
        """One line for the report: the decision, the numbers and the test."""
        if self.difference is None:
            return f"{self.status}: {self.reason}"
        return (
            f"{self.status}: held-out AUROC {self.adapted_auroc:.3f} adapted vs {self.serving_auroc:.3f} serving "
            f"(difference {self.difference:+.3f}, one-sided {1 - self.level:g} lower bound "
            f"{_signed(self.lower_bound)}, "
            f"p = {self.p_value:.3f} at level {self.level:g}; paired bootstrap over {self.questions} held-out "
            f"questions, {self.resamples} resamples); {self.reason}"
        )


def _signed(x: float | None) -> str:
    return "-inf" if x is None else f"{x:+.3f}"


def pair_matrix(scores: np.ndarray, positive: np.ndarray) -> np.ndarray:
    """``M[i, j]`` = 1 when positive i outranks negative j, 0.5 on a tie: the AUROC's pairs."""
    pos, neg = scores[positive][:, None], scores[~positive][None, :]
    return (pos > neg) + 0.5 * (pos == neg)


def weighted_auroc(pairs: np.ndarray, w_pos: np.ndarray, w_neg: np.ndarray) -> np.ndarray:
    """The AUROC of each row of record weights (a resample); NaN where a resample has one class only."""
    num = np.einsum("bp,pq,bq->b", w_pos, pairs, w_neg)
    den = w_pos.sum(axis=1) * w_neg.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


def compare(
    serving: Sequence[float] | np.ndarray,
    adapted: Sequence[float] | np.ndarray,
    correct: Sequence[int] | np.ndarray,
    questions: Sequence[str],
    level: float,
    seed: int = 0,
    resamples: int = RESAMPLES,
) -> Comparison:
    """Paired by question: is the adapted head's held-out AUROC above the serving model's, at ``level``?"""
    s, a = np.asarray(serving, dtype=float), np.asarray(adapted, dtype=float)
    y = np.asarray(correct, dtype=int).astype(bool)
    if not (s.shape == a.shape == y.shape == (len(questions),)):
        raise CandorError(
            f"the comparison needs one serving score, adapted score and label per held-out record, "
            f"got {s.shape}, {a.shape}, {y.shape} and {len(questions)} questions"
        )
    if not 0.0 < level < 1.0:
        raise CandorError(f"the comparison's level must be in (0, 1), got {level}")
    keys = {q: i for i, q in enumerate(dict.fromkeys(questions))}
    group = np.array([keys[q] for q in questions], dtype=int)
    n_groups = len(keys)
    common = {"level": level, "questions": n_groups, "labels": int(y.size), "correct": int(y.sum())}
    if y.all() or not y.any() or not (np.isfinite(s).all() and np.isfinite(a).all()):
        why = (
            "a score is not finite"
            if y.any() and not y.all()
            else f"the held-out labels are all {'correct' if y.size and y.all() else 'wrong'}"
        )
        return Comparison(
            status=KEPT,
            **common,
            serving_auroc=None,
            adapted_auroc=None,
            difference=None,
            lower_bound=None,
            p_value=None,
            resamples=0,
            reason=f"not compared ({why}): the AUROC cannot tell which model ranks better, so the serving one stays",
        )
    rng = np.random.default_rng([seed, 64])
    draws = rng.integers(0, n_groups, size=(resamples, n_groups))
    offsets = draws + (np.arange(resamples) * n_groups)[:, None]
    per_group = np.bincount(offsets.ravel(), minlength=resamples * n_groups).reshape(resamples, n_groups)
    weights = per_group[:, group].astype(float)  # every record of a drawn question, as often as it was drawn
    w_pos, w_neg = weights[:, y], weights[:, ~y]
    ones_pos, ones_neg = np.ones((1, int(y.sum()))), np.ones((1, int((~y).sum())))
    pairs_s, pairs_a = pair_matrix(s, y), pair_matrix(a, y)
    serving_auroc = float(weighted_auroc(pairs_s, ones_pos, ones_neg)[0])
    adapted_auroc = float(weighted_auroc(pairs_a, ones_pos, ones_neg)[0])
    diffs = weighted_auroc(pairs_a, w_pos, w_neg) - weighted_auroc(pairs_s, w_pos, w_neg)
    diffs = np.where(np.isfinite(diffs), diffs, -np.inf)  # one class only: not better
    p_value = float((1 + np.sum(diffs <= 0)) / (resamples + 1))
    lower = float(np.sort(diffs)[int(np.floor(level * resamples))])
    promotable = p_value <= level
    reason = (
        f"the adapted head ranks better (p = {p_value:.3f} <= {level:g})"
        if promotable
        else f"the adapted head is not shown to rank better than the serving model (p = {p_value:.3f} > {level:g}), "
        "so the serving one stays"
    )
    return Comparison(
        status=PROMOTABLE if promotable else KEPT,
        **common,
        serving_auroc=round(serving_auroc, 6),
        adapted_auroc=round(adapted_auroc, 6),
        difference=round(adapted_auroc - serving_auroc, 6),
        lower_bound=round(lower, 6) if np.isfinite(lower) else None,
        p_value=round(p_value, 6),
        resamples=resamples,
        reason=reason,
    )


def not_compared(reason: str, level: float, labels: int, questions: int, correct: int) -> Comparison:
    """Kept without a test: the serving model could not be scored on the held-out labels (``reason`` says why)."""
    return Comparison(
        status=KEPT,
        level=level,
        questions=questions,
        labels=labels,
        correct=correct,
        serving_auroc=None,
        adapted_auroc=None,
        difference=None,
        lower_bound=None,
        p_value=None,
        resamples=0,
        reason=f"not compared ({reason}), so the serving one stays",
    )


FORCE_HINT = 'reload it anyway with {"honest": ..., "force": true}'


def check_promotable(folder: str | Path) -> None:
    """Refuse (:class:`NotPromotable`) a folder ``candor adapt`` marked kept; a folder it never wrote passes.

    Its ``adapt.json`` is read only as a regular file inside the folder (never a FIFO, a device or a
    link out of it); one that cannot be read or says neither mark is refused, since nothing then says
    the model is no worse. The messages name files by their name in the folder only.
    """
    folder = Path(folder)
    path = folder / SUMMARY_FILE
    if not path.exists() and not path.is_symlink():
        return  # not written by candor adapt: no comparison to honour
    try:
        real = path.resolve(strict=True)
        inside = real.is_relative_to(folder.resolve(strict=True)) and real.is_file()
    except (OSError, RuntimeError):
        inside = False
    if not inside:
        raise NotPromotable(f"{SUMMARY_FILE} is not a regular file inside the folder: its mark cannot be read")
    try:
        summary = json.loads(real.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        raise NotPromotable(f"{SUMMARY_FILE} cannot be read as JSON: its mark cannot be read") from None
    mark = summary.get(PROMOTION_KEY) if isinstance(summary, dict) else None
    if mark is None and isinstance(summary, dict):
        return  # adapted before the comparison existed: unmarked, as any folder candor adapt never wrote
    status = mark.get("status") if isinstance(mark, dict) else None
    if status == PROMOTABLE:
        return
    if status == KEPT:
        numbers = mark.get("reason", "")
        if isinstance(mark.get("difference"), (int, float)):
            numbers = (
                f"held-out AUROC {mark.get('adapted_auroc')} adapted vs {mark.get('serving_auroc')} serving, "
                f"p = {mark.get('p_value')} at level {mark.get('level')}"
            )
        raise NotPromotable(
            f"the folder is marked kept by candor adapt: its head was not shown to rank better than the model it "
            f"was adapted from ({numbers}); {FORCE_HINT}"
        )
    raise NotPromotable(f"{SUMMARY_FILE}: '{PROMOTION_KEY}' says neither {PROMOTABLE!r} nor {KEPT!r}")
