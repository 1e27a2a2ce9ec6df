"""benchmarks/README.md's tables and quoted numbers are exactly what benchmarks/readme_tables.py writes."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _script():
    spec = importlib.util.spec_from_file_location("readme_tables", BENCHMARKS / "readme_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_readme_matches_the_results_files():
    rt = _script()
    text = (BENCHMARKS / "README.md").read_text(encoding="utf-8")
    parts = rt.generated()
    assert rt.unused_markers(text, parts) == []
    assert rt.render(text, parts) == text, "run: python benchmarks/readme_tables.py"


def test_the_top_level_readme_places_generated_parts_exactly():
    rt = _script()
    text = (BENCHMARKS.parent / "README.md").read_text(encoding="utf-8")
    assert "<!-- table:serve-conversations -->" in text
    assert rt.render(text, rt.generated(), strict=False) == text, "run: python benchmarks/readme_tables.py"


def test_a_changed_result_changes_the_readme(tmp_path):
    rt = _script()
    results = tmp_path / "results"
    shutil.copytree(BENCHMARKS / "results", results, ignore=shutil.ignore_patterns("*.png", "*.md", "*.csv"))
    doc = json.loads((results / "elical.json").read_text())
    doc["methods"]["EliCal@100"]["id"]["auroc"] = 0.5
    (results / "elical.json").write_text(json.dumps(doc))
    text = (BENCHMARKS / "README.md").read_text(encoding="utf-8")
    new = rt.render(text, rt.generated(results))
    assert new != text
    assert "| EliCal@100 | 50.0 [70, 83] |" in new
    assert "−8 AUROC points in-domain (50.0 [70, 83] vs 57.6 [52, 64])" in new


def test_numbers_quoted_in_prose_come_from_the_json():
    parts = _script().generated()
    assert "1.46× OOD (66.4 → 45.4)" in parts["value:advice-cut"]
    assert parts["value:advice-ood-small"].startswith("OOD (80 questions, 1 correct)")
    assert "+2 at 1800" in parts["value:elical-gaps"]
    assert "in 90.2 s" in parts["value:elical-sweep-time"]
    assert "Prob 6.4 (1.15×)" in parts["value:elical-ece-vs-training-free"]


def test_an_unknown_marker_is_an_error():
    rt = _script()
    with pytest.raises(SystemExit, match="no generator"):
        rt.render("<!-- value:nope -->1<!-- /value -->", rt.generated())


def test_the_advice_section_reports_factors_with_intervals_and_whether_each_loss_term_moved():
    rt = _script()
    assert rt._factor({"factor": 1.4588, "ci": [1.4339, 1.4864]}) == "1.46× [1.43, 1.49]"
    assert rt._factor({"factor": None, "ci": [None, None]}) == "–"
    curve = [{"loss_jsd": 0.6, "loss_sum": 0.2 - 0.01 * i, "epoch": i / 10} for i in range(10)]
    # First five steps average 0.18, last five 0.13; a term that stayed put reads the same on both sides.
    assert rt._term_moves(curve) == "jsd 0.600 → 0.600, sum 0.180 → 0.130"
    ref = {"confidence": 0.144, "id": {"ece": 0.0352, "ece_ci": [0.014, 0.0552]}}
    assert rt._constant13(ref) == "confidence 14.4% for every question: ECE in-domain 3.5 [1, 6]"
    assert rt._constant13(None) == "not computed"


def test_the_advice_section_compares_auroc_within_each_in_domain_dataset():
    rt = _script()
    block = {"per_dataset": {"nq": {"auroc": 0.3}, "hq": {"auroc": None}, "squad": {"auroc": 0.9}}}
    trained = {"per_dataset": {"nq": {"auroc": 0.75}, "hq": {"auroc": 0.7}, "squad": {"auroc": 0.1}}}
    methods = {"Default": {"ScoreLetter": block}, "Prompting": {"ScoreLetter": trained},
               "ADVICE": {"ScoreLetter": trained}}  # fmt: skip
    # Only trained methods, only in-domain datasets (SQuAD is OOD), and an undefined AUROC shows as a dash.
    assert rt._auroc_by_dataset(methods) == "ADVICE ScoreLetter: NQ 30.0 → 75.0, HotpotQA – → 70.0"
