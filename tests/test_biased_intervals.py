"""Intervals of biased statistics (ECE) contain their own estimate; tables mark rows on fewer than 30 items.

A plug-in ECE is biased upwards on small samples (noise only adds to the binned gaps), and its
bootstrap resamples, noisier still, sit above it: a percentile interval can exclude the estimate
it belongs to (the claims table printed "3.8 [4, 11]"). The intervals are now the basic bootstrap
around the bias-corrected estimate (candor.evaluation.aggregate.bias_corrected).
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.readme.formatting import LEGACY_MARK, SMALL_MARK, SMALL_NOTE, estimate, notes_for
from candor.evaluation.aggregate import aggregate_metrics, bias_corrected, is_biased, percentile_interval
from candor.evaluation.claims import claim_metrics, cluster_resamples
from candor.evaluation.metrics import ece


def miscalibrated_by(offset: float, per_bin: int = 40) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ten bins, each exactly ``offset`` too confident: the plug-in ECE is ``offset``; two claims per answer."""
    conf, y = [], []
    for b in range(10):
        k = round((b + 0.5) / 10 * per_bin)
        conf += [k / per_bin + offset] * per_bin
        y += [1] * k + [0] * (per_bin - k)
    groups = np.array([str(i // 2) for i in range(len(y))])
    return np.array(conf), np.array(y), groups


def contains(interval, value) -> bool:
    return interval[0] <= value <= interval[1]


def test_the_claim_ece_interval_contains_its_estimate_where_the_percentile_one_does_not():
    conf, y, groups = miscalibrated_by(0.04)
    out = claim_metrics(conf, y, groups, metrics=["ece"], bootstrap=300, seed=0)["ece"]
    assert out["value"] == pytest.approx(0.04)
    draws = [ece(conf[i], y[i]) for i in cluster_resamples(groups, 300, 0)]
    (low, high), _ = percentile_interval(draws)
    assert not contains((low, high), out["value"])  # the old interval: every resample above the estimate
    assert out["interval"] == "basic" and contains(out["ci"], out["corrected"])
    assert out["corrected"] < out["value"]  # the bias the resamples show is taken off


def test_the_aggregate_ece_interval_contains_its_estimate_and_unbiased_metrics_stay_percentile():
    conf, y, _ = miscalibrated_by(0.04)
    result = aggregate_metrics({"m": {"d": conf}}, {"d": y}, metrics=["ece", "auroc"], bootstrap=300, seed=0)
    m = result.methods["m"]
    assert contains(m.ci["d"]["ece"], m.corrected["d"]["ece"])
    assert "auroc" not in m.corrected["d"] and is_biased("ece") and not is_biased("auroc")


def test_bias_corrected_is_the_basic_interval_around_two_times_the_point_minus_the_mean():
    draws = np.linspace(0.04, 0.11, 101)  # "3.8 [4, 11]": every draw above the point
    value, (low, high), dropped = bias_corrected(0.038, [*draws, float("nan")])
    assert value == pytest.approx(2 * 0.038 - draws.mean())
    q_low, q_high = np.quantile(draws, [0.025, 0.975])
    assert (low, high) == pytest.approx((max(0.0, 2 * 0.038 - q_high), 2 * 0.038 - q_low))
    assert dropped == 1 and contains((low, high), value)


def test_rows_on_fewer_than_30_items_are_marked_not_estimated():
    assert estimate(0.5, [0.5, 0.5], "auroc", n=3) == "–" + SMALL_MARK  # not "50.0 [50, 50]"
    assert estimate(0.5, [0.4, 0.6], "auroc", n=30) == "50.0 [40, 60]"
    assert SMALL_NOTE in notes_for(["–" + SMALL_MARK]) and "n < 30" in SMALL_NOTE
    # a biased metric: the corrected estimate with its interval, or the plug-in marked where only a percentile exists
    assert estimate(0.038, [0.0, 0.036], "ece", corrected=0.006) == "0.6 [0, 4]"
    assert estimate(0.038, [0.04, 0.11], "ece") == "3.8" + LEGACY_MARK


def test_the_claims_table_marks_a_row_on_fewer_than_30_claims_and_prints_no_interval_that_excludes_its_estimate(
    tmp_path,
):
    """The committed results, then the same file with one estimator cut to 3 claims (the 96-prompt run's
    ``claim-ccp[llm]`` row, which printed "50.0 [50, 50]"): the cut row is marked, not estimated."""
    import json

    from benchmarks.readme.claims import claims_section
    from benchmarks.readme.formatting import RESULTS, load

    table = claims_section(RESULTS)["table:claims"]
    assert "50.0 [50, 50]" not in table and "3.8 [4, 11]" not in table
    payload = load("claims", RESULTS)
    name = next(iter(payload["estimators"]))
    payload["estimators"][name].update(
        answers=2,
        claims=3,
        auroc={"value": 0.5, "ci": [0.5, 0.5], "interval": "percentile"},
        ece={"value": 0.038, "ci": [0.04, 0.11], "interval": "percentile"},
    )
    (tmp_path / "claims.json").write_text(json.dumps(payload), encoding="utf-8")
    table = claims_section(tmp_path)["table:claims"]
    row = next(line for line in table.splitlines() if f"`{name}`" in line)
    assert "2 / 3" in row and row.count("–" + SMALL_MARK) >= 3 and SMALL_NOTE in table
    assert "50.0 [50, 50]" not in table and "3.8 [4, 11]" not in table
