"""Metrics of confidence against correctness (docs/methods.md "Metrics").

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

Each metric is registered with :func:`register_metric`, which records its
display label and which direction is better, so tables and the aggregation
(:mod:`candor.evaluation.aggregate`) read one definition.

Alignment and the official EliCal code: when no threshold in 0.01–0.99 splits
the fit slice into two classes (constant confidence, for instance), we return
NaN, and the evaluation writes which cells are undefined into its results; the
official code falls back to a threshold of 0.5 and reports a number anyway.

Selective prediction (risk–coverage): rows are kept in order of decreasing
confidence; the *risk* at coverage k/N is the error rate of the k kept rows.
Tied confidences cannot be ordered, so the risk uses the expected number of
errors over a random order within a tie (the tie block's error rate for each
of its rows). AURC is the mean risk over k = 1..N. PRR (prediction rejection
ratio) is (AURC_random − AURC) / (AURC_random − AURC_oracle), where random
risk is the overall error rate at every coverage and the oracle keeps every
correct answer first: 1 is perfect, 0 no better than chance, NaN with one class.
"""

from __future__ import annotations

import contextlib
import logging
import math
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from candor.util.errors import CandorError
from candor.util.registry import Registry

logger = logging.getLogger(__name__)

MetricFn = Callable[[np.ndarray, np.ndarray], float]
Better = Literal["higher", "lower", "zero"]  # "zero": closest to 0 is best (signed NCE)


@dataclass(frozen=True)
class Metric:
    """A registered metric: the function and what tables need to show it."""

    name: str
    fn: Callable[..., float]
    label: str
    better: Better | None
    binned: bool = False  # takes ``n_bins`` (ECE and relatives)
    # For a metric that fits on some rows and scores the others (Alignment): n → the boolean mask of the
    # rows it fits on. A bootstrap then resamples within each part, so no row is both fit and scored.
    split: Callable[[int], np.ndarray] | None = None
    # A plug-in estimate biased away from its true value in small samples (ECE and other binned absolute gaps:
    # noise only adds to them), so a bootstrap's draws sit beside the point, not around it, and a percentile
    # interval can exclude the point itself. Intervals of these are bias-corrected (aggregate.bias_corrected).
    biased: bool = False

    def __call__(self, confidence: ArrayLike, correct: ArrayLike, **kwargs: object) -> float:
        return self.fn(confidence, correct, **kwargs)

    def bound(self, n_bins: int) -> MetricFn:
        """The function with ``n_bins`` fixed where the metric is binned."""
        return partial(self.fn, n_bins=n_bins) if self.binned else self.fn

    def best(self, values: Sequence[float]) -> float | None:
        """The best of ``values`` by this metric's direction (None when no direction)."""
        if self.better is None or not values:
            return None
        if self.better == "zero":
            return min(values, key=abs)
        return max(values) if self.better == "higher" else min(values)


METRICS: Registry[Metric] = Registry("metric")
DEFAULT_METRICS = ("accuracy", "auroc", "auprc", "brier", "ece", "mce", "nce", "abs_nce", "alignment")
SELECTIVE_METRICS = ("aurc", "prr", "log_loss")  # issue 14: selective prediction and log-loss


def register_metric(
    name: str,
    *,
    label: str,
    better: Better | None,
    binned: bool = False,
    split: Callable[[int], np.ndarray] | None = None,
    biased: bool = False,
) -> Callable[[Callable[..., float]], Callable[..., float]]:
    """Register a metric function with its label and better direction; returns the function unchanged."""

    def decorator(fn: Callable[..., float]) -> Callable[..., float]:
        METRICS.register(name)(
            Metric(name=name, fn=fn, label=label, better=better, binned=binned, split=split, biased=biased)
        )
        return fn

    return decorator


def metric_label(name: str) -> str:
    """The display label of a registered metric (the name itself if unknown)."""
    return METRICS.get(name).label if name in METRICS else name


_quiet = False  # set by the bootstrap so a thousand resamples do not warn a thousand times


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
            f"{what} must lie in [0, 1] (higher = more confident); index {i} is {conf[i].item()!r}"
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
        raise CandorError(f"correct must hold 0/1 labels; index {i} is {raw.tolist()[i]!r}")
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


def _bin_gaps(confidence: np.ndarray, correct: np.ndarray, n_bins: int, strategy: str) -> tuple[np.ndarray, np.ndarray]:
    """Per non-empty bin: weight n_b/N and gap acc_b − conf_b."""
    idx = bin_indices(confidence, n_bins, strategy)
    counts = np.bincount(idx, minlength=n_bins).astype(float)
    conf_sum = np.bincount(idx, weights=confidence, minlength=n_bins)
    acc_sum = np.bincount(idx, weights=correct.astype(float), minlength=n_bins)
    full = counts > 0
    gaps = (acc_sum[full] - conf_sum[full]) / counts[full]
    return counts[full] / confidence.size, gaps


# ---------------------------------------------------------------- metrics


# Each metric is registered by a call after its definition rather than a decorator: mutmut
# (benchmarks/mutation.py) leaves decorated functions unmutated.


def accuracy(confidence: ArrayLike, correct: ArrayLike) -> float:
    """Fraction correct (the confidences are checked but not used)."""
    _, y = check_arrays(confidence, correct)
    return float(y.mean())


register_metric("accuracy", label="Acc", better="higher")(accuracy)


def auroc(confidence: ArrayLike, correct: ArrayLike) -> float:
    """Area under the ROC curve of confidence as a score for correctness.

    Computed by the rank-sum (Mann–Whitney) identity with ties counted half,
    which equals scikit-learn's ``roc_auc_score`` (the tests check it) and is
    many times faster on the small arrays a bootstrap draws.
    """
    conf, y = check_arrays(confidence, correct)
    if _one_class(y):
        return _undefined(f"AUROC is undefined: all {y.size} labels are {int(y[0])}; returning NaN")
    positives = int(y.sum())
    negatives = y.size - positives
    from scipy.stats import rankdata  # lazy: serving imports these metrics, scipy.stats costs seconds

    ranks = rankdata(conf)
    return float((ranks[y == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives))


register_metric("auroc", label="AUROC", better="higher")(auroc)


def auprc(confidence: ArrayLike, correct: ArrayLike) -> float:
    """Area under the precision-recall curve, correct = positive (average precision)."""
    conf, y = check_arrays(confidence, correct)
    if _one_class(y):
        return _undefined(f"AUPRC is undefined: all {y.size} labels are {int(y[0])}; returning NaN")
    from sklearn.metrics import average_precision_score  # lazy, as rankdata above

    return float(average_precision_score(y, conf))


register_metric("auprc", label="AUPRC", better="higher")(auprc)


def brier(confidence: ArrayLike, correct: ArrayLike) -> float:
    """Mean squared difference between confidence and correctness."""
    conf, y = check_arrays(confidence, correct)
    return float(np.mean((conf - y) ** 2))


register_metric("brier", label="Brier", better="lower")(brier)


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


register_metric("ece", label="ECE", better="lower", binned=True, biased=True)(ece)
register_metric("mce", label="MCE", better="lower", binned=True, biased=True)(mce)
register_metric("nce", label="NCE", better="zero", binned=True)(nce)
register_metric("abs_nce", label="|NCE|", better="lower", binned=True, biased=True)(abs_nce)


def ece_quantile(confidence: ArrayLike, correct: ArrayLike) -> float:
    """ECE with 10 equal-mass bins."""
    return ece(confidence, correct, strategy="quantile")


register_metric("ece_quantile", label="ECE (eq-mass)", better="lower", biased=True)(ece_quantile)


ALIGNMENT_THRESHOLDS = np.arange(1, 100) / 100


def alignment(confidence: ArrayLike, correct: ArrayLike, seed: int = 0, fit_fraction: float = 0.2) -> float:
    """EliCal's Alignment: accuracy of 1[conf ≥ t] on held-out rows, t tuned on a seeded slice.

    The threshold t in {0.01, ..., 0.99} maximizes accuracy on a random
    ``fit_fraction`` of the rows (ties go to the smallest t), skipping
    thresholds that put every row of that slice in one class; the accuracy is
    reported on the other rows.

    When no threshold splits the fit slice (e.g. constant confidence) the value
    is NaN, and evaluation results name the undefined cells. The official
    EliCal code instead falls back to t = 0.5 and reports that accuracy; we do
    not, since that number reflects the fallback rather than the confidences.
    """
    conf, y = check_arrays(confidence, correct)
    if y.size < 2:
        return _undefined("Alignment needs at least 2 rows (a fit slice and an eval slice); returning NaN")
    fit = alignment_fit_rows(y.size, seed, fit_fraction)
    threshold = _best_threshold(conf[fit], y[fit])
    if threshold is None:
        return _undefined(
            f"Alignment is undefined: every threshold puts all {int(fit.sum())} fit rows in one class; returning NaN"
        )
    return float(np.mean((conf[~fit] >= threshold).astype(int) == y[~fit]))


def alignment_fit_rows(n: int, seed: int = 0, fit_fraction: float = 0.2) -> np.ndarray:
    """The boolean mask of the rows Alignment fits its threshold on: a seeded ``fit_fraction`` of ``n`` (≥ 1 each side).

    A bootstrap of Alignment must resample the fit rows and the scored rows
    apart: a row drawn into both would score the threshold on the rows it was
    fit to, and lift the interval above the point (issue 28 saw "45.0 [46.2, 79.4]").
    """
    if not 0.0 < fit_fraction < 1.0:
        raise CandorError(f"fit_fraction must be in (0, 1), got {fit_fraction}")
    perm = np.random.default_rng(seed).permutation(n)
    n_fit = min(max(round(fit_fraction * n), 1), n - 1)
    mask = np.zeros(n, dtype=bool)
    mask[perm[:n_fit]] = True
    return mask


register_metric("alignment", label="Alignment", better="higher", split=alignment_fit_rows)(alignment)


def _best_threshold(conf: np.ndarray, y: np.ndarray) -> float | None:
    preds = conf[None, :] >= ALIGNMENT_THRESHOLDS[:, None]  # (thresholds, rows)
    positives = preds.sum(axis=1)
    usable = (positives > 0) & (positives < conf.size)
    if not usable.any():
        return None
    acc = (preds == y[None, :].astype(bool)).mean(axis=1)
    acc[~usable] = -1.0
    return float(ALIGNMENT_THRESHOLDS[int(np.argmax(acc))])


# ---------------------------------------------------------------- selective prediction and log-loss


def risk_coverage(confidence: ArrayLike, correct: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Coverage k/N and risk (error rate of the k most confident rows) for k = 1..N, ties averaged.

    See the module docstring for the tie rule.
    """
    conf, y = check_arrays(confidence, correct)
    order = np.argsort(-conf, kind="stable")
    conf, errors = conf[order], 1.0 - y[order]
    # Within a block of tied confidences every row gets the block's mean error, so the
    # cumulative errors are the expectation over the orders the tie allows.
    _, start, count = np.unique(-conf, return_index=True, return_counts=True)
    block_mean = np.add.reduceat(errors, start) / count
    expected = np.repeat(block_mean, count)
    kept = np.arange(1, conf.size + 1)
    return kept / conf.size, np.cumsum(expected) / kept


def _oracle_aurc(y: np.ndarray) -> float:
    """AURC when every correct row is kept before every wrong one."""
    kept = np.arange(1, y.size + 1)
    return float(np.mean(np.maximum(0, kept - int(y.sum())) / kept))


def aurc(confidence: ArrayLike, correct: ArrayLike) -> float:
    """Area under the risk–coverage curve: the mean risk over coverages 1/N..N/N."""
    _, risk = risk_coverage(confidence, correct)
    return float(np.mean(risk))


register_metric("aurc", label="AURC", better="lower")(aurc)


def prr(confidence: ArrayLike, correct: ArrayLike) -> float:
    """Prediction rejection ratio: how much of the oracle's AURC gain over random the confidence gets."""
    conf, y = check_arrays(confidence, correct)
    if _one_class(y):
        return _undefined(f"PRR is undefined: all {y.size} labels are {int(y[0])}; returning NaN")
    random = 1.0 - float(y.mean())  # expected risk at every coverage when rows are kept at random
    oracle = _oracle_aurc(y)
    return float((random - aurc(conf, y)) / (random - oracle))


register_metric("prr", label="PRR", better="higher")(prr)


def log_loss(confidence: ArrayLike, correct: ArrayLike) -> float:
    """Mean negative log-likelihood of correctness under the confidence, in nats.

    Confidences are clipped to [eps, 1 − eps] (eps = float64 machine epsilon, as
    scikit-learn's ``log_loss`` does), so a confident wrong answer costs about 36
    nats instead of infinity.
    """
    conf, y = check_arrays(confidence, correct)
    eps = np.finfo(float).eps
    p = np.clip(conf, eps, 1.0 - eps)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))


register_metric("log_loss", label="Log-loss", better="lower")(log_loss)


def compute_metrics(confidence: ArrayLike, correct: ArrayLike, names: Sequence[str] | None = None) -> dict[str, float]:
    """The named metrics (default: ``DEFAULT_METRICS``), in order."""
    conf, y = check_arrays(confidence, correct)
    chosen = list(DEFAULT_METRICS if names is None else names)
    fns = [METRICS.get(n) for n in chosen]  # fail on an unknown name before computing anything
    return {name: float(fn(conf, y)) for name, fn in zip(chosen, fns, strict=True)}
