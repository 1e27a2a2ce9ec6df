"""The label-budget curve: metrics of every method over seeds, with bootstrap intervals, as JSON and a PNG.

A *column* is one method at one budget (``"EliCal@100"``), given as one
confidence array per dataset for each seed. For each column and each group of
datasets (in-domain, OOD; averages weighted by test-set size as in the paper)
the summary holds:

- the mean over seeds of AUROC, ECE and Alignment, and their spread (std);
- a 95% percentile bootstrap interval of that seed mean: each resample draws
  the test items of every dataset with replacement (the same draw for every
  seed) and recomputes the seed mean. Resamples where a metric is undefined
  (AUROC when a draw has one class) are left out of that metric's interval.

Training-free baselines are columns with one "seed", so they go through the
same code and are directly comparable.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from scipy.stats import rankdata

from candor.metrics import alignment, check_arrays, ece, quietly
from candor.plots import save_png

logger = logging.getLogger(__name__)

CURVE_METRICS = ("auroc", "ece", "alignment")
GROUPS = ("id", "ood")
CI_ALPHA = 0.05

PerDataset = Mapping[str, np.ndarray]  # dataset → confidences, in the order of that dataset's labels


def fast_auroc(confidence: np.ndarray, correct: np.ndarray) -> float:
    """AUROC by the rank-sum (Mann-Whitney) identity, ties at half; NaN with one class.

    Equal to scikit-learn's ``roc_auc_score`` (checked in the tests) and about
    fifty times faster on the small arrays a bootstrap draws.
    """
    positives = int(correct.sum())
    negatives = correct.size - positives
    if positives == 0 or negatives == 0:
        return math.nan
    ranks = rankdata(confidence)
    return float((ranks[correct == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives))


METRIC_FNS: dict[str, Callable[[np.ndarray, np.ndarray], float]] = {
    "auroc": fast_auroc,
    "ece": ece,
    "alignment": alignment,
}


def _group_metrics(
    arrays: Mapping[str, tuple[np.ndarray, np.ndarray]], roles: Mapping[str, str]
) -> dict[str, dict[str, float]]:
    """Per dataset and per group (size-weighted), every curve metric."""
    out = {ds: {m: METRIC_FNS[m](c, y) for m in CURVE_METRICS} for ds, (c, y) in arrays.items()}
    for group in GROUPS:
        members = [ds for ds in arrays if roles.get(ds) == group]
        if not members:
            continue
        sizes = np.array([arrays[ds][1].size for ds in members], dtype=float)
        out[group] = {m: float(np.dot(sizes, [out[ds][m] for ds in members]) / sizes.sum()) for m in CURVE_METRICS}
    return out


def _seed_mean(
    per_seed: Sequence[PerDataset],
    labels: Mapping[str, np.ndarray],
    roles: Mapping[str, str],
    index: Mapping[str, np.ndarray] | None = None,
) -> tuple[dict[str, dict[str, float]], list[dict[str, dict[str, float]]]]:
    """Metrics averaged over seeds (and the per-seed ones), optionally on resampled ``index``."""
    runs = []
    for conf in per_seed:
        arrays = {
            ds: (conf[ds], y) if index is None else (conf[ds][index[ds]], y[index[ds]]) for ds, y in labels.items()
        }
        runs.append(_group_metrics(arrays, roles))
    mean = {col: {m: float(np.mean([r[col][m] for r in runs])) for m in CURVE_METRICS} for col in runs[0]}
    return mean, runs


def summarize_column(
    per_seed: Sequence[PerDataset],
    labels: Mapping[str, np.ndarray],
    roles: Mapping[str, str],
    bootstrap: int = 200,
    seed: int = 0,
) -> dict[str, Any]:
    """Seed means per group and dataset, seed std, per-seed values and the bootstrap interval."""
    for conf in per_seed:
        for ds, y in labels.items():
            check_arrays(conf[ds], y)
    with quietly(), np.errstate(invalid="ignore"):
        mean, runs = _seed_mean(per_seed, labels, roles)
    groups = [g for g in GROUPS if g in mean]
    out: dict[str, Any] = {g: mean[g] for g in groups}
    out["seed_std"] = {g: {m: float(np.std([r[g][m] for r in runs])) for m in CURVE_METRICS} for g in groups}
    out["per_seed"] = {g: {m: [r[g][m] for r in runs] for m in CURVE_METRICS} for g in groups}
    out["per_dataset"] = {ds: mean[ds] for ds in labels}
    if bootstrap:
        out["ci95"] = _bootstrap(per_seed, labels, roles, groups, bootstrap, seed)
    return out


def _bootstrap(
    per_seed: Sequence[PerDataset],
    labels: Mapping[str, np.ndarray],
    roles: Mapping[str, str],
    groups: Sequence[str],
    n: int,
    seed: int,
) -> dict[str, dict[str, list[float | None]]]:
    streams = np.random.SeedSequence(seed).spawn(len(labels))
    rngs = {ds: np.random.default_rng(s) for ds, s in zip(labels, streams, strict=True)}
    draws: dict[str, dict[str, list[float]]] = {g: {m: [] for m in CURVE_METRICS} for g in groups}
    with quietly(), np.errstate(invalid="ignore"):
        for _ in range(n):
            index = {ds: rngs[ds].integers(0, y.size, size=y.size) for ds, y in labels.items()}
            mean, _ = _seed_mean(per_seed, labels, roles, index)
            for g in groups:
                for m in CURVE_METRICS:
                    draws[g][m].append(mean[g][m])
    return {g: {m: _interval(draws[g][m]) for m in CURVE_METRICS} for g in groups}




def _interval(values: list[float]) -> list[float | None]:
    arr = np.asarray(values, dtype=float)
    arr = arr[~np.isnan(arr)]
    if arr.size == 0:
        return [None, None]
    low, high = np.quantile(arr, [CI_ALPHA / 2, 1 - CI_ALPHA / 2])
    return [float(low), float(high)]


# ---------------------------------------------------------------- plot

METRIC_TITLES = {"auroc": "AUROC", "ece": "ECE", "alignment": "Alignment"}
GROUP_TITLES = {"id": "in-domain", "ood": "OOD"}


def plot_curve(
    summary: Mapping[str, Mapping[str, Any]],
    curves: Mapping[str, Sequence[tuple[int, str]]],
    references: Sequence[str],
    path: str | Path,
    title: str = "",
) -> Path:
    """Metric vs number of labels: one line (with its 95% band) per curve, a dashed line per reference.

    ``curves`` maps a curve's name to ``(n_labels, column)`` points; ``summary``
    maps each column to :func:`summarize_column`'s output.
    """
    groups = [g for g in GROUPS if any(g in col for col in summary.values())]
    fig = Figure(figsize=(4.2 * len(CURVE_METRICS), 3.4 * len(groups)))
    axes = fig.subplots(len(groups), len(CURVE_METRICS), squeeze=False)
    colors = ["#3a6ea5", "#d1495b", "#2a9d5c", "#f4a259", "#6a4c93", "#555555"]
    for row, group in enumerate(groups):
        for col, metric in enumerate(CURVE_METRICS):
            ax = axes[row][col]
            for i, (name, points) in enumerate(curves.items()):
                _draw_curve(ax, summary, points, group, metric, name, colors[i % len(colors)])
            for j, ref in enumerate(references):
                value = summary.get(ref, {}).get(group, {}).get(metric)
                if value is not None and not math.isnan(value):
                    ax.axhline(value, ls="--", lw=1, color=colors[(len(curves) + j) % len(colors)], label=ref)
            ax.set_xscale("log")
            ax.set_title(f"{METRIC_TITLES[metric]} ({GROUP_TITLES[group]})")
            ax.set_xlabel("labelled questions")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return save_png(fig, Path(path))


def _draw_curve(
    ax: Any,
    summary: Mapping[str, Mapping[str, Any]],
    points: Sequence[tuple[int, str]],
    group: str,
    metric: str,
    name: str,
    color: str,
) -> None:
    xs, ys, lows, highs = [], [], [], []
    for n, column in sorted(points):
        entry = summary.get(column, {})
        if group not in entry:
            continue
        xs.append(n)
        ys.append(entry[group][metric])
        low, high = entry.get("ci95", {}).get(group, {}).get(metric, [None, None])
        lows.append(np.nan if low is None else low)
        highs.append(np.nan if high is None else high)
    if xs:
        ax.plot(xs, ys, marker="o", color=color, label=name)
        if not np.isnan(lows).all():
            ax.fill_between(xs, lows, highs, color=color, alpha=0.15)


