"""``candor eval`` with thresholds, an honest-model folder and hand labels; report.html's sections in Chromium."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from browser import browser_context, watched  # noqa: F401  (fixtures)
from typer.testing import CliRunner

from candor.cli import app, run
from candor.estimators.confidences import ConfidenceRow, ConfidenceTable, write_confidences
from candor.evaluation.abstention import LABELS, abstention_counts
from candor.evaluation.calibration import get_calibrator
from candor.evaluation.judge_noise import HandLabels
from candor.evaluation.report import write_report


def toy_table() -> ConfidenceTable:
    rng = np.random.default_rng(4)
    rows = []
    for i in range(80):
        y = int(rng.random() < 0.4)
        rows.append(
            ConfidenceRow(
                f"r{i}",
                "a" if i < 40 else "b",
                y,
                {
                    "m1": round(float(np.clip(0.35 * y + 0.65 * rng.random(), 0, 1)), 4),
                    "m2": round(float(rng.random()), 4),
                },
            )
        )
    return ConfidenceTable(rows)


def run_eval(tmp_path: Path, *extra: str):
    conf = tmp_path / "conf.jsonl"
    if not conf.exists():
        write_confidences(conf, toy_table())
    return CliRunner().invoke(app, ["eval", "-c", str(conf), "-o", str(tmp_path / "report"), *extra])


def test_eval_reports_abstention_scores_and_judge_noise(tmp_path):
    labels = tmp_path / "labels.jsonl"
    labels.write_text("".join(json.dumps({"id": f"r{i}", "human": int(i % 7 != 0)}) + "\n" for i in range(0, 80, 2)))
    done = run_eval(tmp_path, "--threshold", "0.5", "--threshold", "m2=0.9", "--hand-labels", str(labels))
    assert done.exit_code == 0, done.output
    trust = json.loads((tmp_path / "report" / "trust.json").read_text())
    table = toy_table()
    for method, t in (("m1", 0.5), ("m2", 0.9)):
        counts = abstention_counts(*table.arrays(method), t)
        entry = trust["abstention"][method]["all"]
        assert (entry["correct"], entry["incorrect"], entry["abstained"]) == (
            counts.correct,
            counts.incorrect,
            counts.abstained,
        )
        assert entry["penalized_score"] == pytest.approx((counts.correct - counts.incorrect) / 80)
    assert set(trust["judge_noise"]["accuracy"]) == {"a", "b", "all"}
    assert trust["judge_noise"]["auroc_flip"]["m1"]["all"]["draws"] == 200
    assert "m1\tall\t0.5" in done.stdout and "corrected accuracy" in done.stdout


def test_eval_takes_an_honest_models_threshold_through_its_calibrator(tmp_path):
    table = toy_table()
    conf, y = table.arrays("m1")
    platt = get_calibrator("platt").fit(conf, y)
    folder = tmp_path / "honest"
    folder.mkdir()
    (folder / "honest.json").write_text(
        json.dumps(
            {
                "generator": {"model": "x"},
                "confidence": {"kind": "estimator", "name": "m1", "samples": None, "options": {}},
                "calibrator": platt.to_dict(),
                "threshold": {"value": 0.45, "rule": "coverage"},
            }
        )
    )
    done = run_eval(tmp_path, "--honest", str(folder))
    assert done.exit_code == 0, done.output
    entry = json.loads((tmp_path / "report" / "trust.json").read_text())["abstention"]["m1+platt"]["all"]
    counts = abstention_counts(platt.predict(conf), y, 0.45)
    assert (entry["correct"], entry["incorrect"], entry["abstained"]) == (
        counts.correct,
        counts.incorrect,
        counts.abstained,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--threshold", "m9=0.5"], "no method 'm9'"),
        (["--threshold", "high"], "expected VALUE or METHOD=VALUE"),
        (["--threshold", "1.5"], "in [0, 1]"),
        (["--honest", "nowhere"], "not a saved honest model"),
    ],
)
def test_eval_refuses_bad_thresholds(tmp_path, args, message):
    done = run_eval(tmp_path, *args)
    assert done.exit_code == 2 and message in done.output


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{\n  "generator": {"model": "x"}\n  "confidence": {}\n}\n', ":3: malformed JSON (Expecting ',' delimiter"),
        ('{"generator": {"model": "x"}}', ": missing the field 'confidence'"),
    ],
)
def test_eval_names_the_file_of_a_bad_honest_model(tmp_path, capsys, text, says):
    folder = tmp_path / "honest"
    folder.mkdir()
    (folder / "honest.json").write_text(text)
    write_confidences(tmp_path / "conf.jsonl", toy_table())
    with pytest.raises(SystemExit) as exit_info:
        run(["eval", "-c", str(tmp_path / "conf.jsonl"), "-o", str(tmp_path / "report"), "--honest", str(folder)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"error: {folder / 'honest.json'}{says}"), err


def test_eval_names_the_line_of_a_bad_hand_label(tmp_path):
    labels = tmp_path / "labels.jsonl"
    labels.write_text('{"id": "r0", "human": 1}\n{"id": "r1", "human": "yes"}\n')
    done = run_eval(tmp_path, "--hand-labels", str(labels))
    assert done.exit_code == 2 and f"{labels}:2:" in done.output


def test_report_page_shows_the_sections(watched, tmp_path):  # noqa: F811
    table = toy_table()
    verdict = np.array([r.correct for r in table.rows[:40]])
    labels = HandLabels(verdict, np.where(np.arange(40) % 9 == 0, 1 - verdict, verdict))
    result = write_report(table, tmp_path, thresholds={"m1": 0.5}, hand_labels=labels, bootstrap=0)
    watched.page.goto(result.files["html"].as_uri())
    watched.page.wait_for_selector("body[data-ready]", timeout=60_000)
    watched.assert_no_errors()
    watched.assert_offline()
    rows = watched.page.locator("#abstention-table tbody tr")
    assert rows.count() == 3  # a, b and all
    counts = abstention_counts(*table.arrays("m1"), 0.5)
    pooled = rows.nth(2).locator("td").all_text_contents()
    assert pooled[:6] == ["m1", "all", "0.5", str(counts.correct), str(counts.incorrect), str(counts.abstained)]
    header = watched.page.locator("#abstention-table thead th").all_text_contents()
    penalized = pooled[header.index(LABELS["penalized_score"])]
    assert penalized.startswith(f"{100 * (counts.correct - counts.incorrect) / 80:.1f} [")
    assert watched.page.locator("#judge-accuracy-table tbody tr").count() == 3
    assert watched.page.locator("#judge-auroc-table tbody tr").count() == 6  # 2 methods × (a, b, all)
    assert watched.page.locator("#judge-noise").is_visible()
