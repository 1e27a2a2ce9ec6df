"""The demo pipeline (``candor demo``) end to end on a tiny model."""

from __future__ import annotations

from candor.annotation.records import read_records
from candor.demo import run_demo


def test_demo_runs_end_to_end_and_reuses_its_cache(tiny_model_dir, tmp_path):
    methods = ("n-prob", "consis-lex", "p-true", "verbal-letter")
    first = run_demo(tmp_path, model=str(tiny_model_dir), k=2, limit=6, estimators=methods, batch_size=4)
    assert len(first.table.rows) == 6 and first.table.methods == list(methods)
    assert first.report.files["index"].exists()
    assert set(first.report.reliability) == set(methods)
    page = first.report.files["html"].read_text()  # report.html, with the records' questions and provenance
    records = read_records(first.records)
    assert first.report.files["html"].name == "report.html" and records[0].item.question in page
    assert first.report.evaluation.bootstrap > 0  # the demo's main table has 95% intervals
    before = (first.records.read_text(), first.confidences.read_text())
    second = run_demo(tmp_path, model=str(tiny_model_dir), k=2, limit=6, estimators=methods, batch_size=4)
    assert (second.records.read_text(), second.confidences.read_text()) == before
