"""An evaluation's numbers and the tables people read them in.

:func:`evaluate_table` turns a :class:`~candor.estimators.confidences.ConfidenceTable` into
numbers: every metric for every method on every dataset, on all rows pooled
(``"all"``) and, given dataset roles, as size-weighted in-domain (``"id"``) and
out-of-domain (``"ood"``) averages, as the papers report them. With
``bootstrap > 0`` it adds percentile 95% intervals by resampling each dataset
on its own (a stratified bootstrap), so the averages get intervals too.
The numbers come from :func:`candor.evaluation.aggregate.aggregate_metrics`
(``"all"`` is a pooled group, ``"id"``/``"ood"`` are size-weighted groups); this module
adds the labels, notes and tables (:class:`SummaryTable`: values ×100, best per column
flagged), which the report's files (:mod:`candor.evaluation.report`) and page
(:mod:`candor.evaluation.report_page`) render.

Undefined values (AUROC on a dataset with one class) are NaN in memory and "–"
in the tables, with a note saying why.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from candor.estimators.confidences import ConfidenceTable, read_confidences
from candor.evaluation.aggregate import Group, aggregate_metrics
from candor.evaluation.metrics import DEFAULT_METRICS, METRICS, SELECTIVE_METRICS, metric_label
from candor.util.errors import CandorError

logger = logging.getLogger(__name__)

ALL = "all"
ROLES = ("id", "ood")
GROUP_LABELS = {ALL: "All (pooled)", "id": "In-domain (avg)", "ood": "OOD (avg)"}
SHORT_LABELS = {ALL: "All", "id": "ID", "ood": "OOD"}  # main-table headers
MAIN_METRICS = ("auroc", "ece", "brier", "alignment")
PAGE_METRICS = (*MAIN_METRICS, "aurc")  # report.html's main table adds the selective-prediction area
REPORT_METRICS = (*DEFAULT_METRICS, *SELECTIVE_METRICS)
CI_METRICS = ("auroc", "ece", "brier", "alignment", "aurc", "prr", "log_loss")
MISSING = "–"

Nested = dict[str, dict[str, dict[str, float]]]  # method → column → metric → value
NestedCI = dict[str, dict[str, dict[str, tuple[float, float]]]]


# ---------------------------------------------------------------- evaluation


@dataclass
class Evaluation:
    """Every metric for every method, per dataset and per group (:func:`candor.evaluation.aggregate.aggregate_metrics`).

    ``columns`` lists the keys of ``metrics[method]`` in display order: the
    datasets, then ``"all"``, then ``"id"`` / ``"ood"`` when roles were given.
    ``ci`` is empty unless a bootstrap ran; ``bootstrap_dropped`` counts, per
    cell, the resamples left out of its interval because the metric was
    undefined on them. ``counts`` is a per-method slot for provenance counts
    (e.g. verbalized-parse fallbacks) that the results files carry.
    """

    metrics: Nested
    columns: list[str]
    datasets: list[str]
    sizes: dict[str, int]
    accuracy: dict[str, float]
    roles: dict[str, str]
    metric_names: list[str]
    n_bins: int
    ci: NestedCI = field(default_factory=dict)
    bootstrap: int = 0
    seed: int = 0
    notes: list[str] = field(default_factory=list)
    bootstrap_dropped: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)
    counts: dict[str, dict[str, Any]] = field(default_factory=dict)
    corrected: Nested = field(default_factory=dict)  # biased metrics' bias-corrected values (aggregate.bias_corrected)

    @property
    def methods(self) -> list[str]:
        return list(self.metrics)

    def markdown(self) -> str:
        """The main table (AUROC, ECE, Brier, Alignment per method and column) as Markdown."""
        return table_markdown(main_table(self))

    @property
    def groups(self) -> list[str]:
        return [c for c in self.columns if c not in self.datasets]

    @property
    def n_records(self) -> int:
        return sum(self.sizes[d] for d in self.datasets)


def evaluate_table(
    table: ConfidenceTable,
    *,
    roles: Mapping[str, str] | None = None,
    metrics: Sequence[str] = REPORT_METRICS,
    n_bins: int = 10,
    bootstrap: int = 0,
    seed: int = 0,
    counts: Mapping[str, Mapping[str, Any]] | None = None,
) -> Evaluation:
    """The report's numbers for a confidence table (no files). See the module docstring.

    ``counts`` (method → name → value) is provenance to carry into the results
    files beside each method's numbers, e.g. verbalized-parse fallback counts.
    """
    if not table.rows:
        raise CandorError("the confidence table is empty: nothing to evaluate")
    methods = table.methods
    if not methods:
        raise CandorError("the confidence table has no confidence columns: score some methods first")
    datasets = table.datasets
    roles = _check_roles(roles, datasets)
    labels = {ds: _labels(table, ds) for ds in datasets}
    confidences = {m: {ds: table.arrays(m, ds)[0] for ds in datasets} for m in methods}
    if bootstrap:
        logger.info("bootstrap: %d resamples per dataset", bootstrap)
    aggregated = aggregate_metrics(
        confidences,
        labels,
        groups=report_groups(datasets, roles),
        metrics=metrics,
        ci_metrics=CI_METRICS,
        n_bins=n_bins,
        bootstrap=bootstrap,
        seed=seed,
    )
    sizes, accuracy = _sizes_and_accuracy(labels, roles)
    result = Evaluation(
        metrics={m: r.values for m, r in aggregated.methods.items()},
        columns=aggregated.columns,
        datasets=datasets,
        sizes=sizes,
        accuracy=accuracy,
        roles=dict(roles),
        metric_names=aggregated.metric_names,
        n_bins=n_bins,
        ci={m: r.ci for m, r in aggregated.methods.items()} if bootstrap else {},
        bootstrap=bootstrap,
        seed=seed,
        bootstrap_dropped={m: r.bootstrap_dropped for m, r in aggregated.methods.items()} if bootstrap else {},
        corrected={m: r.corrected for m, r in aggregated.methods.items()} if bootstrap else {},
        counts={
            m: {**r.counts, **_table_counts(table, m), **(counts or {}).get(m, {})}
            for m, r in aggregated.methods.items()
        },
    )
    result.notes = _notes(result, labels)
    for note in result.notes:
        logger.warning(note)
    return result


def evaluate(
    confidences: ConfidenceTable | str | Path,
    *,
    ood: Iterable[str] = (),
    metrics: Sequence[str] = REPORT_METRICS,
    bootstrap: int = 0,
) -> Evaluation:
    """Every metric for every method, per dataset and averaged (in-domain / ``ood`` weighted by size).

    ``confidences`` is a table or a confidences file; ``candor.evaluate`` is this function.
    """
    table = read_confidences(confidences) if isinstance(confidences, str | Path) else confidences
    roles = roles_from_ood(table, ood)
    return evaluate_table(table, roles=roles, metrics=metrics, bootstrap=bootstrap)


def _table_counts(table: ConfidenceTable, method: str) -> dict[str, Any]:
    """Counts the confidences file keeps for a column (verbalized-parse fallbacks), for the results files."""
    fallbacks = table.parse_fallbacks(method)
    return {} if fallbacks is None else {"parse_fallbacks": fallbacks}


def roles_from_ood(table: ConfidenceTable, ood: Iterable[str], source: str = "the table") -> dict[str, str] | None:
    """Dataset roles from the out-of-domain names (the rest in-domain); None when none is named.

    An unknown name is an error: a typo would otherwise silently drop the OOD group.
    """
    ood_names = {n.strip() for n in ood if n.strip()}
    unknown = sorted(ood_names - set(table.datasets))
    if unknown:
        raise CandorError(f"--ood {', '.join(unknown)}: not a dataset in {source}; known: {', '.join(table.datasets)}")
    return {d: ("ood" if d in ood_names else "id") for d in table.datasets} if ood_names else None


def report_groups(datasets: Sequence[str], roles: Mapping[str, str]) -> list[Group]:
    """The report's columns after the datasets: all rows pooled, then size-weighted id/ood averages."""
    groups = [Group(ALL, tuple(datasets), "pooled")]
    for role in _present_roles(roles):
        groups.append(Group(role, tuple(d for d in datasets if roles[d] == role), "weighted"))
    return groups


def _sizes_and_accuracy(
    labels: Mapping[str, np.ndarray], roles: Mapping[str, str]
) -> tuple[dict[str, int], dict[str, float]]:
    """Per dataset and per group; a role's accuracy is size-weighted like its metrics."""
    sizes = {ds: int(y.size) for ds, y in labels.items()}
    accuracy = {ds: float(y.mean()) for ds, y in labels.items()}
    pooled = np.concatenate(list(labels.values()))
    sizes[ALL], accuracy[ALL] = int(pooled.size), float(pooled.mean())
    for role in _present_roles(roles):
        members = [d for d in labels if roles[d] == role]
        sizes[role] = sum(sizes[d] for d in members)
        accuracy[role] = sum(sizes[d] * accuracy[d] for d in members) / sizes[role]
    return sizes, accuracy


def _check_roles(roles: Mapping[str, str] | None, datasets: list[str]) -> dict[str, str]:
    for reserved in (ALL, *ROLES):
        if reserved in datasets:
            raise CandorError(f"dataset name {reserved!r} is reserved for a group in the report; rename it")
    if not roles:
        return {}
    bad = {d: r for d, r in roles.items() if r not in ROLES}
    if bad:
        raise CandorError(f"dataset roles must be 'id' or 'ood'; got {bad}")
    unknown = sorted(set(roles) - set(datasets))
    if unknown:
        raise CandorError(f"roles name datasets that are not in the table: {unknown}; known: {datasets}")
    missing = [d for d in datasets if d not in roles]
    if missing:
        raise CandorError(f"datasets {missing} have no role; give every dataset 'id' or 'ood'")
    return dict(roles)


def _present_roles(roles: Mapping[str, str]) -> list[str]:
    return [r for r in ROLES if r in roles.values()]


def _labels(table: ConfidenceTable, dataset: str) -> np.ndarray:
    rows = [r for r in table.rows if r.dataset == dataset]
    unlabeled = [r.id for r in rows if r.correct is None]
    if unlabeled:
        raise CandorError(f"{len(unlabeled)} rows have no correctness label, e.g. {unlabeled[0]}")
    return np.array([r.correct for r in rows], dtype=int)


_WHY_UNDEFINED = {
    "alignment": "no threshold in 0.01–0.99 splits its 20% fit slice into two classes (constant confidence?); "
    "the official EliCal code would fall back to a 0.5 threshold here",
}


def _notes(result: Evaluation, labels: Mapping[str, np.ndarray]) -> list[str]:
    """Say why each undefined value is undefined."""
    notes = []
    for col in result.columns:
        nan_for = {k: [m for m in result.methods if math.isnan(result.metrics[m][col][k])] for k in result.metric_names}
        nan_for = {k: ms for k, ms in nan_for.items() if ms}
        if col in result.datasets and labels[col].min() == labels[col].max():
            y = labels[col]
            ranking = [k for k, ms in nan_for.items() if len(ms) == len(result.methods)]
            if ranking:
                names = ", ".join(metric_label(k) for k in ranking)
                verdict = "correct" if y[0] else "incorrect"
                notes.append(
                    f"`{col}`: all {y.size} answers are {verdict}, so {names} (which rank correct "
                    f"against incorrect answers) are undefined there ({MISSING})."
                )
                nan_for = {k: ms for k, ms in nan_for.items() if k not in ranking}
        for metric, methods in nan_for.items():
            who = ", ".join(f"`{m}`" for m in methods)
            label = metric_label(metric)
            if col in result.roles.values():
                members = [
                    d
                    for d in result.datasets
                    if result.roles[d] == col and any(math.isnan(result.metrics[m][d][metric]) for m in methods)
                ]
                why = f"it is undefined on {', '.join(f'`{d}`' for d in members)}"
            else:
                why = _WHY_UNDEFINED.get(metric, "see the log")
            where = f"`{col}`" if col in result.datasets else column_label(col)
            notes.append(f"{where}: {label} is undefined ({MISSING}) for {who}: {why}.")
    return notes


# ---------------------------------------------------------------- tables


@dataclass(frozen=True)
class Cell:
    text: str
    best: bool = False
    value: float = math.nan  # the unformatted value (report.html sorts by it)


@dataclass(frozen=True)
class SummaryTable:
    """A rendered-agnostic table: methods as rows, (column, metric) pairs as columns."""

    title: str
    headers: list[str]
    rows: list[tuple[str, list[Cell]]]
    pairs: list[tuple[str, str]] = field(default_factory=list)  # (column, metric) behind each header


def column_label(col: str) -> str:
    return GROUP_LABELS.get(col, col or "(no dataset)")


def _fmt(value: float, ci: tuple[float, float] | None) -> str:
    if math.isnan(value):
        return MISSING
    text = f"{100 * value:.1f}"
    if ci is not None and not math.isnan(ci[0]):
        text += f" [{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"
    return text


def _best_rounded(values: list[float], metric: str) -> set[str]:
    """The formatted value(s) that win a column, compared at display precision."""
    finite = [round(100 * v, 1) for v in values if not math.isnan(v)]
    if len(finite) < 2:
        return set()
    spec = METRICS.get(metric)
    best = spec.best(finite)
    if best is None:
        return set()
    if spec.better == "zero":  # +x and -x tie
        return {f"{v:.1f}" for v in finite if abs(v) == abs(best)}
    return {f"{best:.1f}"}


def summary_table(
    result: Evaluation, pairs: Sequence[tuple[str, str]], title: str, header: Callable[[str, str], str]
) -> SummaryTable:
    """Methods × ``(column, metric)`` pairs, values ×100, best per column flagged."""
    rows: list[tuple[str, list[Cell]]] = [(m, []) for m in result.methods]
    for col, metric in pairs:
        values = [result.metrics[m][col][metric] for m in result.methods]
        winners = _best_rounded(values, metric)
        for (method, cells), value in zip(rows, values, strict=True):
            ci = result.ci.get(method, {}).get(col, {}).get(metric)
            best = not math.isnan(value) and f"{100 * value:.1f}" in winners
            corrected = result.corrected.get(method, {}).get(col, {}).get(metric)
            text = _fmt(value, None) + f" → {_fmt(corrected, ci)}" if corrected is not None else _fmt(value, ci)
            cells.append(Cell(text, best, value))
    return SummaryTable(title, [header(c, k) for c, k in pairs], rows, list(pairs))


def main_columns(result: Evaluation) -> list[str]:
    """ID/OOD averages when roles were given, else the datasets (and the pool if several)."""
    groups = _present_roles(result.roles)
    if groups:
        return groups
    return result.datasets + ([ALL] if len(result.datasets) > 1 else [])


def main_table(result: Evaluation, metrics: Sequence[str] = MAIN_METRICS) -> SummaryTable:
    shown = [k for k in metrics if k in result.metric_names]
    pairs = [(c, k) for c in main_columns(result) for k in shown]
    return summary_table(
        result, pairs, "Main results (×100)", lambda c, k: f"{SHORT_LABELS.get(c, c)} {metric_label(k)}"
    )


def per_metric_tables(result: Evaluation) -> list[SummaryTable]:
    """One table per metric, every dataset and group as a column (accuracy is per dataset, not here)."""
    return [
        summary_table(
            result, [(c, k) for c in result.columns], f"{metric_label(k)} (×100)", lambda c, k: column_label(c)
        )
        for k in result.metric_names
        if k != "accuracy"
    ]


def md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def table_markdown(table: SummaryTable) -> str:
    lines = [
        "| method | " + " | ".join(md_cell(h) for h in table.headers) + " |",
        "|---|" + "---:|" * len(table.headers),
    ]
    for method, cells in table.rows:
        texts = [f"**{c.text}**" if c.best else c.text for c in cells]
        lines.append(f"| {md_cell(method)} | " + " | ".join(md_cell(t) for t in texts) + " |")
    return "\n".join(lines)
