"""`candor calibrate`: fit on dev confidences, add calibrated columns to test, refuse leakage."""

from __future__ import annotations

import numpy as np
from typer.testing import CliRunner

from candor.cli import app
from candor.estimators.confidences import ConfidenceRow, ConfidenceTable, read_confidences, write_confidences
from candor.evaluation.calibration import get_calibrator, load_calibrator


def table(prefix: str, n: int, seed: int) -> ConfidenceTable:
    rng = np.random.default_rng(seed)
    conf = rng.uniform(0.01, 0.99, n)
    correct = (rng.uniform(size=n) < conf**2).astype(int)
    pairs = enumerate(zip(conf, correct, strict=True))
    return ConfidenceTable([ConfidenceRow(f"{prefix}:{i}", "nq", int(y), {"n-prob": float(c)}) for i, (c, y) in pairs])


def test_calibrate_adds_the_fitted_column_and_saves_the_calibrator(tmp_path):
    dev, test = table("dev", 300, 1), table("test", 120, 2)
    write_confidences(tmp_path / "dev.jsonl", dev)
    write_confidences(tmp_path / "test.jsonl", test)
    args = [
        "calibrate",
        "--dev",
        str(tmp_path / "dev.jsonl"),
        "-c",
        str(tmp_path / "test.jsonl"),
        "-o",
        str(tmp_path / "out.jsonl"),
        "-m",
        "n-prob",
        "--calibrator",
        "platt",
        "--save-dir",
        str(tmp_path / "cal"),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    out = read_confidences(tmp_path / "out.jsonl")
    assert out.methods == ["n-prob", "n-prob+platt"]
    expected = get_calibrator("platt").fit(*dev.arrays("n-prob")).predict(test.arrays("n-prob")[0])
    np.testing.assert_allclose(out.arrays("n-prob+platt")[0], expected, atol=1e-12)
    np.testing.assert_allclose(out.arrays("n-prob")[0], test.arrays("n-prob")[0])
    reloaded = load_calibrator(tmp_path / "cal" / "n-prob+platt.json")
    np.testing.assert_allclose(reloaded.predict(test.arrays("n-prob")[0]), expected, atol=1e-12)


def test_calibrate_refuses_shared_ids_and_unknown_methods(tmp_path):
    dev = table("x", 50, 1)
    write_confidences(tmp_path / "dev.jsonl", dev)
    base = [
        "calibrate",
        "--dev",
        str(tmp_path / "dev.jsonl"),
        "-c",
        str(tmp_path / "dev.jsonl"),
        "-o",
        str(tmp_path / "out.jsonl"),
    ]
    leak = CliRunner().invoke(app, [*base, "-m", "n-prob"])
    assert leak.exit_code == 2
    assert "share 50 record ids" in leak.output
    write_confidences(tmp_path / "test.jsonl", table("t", 20, 3))
    base[4] = str(tmp_path / "test.jsonl")
    unknown = CliRunner().invoke(app, [*base, "-m", "verbal-0"])
    assert unknown.exit_code == 2
    assert "'verbal-0' is not a column of the dev file" in unknown.output
    assert not (tmp_path / "out.jsonl").exists()
