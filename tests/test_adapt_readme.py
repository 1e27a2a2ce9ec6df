"""README.md's "Calibrate on your own traffic" numbers are exactly what benchmarks/adapt_readme.py writes."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def adapt_readme():
    spec = importlib.util.spec_from_file_location("adapt_readme", BENCHMARKS / "adapt_readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_quotes_adapt_json(adapt_readme):
    text = adapt_readme.README.read_text(encoding="utf-8")
    result = json.loads(adapt_readme.RESULT.read_text(encoding="utf-8"))
    assert adapt_readme.render(text, adapt_readme.parts(result)) == text, "run: python benchmarks/adapt_readme.py"


def test_a_cell_is_the_mean_and_interval_in_points(adapt_readme):
    assert adapt_readme.cell({"mean": 0.6234, "ci95": [0.58, 0.671]}) == "62.3 [58, 67]"
    assert adapt_readme.cell({"mean": None, "ci95": [None, None]}) == "–"
    assert adapt_readme.cell({"mean": 0.5, "ci95": [None, None]}) == "50.0"
