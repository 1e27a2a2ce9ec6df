"""The evaluation report: metric tables, reliability diagrams and an index, as files (docs/methods.md "Metrics").

The numbers and tables come from :mod:`candor.evaluation.summary` (:func:`~candor.evaluation.summary.evaluate_table`);
:func:`write_report` writes them and the plots to a folder::

    out/
      index.md            what is here, with relative links
      metrics.md          the tables (values ×100, best per column in bold)
      metrics.json        method → dataset or group → metric → value
      metrics.csv         long format: method, dataset, metric, value, ci_low, ci_high
      confidence_hist.png
      risk_coverage.png   risk vs coverage per method (AURC, PRR in the tables)
      reliability/<method>.png
      trust.json          abstention-aware scores and the judge-noise correction, when asked for
                          (thresholds, hand labels: :mod:`candor.evaluation.trust`)
      report.html         all of it on one self-contained page (:mod:`candor.evaluation.report_page`)

Undefined values (AUROC on a dataset with one class) are NaN in memory,
``null`` in JSON, ``nan`` in CSV and "–" in the tables, with a note saying why.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from candor.annotation.records import Record
from candor.estimators.confidences import ConfidenceTable
from candor.evaluation.aggregate import CI_ALPHA
from candor.evaluation.judge_noise import HandLabels
from candor.evaluation.metrics import check_arrays
from candor.evaluation.plots import confidence_histograms, reliability_diagram, risk_coverage_plot
from candor.evaluation.report_page import PAGE_FILE, write_report_page
from candor.evaluation.summary import (
    ALL,
    MISSING,
    PAGE_METRICS,
    REPORT_METRICS,
    Evaluation,
    Nested,
    SummaryTable,
    column_label,
    evaluate_table,
    main_table,
    md_cell,
    per_metric_tables,
    table_markdown,
)
from candor.evaluation.trust import trust_sections
from candor.util.files import atomic_write_text

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReportResult:
    """Where the report went, and its numbers."""

    out_dir: Path
    evaluation: Evaluation
    files: dict[str, Path]
    reliability: dict[str, Path]
    trust: dict[str, Any] = field(default_factory=dict)  # abstention / judge-noise sections, when asked for

    @property
    def metrics(self) -> Nested:
        return self.evaluation.metrics


def format_table_rich(result: Evaluation | ReportResult, table: SummaryTable | None = None) -> Table:
    """A rich Table (the main results unless ``table`` is given), for the CLI to print."""
    evaluation = result.evaluation if isinstance(result, ReportResult) else result
    table = table or main_table(evaluation)
    out = Table(title=table.title)
    out.add_column("method", style="cyan", no_wrap=True)
    for h in table.headers:
        out.add_column(h, justify="right")
    for method, cells in table.rows:
        out.add_row(method, *(f"[bold]{c.text}[/bold]" if c.best else c.text for c in cells))
    return out


def write_report(
    table: ConfidenceTable,
    out_dir: str | Path,
    *,
    roles: Mapping[str, str] | None = None,
    metrics: Sequence[str] = REPORT_METRICS,
    n_bins: int = 10,
    bootstrap: int = 0,
    seed: int = 0,
    title: str = "candor report",
    counts: Mapping[str, Mapping[str, Any]] | None = None,
    records: Sequence[Record] | None = None,
    command: str | None = None,
    thresholds: Mapping[str, float] | None = None,
    hand_labels: HandLabels | None = None,
    claims: Sequence[Mapping[str, Any]] | None = None,
) -> ReportResult:
    """Evaluate ``table`` and write the report folder (see the module docstring).

    ``records`` (the annotated records behind the table) give report.html its questions,
    gold and greedy answers and provenance; ``command`` is what made the report, for provenance.
    ``thresholds`` (method → threshold) add the abstention-aware scores, ``hand_labels`` the
    judge-noise correction (``trust.json`` and two sections of report.html); ``claims``
    (refinement rows of claim columns) adds the refinement plot to report.html.
    """
    result = evaluate_table(
        table, roles=roles, metrics=metrics, n_bins=n_bins, bootstrap=bootstrap, seed=seed, counts=counts
    )
    trust = trust_sections(table, thresholds=thresholds, hand_labels=hand_labels, bootstrap=bootstrap, seed=seed)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "json": _write_text(out_dir / "metrics.json", _json_text(result, title)),
        "csv": _write_text(out_dir / "metrics.csv", _csv_text(result)),
        "md": _write_text(out_dir / "metrics.md", _metrics_md(result, title)),
    }
    pooled = {m: _pooled(table, m) for m in result.methods}
    reliability = {}
    for method, name in safe_filenames(result.methods).items():
        conf, correct = pooled[method]
        reliability[method] = reliability_diagram(
            conf,
            correct,
            out_dir / "reliability" / f"{name}.png",
            title=f"{method} (all datasets)",
            ece=result.metrics[method][ALL].get("ece"),
            n_bins=n_bins,
        )
    files["confidence_hist"] = confidence_histograms(
        pooled, out_dir / "confidence_hist.png", title=f"{title}: confidence of correct vs incorrect answers"
    )
    files["risk_coverage"] = risk_coverage_plot(
        pooled, out_dir / "risk_coverage.png", title=f"{title}: risk vs coverage (all datasets pooled)"
    )
    if trust:
        files["trust"] = _write_text(out_dir / "trust.json", json.dumps(trust, indent=2, ensure_ascii=False) + "\n")
    files["html"] = write_report_page(
        out_dir / PAGE_FILE,
        table,
        result,
        main_table(result, PAGE_METRICS),
        title=title,
        records=records,
        command=command,
        trust=trust,
        claims=claims,
    )
    files["index"] = _write_text(out_dir / "index.md", _index_md(result, title, files, reliability, out_dir))
    logger.info("report written to %s (%d methods, %d datasets)", out_dir, len(result.methods), len(result.datasets))
    return ReportResult(out_dir=out_dir, evaluation=result, files=files, reliability=reliability, trust=trust)


def _pooled(table: ConfidenceTable, method: str) -> tuple[np.ndarray, np.ndarray]:
    return check_arrays(*table.arrays(method))


def safe_filenames(names: Sequence[str]) -> dict[str, str]:
    """A distinct file-safe stem per name (``advice@letter`` → ``advice_letter``)."""
    out: dict[str, str] = {}
    taken: set[str] = set()
    for name in names:
        stem = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "method"
        candidate, i = stem, 2
        while candidate.lower() in taken:  # case-insensitive file systems
            candidate, i = f"{stem}-{i}", i + 1
        taken.add(candidate.lower())
        out[name] = candidate
    return out


def _write_text(path: Path, text: str) -> Path:
    return atomic_write_text(path, text)


def _num(value: float) -> float | None:
    return None if math.isnan(value) else value


def _json_text(result: Evaluation, title: str) -> str:
    return json.dumps(_json_doc(result, title), indent=2, ensure_ascii=False) + "\n"


def _json_doc(result: Evaluation, title: str) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "title": title,
        "n_records": result.n_records,
        "n_bins": result.n_bins,
        "bootstrap": ({"n": result.bootstrap, "seed": result.seed, "alpha": CI_ALPHA} if result.bootstrap else None),
        "datasets": {
            d: {"size": result.sizes[d], "accuracy": result.accuracy[d], "role": result.roles.get(d)}
            for d in result.datasets
        },
        "groups": {
            g: {
                "size": result.sizes[g],
                "accuracy": result.accuracy[g],
                "datasets": [d for d in result.datasets if g == ALL or result.roles.get(d) == g],
            }
            for g in result.groups
        },
        "metrics": {
            m: {c: {k: _num(v) for k, v in cols.items()} for c, cols in per.items()}
            for m, per in result.metrics.items()
        },
        "notes": result.notes,
        # Counts that used to go only to the log: cells whose metric is undefined (NaN: AUROC on one class;
        # Alignment where no threshold splits the fit slice, where the official EliCal code would report
        # its 0.5-threshold fallback), and per-method provenance counts such as parse fallbacks.
        "counts": {m: {"undefined": _undefined_cells(result, m), **result.counts.get(m, {})} for m in result.methods},
    }
    if result.bootstrap:
        doc["bootstrap"]["dropped"] = {  # resamples left out of an interval because the metric was NaN there
            m: {c: {k: v for k, v in cols.items() if v} for c, cols in per.items() if any(cols.values())}
            for m, per in result.bootstrap_dropped.items()
        }
    if result.corrected:
        doc["corrected"] = {  # biased metrics: the bias-corrected estimate their interval ("ci") is around
            m: {c: {k: _num(v) for k, v in cols.items()} for c, cols in per.items()}
            for m, per in result.corrected.items()
        }
    if result.ci:
        doc["ci"] = {
            m: {c: {k: [_num(lo), _num(hi)] for k, (lo, hi) in cols.items()} for c, cols in per.items()}
            for m, per in result.ci.items()
        }
    return doc


def _undefined_cells(result: Evaluation, method: str) -> dict[str, list[str]]:
    """Column → metrics that are NaN for ``method``."""
    out = {c: [k for k, v in cols.items() if math.isnan(v)] for c, cols in result.metrics[method].items()}
    return {c: ks for c, ks in out.items() if ks}


def _csv_text(result: Evaluation) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["method", "dataset", "metric", "value", "ci_low", "ci_high"])
    for method in result.methods:
        for col in result.columns:
            for metric, value in result.metrics[method][col].items():
                ci = result.ci.get(method, {}).get(col, {}).get(metric)
                bounds = ["" if ci is None else repr(b) for b in (ci or (None, None))]
                writer.writerow([method, col, metric, repr(value), *bounds])
    return buf.getvalue()


def _metrics_md(result: Evaluation, title: str) -> str:
    parts = [f"# {title}: metrics", ""]
    parts.append(
        f"{result.n_records} records, {len(result.datasets)} datasets, {len(result.methods)} methods. "
        f"Values ×100; best per column in **bold** (ECE, Brier, MCE, |NCE|: lower is better; "
        f"NCE: closest to 0). {MISSING} marks an undefined value. ECE uses {result.n_bins} equal-width bins."
    )
    if result.roles:
        parts.append("In-domain and OOD columns are averages over datasets weighted by their size.")
    if result.bootstrap:
        parts.append(
            f"[low, high]: {100 * (1 - CI_ALPHA):.0f}% percentile bootstrap interval, "
            f"{result.bootstrap} resamples of each dataset. ECE, MCE and |NCE| are biased upwards on small "
            "samples (their resamples sit above the value, and a percentile interval can exclude it): "
            "`value → corrected [low, high]` gives the plug-in value, the bias-corrected estimate "
            "(2·value − mean of the resamples) and the basic bootstrap interval around it."
        )
    parts += ["", "## " + main_table(result).title, "", table_markdown(main_table(result)), ""]
    parts += ["## Per dataset", ""]
    for t in per_metric_tables(result):
        parts += [f"### {t.title}", "", table_markdown(t), ""]
    if result.notes:
        parts += ["## Notes", "", *(f"- {n}" for n in result.notes), ""]
    return "\n".join(parts)


def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def _index_md(
    result: Evaluation, title: str, files: Mapping[str, Path], reliability: Mapping[str, Path], root: Path
) -> str:
    parts = [f"# {title}", ""]
    parts.append(f"- Records: {result.n_records}")
    parts.append(f"- Datasets: {len(result.datasets)}")
    parts.append(f"- Methods: {', '.join(f'`{m}`' for m in result.methods)}")
    parts += ["", "| dataset | role | n | accuracy (%) |", "|---|---|---:|---:|"]
    for col in result.datasets + result.groups:
        role = result.roles.get(col, "") if col in result.datasets else "group"
        parts.append(
            f"| {md_cell(column_label(col))} | {role} | {result.sizes[col]} | {100 * result.accuracy[col]:.1f} |"
        )
    parts += ["", "## Files", ""]
    parts.append(
        f"- [report.html]({_rel(files['html'], root)}): everything on one page that opens offline "
        "(sortable table, plots, threshold slider, records browser)"
    )
    parts.append(f"- [metrics.md]({_rel(files['md'], root)}): the tables")
    parts.append(f"- [metrics.json]({_rel(files['json'], root)}): every value, method → dataset → metric")
    parts.append(f"- [metrics.csv]({_rel(files['csv'], root)}): the same, long format")
    parts.append(
        f"- [confidence_hist.png]({_rel(files['confidence_hist'], root)}): confidence of correct vs incorrect answers"
    )
    parts.append(
        f"- [risk_coverage.png]({_rel(files['risk_coverage'], root)}): error rate of the answers kept, "
        "most confident first, against the share kept (AURC is the area under it)"
    )
    parts += ["", "## Main results", "", table_markdown(main_table(result)), ""]
    parts += ["## Reliability diagrams (all datasets pooled)", ""]
    for method, path in reliability.items():
        parts.append(f"- [{md_cell(method)}]({_rel(path, root)})")
    parts += ["", f"![confidence histograms]({_rel(files['confidence_hist'], root)})", ""]
    parts += [f"![risk-coverage]({_rel(files['risk_coverage'], root)})", ""]
    if result.notes:
        parts += ["## Notes", "", *(f"- {n}" for n in result.notes), ""]
    return "\n".join(parts)
