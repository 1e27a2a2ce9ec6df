"""report.html: one offline file with the numbers the report computes, small enough at scale."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
from pages_data import ROLES, page_records
from typer.testing import CliRunner

from candor.annotation.records import write_records
from candor.cli import app
from candor.estimators.confidences import ConfidenceRow, ConfidenceTable, write_confidences
from candor.evaluation.report import write_report
from candor.evaluation.report_page import page_data, selective_stats, write_report_page
from candor.evaluation.summary import PAGE_METRICS, evaluate_table, main_table
from candor.util.pages import script_json


def embedded(html: str, element: str) -> dict:
    match = re.search(rf'<script id="{element}" type="application/json">(.*?)</script>', html, re.S)
    assert match, element
    return json.loads(match.group(1))


def test_selective_stats_by_hand():
    conf = np.array([0.9, 0.8, 0.6, 0.4, 0.3, 0.1])
    correct = np.array([1, 0, 1, 1, 0, 0])
    s = selective_stats(conf, correct, 0.5)
    assert (s.answered, s.coverage) == (3, 0.5)
    assert s.accuracy == pytest.approx(2 / 3)
    assert s.over_abstention == pytest.approx(1 / 3)  # one of the three refused was right
    everything = selective_stats(conf, correct, 0.0)
    assert everything.coverage == 1.0 and math.isnan(everything.over_abstention)
    nothing = selective_stats(conf, correct, 0.95)
    assert nothing.answered == 0 and math.isnan(nothing.accuracy) and nothing.over_abstention == 0.5


def test_script_json_cannot_close_its_script_element():
    text = script_json({"q": "</script><script>alert(1)</script> <!--"})
    assert "</script" not in text and "<!--" not in text
    assert json.loads(text) == {"q": "</script><script>alert(1)</script> <!--"}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    records, table = page_records()
    out = tmp_path_factory.mktemp("page")
    return (
        records,
        table,
        write_report(
            table,
            out,
            roles=ROLES,
            bootstrap=30,
            title="page test",
            records=records,
            command="candor eval -c x.jsonl -o out",
        ),
    )


def test_the_page_is_written_beside_the_report_and_listed(report):
    _, _, result = report
    page = result.files["html"]
    assert page.name == "report.html" and page.parent == result.out_dir
    assert "report.html" in result.files["index"].read_text()


def test_the_page_is_self_contained(report):
    html = report[2].files["html"].read_text()
    markup = re.sub(r"(<script[^>]*>).*?</script>", r"\1</script>", html, flags=re.S)  # the tags, not the code
    assert "<link" not in markup and not re.search(r"<(script|img|iframe)[^>]+src=", markup)
    assert "default-src 'none'" in html  # the policy that blocks any request the runtime might try
    assert "vegaEmbed" in html


def test_the_page_carries_the_reports_numbers(report):
    records, table, result = report
    html = result.files["html"].read_text()
    data = embedded(html, "page-data")
    assert data["methods"] == table.methods
    assert data["records"]["question"][5] == records[5].item.question
    assert data["records"]["gold"][5] == "gold 5 | alias 5"
    assert data["records"]["confidence"]["method-1"] == [r.confidence["method-1"] for r in table.rows]
    # the main table: every method a row, values ×100 with their bootstrap interval, the best marked per column
    ev = result.evaluation
    auroc_id = ev.metrics["method-0"]["id"]["auroc"]
    lo, hi = ev.ci["method-0"]["id"]["auroc"]
    assert f'{100 * auroc_id:.1f} <span class="ci">[{100 * lo:.1f}, {100 * hi:.1f}]</span>' in html
    assert html.count('class="num best"') >= len(main_table(ev, PAGE_METRICS).headers)
    assert data["provenance"]["model"] == "tiny-llama" and data["provenance"]["template"] == "fewshot"
    assert data["provenance"]["judges"] == {"correctness": "exact-match", "consistency": "lexical-echo"}
    assert data["provenance"]["command"] == "candor eval -c x.jsonl -o out"
    # the selective curve at 0.5 is the reference computation
    conf, y = table.arrays("method-2")
    ref = selective_stats(conf, y, 0.5)
    at = {r["measure"]: r["value"] for r in data["selective"] if r["method"] == "method-2" and r["threshold"] == 0.5}
    assert at["coverage"] == pytest.approx(ref.coverage, abs=1e-4)
    assert at["over-abstention"] == pytest.approx(ref.over_abstention, abs=1e-4)
    charts = embedded(html, "page-charts")
    assert set(charts) == {"reliability", "histogram", "risk", "selective"}


def test_reliability_bins_count_every_record(report):
    _, table, result = report
    data = embedded(result.files["html"].read_text(), "page-data")
    for method in table.methods:
        assert sum(r["count"] for r in data["reliability"] if r["method"] == method) == len(table.rows)


def test_without_records_the_browser_has_ids_only(report):
    _, table, result = report
    data = page_data(table, result.evaluation, main_table(result.evaluation), title="t")
    assert not data["has_records"] and set(data["records"]["question"]) == {""}


def test_5000_records_by_10_methods_stay_under_5_mb(tmp_path):
    records, table = page_records(n=5000, methods=10, seed=1)
    ev = evaluate_table(table, roles=ROLES)
    path = write_report_page(
        tmp_path / "report.html", table, ev, main_table(ev, PAGE_METRICS), title="big", records=records
    )
    size = path.stat().st_size
    assert size <= 5 * 1024 * 1024, f"{size / 1e6:.2f} MB"
    assert len(embedded(path.read_text(), "page-data")["records"]["id"]) == 5000


def test_candor_eval_writes_the_page_with_records(tmp_path):
    records, table = page_records(n=60)
    write_records(tmp_path / "records.jsonl", records)
    write_confidences(tmp_path / "conf.jsonl", table)
    out = tmp_path / "report"
    result = CliRunner().invoke(
        app,
        [
            "eval",
            "-c",
            str(tmp_path / "conf.jsonl"),
            "-o",
            str(out),
            "--ood",
            "geo",
            "--records",
            str(tmp_path / "records.jsonl"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert f"page: {out / 'report.html'}" in result.output
    data = embedded((out / "report.html").read_text(), "page-data")
    assert data["records"]["answer"][0] == records[0].greedy.text
    assert data["provenance"]["command"].startswith("candor ")


def test_candor_eval_refuses_records_that_match_no_row(tmp_path):
    records, table = page_records(n=30)
    other = ConfidenceTable([ConfidenceRow("x:1", "x", 1, {"m": 0.5}), ConfidenceRow("x:2", "x", 0, {"m": 0.2})])
    write_records(tmp_path / "records.jsonl", records)
    write_confidences(tmp_path / "conf.jsonl", other)
    result = CliRunner().invoke(
        app,
        [
            "eval",
            "-c",
            str(tmp_path / "conf.jsonl"),
            "-o",
            str(tmp_path / "o"),
            "--records",
            str(tmp_path / "records.jsonl"),
        ],
    )
    assert result.exit_code == 2 and "no record id matches" in result.output
