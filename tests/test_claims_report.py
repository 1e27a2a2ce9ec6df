"""report.html with claim data: the refinement plot renders in a real headless Chromium, offline."""

from __future__ import annotations

import json

import numpy as np
from browser import (  # noqa: F401  (fixtures)
    browser_context,
    screenshot,
    watched,
)
from pages_data import ROLES, page_records

from candor.evaluation.claims import refinement_curve, refinement_rows
from candor.evaluation.report import write_report


def claim_columns():
    rng = np.random.default_rng(5)
    y = rng.integers(0, 2, 120)
    informative = np.clip(0.3 + 0.4 * y + rng.normal(0, 0.2, 120), 0, 1)
    return {
        "claim-prob": (informative.tolist(), y.tolist()),
        "claim-ptrue": (rng.uniform(size=120).tolist(), y.tolist()),
    }


def test_refinement_rows_follow_the_curve_and_end_at_everything_kept():
    columns = claim_columns()
    rows = refinement_rows(columns, points=10)
    for method, (conf, y) in columns.items():
        mine = [r for r in rows if r["method"] == method]
        curve = refinement_curve(conf, y)
        assert mine[-1]["kept"] == 1.0 and mine[-1]["precision"] == round(float(np.mean(y)), 4)
        assert len(mine) <= 12 and mine[0]["precision"] == round(curve["precision"][0], 4)


def test_report_shows_the_refinement_plot(watched, tmp_path):  # noqa: F811
    records, table = page_records(n=60, methods=2, seed=3)
    rows = refinement_rows(claim_columns())
    result = write_report(table, tmp_path, roles=ROLES, title="claims page test", records=records, claims=rows)
    html = result.files["html"].read_text()
    assert '<div id="chart-refinement">' in html
    watched.page.goto(result.files["html"].as_uri())
    watched.page.wait_for_selector("body[data-ready]", timeout=60_000)
    watched.assert_no_errors()
    watched.assert_offline()
    assert watched.page.locator("#chart-refinement svg").count() >= 1
    charts = json.loads(watched.page.locator("#page-charts").text_content())
    values = charts["refinement"]["data"]["values"] if "data" in charts["refinement"] else None
    assert values is None or {r["method"] for r in values} == {"claim-prob", "claim-ptrue"}
    screenshot(watched, "report-claims.png")
    # without claim data the section is absent
    plain = write_report(table, tmp_path / "plain", roles=ROLES, title="no claims", records=records)
    assert "chart-refinement" not in plain.files["html"].read_text()
