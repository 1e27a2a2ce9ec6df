"""Metrics aggregated per dataset and group, over seeds, with bootstrap intervals.

Every table candor prints (the report, the EliCal label-budget curve, the
benchmarks) comes from :func:`aggregate_metrics`::

    result = aggregate_metrics({"n-prob": {"nq": conf_nq, "squad": conf_sq}}, {"nq": y_nq, "squad": y_sq},
                               groups=[Group("id", ("nq",)), Group("ood", ("squad",))], bootstrap=1000)
    result.methods["n-prob"].values["id"]["auroc"]

A method is one confidence array per dataset, or a list of those, one per
training seed; its value in a cell is the mean over seeds. A :class:`Group`
averages its datasets either ``"weighted"`` (the per-dataset values weighted
by test-set size, as the papers report and docs/methods.md "Metrics" asks) or
``"pooled"`` (the metric on all the group's rows at once), chosen explicitly.

The bootstrap resamples each dataset's rows with replacement on its own (a
stratified bootstrap), the same draw for every seed and method, and
recomputes the seed mean of every cell; percentile intervals at level
1 − ``alpha``, except for a *biased* metric (``Metric.biased``: ECE, MCE, |NCE|),
whose draws sit above its plug-in value rather than around it, so a percentile
interval can exclude the value itself ("3.8 [4, 11]"). Those cells get the
bias-corrected estimate, 2·value − mean(draws), in :attr:`MethodResult.corrected`
and the basic bootstrap interval around it, (2·value − q_high, 2·value − q_low),
both clipped to [0, 1] (:func:`bias_corrected`); tables print the two together.
A resample where a metric is undefined (AUROC on a draw of one class) is left
out of that cell's interval, and the number left out is kept in
:attr:`MethodResult.bootstrap_dropped`, so results files can report it.

A metric that fits on some rows and scores the others (Alignment: a threshold
fit on a seeded 20% of the rows, accuracy on the rest; its ``split``) is
resampled within each part and position, so each resample is computed exactly
as the point is: the threshold fit on a draw of the fit rows and scored on a
draw of the other rows. A plain resample would put copies of a row on both
sides and bias the interval upwards, past the point itself.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import sklearn
from numpy.typing import ArrayLike

from candor.evaluation.metrics import DEFAULT_METRICS, METRICS, MetricFn, check_arrays, quietly
from candor.util.errors import CandorError

logger = logging.getLogger(__name__)

CI_ALPHA = 0.05
Average = Literal["weighted", "pooled"]
AVERAGES: tuple[str, ...] = ("weighted", "pooled")

PerDataset = Mapping[str, ArrayLike]  # dataset → confidences, in the order of that dataset's labels
Cells = dict[str, dict[str, float]]  # column (dataset or group) → metric → value


@dataclass(frozen=True)
class Group:
    """A column that averages several datasets, ``weighted`` by test-set size or ``pooled``."""

    name: str
    datasets: tuple[str, ...]
    average: Average = "weighted"

    def __post_init__(self) -> None:
        if self.average not in AVERAGES:
            raise CandorError(f"group {self.name!r}: average must be one of {AVERAGES}, got {self.average!r}")
        if not self.datasets:
            raise CandorError(f"group {self.name!r} has no datasets")


@dataclass
class MethodResult:
    """One method's numbers. ``values``: seed means; ``per_seed``: one value per seed.

    ``counts`` is a free slot for provenance a caller wants in the results
    file beside the numbers (for instance how many verbalized replies fell back
    to a default when parsed); :func:`aggregate_metrics` itself fills ``bootstrap_dropped``.
    """

    values: Cells
    per_seed: dict[str, dict[str, list[float]]]
    ci: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)
    bootstrap_dropped: dict[str, dict[str, int]] = field(default_factory=dict)
    counts: dict[str, Any] = field(default_factory=dict)
    corrected: dict[str, dict[str, float]] = field(default_factory=dict)  # biased metrics: column → metric → value

    @property
    def seed_std(self) -> Cells:
        return {c: {k: float(np.std(v)) for k, v in per.items()} for c, per in self.per_seed.items()}

    def undefined(self) -> dict[str, list[str]]:
        """Column → metrics whose value is NaN (e.g. Alignment where no threshold splits the classes)."""
        out = {c: [k for k, v in per.items() if math.isnan(v)] for c, per in self.values.items()}
        return {c: ks for c, ks in out.items() if ks}


@dataclass
class EvaluationResult:
    """Every method's :class:`MethodResult` and the setup that produced them."""

    methods: dict[str, MethodResult]
    datasets: list[str]
    groups: list[Group]
    sizes: dict[str, int]
    metric_names: list[str]
    ci_metrics: list[str]
    n_bins: int
    bootstrap: int
    seed: int
    alpha: float

    @property
    def columns(self) -> list[str]:
        return [*self.datasets, *(g.name for g in self.groups)]


def aggregate_metrics(
    methods: Mapping[str, PerDataset | Sequence[PerDataset]],
    labels: Mapping[str, ArrayLike],
    *,
    groups: Sequence[Group] = (),
    metrics: Sequence[str] = DEFAULT_METRICS,
    ci_metrics: Sequence[str] | None = None,
    n_bins: int = 10,
    bootstrap: int = 0,
    seed: int = 0,
    alpha: float = CI_ALPHA,
) -> EvaluationResult:
    """Compute ``metrics`` for each method per dataset and group (see the module docstring).

    ``labels`` fixes the datasets and their order; each method gives a
    confidence array per dataset (or a list of those, one per seed).
    ``ci_metrics`` (default: all of ``metrics``) get bootstrap intervals when
    ``bootstrap`` > 0.
    """
    if not methods:
        raise CandorError("nothing to evaluate: no methods")
    if not labels:
        raise CandorError("nothing to evaluate: no datasets")
    if bootstrap < 0:
        raise CandorError(f"bootstrap must be 0 (off) or a number of resamples, got {bootstrap}")
    if not 0.0 < alpha < 1.0:
        raise CandorError(f"alpha must be in (0, 1), got {alpha}")
    fns = metric_functions(metrics, n_bins)
    ci_names = list(fns) if ci_metrics is None else [k for k in ci_metrics if k in fns]
    ys = {ds: _check_labels(ds, y) for ds, y in labels.items()}
    _check_groups(groups, ys)
    runs = {name: _runs(name, given, ys) for name, given in methods.items()}
    sizes = {ds: int(y.size) for ds, y in ys.items()}
    sizes.update({g.name: sum(sizes[d] for d in g.datasets) for g in groups})

    out: dict[str, MethodResult] = {}
    with quietly(), np.errstate(invalid="ignore"):  # undefined cells are reported by the caller, not warned per call
        for name, method_runs in runs.items():
            cells = [_cells(run, fns, groups) for run in method_runs]
            per_seed = {c: {k: [r[c][k] for r in cells] for k in fns} for c in cells[0]}
            values = {c: {k: float(np.mean(v)) for k, v in per.items()} for c, per in per_seed.items()}
            out[name] = MethodResult(values=values, per_seed=per_seed)
            if bootstrap:
                ci_fns = {k: fns[k] for k in ci_names}
                out[name].ci, out[name].bootstrap_dropped, out[name].corrected = _bootstrap(
                    method_runs, ci_fns, groups, bootstrap, seed, alpha, values
                )
    return EvaluationResult(
        methods=out,
        datasets=list(ys),
        groups=list(groups),
        sizes=sizes,
        metric_names=list(fns),
        ci_metrics=ci_names if bootstrap else [],
        n_bins=n_bins,
        bootstrap=bootstrap,
        seed=seed,
        alpha=alpha,
    )


def metric_functions(names: Sequence[str], n_bins: int = 10) -> dict[str, MetricFn]:
    """Registry lookups, with ``n_bins`` bound for the binned metrics; unknown names fail first."""
    if n_bins < 1:
        raise CandorError(f"n_bins must be at least 1, got {n_bins}")
    if not names:
        raise CandorError(f"no metrics chosen; known: {', '.join(METRICS.names())}")
    return {name: METRICS.get(name).bound(n_bins) for name in names}


def _check_labels(dataset: str, labels: ArrayLike) -> np.ndarray:
    y = np.asarray(labels).reshape(-1)
    if y.size == 0:
        raise CandorError(f"dataset {dataset!r} has no labelled rows")
    return check_arrays(np.zeros(y.size), y)[1]


def _check_groups(groups: Sequence[Group], labels: Mapping[str, np.ndarray]) -> None:
    names = [g.name for g in groups]
    clash = sorted({n for n in names if names.count(n) > 1} | (set(names) & set(labels)))
    if clash:
        raise CandorError(f"group names must differ from each other and from the datasets: {clash}")
    for g in groups:
        unknown = [d for d in g.datasets if d not in labels]
        if unknown:
            raise CandorError(f"group {g.name!r} names datasets with no labels: {unknown}; known: {list(labels)}")


Run = dict[str, tuple[np.ndarray, np.ndarray]]  # dataset → (confidence, correct), validated


def _runs(name: str, given: PerDataset | Sequence[PerDataset], labels: Mapping[str, np.ndarray]) -> list[Run]:
    """One validated ``{dataset: (conf, y)}`` per seed."""
    seeds = [given] if isinstance(given, Mapping) else list(given)
    if not seeds:
        raise CandorError(f"method {name!r} has no runs")
    out = []
    for per_ds in seeds:
        missing = [d for d in labels if d not in per_ds]
        if missing:
            raise CandorError(f"method {name!r} has no confidences for datasets {missing}")
        out.append({ds: check_arrays(per_ds[ds], y) for ds, y in labels.items()})
    return out


def _cells(run: Run, fns: Mapping[str, MetricFn], groups: Sequence[Group]) -> Cells:
    """Every metric per dataset, then per group (weighted or pooled)."""
    out = {ds: {k: float(fn(c, y)) for k, fn in fns.items()} for ds, (c, y) in run.items()}
    for g in groups:
        if g.average == "pooled":
            conf = np.concatenate([run[d][0] for d in g.datasets])
            correct = np.concatenate([run[d][1] for d in g.datasets])
            out[g.name] = {k: float(fn(conf, correct)) for k, fn in fns.items()}
        else:
            sizes = {d: run[d][1].size for d in g.datasets}
            total = sum(sizes.values())
            # A NaN in any member makes the average NaN: an undefined cell is never averaged away.
            out[g.name] = {k: sum(sizes[d] * out[d][k] for d in g.datasets) / total for k in fns}
    return out


def _bootstrap(
    runs: Sequence[Run],
    fns: Mapping[str, MetricFn],
    groups: Sequence[Group],
    n: int,
    seed: int,
    alpha: float,
    point: Cells,
) -> tuple[dict[str, dict[str, tuple[float, float]]], dict[str, dict[str, int]], Cells]:
    """Intervals of every cell's seed mean (percentile; bias-corrected for biased metrics), the resamples dropped
    per cell, and the bias-corrected values of the biased metrics."""
    splits = {k: METRICS.get(k).split for k in fns if k in METRICS and METRICS.get(k).split is not None}
    plain = {k: fn for k, fn in fns.items() if k not in splits}
    draws: list[Cells] = []
    split_draws = {k: _split_resamples(runs[0], groups, split, n, seed) for k, split in splits.items()}
    # Inputs were validated once by check_arrays; skipping sklearn's per-call checks saves time.
    with sklearn.config_context(assume_finite=True, skip_parameter_validation=True):
        for index in _resample_indices(runs[0], n, seed):
            per_run = [
                _cells({ds: (c[index[ds]], y[index[ds]]) for ds, (c, y) in run.items()}, plain, groups) for run in runs
            ]
            draws.append({c: {k: float(np.mean([r[c][k] for r in per_run])) for k in plain} for c in per_run[0]})
        for k, resamples in split_draws.items():
            for draw, index in zip(draws, resamples, strict=True):
                values = [_split_cells(run, index, fns[k], groups) for run in runs]
                for col in draw:
                    draw[col][k] = float(np.mean([v[col] for v in values]))
    ci: dict[str, dict[str, tuple[float, float]]] = {}
    dropped: dict[str, dict[str, int]] = {}
    corrected: Cells = {}
    for col in draws[0]:
        ci[col], dropped[col] = {}, {}
        for metric in fns:
            values = [d[col][metric] for d in draws]
            if is_biased(metric):
                value, ci[col][metric], dropped[col][metric] = bias_corrected(point[col][metric], values, alpha)
                corrected.setdefault(col, {})[metric] = value
            else:
                ci[col][metric], dropped[col][metric] = percentile_interval(values, alpha)
            if dropped[col][metric]:
                logger.info(
                    "bootstrap: %s on %s is undefined in %d of %d resamples (left out)",
                    metric,
                    col,
                    dropped[col][metric],
                    n,
                )
    return ci, dropped, corrected


def _resample_indices(run: Run, n: int, seed: int) -> Iterator[dict[str, np.ndarray]]:
    """``n`` stratified resamples (row indices per dataset); the same seed and sizes give the same draws."""
    datasets = list(run)
    # Independent streams per dataset, so equal-sized datasets do not share index draws.
    streams = np.random.SeedSequence(seed).spawn(len(datasets))
    rngs = {ds: np.random.default_rng(s) for ds, s in zip(datasets, streams, strict=True)}
    for _ in range(n):
        yield {ds: rngs[ds].integers(0, y.size, size=y.size) for ds, (_, y) in run.items()}


SplitIndex = dict[str, np.ndarray]  # column (a dataset, or a pooled group) → row indices of one resample


def _split_resamples(run: Run, groups: Sequence[Group], split: Any, n: int, seed: int) -> Iterator[SplitIndex]:
    """``n`` resamples that keep every position in its part of ``split`` (fit or scored), per dataset and pooled group.

    A pooled group's rows are the concatenation of its datasets', so its split
    is over that concatenation and each position is drawn from the same
    dataset and the same part.
    """
    sizes = {ds: y.size for ds, (_, y) in run.items()}
    strata = {ds: [split(size)] for ds, size in sizes.items()}
    for g in groups:
        if g.average == "pooled":
            mask, start = split(sum(sizes[d] for d in g.datasets)), 0
            strata[g.name] = []
            for d in g.datasets:
                strata[g.name].append(mask[start : start + sizes[d]])
                start += sizes[d]
    # A stream per column, apart from the plain draws': a dataset's interval does not depend on the groups asked.
    rngs = {col: np.random.default_rng(np.random.SeedSequence([seed, 1, *col.encode()])) for col in strata}
    for _ in range(n):
        yield {col: np.concatenate([_within_parts(m, rngs[col]) for m in masks]) for col, masks in strata.items()}


def _within_parts(mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Row indices where each position is drawn, with replacement, from the positions of its own part."""
    out = np.empty(mask.size, dtype=int)
    for part in (mask, ~mask):
        where = np.flatnonzero(part)
        if where.size:
            out[where] = rng.choice(where, size=where.size)
    return out


def _split_cells(run: Run, index: SplitIndex, fn: MetricFn, groups: Sequence[Group]) -> dict[str, float]:
    """One split metric on one split-keeping resample: per dataset, then per group (weighted or pooled)."""
    out = {ds: float(fn(c[index[ds]], y[index[ds]])) for ds, (c, y) in run.items()}
    for g in groups:
        if g.average == "pooled":
            conf = np.concatenate([run[d][0] for d in g.datasets])[_pooled_rows(run, g, index[g.name])]
            correct = np.concatenate([run[d][1] for d in g.datasets])[_pooled_rows(run, g, index[g.name])]
            out[g.name] = float(fn(conf, correct))
        else:
            sizes = {d: run[d][1].size for d in g.datasets}
            out[g.name] = sum(sizes[d] * out[d] for d in g.datasets) / sum(sizes.values())
    return out


def _pooled_rows(run: Run, group: Group, index: np.ndarray) -> np.ndarray:
    """A pooled group's per-dataset indices (each within its dataset) as indices into the concatenation."""
    offsets = np.repeat(
        np.cumsum([0] + [run[d][1].size for d in group.datasets[:-1]]), [run[d][1].size for d in group.datasets]
    )
    return index + offsets


@dataclass(frozen=True)
class Ratio:
    """``metric(numerator) / metric(denominator)`` in one column, with its paired bootstrap interval."""

    value: float
    ci: tuple[float, float]
    dropped: int  # resamples where either metric was undefined or the denominator was 0


def metric_ratios(
    numerator: PerDataset,
    denominator: PerDataset,
    labels: Mapping[str, ArrayLike],
    *,
    metric: str = "ece",
    groups: Sequence[Group] = (),
    n_bins: int = 10,
    bootstrap: int = 1000,
    seed: int = 0,
    alpha: float = CI_ALPHA,
) -> dict[str, Ratio]:
    """How many times one method's metric is another's, per dataset and group (e.g. ECE Default / ECE ADVICE).

    The interval is a *paired* bootstrap: each resample draws the same rows
    for both methods (the draws :func:`aggregate_metrics` makes with this seed), so
    the shared question difficulty cancels out of the ratio.
    """
    if bootstrap < 1:
        raise CandorError(f"metric_ratios needs at least one bootstrap resample, got {bootstrap}")
    fns = metric_functions([metric], n_bins)
    ys = {ds: _check_labels(ds, y) for ds, y in labels.items()}
    _check_groups(groups, ys)
    top, bottom = _runs("numerator", numerator, ys)[0], _runs("denominator", denominator, ys)[0]
    with quietly(), np.errstate(invalid="ignore", divide="ignore"):
        point_top, point_bottom = _cells(top, fns, groups), _cells(bottom, fns, groups)
        draws: list[dict[str, float]] = []
        split = METRICS.get(metric).split
        with sklearn.config_context(assume_finite=True, skip_parameter_validation=True):
            if split is not None:  # fit and scored rows resampled apart, as in aggregate_metrics
                for index in _split_resamples(top, groups, split, bootstrap, seed):
                    a, b = (_split_cells(run, index, fns[metric], groups) for run in (top, bottom))
                    draws.append({col: _ratio(a[col], b[col]) for col in a})
            for index in _resample_indices(top, bootstrap if split is None else 0, seed):
                a = _cells({ds: (c[index[ds]], y[index[ds]]) for ds, (c, y) in top.items()}, fns, groups)
                b = _cells({ds: (c[index[ds]], y[index[ds]]) for ds, (c, y) in bottom.items()}, fns, groups)
                draws.append({col: _ratio(a[col][metric], b[col][metric]) for col in a})
    out = {}
    for col in point_top:
        ci, dropped = percentile_interval([d[col] for d in draws], alpha)
        out[col] = Ratio(_ratio(point_top[col][metric], point_bottom[col][metric]), ci, dropped)
    return out


@dataclass(frozen=True)
class Difference:
    """``metric(first) - metric(second)`` (seed means) in one column, with its paired bootstrap interval."""

    value: float
    ci: tuple[float, float]
    dropped: int  # resamples where either metric was undefined


def metric_differences(
    first: PerDataset | Sequence[PerDataset],
    second: PerDataset | Sequence[PerDataset],
    labels: Mapping[str, ArrayLike],
    *,
    metric: str = "auroc",
    groups: Sequence[Group] = (),
    n_bins: int = 10,
    bootstrap: int = 1000,
    seed: int = 0,
    alpha: float = CI_ALPHA,
) -> dict[str, Difference]:
    """How much one method's metric exceeds another's, per dataset and group (e.g. AUROC EliCal@all - @100).

    Each method may give one confidence array per dataset or a list of them, one per seed; the
    value is the difference of seed means. The interval is a *paired* bootstrap: each resample
    draws the same rows for both methods and every seed, so shared question difficulty cancels.
    """
    if bootstrap < 1:
        raise CandorError(f"metric_differences needs at least one bootstrap resample, got {bootstrap}")
    fns = metric_functions([metric], n_bins)
    ys = {ds: _check_labels(ds, y) for ds, y in labels.items()}
    _check_groups(groups, ys)
    a_runs, b_runs = _runs("first", first, ys), _runs("second", second, ys)

    def gap(index: Mapping[str, np.ndarray] | None) -> dict[str, float]:
        def mean(runs: list) -> dict[str, float]:
            cells = [
                _cells(
                    run if index is None else {ds: (c[index[ds]], y[index[ds]]) for ds, (c, y) in run.items()},
                    fns,
                    groups,
                )
                for run in runs
            ]
            return {col: float(np.mean([c[col][metric] for c in cells])) for col in cells[0]}

        a, b = mean(a_runs), mean(b_runs)
        return {col: a[col] - b[col] for col in a}

    with quietly(), np.errstate(invalid="ignore"):
        point = gap(None)
        with sklearn.config_context(assume_finite=True, skip_parameter_validation=True):
            draws = [gap(index) for index in _resample_indices(a_runs[0], bootstrap, seed)]
    out = {}
    for col, value in point.items():
        ci, dropped = percentile_interval([d[col] for d in draws], alpha)
        out[col] = Difference(value, ci, dropped)
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b != 0 and math.isfinite(a) and math.isfinite(b) else math.nan


def percentile_interval(values: Sequence[float], alpha: float = CI_ALPHA) -> tuple[tuple[float, float], int]:
    """The (low, high) percentile interval of the finite values, and how many NaN values were left out."""
    arr = np.asarray(values, dtype=float)
    kept = arr[~np.isnan(arr)]
    if kept.size == 0:
        return (math.nan, math.nan), int(arr.size)
    low, high = np.quantile(kept, [alpha / 2, 1 - alpha / 2])
    return (float(low), float(high)), int(arr.size - kept.size)


def is_biased(metric: str) -> bool:
    """Whether the registered metric ``metric`` is biased like ECE (its intervals are bias-corrected)."""
    return metric in METRICS and METRICS.get(metric).biased


def bias_corrected(
    point: float, values: Sequence[float], alpha: float = CI_ALPHA, bounds: tuple[float, float] = (0.0, 1.0)
) -> tuple[float, tuple[float, float], int]:
    """A biased statistic's bootstrap: the bias-corrected estimate and the basic interval, and the draws left out.

    The bootstrap estimates the bias as mean(draws) − point, so the corrected estimate is
    2·point − mean(draws); the basic interval is (2·point − q_high, 2·point − q_low), the percentile
    interval reflected about the point. Both are clipped to ``bounds`` (ECE lies in [0, 1]). The
    estimate lies inside the interval whenever the draws' mean lies between their quantiles, which a
    percentile interval's point does not ("3.8 [4, 11]": every draw above the point).
    """
    arr = np.asarray(values, dtype=float)
    kept = arr[~np.isnan(arr)]
    if kept.size == 0 or math.isnan(point):
        return math.nan, (math.nan, math.nan), int(arr.size - kept.size)
    low_q, high_q = np.quantile(kept, [alpha / 2, 1 - alpha / 2])
    lo, hi = bounds
    value = float(np.clip(2 * point - kept.mean(), lo, hi))
    interval = (float(np.clip(2 * point - high_q, lo, hi)), float(np.clip(2 * point - low_q, lo, hi)))
    return value, interval, int(arr.size - kept.size)


def json_number(value: float) -> float | None:
    """A float for JSON: NaN becomes null."""
    return None if math.isnan(value) else value
