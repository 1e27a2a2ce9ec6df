"""diagnose.html from the committed diagnose run's details: the page carries what the details hold."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from candor.diagnose.config_and_results import DiagnoseConfig, ModelDiagnosis
from candor.diagnose.diagnosis_report import write_diagnosis_report

RUN = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "diagnose"


def committed_run() -> tuple[dict, dict[str, ModelDiagnosis], DiagnoseConfig]:
    doc = json.loads((RUN / "diagnose.json").read_text())
    diagnoses = {
        n: ModelDiagnosis.from_details(json.loads((RUN / "details" / f"{n}.json").read_text())) for n in doc["models"]
    }
    return doc, diagnoses, DiagnoseConfig.from_dict(doc["config"])


@pytest.fixture(scope="module")
def diagnose_page(tmp_path_factory):
    doc, diagnoses, config = committed_run()
    files = write_diagnosis_report(diagnoses, tmp_path_factory.mktemp("diag"), config, doc["title"])
    return doc, diagnoses, files


def page_json(html: str, element: str) -> dict:
    return json.loads(re.search(rf'<script id="{element}" type="application/json">(.*?)</script>', html, re.S).group(1))


def test_details_round_trip_to_the_same_summary():
    doc, diagnoses, config = committed_run()
    assert config.to_dict() == doc["config"]
    for name, d in diagnoses.items():
        summary = d.summary(config.top_k)
        assert summary["share_jsd_le_0.1"] == pytest.approx(doc["models"][name]["share_jsd_le_0.1"])
        assert summary["mask_shift"] == pytest.approx(doc["models"][name]["mask_shift"])


def test_the_page_is_written_and_listed(diagnose_page):
    _, _, files = diagnose_page
    assert files["html"].name == "diagnose.html"
    assert "diagnose.html" in files["md"].read_text()


def test_the_page_carries_every_stage(diagnose_page):
    doc, diagnoses, files = diagnose_page
    html = files["html"].read_text()
    data = page_json(html, "page-data")
    assert set(page_json(html, "page-charts")) == {"jsd", "mu", "masking", "shift", "rollout"}
    for name, d in diagnoses.items():
        pairs = sum(r["pairs"] for r in data["jsd"] if r["model"] == name)
        assert pairs == d.sensitivity.all_jsd.size
        share_le = sum(r["share"] for r in data["jsd"] if r["model"] == name and r["hi"] <= 0.1 + 1e-9)
        assert share_le <= doc["models"][name]["share_jsd_le_0.1"] + 1e-6  # bins up to 0.1 are inside "≤ 0.1"
        assert len([r for r in data["shift"] if r["model"] == name]) == len(d.masking.examples)
        ig = data["attribution"][name]
        assert [e["item_id"] for e in ig] == [e.item_id for e in d.attribution.examples]
        assert ig[0]["tokens"] == d.attribution.examples[0].tokens
    # the headline table shows the markdown's numbers
    assert f"{100 * doc['models']['base']['share_jsd_le_0.1']:.1f}" in html
