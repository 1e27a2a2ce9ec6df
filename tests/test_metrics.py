"""Metrics: reference checks against scikit-learn and torchmetrics, hand-computed cases, bad input."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, brier_score_loss, roc_auc_score
from torchmetrics.functional.classification import binary_calibration_error

from candor.evaluation.metrics import (
    DEFAULT_METRICS,
    METRICS,
    abs_nce,
    accuracy,
    alignment,
    auprc,
    auroc,
    bin_indices,
    brier,
    check_arrays,
    compute_metrics,
    ece,
    log_loss,
    mce,
    metric_label,
    nce,
    prr,
)
from candor.util.errors import CandorError

SEEDS = [0, 1, 2, 3, 4]


def random_data(seed: int, n: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """Confidences with some signal and some miscalibration, strictly below 1."""
    rng = np.random.default_rng(seed)
    conf = rng.uniform(0.0, 1.0, n) * 0.999
    correct = (rng.uniform(0.0, 1.0, n) < conf**1.5).astype(int)
    return conf, correct


# ---------------------------------------------------------------- reference libraries


@pytest.mark.parametrize("seed", SEEDS)
def test_sklearn_reference(seed: int) -> None:
    conf, correct = random_data(seed)
    assert auroc(conf, correct) == pytest.approx(roc_auc_score(correct, conf), abs=1e-12)
    assert auprc(conf, correct) == pytest.approx(average_precision_score(correct, conf), abs=1e-12)
    assert brier(conf, correct) == pytest.approx(brier_score_loss(correct, conf), abs=1e-12)
    assert accuracy(conf, correct) == pytest.approx(correct.mean())


def _torchmetrics_ce(conf: np.ndarray, correct: np.ndarray, n_bins: int, norm: str) -> float:
    preds, target = torch.tensor(conf, dtype=torch.float64), torch.tensor(correct)
    return float(binary_calibration_error(preds, target, n_bins=n_bins, norm=norm))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("n_bins", [10, 5, 15])
def test_ece_and_mce_match_torchmetrics(seed: int, n_bins: int) -> None:
    conf, correct = random_data(seed)
    assert ece(conf, correct, n_bins=n_bins) == pytest.approx(_torchmetrics_ce(conf, correct, n_bins, "l1"))
    assert mce(conf, correct, n_bins=n_bins) == pytest.approx(_torchmetrics_ce(conf, correct, n_bins, "max"))


def test_confidence_one_goes_in_last_bin_unlike_torchmetrics() -> None:
    # Ours: one bin [0.9, 1.0] with mean conf 0.95 and accuracy 0.5 -> 0.45.
    # torchmetrics puts 1.0 in an extra bin of its own: 0.5·0.1 + 0.5·1.0 = 0.55.
    conf, correct = np.array([1.0, 0.9]), np.array([0, 1])
    assert ece(conf, correct) == pytest.approx(0.45)
    assert _torchmetrics_ce(conf, correct, 10, "l1") == pytest.approx(0.55)


# ---------------------------------------------------------------- hand-computed cases

HAND_CONF = np.array([0.15, 0.25, 0.25, 0.85, 0.95])
HAND_CORRECT = np.array([0, 1, 0, 1, 1])
# bins: [0.1,0.2): gap 0-0.15; [0.2,0.3): gap 0.5-0.25 (two rows); [0.8,0.9): 1-0.85; [0.9,1]: 1-0.95


def test_hand_ece_mce_nce() -> None:
    assert ece(HAND_CONF, HAND_CORRECT) == pytest.approx((0.15 + 2 * 0.25 + 0.15 + 0.05) / 5)  # 0.17
    assert mce(HAND_CONF, HAND_CORRECT) == pytest.approx(0.25)
    assert nce(HAND_CONF, HAND_CORRECT) == pytest.approx((-0.15 + 2 * 0.25 + 0.15 + 0.05) / 5)  # 0.11
    assert abs_nce(HAND_CONF, HAND_CORRECT) == pytest.approx(0.11)
    assert nce(1 - HAND_CONF, HAND_CORRECT) == pytest.approx(0.6 - 0.51)
    assert abs_nce([0.9, 0.9], [0, 1]) == pytest.approx(0.4)
    assert nce([0.9, 0.9], [0, 1]) == pytest.approx(-0.4)  # negative = over-confident


def test_bin_edges_are_left_closed() -> None:
    # 0.7 shares the bin [0.7, 0.8) with 0.75: |0.5 - 0.725| = 0.225.
    # Were 0.7 in [0.6, 0.7) the ECE would be 0.5·0.3 + 0.5·0.75 = 0.525.
    assert ece([0.7, 0.75], [1, 0]) == pytest.approx(0.225)
    assert ece([0.0, 0.05], [1, 0]) == pytest.approx(0.475)  # 0.0 sits in the first bin


def test_quantile_strategy() -> None:
    conf, correct = [0.1, 0.2, 0.3, 0.4], [0, 0, 1, 1]
    # equal mass, 2 bins: {0.1, 0.2} gap 0.15 and {0.3, 0.4} gap 0.65
    assert ece(conf, correct, n_bins=2, strategy="quantile") == pytest.approx(0.4)
    assert mce(conf, correct, n_bins=2, strategy="quantile") == pytest.approx(0.65)
    # equal width, 2 bins: everything in [0, 0.5): |0.5 - 0.25|
    assert ece(conf, correct, n_bins=2) == pytest.approx(0.25)
    with pytest.raises(CandorError, match="unknown binning strategy"):
        ece(conf, correct, strategy="equal")
    with pytest.raises(CandorError, match="n_bins"):
        ece(conf, correct, n_bins=0)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("strategy", ["uniform", "quantile"])
def test_nce_is_accuracy_minus_mean_confidence(seed: int, strategy: str) -> None:
    conf, correct = random_data(seed)
    assert nce(conf, correct, strategy=strategy) == pytest.approx(correct.mean() - conf.mean())
    assert ece(conf, correct, strategy=strategy) >= abs_nce(conf, correct, strategy=strategy) - 1e-12


def test_brier_hand() -> None:
    assert brier([0.9, 0.2, 0.5], [1, 0, 0]) == pytest.approx((0.01 + 0.04 + 0.25) / 3)


def test_auroc_auprc_hand() -> None:
    # pairs (pos, neg): (0.8, 0.4) win, (0.8, 0.9) loss, (0.6, 0.4) win, (0.6, 0.9) loss -> 0.5
    assert auroc([0.8, 0.6, 0.4, 0.9], [1, 1, 0, 0]) == pytest.approx(0.5)
    # ranked 0.9(-), 0.8(+), 0.6(+): AP = 0.5·(1/2) + 0.5·(2/3)
    assert auprc([0.8, 0.6, 0.4, 0.9], [1, 1, 0, 0]) == pytest.approx(0.25 + 1 / 3)


def _alignment_data(fit_labels: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Ten rows; the fit slice is the first 2 of the seeded permutation (seed 0)."""
    perm = np.random.default_rng(0).permutation(10)
    conf, correct = np.zeros(10), np.zeros(10, dtype=int)
    conf[perm[:2]], correct[perm[:2]] = [0.3, 0.6], fit_labels
    conf[perm[2:]] = [0.05, 0.2, 0.31, 0.35, 0.5, 0.7, 0.9, 0.99]
    correct[perm[2:]] = [0, 0, 0, 1, 1, 1, 0, 1]
    return conf, correct


def test_alignment_hand() -> None:
    # fit rows (0.3 wrong, 0.6 right): t ≤ 0.30 predicts all-1 (skipped); 0.31..0.60 are perfect;
    # ties go to the smallest, t = 0.31. Held-out predictions 1[c ≥ 0.31] = 0,0,1,1,1,1,1,1
    # against 0,0,0,1,1,1,0,1: 6 of 8 right.
    conf, correct = _alignment_data((0, 1))
    assert alignment(conf, correct) == pytest.approx(0.75)


def test_alignment_skips_single_class_thresholds() -> None:
    # fit rows both right: t ≤ 0.30 would be perfect but predicts one class, so it is skipped;
    # the best usable threshold is 0.31 (50%), giving 0.75 held out. Without the skip, t = 0.01
    # would predict all-1 and score 5/8.
    conf, correct = _alignment_data((1, 1))
    assert alignment(conf, correct) == pytest.approx(0.75)


def test_alignment_degenerate() -> None:
    with pytest.warns(RuntimeWarning, match="Alignment is undefined"):
        assert math.isnan(alignment(np.full(20, 0.5), np.arange(20) % 2))
    with pytest.warns(RuntimeWarning, match="at least 2 rows"):
        assert math.isnan(alignment([0.5], [1]))
    with pytest.raises(CandorError, match="fit_fraction"):
        alignment([0.2, 0.8], [0, 1], fit_fraction=1.0)


def test_alignment_is_seeded() -> None:
    conf, correct = random_data(7)
    assert alignment(conf, correct, seed=3) == alignment(conf, correct, seed=3)
    assert 0.0 <= alignment(conf, correct) <= 1.0


# ---------------------------------------------------------------- degenerate input

BAD_INPUTS = [
    ([0.2, 0.8], [1], "confidence has 2 values but correct has 1"),
    ([0.2, float("nan")], [1, 0], "1 NaN/inf values, e.g. at index 1"),
    ([0.2, float("inf")], [1, 0], "NaN/inf"),
    ([0.2, 1.2], [1, 0], r"must lie in \[0, 1\].*index 1 is 1\.2"),
    ([-0.1, 0.5], [1, 0], r"must lie in \[0, 1\]"),
    ([0.2, 0.8], [1, 2], "0/1 labels; index 1 is 2"),
    ([0.2, 0.8], ["a", "b"], "0/1 labels, got dtype <U1"),
    ([0.2, 0.8], [1, float("nan")], "0/1 labels"),
    ([0.2, 0.8], [1, None], "0/1 labels"),
    ([], [], "^confidence is empty"),
]


@pytest.mark.parametrize("name", METRICS.names())
@pytest.mark.parametrize(("conf", "correct", "message"), BAD_INPUTS)
def test_bad_input_raises(name: str, conf: list, correct: list, message: str) -> None:
    with pytest.raises(CandorError, match=message):
        METRICS.get(name)(conf, correct)


@pytest.mark.parametrize("fn", [auroc, auprc])
@pytest.mark.parametrize("label", [0, 1])
def test_single_class_is_nan_with_warning(fn, label: int, caplog: pytest.LogCaptureFixture) -> None:
    with (
        caplog.at_level(logging.WARNING, logger="candor.evaluation.metrics"),
        pytest.warns(RuntimeWarning, match="undefined"),
    ):
        value = fn([0.2, 0.5, 0.9], [label] * 3)
    assert math.isnan(value)
    assert "undefined" in caplog.text


def test_boolean_labels_are_accepted() -> None:
    assert accuracy([0.2, 0.8], [True, False]) == 0.5


# ---------------------------------------------------------------- compute_metrics, bootstrap, averages


def test_compute_metrics() -> None:
    conf, correct = random_data(0)
    out = compute_metrics(conf, correct)
    assert list(out) == list(DEFAULT_METRICS)
    assert out["auroc"] == auroc(conf, correct)
    assert out["ece"] == ece(conf, correct)
    assert out["alignment"] == alignment(conf, correct)
    assert compute_metrics(conf, correct, ["brier", "ece_quantile"]) == {
        "brier": brier(conf, correct),
        "ece_quantile": ece(conf, correct, strategy="quantile"),
    }
    with pytest.raises(CandorError, match="unknown metric 'aurooc'"):
        compute_metrics(conf, correct, ["auroc", "aurooc"])


# ---------------------------------------------------------------- cases the mutation run found untested


def test_registered_metrics_pass_n_bins_through_and_pick_the_best_by_direction() -> None:
    conf, correct = random_data(1)
    assert METRICS.get("ece")(conf, correct, n_bins=5) == ece(conf, correct, n_bins=5) != ece(conf, correct)
    assert METRICS.get("ece").bound(5)(conf, correct) == ece(conf, correct, n_bins=5)
    assert METRICS.get("auroc").bound(5) is auroc
    assert METRICS.get("auroc").best([0.6, 0.8, 0.7]) == 0.8
    assert METRICS.get("ece").best([0.3, 0.1, 0.2]) == 0.1
    assert METRICS.get("nce").best([-0.3, 0.2, -0.1]) == -0.1
    assert METRICS.get("auroc").best([]) is None
    assert metric_label("abs_nce") == "|NCE|"
    assert metric_label("no-such-metric") == "no-such-metric"


def test_defaults_are_ten_uniform_bins() -> None:
    conf, correct = random_data(2)
    assert bin_indices(np.array([0.0, 0.05, 0.95, 1.0])).tolist() == [0, 0, 9, 9]
    assert mce(conf, correct) == mce(conf, correct, n_bins=10) != mce(conf, correct, n_bins=11)
    # one bin: |accuracy − mean confidence|
    assert ece(conf, correct, n_bins=1) == pytest.approx(abs(correct.mean() - conf.mean()))


def test_quantile_bins_fill_tied_confidences_in_row_order() -> None:
    conf = np.random.default_rng(0).integers(0, 3, 100) / 2  # three values, many ties per bin edge
    idx = bin_indices(conf, 10, "quantile")
    assert np.bincount(idx).tolist() == [10] * 10
    for value in (0.0, 0.5, 1.0):
        assert np.all(np.diff(idx[conf == value]) >= 0)  # the stable sort keeps row order within a tie


def test_arrays_are_flattened_and_typed() -> None:
    conf, correct = check_arrays([0, 1], [True, False])
    assert conf.dtype == np.float64 and correct.dtype.kind == "i"
    column = np.array([[0.15], [0.25], [0.25], [0.85], [0.95]])  # e.g. a DataFrame column or a [N, 1] tensor
    assert ece(column, HAND_CORRECT[:, None]) == pytest.approx(ece(HAND_CONF, HAND_CORRECT))


@pytest.mark.parametrize("fn", [auroc, auprc, prr])
def test_one_row_is_undefined_not_an_error(fn) -> None:
    with pytest.warns(RuntimeWarning, match="all 1 labels are 1"):
        assert math.isnan(fn([0.5], [1]))


def _alignment_fit_and_held(fit_conf, fit_y, held_conf, held_y, fit_fraction):
    """Rows placed so that the seeded permutation (seed 0) puts ``fit_*`` in the fit slice."""
    n = len(fit_conf) + len(held_conf)
    perm = np.random.default_rng(0).permutation(n)
    conf, correct = np.zeros(n), np.zeros(n, dtype=int)
    k = len(fit_conf)
    conf[perm[:k]], correct[perm[:k]] = fit_conf, fit_y
    conf[perm[k:]], correct[perm[k:]] = held_conf, held_y
    return conf, correct


def test_alignment_takes_the_most_accurate_threshold_and_counts_ties_at_it() -> None:
    # Fit rows (half of 10): t in 0.11–0.20 and 0.41–0.60 score 4/5, 0.21–0.40 and 0.61–0.80 score 3/5;
    # the best, smallest, is t = 0.11 (0.10 itself puts the 0.10 row, so every row, on the 1 side).
    # Held out, 1[c ≥ 0.11] = 0,1,1,1,0 against 0,1,0,1,0: 4/5. The worst threshold (0.21) or t = 0.10
    # would give 3/5.
    conf, correct = _alignment_fit_and_held(
        [0.1, 0.2, 0.4, 0.6, 0.8], [0, 1, 0, 1, 1], [0.10, 0.15, 0.3, 0.7, 0.05], [0, 1, 0, 1, 0], 0.5
    )
    assert alignment(conf, correct, fit_fraction=0.5) == pytest.approx(0.8)


def test_alignment_fit_slice_sizes() -> None:
    # 5 rows at fit_fraction 0.2: a 1-row fit slice never splits into two classes, so NaN.
    with pytest.warns(RuntimeWarning, match="all 1 fit rows in one class"):
        assert math.isnan(alignment([0.1, 0.3, 0.5, 0.7, 0.9], [0, 1, 0, 1, 0]))
    # 10 rows at 0.95: round(9.5) = 10 is capped at 9 so one row is held out.
    # Fit: 0.2, 0.4 wrong, 0.6, 0.8 right and the rest spread; t = 0.41 is perfect; held: 0.3 (wrong) → right.
    conf, correct = _alignment_fit_and_held(
        [0.2, 0.4, 0.6, 0.8, 0.05, 0.1, 0.9, 0.95, 0.7], [0, 0, 1, 1, 0, 0, 1, 1, 1], [0.3], [0], 0.95
    )
    assert alignment(conf, correct, fit_fraction=0.95) == 1.0
    with pytest.raises(CandorError, match="fit_fraction"):
        alignment([0.2, 0.8], [0, 1], fit_fraction=0.0)


def test_log_loss_clips_at_machine_epsilon() -> None:
    assert log_loss([1.0], [0]) == pytest.approx(-math.log(np.finfo(float).eps), rel=1e-12)
