"""Claim-level evaluation: metrics with intervals bootstrapped by answer, and refinement.

See docs/claims.md "Evaluation".

Claims of one answer are not independent (one bad answer holds several wrong
claims), so every interval here resamples *answers* with replacement and keeps
all the claims of each drawn answer (a cluster bootstrap), never single claims.

- :func:`claim_metrics`: AUROC, ECE, PRR, AURC of one claim column, with
  percentile intervals; ECE, biased upwards on small samples, gets the
  bias-corrected estimate (``corrected``) and the basic interval around it
  (:func:`candor.evaluation.aggregate.bias_corrected`).
- :func:`refinement_curve`: as the threshold rises, the share of claims kept
  against the factual precision of what is kept (the share of kept claims
  that are correct, pooled over answers); :func:`precision_at_kept` reads it
  at given shares, with intervals.
- :func:`paired_gap`: a metric on one set minus the same metric on another,
  both drawn from the same answers in each resample (claims inside answers
  against the same questions asked alone).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from candor.evaluation.aggregate import bias_corrected, is_biased
from candor.evaluation.metrics import aurc, auroc, ece, prr, quietly
from candor.util.errors import CandorError

CLAIM_METRICS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "auroc": auroc,
    "ece": ece,
    "prr": prr,
    "aurc": aurc,
}
DEFAULT_SHARES = (0.5, 0.75, 0.9)


def _check(conf: Sequence[float], correct: Sequence[int], groups: Sequence[str]) -> tuple[np.ndarray, ...]:
    c, y, g = np.asarray(conf, dtype=float), np.asarray(correct, dtype=float), np.asarray(groups)
    if not (len(c) == len(y) == len(g)):
        raise CandorError(f"claim evaluation: {len(c)} confidences, {len(y)} labels, {len(g)} answer ids")
    if len(c) == 0:
        raise CandorError("claim evaluation: no scored claims")
    return c, y, g


def cluster_resamples(groups: np.ndarray, n: int, seed: int) -> list[np.ndarray]:
    """``n`` resamples of row indices, each drawing whole groups (answers) with replacement."""
    names, inverse = np.unique(groups, return_inverse=True)
    members = [np.flatnonzero(inverse == k) for k in range(len(names))]
    rng = np.random.default_rng(seed)
    return [np.concatenate([members[k] for k in rng.integers(0, len(names), len(names))]) for _ in range(n)]


def _interval(values: Sequence[float], alpha: float) -> list[float | None]:
    finite = np.asarray([v for v in values if np.isfinite(v)])
    if not len(finite):
        return [None, None]
    return [float(np.quantile(finite, alpha / 2)), float(np.quantile(finite, 1 - alpha / 2))]


def _num(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def claim_metrics(
    conf: Sequence[float],
    correct: Sequence[int],
    groups: Sequence[str],
    *,
    metrics: Sequence[str] = tuple(CLAIM_METRICS),
    bootstrap: int = 1000,
    seed: int = 0,
    alpha: float = 0.05,
) -> dict[str, dict[str, Any]]:
    """Each metric's value and ``ci`` over answer resamples (empty when bootstrap=0), and how it was made
    (``interval``): percentile, or for a biased metric (ECE) basic around its ``corrected`` estimate."""
    c, y, g = _check(conf, correct, groups)
    unknown = [m for m in metrics if m not in CLAIM_METRICS]
    if unknown:
        raise CandorError(f"unknown claim metric(s) {unknown}; choose from {sorted(CLAIM_METRICS)}")
    draws = cluster_resamples(g, bootstrap, seed) if bootstrap else []
    out: dict[str, dict[str, Any]] = {}
    with quietly():
        for name in metrics:
            fn = CLAIM_METRICS[name]
            value = fn(c, y)
            boot = [fn(c[idx], y[idx]) for idx in draws]
            out[name] = {"value": _num(value), "ci": _interval(boot, alpha) if draws else [], "interval": "percentile"}
            if draws and is_biased(name):
                corrected, (low, high), _ = bias_corrected(value, boot, alpha)
                out[name].update(corrected=_num(corrected), ci=[_num(low), _num(high)], interval="basic")
    return out


def refinement_curve(conf: Sequence[float], correct: Sequence[int]) -> dict[str, list[float]]:
    """At each distinct threshold (claims at or above it kept): share of claims kept and factual precision."""
    c = np.asarray(conf, dtype=float)
    y = np.asarray(correct, dtype=float)
    if len(c) == 0:
        raise CandorError("refinement: no scored claims")
    order = np.argsort(-c, kind="stable")
    c_sorted, y_sorted = c[order], y[order]
    cum = np.cumsum(y_sorted)
    # The last position of each distinct value: a threshold keeps ties together.
    ends = np.flatnonzero(np.r_[c_sorted[1:] != c_sorted[:-1], True])
    kept = (ends + 1) / len(c)
    precision = cum[ends] / (ends + 1)
    return {"threshold": c_sorted[ends].tolist(), "kept": kept.tolist(), "precision": precision.tolist()}


def precision_when_keeping(conf: np.ndarray, correct: np.ndarray, share: float) -> float:
    """Factual precision of the ``share`` most confident claims (the threshold that keeps at least that share)."""
    curve = refinement_curve(conf, correct)
    kept = np.asarray(curve["kept"])
    at = int(np.searchsorted(kept, share - 1e-12))
    return float(curve["precision"][min(at, len(kept) - 1)])


def precision_at_kept(
    conf: Sequence[float],
    correct: Sequence[int],
    groups: Sequence[str],
    *,
    shares: Sequence[float] = DEFAULT_SHARES,
    bootstrap: int = 1000,
    seed: int = 0,
    alpha: float = 0.05,
) -> dict[str, dict[str, Any]]:
    """Factual precision at each share of claims kept (``"50%"`` …), with intervals by answer."""
    c, y, g = _check(conf, correct, groups)
    draws = cluster_resamples(g, bootstrap, seed) if bootstrap else []
    out = {"100%": {"value": float(y.mean()), "ci": _interval([y[i].mean() for i in draws], alpha) if draws else []}}
    for share in shares:
        if not 0 < share <= 1:
            raise CandorError(f"refinement: a share of claims kept must be in (0, 1], got {share}")
        boot = [precision_when_keeping(c[i], y[i], share) for i in draws]
        out[f"{round(share * 100)}%"] = {
            "value": precision_when_keeping(c, y, share),
            "ci": _interval(boot, alpha) if draws else [],
        }
    return out


def paired_gap(
    first: tuple[Sequence[float], Sequence[int], Sequence[str]],
    second: tuple[Sequence[float], Sequence[int], Sequence[str]],
    metric: str = "auroc",
    *,
    bootstrap: int = 1000,
    seed: int = 0,
    alpha: float = 0.05,
) -> dict[str, Any]:
    """``metric(first) - metric(second)``, each a (confidences, labels, answer ids) triple over the same answers.

    A resample draws answer ids once and takes, for both sides, the rows of
    the drawn answers (a paired cluster bootstrap).
    """
    fn = CLAIM_METRICS[metric]
    c1, y1, g1 = _check(*first)
    c2, y2, g2 = _check(*second)
    names = np.unique(np.concatenate([g1, g2]))
    rows1 = {n: np.flatnonzero(g1 == n) for n in names}
    rows2 = {n: np.flatnonzero(g2 == n) for n in names}
    rng = np.random.default_rng(seed)
    boot = []
    with quietly():
        value = fn(c1, y1) - fn(c2, y2)
        for _ in range(bootstrap):
            drawn = names[rng.integers(0, len(names), len(names))]
            i1 = np.concatenate([rows1[n] for n in drawn])
            i2 = np.concatenate([rows2[n] for n in drawn])
            boot.append(fn(c1[i1], y1[i1]) - fn(c2[i2], y2[i2]))
    return {"value": _num(value), "ci": _interval(boot, alpha) if bootstrap else []}


def refinement_rows(
    columns: dict[str, tuple[Sequence[float], Sequence[int]]], points: int = 200
) -> list[dict[str, Any]]:
    """The refinement curve of each claim column as chart rows (``method``, ``kept``, ``precision``)."""
    rows = []
    for method, (conf, correct) in columns.items():
        curve = refinement_curve(conf, correct)
        step = max(1, len(curve["kept"]) // points)
        keep = sorted(set(range(0, len(curve["kept"]), step)) | {len(curve["kept"]) - 1})
        rows.extend(
            {
                "method": method,
                "kept": round(curve["kept"][i], 4),
                "precision": round(curve["precision"][i], 4),
                "threshold": round(curve["threshold"][i], 4),
            }
            for i in keep
        )
    return rows
