"""``diagnose.html``: the diagnose report as one self-contained page (like the evaluation's report.html).

Models side by side: the headline table, the pairwise-JSD histogram with the
0.1 mark, μ of correct vs wrong candidates, the answer-masking distributions
and the per-question masking shift (μ with the real answer against μ with it
masked), the attention-rollout mass per region (log scale), and an
integrated-gradients view per (question, candidate answer): pick a model and an
example and see its prompt's tokens shaded by attribution, with μ, the
convergence delta and the top tokens. A stage that did not run leaves its
section out. Charts are Vega-Lite through Altair, inlined by
:mod:`candor.util.pages`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import altair as alt
import numpy as np

from candor.diagnose.config_and_results import DiagnoseConfig, ModelDiagnosis
from candor.diagnose.regions import REGIONS
from candor.diagnose.sensitivity import JSD_THRESHOLD
from candor.util.files import atomic_write_text
from candor.util.pages import asset, esc, render_page
from candor.util.version import __version__
from candor.verbal.formats import get_format

PAGE_FILE = "diagnose.html"
JSD_BINS = 35
MU_BINS = 20
LOG_FLOOR = 1e-10

# Shown beside the integrated-gradients view: single tokens' attributions often exceed the change they explain.
IG_CAVEAT = (
    "Integrated gradients splits the change from the baseline (μ minus μ with every token a pad token) into "
    "per-token parts that add up to it, positive and negative parts cancelling: one token's attribution "
    "can therefore be larger than the whole change. Compare tokens with each other, not with the change."
)


def write_diagnosis_page(
    path: str | Path,
    diagnoses: Mapping[str, ModelDiagnosis],
    config: DiagnoseConfig,
    headline: Sequence[tuple[str, Sequence[str]]],
    *,
    title: str,
) -> Path:
    """Write ``diagnose.html``; ``headline`` is the report's table (label, one cell per model)."""
    data = page_data(diagnoses, config, headline, title=title)
    html = render_page(
        title, _body(data), data=data, charts=_charts(data), script=asset("diagnose.js", "candor.diagnose.page_assets")
    )
    return atomic_write_text(Path(path), html)


def page_data(
    diagnoses: Mapping[str, ModelDiagnosis],
    config: DiagnoseConfig,
    headline: Sequence[tuple[str, Sequence[str]]],
    *,
    title: str,
) -> dict[str, Any]:
    """Everything the page shows, as plain JSON data."""
    return {
        "title": title,
        "models": {n: {"model": d.model, "adapter": d.adapter} for n, d in diagnoses.items()},
        "config": config.to_dict(),
        "candor_version": __version__,
        "headline": [{"label": label, "cells": list(cells)} for label, cells in headline],
        "jsd": [row for n, d in diagnoses.items() for row in _jsd_rows(n, d)],
        "mu": [row for n, d in diagnoses.items() for row in _mu_rows(n, d)],
        "masking": [row for n, d in diagnoses.items() for row in _masking_rows(n, d, get_format(config.fmt).labels)],
        "shift": [row for n, d in diagnoses.items() for row in _shift_rows(n, d)],
        "rollout": [row for n, d in diagnoses.items() for row in _rollout_rows(n, d)],
        "attribution": {
            n: [_attribution(e) for e in d.attribution.examples]
            for n, d in diagnoses.items()
            if d.attribution is not None and d.attribution.examples
        },
        "jsd_threshold": JSD_THRESHOLD,
    }


# ---------------------------------------------------------------- data per stage


def _jsd_rows(name: str, d: ModelDiagnosis) -> list[dict[str, Any]]:
    if d.sensitivity is None or not d.sensitivity.questions:
        return []
    values = d.sensitivity.all_jsd
    counts, edges = np.histogram(values, bins=np.linspace(0.0, math.log(2), JSD_BINS + 1))
    total = max(1, values.size)
    return [
        {
            "model": name,
            "lo": round(float(edges[i]), 4),
            "hi": round(float(edges[i + 1]), 4),
            "share": round(float(c) / total, 5),
            "pairs": int(c),
        }
        for i, c in enumerate(counts)
    ]


def _mu_rows(name: str, d: ModelDiagnosis) -> list[dict[str, Any]]:
    if d.sensitivity is None or not d.sensitivity.questions:
        return []
    mu = np.concatenate([q.mu for q in d.sensitivity.questions])
    correct = np.concatenate([q.correct for q in d.sensitivity.questions]).astype(bool)
    edges = np.linspace(0.0, 1.0, MU_BINS + 1)
    rows = []
    for outcome, mask in (("correct", correct), ("wrong", ~correct)):
        counts, _ = np.histogram(mu[mask], bins=edges)
        rows += [
            {
                "model": name,
                "outcome": outcome,
                "lo": round(float(edges[i]), 3),
                "hi": round(float(edges[i + 1]), 3),
                "count": int(c),
            }
            for i, c in enumerate(counts)
        ]
    return rows


def _masking_rows(name: str, d: ModelDiagnosis, labels: Sequence[str]) -> list[dict[str, Any]]:
    if d.masking is None or not d.masking.examples:
        return []
    real, masked = d.masking.mean_distributions()
    return [
        {"model": name, "label": str(label), "order": i, "answer": which, "p": round(float(p[i]), 5)}
        for which, p in (("real answer", real), ("answer masked", masked))
        for i, label in enumerate(labels)
    ]


def _shift_rows(name: str, d: ModelDiagnosis) -> list[dict[str, Any]]:
    if d.masking is None:
        return []
    return [
        {
            "model": name,
            "item_id": e.item_id,
            "answer": e.answer,
            "mu_real": round(float(e.mu_real), 4),
            "mu_masked": round(float(e.mu_masked), 4),
        }
        for e in d.masking.examples
    ]


def _rollout_rows(name: str, d: ModelDiagnosis) -> list[dict[str, Any]]:
    if d.rollout is None or not d.rollout.examples:
        return []
    summary = d.rollout.summary()
    return [
        {
            "model": name,
            "region": region,
            "mass": max(float(summary[region]), LOG_FLOOR),
            "without_bos": summary.get("excl_bos", {}).get(region),
        }
        for region in REGIONS
    ]


def _attribution(example: Any) -> dict[str, Any]:
    return {
        "item_id": example.item_id,
        "answer": example.answer,
        "tokens": list(example.tokens),
        "roles": [REGIONS[r] for r in example.roles],
        "scores": [round(float(s), 6) for s in example.scores],
        "mu_input": round(float(example.mu_input), 5),
        "mu_baseline": round(float(example.mu_baseline), 5),
        "delta": float(example.delta),
        "first_answer_rank": example.first_answer_rank,
        "top": example.top(10),
    }


# ---------------------------------------------------------------- charts


def _charts(data: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    charts: dict[str, dict[str, Any]] = {}
    if data["jsd"]:
        charts["jsd"] = _jsd_chart(data["jsd"], data["jsd_threshold"]).to_dict()
        charts["mu"] = _mu_chart(data["mu"]).to_dict()
    if data["masking"]:
        charts["masking"] = _masking_chart(data["masking"]).to_dict()
        charts["shift"] = _shift_chart(data["shift"]).to_dict()
    if data["rollout"]:
        charts["rollout"] = _rollout_chart(data["rollout"]).to_dict()
    return charts


def _jsd_chart(rows: list[dict[str, Any]], threshold: float) -> alt.TopLevelMixin:
    bars = (
        alt.Chart(alt.Data(values=rows))
        .mark_bar(opacity=0.6, stroke="white")
        .encode(
            x=alt.X("lo:Q", title="JSD between candidates' P(C) (nats)", scale=alt.Scale(domain=[0, math.log(2)])),
            x2="hi:Q",
            y=alt.Y("share:Q", title="share of pairs", stack=None),
            y2=alt.datum(0),
            color=alt.Color("model:N"),
            tooltip=["model:N", "lo:Q", "hi:Q", "pairs:Q", alt.Tooltip("share:Q", format=".3f")],
        )
    )
    rule = alt.Chart(alt.Data(values=[{"t": threshold}])).mark_rule(strokeDash=[4, 4], color="#222").encode(x="t:Q")
    return alt.layer(bars, rule).properties(width=460, height=260, title=f"Answer sensitivity (dashed: {threshold})")


def _mu_chart(rows: list[dict[str, Any]]) -> alt.TopLevelMixin:
    color = alt.Color("outcome:N", scale=alt.Scale(domain=["correct", "wrong"], range=["#1b8a5a", "#c2412d"]))
    return (
        alt.Chart(alt.Data(values=rows))
        .mark_bar(opacity=0.55, stroke="white")
        .encode(
            x=alt.X("lo:Q", title="μ", scale=alt.Scale(domain=[0, 1])),
            x2="hi:Q",
            y=alt.Y("count:Q", stack=None, title="candidates"),
            y2=alt.datum(0),
            color=color,
            tooltip=["outcome:N", "lo:Q", "hi:Q", "count:Q"],
        )
        .properties(width=260, height=200)
        .facet(column=alt.Column("model:N", title=None))
        .properties(title="μ of candidate answers: correct vs wrong")
    )


def _masking_chart(rows: list[dict[str, Any]]) -> alt.TopLevelMixin:
    return (
        alt.Chart(alt.Data(values=rows))
        .mark_bar()
        .encode(
            x=alt.X("label:N", sort=alt.EncodingSortField("order"), title="confidence label"),
            xOffset=alt.XOffset("answer:N"),
            y=alt.Y("p:Q", title="mean P(C)"),
            color=alt.Color("answer:N", title=None),
            tooltip=["model:N", "label:N", "answer:N", alt.Tooltip("p:Q", format=".4f")],
        )
        .properties(width=300, height=200)
        .facet(column=alt.Column("model:N", title=None))
        .properties(title="Answer masking: P(C) averaged over questions")
    )


def _shift_chart(rows: list[dict[str, Any]]) -> alt.TopLevelMixin:
    points = (
        alt.Chart(alt.Data(values=rows))
        .mark_point(filled=True, opacity=0.6)
        .encode(
            x=alt.X("mu_real:Q", title="μ with the real answer", scale=alt.Scale(domain=[0, 1])),
            y=alt.Y("mu_masked:Q", title="μ with the answer masked", scale=alt.Scale(domain=[0, 1])),
            color="model:N",
            tooltip=["model:N", "item_id:N", "answer:N", "mu_real:Q", "mu_masked:Q"],
        )
    )
    diagonal = (
        alt.Chart(alt.Data(values=[{"x": 0, "y": 0}, {"x": 1, "y": 1}]))
        .mark_line(strokeDash=[4, 4], color="#333")
        .encode(x="x:Q", y="y:Q")
    )
    return alt.layer(diagonal, points).properties(
        width=300, height=300, title="Masking shift per question (on the diagonal: no shift)"
    )


def _rollout_chart(rows: list[dict[str, Any]]) -> alt.TopLevelMixin:
    return (
        alt.Chart(alt.Data(values=rows))
        .mark_bar()
        .encode(
            x=alt.X("region:N", sort=list(REGIONS)),
            xOffset="model:N",
            color="model:N",
            y=alt.Y("mass:Q", scale=alt.Scale(type="log", domain=[LOG_FLOOR, 1.5]), title="rollout mass (log)"),
            y2=alt.datum(LOG_FLOOR),  # a log axis has no 0 for bars to start from
            tooltip=[
                "model:N",
                "region:N",
                alt.Tooltip("mass:Q", format=".3g"),
                alt.Tooltip("without_bos:Q", title="share without BOS", format=".3g"),
            ],
        )
        .properties(width=340, height=260, title="Attention rollout from the confidence position")
    )


# ---------------------------------------------------------------- HTML


def _body(data: Mapping[str, Any]) -> str:
    names = list(data["models"])
    weights = "".join(
        f"<tr><th>{esc(n)}</th><td><code>{esc(m['model'])}</code>"
        f"{' + adapter <code>' + esc(m['adapter']) + '</code>' if m['adapter'] else ''}</td></tr>"
        for n, m in data["models"].items()
    )
    head = "".join(f'<th class="num">{esc(n)}</th>' for n in names)
    rows = "".join(
        f"<tr><th>{esc(r['label'])}</th>" + "".join(f'<td class="num">{esc(c)}</td>' for c in r["cells"]) + "</tr>"
        for r in data["headline"]
    )
    cfg = data["config"]
    sections = []
    if data["jsd"]:
        sections.append(
            '<h2 id="sensitivity">Answer sensitivity</h2><p class="note">Pairwise Jensen–Shannon '
            "divergence between the confidence distributions a model gives to different candidate answers "
            "of one question: near 0, the confidence ignores the answer.</p>"
            '<div class="charts"><div id="chart-jsd"></div><div id="chart-mu"></div></div>'
        )
    if data["masking"]:
        sections.append(
            '<h2 id="masking">Answer masking</h2><p class="note">The answer replaced by pad tokens: '
            "a confidence grounded in the answer moves.</p>"
            '<div class="charts"><div id="chart-masking"></div><div id="chart-shift"></div></div>'
        )
    if data["rollout"]:
        sections.append('<h2 id="rollout">Attention rollout</h2><div id="chart-rollout"></div>')
    if data["attribution"]:
        sections.append(
            '<h2 id="attribution">Integrated gradients per candidate</h2>'
            '<div class="controls"><label>model <select id="ig-model"></select></label>'
            '<label>question and answer <select id="ig-example"></select></label></div>'
            '<p id="ig-summary" class="note"></p>'
            '<p class="note">Green raises μ, red lowers it; the answer\'s tokens are underlined; hover a token for its '
            "attribution.</p>"
            f'<p class="note" id="ig-caveat">{IG_CAVEAT}</p>'
            '<pre id="ig-tokens" class="tokens"></pre><h3>Top tokens</h3><ol id="ig-top"></ol>'
        )
    return f"""
<h1>{esc(data["title"])}</h1>
<p class="muted">Format <code>{esc(cfg["fmt"])}</code>, variant <code>{esc(cfg["variant"])}</code>, up to
{esc(cfg["max_candidates"])} candidates per question judged by <code>{esc(cfg["judge"])}</code>;
candor {esc(data["candor_version"])}.</p>
<table>{weights}</table>
<h2 id="headline">Headline</h2>
<table id="headline-table"><thead><tr><th></th>{head}</tr></thead><tbody>{rows}</tbody></table>
{"".join(sections)}
"""
