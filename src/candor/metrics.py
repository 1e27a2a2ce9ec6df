"""Metrics of confidence against correctness (DESIGN.md §4.6).

Every metric takes ``confidence`` (floats in [0, 1], higher = more confident)
and ``correct`` (0/1) arrays of the same length and returns a float::

    compute_metrics(conf, correct)  # {"accuracy": ..., "auroc": ..., "ece": ...}

Bad input (length mismatch, NaN, values outside [0, 1], labels other than 0/1,
empty arrays) raises :class:`CandorError`. A metric that is undefined on valid
input (AUROC with one class) returns NaN and warns, never a made-up number.

Binning (ECE, MCE, NCE): ``uniform`` bins are [k/n, (k+1)/n) with the last bin
closed, so a confidence of exactly 1.0 counts in the last bin. The official
EliCal code drops such rows; torchmetrics puts them in an extra bin of their
own. On confidences below 1.0 our uniform bins match torchmetrics up to
floating-point ties at the bin edges. ``quantile`` bins sort the confidences
and split them into ``n_bins`` groups of (nearly) equal size; tied values may
land in neighbouring bins.
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np
from numpy.typing import ArrayLike
from sklearn.metrics import average_precision_score, roc_auc_score

from candor.errors import CandorError
from candor.registry import Registry

logger = logging.getLogger(__name__)

MetricFn = Callable[[np.ndarray, np.ndarray], float]
METRICS: Registry[MetricFn] = Registry("metric")
DEFAULT_METRICS = ("accuracy", "auroc", "auprc", "brier", "ece", "mce", "nce", "abs_nce", "alignment")

_quiet = False  # set by bootstrap_ci so a thousand resamples do not warn a thousand times


@contextlib.contextmanager
def quietly() -> Iterator[None]:
    """Undefined metrics (one class, empty bins) return NaN without a warning; the caller reports them."""
    global _quiet
    previous, _quiet = _quiet, True
    try:
        yield
    finally:
        _quiet = previous


def _undefined(message: str) -> float:
    """Warn (and log) that a metric is undefined here, and return NaN."""
    if not _quiet:
        warnings.warn(message, RuntimeWarning, stacklevel=3)
        logger.warning(message)
    return math.nan


# ---------------------------------------------------------------- validation


def check_confidence(confidence: ArrayLike, what: str = "confidence") -> np.ndarray:
    """``confidence`` as a float array, after checking it is finite and in [0, 1]."""
    conf = np.asarray(confidence, dtype=float).reshape(-1)
    if conf.size == 0:
        raise CandorError(f"{what} is empty")
    bad = ~np.isfinite(conf)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise CandorError(f"{what} has {int(bad.sum())} NaN/inf values, e.g. at index {i}")
    out = (conf < 0.0) | (conf > 1.0)
    if out.any():
        i = int(np.flatnonzero(out)[0])
        raise CandorError(
            f"{what} must lie in [0, 1] (higher = more confident); index {i} is {conf[i]!r}"
            f" and {int(out.sum())} values are outside"
        )
    return conf


def check_arrays(confidence: ArrayLike, correct: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Validated ``(confidence, correct)`` as float and int arrays of equal length."""
    conf = check_confidence(confidence)
    raw = np.asarray(correct).reshape(-1)
    if raw.size != conf.size:
        raise CandorError(f"confidence has {conf.size} values but correct has {raw.size}")
    try:
        labels = raw.astype(float)
    except (TypeError, ValueError):
        raise CandorError(f"correct must hold 0/1 labels, got dtype {raw.dtype}") from None
    bad = ~np.isin(labels, (0.0, 1.0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise CandorError(f"correct must hold 0/1 labels; index {i} is {raw[i]!r}")
    return conf, labels.astype(int)


def _one_class(correct: np.ndarray) -> bool:
    return correct.min() == correct.max()


# ---------------------------------------------------------------- binning


def bin_indices(confidence: np.ndarray, n_bins: int = 10, strategy: str = "uniform") -> np.ndarray:
    """The bin of each confidence, 0..n_bins-1 (see the module docstring for the rules)."""
    if n_bins < 1:
        raise CandorError(f"n_bins must be at least 1, got {n_bins}")
    if strategy == "uniform":
        # Edges k/n as the nearest doubles, so a confidence of 0.7 sits in [0.7, 0.8).
        edges = np.arange(n_bins + 1) / n_bins
        return np.clip(np.searchsorted(edges, confidence, side="right") - 1, 0, n_bins - 1)
    if strategy == "quantile":
        idx = np.empty(confidence.size, dtype=int)
        order = np.argsort(confidence, kind="stable")
        for b, members in enumerate(np.array_split(order, n_bins)):
            idx[members] = b
        return idx
    raise CandorError(f"unknown binning strategy {strategy!r}; known: quantile, uniform")


def _bin_gaps(
    confidence: np.ndarray, correct: np.ndarray, n_bins: int, strategy: str
) -> tuple[np.ndarray, np.ndarray]:
    """Per non-empty bin: weight n_b/N and gap acc_b − conf_b."""
    idx = bin_indices(confidence, n_bins, strategy)
    counts = np.bincount(idx, minlength=n_bins).astype(float)
    conf_sum = np.bincount(idx, weights=confidence, minlength=n_bins)
    acc_sum = np.bincount(idx, weights=correct.astype(float), minlength=n_bins)
    full = counts > 0
    gaps = (acc_sum[full] - conf_sum[full]) / counts[full]
    return counts[full] / confidence.size, gaps


# ---------------------------------------------------------------- metrics


@METRICS.register("accuracy")
def accuracy(confidence: ArrayLike, correct: ArrayLike) -> float:
    """Fraction correct (the confidences are checked but not used)."""
    _, y = check_arrays(confidence, correct)
    return float(y.mean())


@METRICS.register("auroc")
def auroc(confidence: ArrayLike, correct: ArrayLike) -> float:
    """Area under the ROC curve of confidence as a score for correctness (scikit-learn)."""
    conf, y = check_arrays(confidence, correct)
    if _one_class(y):
        return _undefined(f"AUROC is undefined: all {y.size} labels are {int(y[0])}; returning NaN")
    return float(roc_auc_score(y, conf))


@METRICS.register("auprc")
def auprc(confidence: ArrayLike, correct: ArrayLike) -> float:
    """Area under the precision-recall curve, correct = positive (average precision)."""
    conf, y = check_arrays(confidence, correct)
    if _one_class(y):
        return _undefined(f"AUPRC is undefined: all {y.size} labels are {int(y[0])}; returning NaN")
    return float(average_precision_score(y, conf))


@METRICS.register("brier")
def brier(confidence: ArrayLike, correct: ArrayLike) -> float:
    """Mean squared difference between confidence and correctness."""
    conf, y = check_arrays(confidence, correct)
    return float(np.mean((conf - y) ** 2))


def ece(confidence: ArrayLike, correct: ArrayLike, n_bins: int = 10, strategy: str = "uniform") -> float:
    """Expected calibration error: Σ_b (n_b/N)·|acc_b − conf_b|."""
    conf, y = check_arrays(confidence, correct)
    weights, gaps = _bin_gaps(conf, y, n_bins, strategy)
    return float(np.sum(weights * np.abs(gaps)))


def mce(confidence: ArrayLike, correct: ArrayLike, n_bins: int = 10, strategy: str = "uniform") -> float:
    """Maximum calibration error: the largest |acc_b − conf_b| over non-empty bins."""
    conf, y = check_arrays(confidence, correct)
    _, gaps = _bin_gaps(conf, y, n_bins, strategy)
    return float(np.max(np.abs(gaps)))


def nce(confidence: ArrayLike, correct: ArrayLike, n_bins: int = 10, strategy: str = "uniform") -> float:
    """Signed calibration error Σ_b (n_b/N)·(acc_b − conf_b); negative = over-confident.

    The bins cancel out: this always equals accuracy − mean confidence.
    """
    conf, y = check_arrays(confidence, correct)
    weights, gaps = _bin_gaps(conf, y, n_bins, strategy)
    return float(np.sum(weights * gaps))


def abs_nce(confidence: ArrayLike, correct: ArrayLike, n_bins: int = 10, strategy: str = "uniform") -> float:
    """|NCE|."""
    return abs(nce(confidence, correct, n_bins, strategy))


METRICS.register("ece")(ece)
METRICS.register("mce")(mce)
METRICS.register("nce")(nce)
METRICS.register("abs_nce")(abs_nce)


@METRICS.register("ece_quantile")
def ece_quantile(confidence: ArrayLike, correct: ArrayLike) -> float:
    """ECE with 10 equal-mass bins."""
    return ece(confidence, correct, strategy="quantile")


ALIGNMENT_THRESHOLDS = np.arange(1, 100) / 100


@METRICS.register("alignment")
def alignment(
    confidence: ArrayLike, correct: ArrayLike, seed: int = 0, fit_fraction: float = 0.2
) -> float:
    """EliCal's Alignment: accuracy of 1[conf ≥ t] on held-out rows, t tuned on a seeded slice.

    The threshold t in {0.01, ..., 0.99} maximizes accuracy on a random
    ``fit_fraction`` of the rows (ties go to the smallest t), skipping
    thresholds that put every row of that slice in one class; the accuracy is
    reported on the other rows.
    """
    conf, y = check_arrays(confidence, correct)
    if not 0.0 < fit_fraction < 1.0:
        raise CandorError(f"fit_fraction must be in (0, 1), got {fit_fraction}")
    if y.size < 2:
        return _undefined("Alignment needs at least 2 rows (a fit slice and an eval slice); returning NaN")
    perm = np.random.default_rng(seed).permutation(y.size)
    n_fit = min(max(round(fit_fraction * y.size), 1), y.size - 1)
    fit, held = perm[:n_fit], perm[n_fit:]
    threshold = _best_threshold(conf[fit], y[fit])
    if threshold is None:
        return _undefined(
            f"Alignment is undefined: every threshold puts all {n_fit} fit rows in one class; returning NaN"
        )
    return float(np.mean((conf[held] >= threshold).astype(int) == y[held]))


def _best_threshold(conf: np.ndarray, y: np.ndarray) -> float | None:
    preds = conf[None, :] >= ALIGNMENT_THRESHOLDS[:, None]  # (thresholds, rows)
    positives = preds.sum(axis=1)
    usable = (positives > 0) & (positives < conf.size)
    if not usable.any():
        return None
    acc = (preds == y[None, :].astype(bool)).mean(axis=1)
    acc[~usable] = -1.0
    return float(ALIGNMENT_THRESHOLDS[int(np.argmax(acc))])


def compute_metrics(
    confidence: ArrayLike, correct: ArrayLike, names: Sequence[str] | None = None
) -> dict[str, float]:
    """The named metrics (default: ``DEFAULT_METRICS``), in order."""
    conf, y = check_arrays(confidence, correct)
    chosen = list(DEFAULT_METRICS if names is None else names)
    fns = [METRICS.get(n) for n in chosen]  # fail on an unknown name before computing anything
    return {name: float(fn(conf, y)) for name, fn in zip(chosen, fns, strict=True)}


# ---------------------------------------------------------------- intervals and averages


def bootstrap_ci(
    metric_fn: MetricFn | str,
    confidence: ArrayLike,
    correct: ArrayLike,
    n: int = 1000,
    seed: int = 0,
    alpha: float = 0.05,
) -> tuple[float, float]:
    """Percentile bootstrap ``(low, high)`` interval of a metric at level 1 − ``alpha``.

    Resamples where the metric is NaN (e.g. one class drawn for AUROC) are
    skipped and counted in a log line; if all are NaN, the interval is NaN.
    """
    fn = METRICS.get(metric_fn) if isinstance(metric_fn, str) else metric_fn
    conf, y = check_arrays(confidence, correct)
    if n < 1:
        raise CandorError(f"bootstrap needs n ≥ 1 resamples, got {n}")
    if not 0.0 < alpha < 1.0:
        raise CandorError(f"alpha must be in (0, 1), got {alpha}")
    rng = np.random.default_rng(seed)
    values = []
    with quietly():
        for _ in range(n):
            idx = rng.integers(0, y.size, size=y.size)
            values.append(float(fn(conf[idx], y[idx])))
    arr = np.asarray(values)
    kept = arr[~np.isnan(arr)]
    if kept.size < arr.size:
        logger.info("bootstrap: skipped %d of %d resamples where the metric is NaN", arr.size - kept.size, n)
    if kept.size == 0:
        return _undefined(f"bootstrap: the metric is NaN on all {n} resamples"), math.nan
    low, high = np.quantile(kept, [alpha / 2, 1 - alpha / 2])
    return float(low), float(high)


def weighted_average(
    per_dataset: Mapping[str, Mapping[str, float]], sizes: Mapping[str, int]
) -> dict[str, float]:
    """Average each metric over datasets, weighted by test-set size (as in the papers).

    A NaN in any dataset makes that metric's average NaN, with a warning.
    """
    if not per_dataset:
        raise CandorError("weighted_average needs at least one dataset")
    names = list(next(iter(per_dataset.values())))
    for ds, metrics in per_dataset.items():
        if ds not in sizes:
            raise CandorError(f"no test-set size for dataset {ds!r}")
        if sizes[ds] <= 0:
            raise CandorError(f"dataset {ds!r} has test-set size {sizes[ds]}; sizes must be positive")
        if set(metrics) != set(names):
            diff = sorted(set(metrics) ^ set(names))
            raise CandorError(f"dataset {ds!r} does not report the same metrics as the others: {diff}")
    total = sum(sizes[ds] for ds in per_dataset)
    out: dict[str, float] = {}
    for name in names:
        nan_in = [ds for ds, m in per_dataset.items() if math.isnan(m[name])]
        if nan_in:
            out[name] = _undefined(f"average of {name!r} is NaN because it is NaN on {nan_in}")
            continue
        out[name] = sum(sizes[ds] * per_dataset[ds][name] for ds in per_dataset) / total
    return out


def group_averages(
    per_dataset: Mapping[str, Mapping[str, float]],
    sizes: Mapping[str, int],
    roles: Mapping[str, str],
) -> dict[str, dict[str, float]]:
    """Size-weighted averages per role, e.g. ``{"id": {...}, "ood": {...}}``.

    ``roles`` maps each dataset to its group; datasets in ``roles`` with no
    results are ignored, results with no role are an error.
    """
    groups: dict[str, dict[str, Mapping[str, float]]] = {}
    for ds, metrics in per_dataset.items():
        if ds not in roles:
            raise CandorError(f"dataset {ds!r} has no role (known roles: {sorted(set(roles.values()))})")
        groups.setdefault(roles[ds], {})[ds] = metrics
    return {role: weighted_average(members, sizes) for role, members in groups.items()}
