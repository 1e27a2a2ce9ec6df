"""``report.html``: the evaluation report as one self-contained page (docs/methods.md "Metrics").

:func:`write_report_page` writes, beside the Markdown, CSV, JSON and PNG files
of :func:`candor.evaluation.report.write_report`, one HTML file that opens
offline (:mod:`candor.util.pages`). It shows

- the main table with 95% intervals (when a bootstrap ran), sortable by any
  column, the best value per column marked, in-domain / OOD column groups;
- per method (picked from a list): the reliability diagram with bin counts on
  hover, confidence histograms of correct vs wrong answers, risk–coverage with
  its AURC;
- selective answering: for a chosen method, a threshold slider with the
  answered accuracy, the coverage and the over-abstention (the share of
  refused questions the model would have answered correctly), computed from
  the records in the page (:func:`selective_stats` is the reference);
- a records browser: question, gold, answer, correctness and every method's
  confidence, filtered to "confident and wrong" / "unsure and right" at the
  slider's method and threshold;
- given thresholds or hand labels, the abstention-aware scores and the
  judge-noise correction (:mod:`candor.evaluation.trust`);
- provenance: model, template, judges, candor version, the command;
- with claim data (``claims``: :func:`candor.evaluation.claims.refinement_rows`), the
  refinement curve of each claim column: factual precision against the share of claims kept
  (docs/claims.md "Evaluation").

Records (questions, gold answers, greedy answers) are optional: without them
the browser shows ids, datasets, labels and confidences.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import altair as alt
import numpy as np

from candor.annotation.records import Record
from candor.estimators.confidences import ConfidenceTable
from candor.evaluation.metrics import aurc, risk_coverage
from candor.evaluation.plots import equal_width_bins
from candor.evaluation.trust import trust_html
from candor.util.files import atomic_write_text
from candor.util.pages import asset, esc, render_page
from candor.util.version import __version__

if TYPE_CHECKING:
    from candor.evaluation.summary import Evaluation, SummaryTable

PAGE_FILE = "report.html"
HIST_BINS = 20
CURVE_POINTS = 200  # risk–coverage points kept per method (the curve has one per record)
THRESHOLDS = np.round(np.linspace(0.0, 1.0, 101), 2)
DEFAULT_THRESHOLD = 0.5
TRUST_SLOT = "<!-- trust sections -->"  # where the abstention and judge-noise sections go, when asked for
OPTIONS_CHARS = 200  # an estimator's options shown in the provenance
GROUP_TITLES = {
    "id": "In-domain (size-weighted average)",
    "ood": "Out-of-domain (size-weighted average)",
    "all": "All (pooled)",
}
CORRECT, WRONG = "correct", "wrong"
COLORS = {CORRECT: "#1b8a5a", WRONG: "#c2412d"}


@dataclass(frozen=True)
class Selective:
    """Answer when confidence ≥ threshold: what is answered, how well, and what is refused that was right."""

    threshold: float
    answered: int
    coverage: float
    accuracy: float  # of the answered; NaN when none is answered
    over_abstention: float  # share of the refused that were correct; NaN when none is refused


def selective_stats(confidence: np.ndarray, correct: np.ndarray, threshold: float) -> Selective:
    """The selective-answering numbers at one threshold (the page's script computes the same)."""
    conf, y = np.asarray(confidence, dtype=float), np.asarray(correct, dtype=int)
    answered = conf >= threshold
    n_answered, n_refused = int(answered.sum()), int((~answered).sum())
    accuracy = float(y[answered].mean()) if n_answered else math.nan
    over = float(y[~answered].mean()) if n_refused else math.nan
    return Selective(
        threshold=float(threshold),
        answered=n_answered,
        coverage=n_answered / max(1, conf.size),
        accuracy=accuracy,
        over_abstention=over,
    )


def write_report_page(
    path: str | Path,
    table: ConfidenceTable,
    evaluation: Evaluation,
    main: SummaryTable,
    *,
    title: str,
    records: Sequence[Record] | None = None,
    command: str | None = None,
    trust: Mapping[str, Any] | None = None,
    claims: Sequence[Mapping[str, Any]] | None = None,
) -> Path:
    """Write ``report.html`` (see the module docstring); returns its path.

    ``trust`` (:func:`candor.evaluation.trust.trust_sections`) adds the abstention and judge-noise sections.
    """
    data = page_data(table, evaluation, main, title=title, records=records, command=command)
    charts = _charts(data)
    body = _body(title, evaluation, main).replace(TRUST_SLOT, trust_html(trust or {}))
    if claims:
        charts["refinement"] = _refinement_chart(list(claims)).to_dict()
        body += CLAIMS_SECTION
    html = render_page(
        title, body, data=data, charts=charts, script=asset("report.js", "candor.evaluation.page_assets")
    )
    return atomic_write_text(Path(path), html)


def page_data(
    table: ConfidenceTable,
    evaluation: Evaluation,
    main: SummaryTable,
    *,
    title: str,
    records: Sequence[Record] | None = None,
    command: str | None = None,
) -> dict[str, Any]:
    """Everything the page's script and charts read, as plain JSON data."""
    methods = evaluation.methods
    labels = np.array([r.correct for r in table.rows], dtype=int)
    confidences = {m: table.arrays(m)[0] for m in methods}
    by_id = {r.id: r for r in records or ()}
    return {
        "title": title,
        "methods": methods,
        "threshold": DEFAULT_THRESHOLD,
        "aurc": {m: _num(aurc(confidences[m], labels)) for m in methods},
        "records": {
            "id": [r.id for r in table.rows],
            "dataset": [r.dataset for r in table.rows],
            "correct": labels.tolist(),
            "question": [_question(by_id.get(r.id)) for r in table.rows],
            "gold": [_gold(by_id.get(r.id)) for r in table.rows],
            "answer": [_answer(by_id.get(r.id)) for r in table.rows],
            # 4 decimals: finer than any threshold a reader picks, and it keeps 5,000 × 10 small.
            "confidence": {m: [round(float(v), 4) for v in confidences[m]] for m in methods},
        },
        "reliability": [
            row for m in methods for row in _reliability_rows(m, confidences[m], labels, evaluation.n_bins)
        ],
        "histogram": [row for m in methods for row in _histogram_rows(m, confidences[m], labels)],
        "risk_coverage": [row for m in methods for row in _risk_rows(m, confidences[m], labels)],
        "selective": [row for m in methods for row in _selective_rows(m, confidences[m], labels)],
        "provenance": provenance(table, records, command),
        "has_records": bool(by_id),
        "main_columns": [list(p) for p in main.pairs],
    }


def provenance(table: ConfidenceTable, records: Sequence[Record] | None, command: str | None) -> dict[str, Any]:
    """Model, template, judges, versions and the command, from the records and the confidence columns."""
    first = records[0].provenance if records else {}
    judges = first.get("judges") or {
        k: first.get(f"{k}_judge") for k in ("correctness", "consistency") if first.get(f"{k}_judge")
    }
    columns = {m: (table.provenance(m) or {}).get("produced_by") for m in table.methods}
    models = sorted({str(p.get("model")) for p in columns.values() if p and p.get("model")})
    described = {m: _column_text(p) for m, p in columns.items() if p}
    return {
        "model": first.get("model") or (", ".join(models) if models else None),
        "template": first.get("template"),
        "k": first.get("k"),
        "judges": judges or None,
        "annotated_with_candor": first.get("candor_version"),
        "candor_version": __version__,
        "command": command,
        **{f"column {m}": text for m, text in described.items()},
    }


def _column_text(produced_by: Mapping[str, Any]) -> str:
    """What produced one confidence column, in a line: estimator, options, model and adapter when set."""
    parts = [str(produced_by.get("estimator", "?"))]
    if produced_by.get("options"):
        options = json.dumps(produced_by["options"], sort_keys=True, ensure_ascii=False)
        # Record-valued options (length's dev set, verbal-10's examples) would fill the page: cut them short.
        parts.append(f"options {options if len(options) <= OPTIONS_CHARS else options[:OPTIONS_CHARS] + '…'}")
    parts += [f"{key} {produced_by[key]}" for key in ("model", "adapter") if produced_by.get(key)]
    return ", ".join(parts)


# ---------------------------------------------------------------- chart data


def _reliability_rows(method: str, conf: np.ndarray, y: np.ndarray, n_bins: int) -> list[dict[str, Any]]:
    stats = equal_width_bins(conf, y, n_bins)
    return [
        {
            "method": method,
            "lo": round(float(stats.edges[i]), 4),
            "hi": round(float(stats.edges[i + 1]), 4),
            "count": int(stats.count[i]),
            "accuracy": _num(stats.accuracy[i]),
            "mean_confidence": _num(stats.mean_conf[i]),
        }
        for i in range(n_bins)
        if stats.count[i]
    ]


def _histogram_rows(method: str, conf: np.ndarray, y: np.ndarray) -> list[dict[str, Any]]:
    edges = np.linspace(0.0, 1.0, HIST_BINS + 1)
    rows = []
    for outcome, mask in ((CORRECT, y == 1), (WRONG, y == 0)):
        counts, _ = np.histogram(conf[mask], bins=edges)
        rows += [
            {
                "method": method,
                "outcome": outcome,
                "lo": round(float(edges[i]), 3),
                "hi": round(float(edges[i + 1]), 3),
                "count": int(c),
            }
            for i, c in enumerate(counts)
        ]
    return rows


def _risk_rows(method: str, conf: np.ndarray, y: np.ndarray) -> list[dict[str, Any]]:
    coverage, risk = risk_coverage(conf, y)
    keep = np.unique(np.linspace(0, coverage.size - 1, min(CURVE_POINTS, coverage.size)).round().astype(int))
    return [
        {"method": method, "coverage": round(float(coverage[i]), 4), "risk": round(float(risk[i]), 4)} for i in keep
    ]


def _selective_rows(method: str, conf: np.ndarray, y: np.ndarray) -> list[dict[str, Any]]:
    rows = []
    for t in THRESHOLDS:
        s = selective_stats(conf, y, float(t))
        for measure, value in (
            ("answered accuracy", s.accuracy),
            ("coverage", s.coverage),
            ("over-abstention", s.over_abstention),
        ):
            if not math.isnan(value):
                rows.append({"method": method, "threshold": float(t), "measure": measure, "value": round(value, 4)})
    return rows


# ---------------------------------------------------------------- charts (Vega-Lite through Altair)


def _charts(data: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    first = data["methods"][0]
    return {
        "reliability": _reliability_chart(data["reliability"], first).to_dict(),
        "histogram": _histogram_chart(data["histogram"], first).to_dict(),
        "risk": _risk_chart(data["risk_coverage"], first).to_dict(),
        "selective": _selective_chart(data["selective"], first, data["threshold"]).to_dict(),
    }


def _method_param(first: str) -> alt.Parameter:
    return alt.param(name="method", value=first)


def _reliability_chart(rows: list[dict[str, Any]], first: str) -> alt.TopLevelMixin:
    method = _method_param(first)
    tooltip = [
        alt.Tooltip("lo:Q", title="bin from"),
        alt.Tooltip("hi:Q", title="bin to"),
        alt.Tooltip("count:Q", title="records in bin"),
        alt.Tooltip("accuracy:Q", format=".3f"),
        alt.Tooltip("mean_confidence:Q", title="mean confidence", format=".3f"),
    ]
    base = alt.Chart(alt.Data(values=rows)).transform_filter(alt.datum.method == method)
    scale = alt.Scale(domain=[0, 1])
    bars = base.mark_bar(color="#4c78a8", opacity=0.85, stroke="white").encode(
        x=alt.X("lo:Q", scale=scale, title="confidence"),
        x2="hi:Q",
        y=alt.Y("accuracy:Q", scale=scale, title="accuracy"),
        y2=alt.datum(0),
        tooltip=tooltip,
    )
    dots = base.mark_point(color="#c2412d", filled=True, size=40).encode(
        x="mean_confidence:Q", y="accuracy:Q", tooltip=tooltip
    )
    diagonal = (
        alt.Chart(alt.Data(values=[{"x": 0, "y": 0}, {"x": 1, "y": 1}]))
        .mark_line(strokeDash=[4, 4], color="#333")
        .encode(x="x:Q", y="y:Q")
    )
    top = alt.layer(bars, diagonal, dots).properties(width=300, height=230, title="Reliability (hover: bin counts)")
    counts = (
        base.mark_bar(color="#888", stroke="white")
        .encode(
            x=alt.X("lo:Q", scale=scale, title="confidence"),
            x2="hi:Q",
            y=alt.Y("count:Q", title="count"),
            y2=alt.datum(0),
            tooltip=tooltip,
        )
        .properties(width=300, height=70)
    )
    return alt.vconcat(top, counts, spacing=4).add_params(method)


def _histogram_chart(rows: list[dict[str, Any]], first: str) -> alt.TopLevelMixin:
    method = _method_param(first)
    color = alt.Color("outcome:N", scale=alt.Scale(domain=list(COLORS), range=list(COLORS.values())))
    return (
        alt.Chart(alt.Data(values=rows))
        .transform_filter(alt.datum.method == method)
        .mark_bar(opacity=0.55, stroke="white")
        .encode(
            x=alt.X("lo:Q", scale=alt.Scale(domain=[0, 1]), title="confidence"),
            x2="hi:Q",
            y=alt.Y("count:Q", stack=None, title="answers"),
            y2=alt.datum(0),
            color=color,
            tooltip=["outcome:N", "lo:Q", "hi:Q", "count:Q"],
        )
        .properties(width=300, height=300, title="Confidence: correct vs wrong")
        .add_params(method)
    )


def _risk_chart(rows: list[dict[str, Any]], first: str) -> alt.TopLevelMixin:
    method = _method_param(first)
    return (
        alt.Chart(alt.Data(values=rows))
        .transform_filter(alt.datum.method == method)
        .mark_line(color="#4c78a8")
        .encode(
            x=alt.X("coverage:Q", scale=alt.Scale(domain=[0, 1])),
            y=alt.Y("risk:Q", title="risk (error rate kept)"),
            tooltip=["coverage:Q", "risk:Q"],
        )
        .properties(width=300, height=300, title="Risk–coverage")
        .add_params(method)
    )


def _selective_chart(rows: list[dict[str, Any]], first: str, threshold: float) -> alt.TopLevelMixin:
    method = _method_param(first)
    at = alt.param(name="threshold", value=threshold)
    lines = (
        alt.Chart(alt.Data(values=rows))
        .transform_filter(alt.datum.method == method)
        .mark_line()
        .encode(
            x=alt.X("threshold:Q", scale=alt.Scale(domain=[0, 1]), title="threshold (answer when confidence ≥)"),
            y=alt.Y("value:Q", scale=alt.Scale(domain=[0, 1]), title=""),
            color=alt.Color("measure:N", title=None),
            tooltip=["measure:N", "threshold:Q", alt.Tooltip("value:Q", format=".3f")],
        )
    )
    rule = alt.Chart(alt.Data(values=[{}])).transform_calculate(t="threshold").mark_rule(color="#222").encode(x="t:Q")
    return alt.layer(lines, rule).properties(width=520, height=260).add_params(method, at)


def _refinement_chart(rows: list[dict[str, Any]]) -> alt.TopLevelMixin:
    return (
        alt.Chart(alt.Data(values=rows))
        .mark_line(point=True)
        .encode(
            x=alt.X("kept:Q", scale=alt.Scale(domain=[0, 1]), title="share of claims kept"),
            y=alt.Y("precision:Q", scale=alt.Scale(domain=[0, 1]), title="factual precision of the kept claims"),
            color=alt.Color("method:N", title="claim confidence"),
            tooltip=[
                "method:N",
                alt.Tooltip("threshold:Q", format=".3f"),
                alt.Tooltip("kept:Q", format=".2f"),
                alt.Tooltip("precision:Q", format=".3f"),
            ],
        )
        .properties(width=520, height=300, title="Refinement: drop the claims below a threshold")
    )


# ---------------------------------------------------------------- HTML

CLAIMS_SECTION = """
<h2 id="claims">Claims: refinement</h2>
<p class="note">Each claim of a long answer has its own confidence. Raising the threshold drops the claims
below it: the curve shows the share of claims kept against the share of kept claims that are correct.</p>
<div id="chart-refinement"></div>
"""


def _body(title: str, evaluation: Evaluation, main: SummaryTable) -> str:
    sizes = ", ".join(
        f"{esc(d)} ({evaluation.sizes[d]}, acc {100 * evaluation.accuracy[d]:.1f}%"
        f"{', ' + evaluation.roles[d].upper() if d in evaluation.roles else ''})"
        for d in evaluation.datasets
    )
    ci = (
        f"[low, high]: 95% percentile bootstrap interval, {evaluation.bootstrap} resamples per dataset."
        if evaluation.bootstrap
        else "No bootstrap ran (pass --bootstrap N for 95% intervals)."
    )
    notes = "".join(f"<li>{esc(n)}</li>" for n in evaluation.notes)
    return f"""
<h1>{esc(title)}</h1>
<p class="muted">{evaluation.n_records} records · {len(evaluation.methods)} methods · datasets: {sizes}</p>
<nav><a href="#results">Results</a><a href="#methods">Per method</a><a href="#selective">Selective answering</a>
<a href="#records">Records</a><a href="#provenance">Provenance</a></nav>
<h2 id="results">{esc(main.title)}</h2>
<p class="note">Values ×100; click a header to sort; the best value per column is bold on green.
ECE, Brier and AURC: lower is better. {esc(ci)}</p>
{_main_table_html(main)}
{f'<ul class="note">{notes}</ul>' if notes else ""}
<h2 id="methods">Per method</h2>
<div class="controls"><label>method <select id="method-select"></select></label>
<span>AURC <b id="method-aurc">–</b></span></div>
<div class="charts"><div id="chart-reliability"></div><div id="chart-histogram"></div><div id="chart-risk"></div></div>
<h2 id="selective">Selective answering</h2>
<p class="note">Answer when the confidence is at least the threshold; refuse otherwise. Over-abstention is the
share of refused questions the model would have answered correctly.</p>
<div class="controls"><label>method <select id="sel-method"></select></label>
<label>threshold <input id="sel-threshold" type="range" min="0" max="1" step="0.01"></label>
<b id="sel-threshold-value"></b></div>
<div class="controls">
<span class="stat">answered accuracy<b id="sel-accuracy">–</b></span>
<span class="stat">coverage<b id="sel-coverage">–</b></span>
<span class="stat">over-abstention<b id="sel-over">–</b></span>
<span class="stat">answered<b id="sel-answered">–</b></span></div>
<div id="chart-selective"></div>
{TRUST_SLOT}
<h2 id="records">Records</h2>
<div class="controls"><label>show <select id="rec-filter">
<option value="all">all</option>
<option value="confident-wrong">confident and wrong</option>
<option value="unsure-right">unsure and right</option></select></label>
<label>search <input id="rec-search" type="search" placeholder="question, answer, id"></label>
<span class="muted">confident / unsure: the selective method at its threshold</span>
<b id="rec-count"></b></div>
<div class="scroll"><table id="rec-table"><thead></thead><tbody></tbody></table></div>
<p class="muted" id="rec-more"></p>
<h2 id="provenance">Provenance</h2>
<dl class="kv" id="provenance-list"></dl>
"""


def _main_table_html(main: SummaryTable) -> str:
    groups: list[tuple[str, int]] = []
    for col, _ in main.pairs:
        if groups and groups[-1][0] == col:
            groups[-1] = (col, groups[-1][1] + 1)
        else:
            groups.append((col, 1))
    top = "".join(f'<th colspan="{n}" class="group">{esc(GROUP_TITLES.get(c, c))}</th>' for c, n in groups)
    heads = "".join(f'<th class="num sortable" data-col="{i + 1}">{esc(h)}</th>' for i, h in enumerate(main.headers))
    rows = []
    for method, cells in main.rows:
        tds = "".join(_cell_html(c) for c in cells)
        rows.append(f'<tr data-method="{esc(method)}"><th>{esc(method)}</th>{tds}</tr>')
    return (
        f'<table id="main-table"><thead><tr><th></th>{top}</tr>'
        f'<tr><th class="sortable" data-col="0">method</th>{heads}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _cell_html(cell: Any) -> str:
    value, _, ci = cell.text.partition(" [")
    ci_html = f' <span class="ci">[{esc(ci)}</span>' if ci else ""
    sort = "" if math.isnan(cell.value) else f"{cell.value:.6g}"
    return f'<td class="num{" best" if cell.best else ""}" data-value="{sort}">{esc(value)}{ci_html}</td>'


# ---------------------------------------------------------------- helpers


def _num(x: float) -> float | None:
    return None if x is None or not math.isfinite(float(x)) else round(float(x), 4)


def _question(rec: Record | None) -> str:
    return "" if rec is None else rec.item.question


def _gold(rec: Record | None) -> str:
    return "" if rec is None else " | ".join(rec.item.answers)


def _answer(rec: Record | None) -> str:
    return "" if rec is None else rec.greedy.text
