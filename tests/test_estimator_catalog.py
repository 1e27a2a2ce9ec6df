"""The estimator table comes from the registry: docs/estimators.md's copy, ``-e list``, "did you mean" on a typo."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from candor.cli import app
from candor.estimators import ESTIMATORS
from candor.estimators.catalog import estimator_rows, markdown_table
from candor.util.errors import CandorError

ROOT = Path(__file__).resolve().parents[1]
ESTIMATORS_PAGE = ROOT / "docs" / "estimators.md"
EVALUATION_PAGE = ROOT / "docs" / "evaluation.md"


def test_every_registered_estimator_has_one_row():
    rows = estimator_rows()
    assert sorted(r.name for r in rows) == sorted(ESTIMATORS.names())
    assert len(rows) >= 36 and all(r.family and r.reference and r.needs for r in rows)


def test_what_each_needs_is_read_from_the_estimator():
    needs = {r.name: r.needs for r in estimator_rows()}
    assert needs["eigenscore"] == "samples, hidden states, the model when scoring"
    assert needs["p-true"] == "next-token log-probs, the model when scoring"
    assert needs["n-prob"] == "token log-probs"
    assert needs["semantic-entropy"] == "samples, token log-probs, a judge"
    assert needs["consis-lex"] == "samples"
    assert needs["elical"] == "a trained folder"
    assert needs["length"] == "the greedy answer"


def test_the_docs_table_is_the_generated_one_and_names_every_estimator():
    text = ESTIMATORS_PAGE.read_text()
    block = re.search(r"<!-- table:estimators -->\n(.*?)<!-- /table -->", text, re.S)
    assert block, "docs/estimators.md has no generated estimator table"
    assert block.group(1) == markdown_table(), "run: python -m benchmarks.readme_tables"
    for name in ESTIMATORS.names():
        assert f"| `{name}` |" in block.group(1), name


def test_list_prints_the_table():
    result = CliRunner().invoke(app, ["score", "-e", "list"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    for needle in ("family", "reference", "cocoa", "Vashurin", "semantic-entropy-discrete", "hidden states"):
        assert needle in result.output, needle


def test_a_typo_gets_the_nearest_names():
    with pytest.raises(CandorError, match=r"unknown estimator 'n-porb' \(did you mean 'n-prob'"):
        ESTIMATORS.get("n-porb")
    with pytest.raises(CandorError, match=r"unknown estimator 'zzz'; known: "):
        ESTIMATORS.get("zzz")  # nothing near: no guess
    result = CliRunner().invoke(app, ["score", "-r", "r.jsonl", "-o", "o.jsonl", "-e", "consis-sen"])
    assert result.exit_code == 2 and "did you mean 'consis-sem'" in result.output, result.output


def test_the_docs_show_calibrate():
    text = EVALUATION_PAGE.read_text()
    assert "candor calibrate --dev" in text and "--calibrator" in text
