"""The label-budget curve: metrics of every method over seeds, with bootstrap intervals, as JSON and a PNG.

A *column* is one method at one budget (``"EliCal@100"``), given as one
confidence array per dataset for each seed. For each column and each group of
datasets (in-domain, OOD; averages weighted by test-set size as in the paper)
the summary holds:

- the mean over seeds of AUROC, ECE and Alignment, and their spread (std);
- a 95% percentile bootstrap interval of that seed mean: each resample draws
  the test items of every dataset with replacement (the same draw for every
  seed) and recomputes the seed mean. Resamples where a metric is undefined
  (AUROC when a draw has one class) are left out of that metric's interval,
  and counted under ``bootstrap_dropped``.

Every number comes from :func:`candor.evaluation.aggregate.aggregate_metrics`,
so the curve and the report agree on the same arrays.

Training-free baselines are columns with one "seed", so they go through the
same code and are directly comparable.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from candor.evaluation.aggregate import Group, aggregate_metrics, json_number
from candor.evaluation.metrics import metric_label
from candor.evaluation.plots import save_png

logger = logging.getLogger(__name__)

CURVE_METRICS = ("auroc", "ece", "alignment")
GROUPS = ("id", "ood")

PerDataset = Mapping[str, np.ndarray]  # dataset → confidences, in the order of that dataset's labels


def summarize_column(
    per_seed: Sequence[PerDataset],
    labels: Mapping[str, np.ndarray],
    roles: Mapping[str, str],
    bootstrap: int = 200,
    seed: int = 0,
) -> dict[str, Any]:
    """Seed means per group and dataset, seed std, per-seed values and the bootstrap interval.

    The numbers come from :func:`candor.evaluation.aggregate.aggregate_metrics` (groups weighted by
    test-set size); this only lays them out for ``curve.json``.
    """
    groups = [
        Group(g, tuple(ds for ds in labels if roles.get(ds) == g))
        for g in GROUPS
        if any(roles.get(ds) == g for ds in labels)
    ]
    result = aggregate_metrics(
        {"column": list(per_seed)}, labels, groups=groups, metrics=CURVE_METRICS, bootstrap=bootstrap, seed=seed
    ).methods["column"]
    names = [g.name for g in groups]
    out: dict[str, Any] = {g: result.values[g] for g in names}
    std = result.seed_std
    out["seed_std"] = {g: std[g] for g in names}
    out["per_seed"] = {g: result.per_seed[g] for g in names}
    out["per_dataset"] = {ds: result.values[ds] for ds in labels}
    out["undefined"] = result.undefined()  # cells that are NaN, e.g. Alignment where no threshold splits the classes
    if bootstrap:
        out["ci95"] = {g: {m: [json_number(v) for v in result.ci[g][m]] for m in CURVE_METRICS} for g in names}
        out["bootstrap_dropped"] = {g: result.bootstrap_dropped[g] for g in names}
        # biased metrics (ECE): the bias-corrected estimate their ci95 (a basic interval) is around
        out["corrected"] = {g: {m: json_number(v) for m, v in result.corrected.get(g, {}).items()} for g in names}
    return out


# ---------------------------------------------------------------- plot

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
            label_budget_axis(ax, sorted({n for pts in curves.values() for n, _ in pts}))
            ax.set_title(f"{metric_label(metric)} ({GROUP_TITLES[group]})")
            ax.set_xlabel("labelled questions")
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return save_png(fig, Path(path))


def label_budget_axis(ax: Any, budgets: Sequence[int]) -> None:
    """A log x-axis ticked at the budgets, in plain numbers ("20", not matplotlib's "2×10¹")."""
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_locator(FixedLocator([float(n) for n in budgets]))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_locator(NullLocator())


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
