"""The evaluation report: numbers match the metrics, averages are size-weighted, files are whole."""

from __future__ import annotations

import csv
import json
import math
import re
import shutil
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest
from rich.console import Console

from candor.estimators.confidences import ConfidenceRow, ConfidenceTable
from candor.evaluation.metrics import compute_metrics, ece
from candor.evaluation.report import format_table_rich, safe_filenames, write_report
from candor.evaluation.summary import CI_METRICS, REPORT_METRICS, evaluate_table
from candor.util.errors import CandorError

ROLES = {"a": "id", "b": "id", "c": "ood"}


def _hand_table() -> ConfidenceTable:
    """Known values per dataset for method ``fixed``; ``noise@x`` is seeded noise.

    a (100 rows): half correct, confidence 0.8 everywhere → ECE 0.3, Brier 0.34, AUROC 0.5.
    b (300 rows): 180 correct, confidence 1.0 when correct, 0.0 when not → ECE 0, Brier 0, AUROC 1.
    c (50 rows): 20 correct, confidence 0.4 everywhere → ECE 0, Brier 0.24.
    """
    rng = np.random.default_rng(7)
    rows = []
    spec = {
        "a": [(int(i < 50), 0.8) for i in range(100)],
        "b": [(int(i < 180), float(i < 180)) for i in range(300)],
        "c": [(int(i < 20), 0.4) for i in range(50)],
    }
    for ds, items in spec.items():
        for i, (y, conf) in enumerate(items):
            noise = float(np.clip(0.5 * y + 0.25 + rng.normal(0, 0.2), 0, 1))
            rows.append(ConfidenceRow(f"{ds}:{i}", ds, y, {"fixed": conf, "noise@x": noise}))
    return ConfidenceTable(rows)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    table = _hand_table()
    return table, write_report(table, out, roles=ROLES, bootstrap=20, seed=3, title="test report")


def _json(result) -> dict:
    return json.loads((result.out_dir / "metrics.json").read_text(encoding="utf-8"))


def _same(stored: float | None, expected: float) -> bool:
    if stored is None:
        return math.isnan(expected)
    return stored == pytest.approx(expected)


@pytest.mark.filterwarnings("ignore:Alignment is undefined")  # `fixed` is constant on a and c
def test_json_matches_compute_metrics_per_dataset_and_pooled(report):
    table, result = report
    doc = _json(result)
    for method in table.methods:
        for ds in table.datasets:
            expected = compute_metrics(*table.arrays(method, ds), names=REPORT_METRICS)
            stored = doc["metrics"][method][ds]
            assert set(stored) == set(expected)
            assert all(_same(stored[k], v) for k, v in expected.items()), (method, ds)
        pooled = compute_metrics(*table.arrays(method), names=REPORT_METRICS)
        assert all(_same(doc["metrics"][method]["all"][k], v) for k, v in pooled.items())


def test_hand_computed_values_and_size_weighted_averages(report):
    _, result = report
    fixed = result.metrics["fixed"]
    assert fixed["a"]["ece"] == pytest.approx(0.3)
    assert fixed["a"]["brier"] == pytest.approx(0.34)
    assert fixed["b"]["auroc"] == pytest.approx(1.0)
    # In-domain = a (100) and b (300), weighted by size.
    assert fixed["id"]["ece"] == pytest.approx((100 * 0.3 + 300 * 0.0) / 400)
    assert fixed["id"]["brier"] == pytest.approx((100 * 0.34 + 300 * 0.0) / 400)
    assert fixed["id"]["auroc"] == pytest.approx((100 * 0.5 + 300 * 1.0) / 400)
    assert fixed["ood"]["brier"] == pytest.approx(0.24)
    doc = _json(result)
    assert doc["datasets"]["a"] == {"size": 100, "accuracy": 0.5, "role": "id"}
    assert doc["groups"]["id"]["size"] == 400
    assert doc["groups"]["id"]["accuracy"] == pytest.approx((50 + 180) / 400)
    assert doc["groups"]["all"]["accuracy"] == pytest.approx((50 + 180 + 20) / 450)
    assert doc["groups"]["ood"]["datasets"] == ["c"]


def test_bootstrap_intervals_bracket_the_estimate_and_are_seeded(report):
    table, result = report
    doc = _json(result)
    for method in table.methods:
        for col in ("b", "all", "id"):
            for metric in ("auroc", "ece", "brier"):
                low, high = doc["ci"][method][col][metric]
                value = doc["metrics"][method][col][metric]
                assert low - 1e-12 <= value <= high + 1e-12, (method, col, metric)
    # b is perfectly separated, so every resample has AUROC 1 (and ECE 0).
    assert doc["ci"]["fixed"]["b"]["auroc"] == [1.0, 1.0]
    again = evaluate_table(table, roles=ROLES, bootstrap=20, seed=3)
    assert again.ci == result.evaluation.ci
    other = evaluate_table(table, roles=ROLES, bootstrap=20, seed=4)
    assert other.ci["noise@x"]["a"]["auroc"] != result.evaluation.ci["noise@x"]["a"]["auroc"]


def test_csv_is_long_format_and_agrees_with_json(report):
    table, result = report
    doc = _json(result)
    with (result.out_dir / "metrics.csv").open(encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0]) == ["method", "dataset", "metric", "value", "ci_low", "ci_high"]
    columns = ["a", "b", "c", "all", "id", "ood"]
    assert len(rows) == len(table.methods) * len(columns) * len(REPORT_METRICS)
    for row in rows:
        stored = doc["metrics"][row["method"]][row["dataset"]][row["metric"]]
        assert _same(stored, float(row["value"]))
        has_ci = row["metric"] in CI_METRICS
        assert (row["ci_low"] != "") == has_ci, row


def test_files_exist_and_pngs_are_real_images(report):
    _, result = report
    for name in ("metrics.json", "metrics.csv", "metrics.md", "index.md", "confidence_hist.png"):
        assert (result.out_dir / name).stat().st_size > 0, name
    assert set(result.reliability) == {"fixed", "noise@x"}
    assert result.reliability["noise@x"] == result.out_dir / "reliability" / "noise_x.png"
    for path in [*result.reliability.values(), result.files["confidence_hist"]]:
        image = mpimg.imread(path)
        assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 200
        assert image[..., :3].std() > 0.05  # not a blank canvas
    assert not list(result.out_dir.rglob("*.tmp"))


def test_index_links_resolve_even_after_moving_the_folder(report, tmp_path):
    _, result = report
    moved = Path(shutil.copytree(result.out_dir, tmp_path / "moved"))
    index = (moved / "index.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)]+)\)", index)
    assert len(links) >= 7  # 4 data files, 2 diagrams, the embedded histogram
    for link in links:
        assert not link.startswith("/")
        assert (moved / link).is_file(), link
    assert "Records: 450" in index
    assert "| a | id | 100 | 50.0 |" in index
    assert "`noise@x`" in index


def test_markdown_scales_by_100_and_bolds_the_best(report):
    _, result = report
    md = (result.out_dir / "metrics.md").read_text(encoding="utf-8")
    header = next(line for line in md.splitlines() if line.startswith("| method | ID AUROC"))
    assert "OOD Alignment" in header
    cells = {}
    for method in ("fixed", "noise@x"):
        row = next(line for line in md.splitlines() if line.startswith(f"| {method} | "))
        cells[method] = [c.strip() for c in row.strip("|").split("|")]
    # ID ECE 0.075, then its bias-corrected estimate with the basic interval around it (ECE is biased upwards)
    plug_in, corrected = cells["fixed"][2].strip("*").split(" → ")
    assert plug_in == "7.5" and corrected.split(" [")[0] in {"7.4", "7.5", "7.6"}
    # Lower ECE wins, higher AUROC wins; the loser is not bold.
    ece_id = {m: result.metrics[m]["id"]["ece"] for m in cells}
    auroc_id = {m: result.metrics[m]["id"]["auroc"] for m in cells}
    assert cells[min(ece_id, key=ece_id.get)][2].startswith("**")
    assert not cells[max(ece_id, key=ece_id.get)][2].startswith("**")
    assert cells[max(auroc_id, key=auroc_id.get)][1].startswith("**")
    assert not cells[min(auroc_id, key=auroc_id.get)][1].startswith("**")


def test_rich_table_for_the_cli(report):
    _, result = report
    table = format_table_rich(result)
    assert table.row_count == 2
    console = Console(record=True, width=200)
    console.print(table)
    text = console.export_text()
    assert "ID AUROC" in text and "noise@x" in text and "87.5" in text


def test_single_class_dataset_shows_a_dash_and_a_note(tmp_path, caplog):
    rows = [ConfidenceRow(f"s:{i}", "s", 1, {"m": 0.1 * (i % 10)}) for i in range(20)]
    rows += [ConfidenceRow(f"t:{i}", "t", i % 2, {"m": 0.3 + 0.4 * (i % 2)}) for i in range(20)]
    result = write_report(ConfidenceTable(rows), tmp_path, roles={"s": "ood", "t": "id"})
    assert math.isnan(result.metrics["m"]["s"]["auroc"])
    assert math.isnan(result.metrics["m"]["ood"]["auroc"])
    assert result.metrics["m"]["t"]["auroc"] == pytest.approx(1.0)
    doc = _json(result)
    assert doc["metrics"]["m"]["s"]["auroc"] is None
    md = (tmp_path / "metrics.md").read_text(encoding="utf-8")
    assert "| m | 100.0 |" in md  # ID AUROC
    assert "| – |" in md
    index = (tmp_path / "index.md").read_text(encoding="utf-8")
    assert "`s`: all 20 answers are correct" in index
    assert any("all 20 answers are correct" in r.message for r in caplog.records)


def test_n_bins_reaches_the_binned_metrics():
    table = _hand_table()
    result = evaluate_table(table, metrics=["ece", "brier"], n_bins=5)
    conf, correct = table.arrays("noise@x", "a")
    assert result.metrics["noise@x"]["a"]["ece"] == pytest.approx(ece(conf, correct, n_bins=5))
    assert result.metric_names == ["ece", "brier"]
    assert "id" not in result.metrics["noise@x"]  # no roles, no averages
    assert result.columns == ["a", "b", "c", "all"]


def test_safe_filenames_are_distinct():
    names = safe_filenames(["advice@letter", "advice_letter", "Advice@Letter", "../x", "@"])
    assert names["advice@letter"] == "advice_letter"
    assert len({n.lower() for n in names.values()}) == 5
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", n) and not n.startswith(".") for n in names.values())


@pytest.mark.parametrize(
    ("table", "kwargs", "message"),
    [
        (ConfidenceTable([]), {}, "empty"),
        (ConfidenceTable([ConfidenceRow("x", "d", 1, {})]), {}, "no confidence columns"),
        (_hand_table(), {"metrics": ["auroc", "nope"]}, "unknown metric 'nope'"),
        (_hand_table(), {"roles": {"a": "id", "b": "test", "c": "ood"}}, "'id' or 'ood'"),
        (_hand_table(), {"roles": {"a": "id"}}, "have no role"),
        (_hand_table(), {"roles": {**ROLES, "zz": "id"}}, "not in the table"),
        (_hand_table(), {"n_bins": 0}, "n_bins"),
        (_hand_table(), {"metrics": []}, "no metrics chosen"),
        (_hand_table(), {"bootstrap": -1}, "bootstrap"),
        (ConfidenceTable([ConfidenceRow("x", "all", 1, {"m": 0.5})]), {}, "reserved"),
        (ConfidenceTable([ConfidenceRow("x", "d", 1, {"m": 1.5})]), {}, r"\[0, 1\]"),
    ],
)
def test_user_mistakes_raise_candor_error(tmp_path, table, kwargs, message):
    with pytest.raises(CandorError, match=message):
        write_report(table, tmp_path, **kwargs)
    assert not (tmp_path / "metrics.json").exists()


def test_parse_fallback_counts_from_the_confidences_file_reach_metrics_json(tmp_path):
    rows = [
        ConfidenceRow(f"q{i}", "nq", i % 2, {"verbal-0": 0.5 + 0.04 * (i % 5), "n-prob": 0.1 * (i % 9)})
        for i in range(40)
    ]
    table = ConfidenceTable(rows, columns={"verbal-0": {"parse_fallbacks": 7}, "n-prob": {}})
    result = write_report(table, tmp_path / "rep")
    doc = json.loads((tmp_path / "rep" / "metrics.json").read_text())
    assert doc["counts"]["verbal-0"]["parse_fallbacks"] == 7
    assert "parse_fallbacks" not in doc["counts"].get("n-prob", {})
    assert result.evaluation.counts["verbal-0"]["parse_fallbacks"] == 7
