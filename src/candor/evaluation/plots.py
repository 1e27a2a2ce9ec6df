"""Plots for the evaluation report: reliability diagrams, confidence histograms and risk–coverage curves.

Figures are built with matplotlib's object API (``Figure`` + the Agg canvas), so
nothing touches pyplot's global state or needs a display. Files are written to
a temporary name and renamed, so a killed run never leaves half a PNG.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from candor.evaluation.metrics import aurc, bin_indices, risk_coverage
from candor.util.errors import CandorError
from candor.util.files import atomic_target

CORRECT_COLOR = "#2a9d5c"
WRONG_COLOR = "#d1495b"
BAR_COLOR = "#3a6ea5"
UNDER_COLOR = "#f4a259"


@dataclass(frozen=True)
class BinStats:
    """Equal-width bins over [0, 1]: count, mean confidence and accuracy per bin.

    Empty bins have NaN mean confidence and accuracy.
    """

    edges: np.ndarray
    count: np.ndarray
    mean_conf: np.ndarray
    accuracy: np.ndarray


def equal_width_bins(conf: np.ndarray, correct: np.ndarray, n_bins: int = 10) -> BinStats:
    """Bin exactly as ECE's default does: ``n_bins`` equal-width bins, 1.0 in the last bin."""
    conf = np.asarray(conf, dtype=float)
    correct = np.asarray(correct, dtype=float)
    idx = bin_indices(conf, n_bins, "uniform")
    count = np.bincount(idx, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.bincount(idx, weights=conf, minlength=n_bins) / count
        accuracy = np.bincount(idx, weights=correct, minlength=n_bins) / count
    return BinStats(np.linspace(0.0, 1.0, n_bins + 1), count, mean_conf, accuracy)


def save_png(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` as a PNG atomically (temporary file, then rename); parents are created."""
    path = Path(path)
    FigureCanvasAgg(fig)
    with atomic_target(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    return path


def reliability_diagram(
    conf: np.ndarray,
    correct: np.ndarray,
    path: Path,
    *,
    title: str,
    ece: float | None = None,
    n_bins: int = 10,
) -> Path:
    """Accuracy per confidence bin against the diagonal, with a count histogram below.

    The hatched part of each bin spans its accuracy and its mean confidence: red
    above the bar means over-confidence, orange inside it under-confidence.
    """
    stats = equal_width_bins(conf, correct, n_bins)
    left, width = stats.edges[:-1], 1.0 / n_bins
    filled = stats.count > 0

    fig = Figure(figsize=(5.2, 6.2), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 1]})

    top.bar(
        left[filled],
        stats.accuracy[filled],
        width=width,
        align="edge",
        color=BAR_COLOR,
        edgecolor="white",
        label="accuracy",
    )
    acc, mean_conf = stats.accuracy[filled], stats.mean_conf[filled]
    over = mean_conf > acc  # over-confident bins: the gap sits above the accuracy bar
    # The under-confident gap covers the blue bar, so it needs to be nearly opaque to read as orange.
    for mask, color, alpha, label in (
        (over, WRONG_COLOR, 0.35, "gap: over-confident"),
        (~over, UNDER_COLOR, 0.85, "gap: under-confident"),
    ):
        if mask.any():
            low = np.minimum(acc, mean_conf)[mask]
            top.bar(
                left[filled][mask],
                np.abs(mean_conf - acc)[mask],
                bottom=low,
                width=width,
                align="edge",
                color=color,
                alpha=alpha,
                edgecolor=color,
                hatch="//",
                label=label,
            )
    top.plot([0, 1], [0, 1], linestyle="--", color="0.2", zorder=3, label="perfect calibration")
    top.set_xlim(0, 1)
    top.set_ylim(0, 1)
    top.set_ylabel("accuracy")
    top.legend(loc="upper left", fontsize="small")
    ece_text = "" if ece is None or not np.isfinite(ece) else f"  ECE = {100 * ece:.1f}"
    top.set_title(f"{title}{ece_text}  (n = {len(conf)})")
    top.grid(alpha=0.3)

    bottom.bar(left, stats.count, width=width, align="edge", color="0.55", edgecolor="white")
    bottom.set_xlabel("confidence")
    bottom.set_ylabel("count")
    bottom.set_xticks(stats.edges[:: max(1, n_bins // 5)] if n_bins > 10 else stats.edges)
    bottom.grid(alpha=0.3, axis="y")
    return save_png(fig, path)


def confidence_histograms(
    arrays: Mapping[str, tuple[np.ndarray, np.ndarray]],
    path: Path,
    *,
    n_bins: int = 20,
    title: str = "confidence by correctness",
) -> Path:
    """One panel per method: confidence histograms of correct vs incorrect answers."""
    names = list(arrays)
    ncols = min(3, max(1, len(names)))
    nrows = -(-len(names) // ncols)
    fig = Figure(figsize=(4.2 * ncols, 3.2 * nrows + 0.5), layout="constrained")
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    edges = np.linspace(0.0, 1.0, n_bins + 1)
    for ax, name in zip(axes, names, strict=False):
        conf, correct = arrays[name]
        correct = np.asarray(correct).astype(bool)
        # Each group sums to 1, so a rare class (often the correct answers) stays visible;
        # the correct group is drawn as a thick outline on top of the filled incorrect one.
        for group, color, label, style in (
            (conf[~correct], WRONG_COLOR, "incorrect", {"histtype": "stepfilled", "alpha": 0.55}),
            (conf[correct], CORRECT_COLOR, "correct", {"histtype": "step", "linewidth": 2.2}),
        ):
            if len(group):
                ax.hist(
                    group,
                    bins=edges,
                    color=color,
                    weights=np.full(len(group), 1 / len(group)),
                    label=f"{label} (n={len(group)})",
                    **style,
                )
        ax.set_title(name)
        ax.set_xlim(0, 1)
        ax.set_xlabel("confidence")
        ax.set_ylabel("share of group")
        ax.legend(fontsize="small")
        ax.grid(alpha=0.3)
    for ax in axes[len(names) :]:
        ax.set_visible(False)
    fig.suptitle(title)
    return save_png(fig, path)


def risk_coverage_plot(
    arrays: Mapping[str, tuple[np.ndarray, np.ndarray]],
    path: Path,
    *,
    title: str = "risk vs coverage",
) -> Path:
    """One risk–coverage line per method (AURC in the legend), with each method's error rate dashed.

    Risk at coverage c is the error rate of the c·N most confident answers
    (:func:`candor.evaluation.metrics.risk_coverage`); a useful confidence bends the line
    below the dashed error rate of keeping everything.
    """
    fig = Figure(figsize=(6.0, 4.4), layout="constrained")
    ax = fig.subplots()
    colors = [BAR_COLOR, WRONG_COLOR, CORRECT_COLOR, UNDER_COLOR, "#6a4c93", "#555555"]
    for i, (name, (conf, correct)) in enumerate(arrays.items()):
        coverage, risk = risk_coverage(conf, correct)
        color = colors[i % len(colors)]
        ax.plot(coverage, risk, color=color, label=f"{name} (AURC {100 * aurc(conf, correct):.1f})")
        ax.axhline(risk[-1], color=color, ls=":", lw=0.8)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("coverage (share of answers kept, most confident first)")
    ax.set_ylabel("risk (error rate of the kept answers)")
    ax.set_title(title, fontsize="medium")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    return save_png(fig, path)


def loss_curves(history: Sequence[Mapping[str, float]], path: str | Path, title: str = "") -> Path:
    """Each logged loss term (keys starting ``loss``) against the optimizer step, one line per term.

    ``history`` is a trainer's log (``TrainResult.history``); rows without a
    loss (evaluation, the final summary) are skipped.
    """
    rows = [h for h in history if any(k.startswith("loss") for k in h)]
    if not rows:
        raise CandorError(f"no loss was logged, so there is no curve to draw into {path}")
    terms = sorted({k for h in rows for k in h if k.startswith("loss")}, key=lambda k: (k != "loss", k))
    fig = Figure(figsize=(6.4, 3.6))
    ax = fig.add_subplot()
    for term in terms:
        points = [(h.get("step", i + 1), h[term]) for i, h in enumerate(rows) if term in h]
        ax.plot(*zip(*points, strict=True), label=term, linewidth=2.0 if term == "loss" else 1.2)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_png(fig, path)
