"""Selective prediction (risk–coverage, AURC, PRR) and log-loss: hand-computed cases and references."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from sklearn.metrics import log_loss as sk_log_loss

from candor.evaluation.metrics import METRICS, aurc, log_loss, prr, risk_coverage


def test_risk_coverage_and_aurc_by_hand():
    conf, y = [0.9, 0.8, 0.7, 0.6], [1, 0, 1, 0]
    coverage, risk = risk_coverage(conf, y)
    assert coverage.tolist() == [0.25, 0.5, 0.75, 1.0]
    assert risk == pytest.approx([0.0, 1 / 2, 1 / 3, 2 / 4])
    assert aurc(conf, y) == pytest.approx((0 + 1 / 2 + 1 / 3 + 1 / 2) / 4)
    # random keeps risk at the error rate 1/2; the oracle's risks are 0, 0, 1/3, 1/2
    oracle = (0 + 0 + 1 / 3 + 1 / 2) / 4
    assert prr(conf, y) == pytest.approx((0.5 - aurc(conf, y)) / (0.5 - oracle))
    assert prr(conf, y) == pytest.approx(4 / 7)


def test_prr_is_one_for_a_perfect_ranking_minus_one_for_the_reverse_and_zero_for_a_constant():
    y = [1, 1, 0, 0]
    assert prr([0.9, 0.8, 0.2, 0.1], y) == pytest.approx(1.0)
    assert prr([0.1, 0.2, 0.8, 0.9], y) == pytest.approx(-1.0)
    assert prr([0.5, 0.5, 0.5, 0.5], y) == pytest.approx(0.0)  # ties: no order, so exactly random
    assert aurc([0.5] * 4, y) == pytest.approx(0.5)


def test_ties_take_the_expected_risk_over_every_order_the_tie_allows():
    rng = np.random.default_rng(0)
    for _ in range(5):
        conf = rng.choice([0.2, 0.5, 0.8], size=7)
        y = rng.integers(0, 2, size=7)
        # brute force: every permutation that keeps the confidence order, averaged
        risks = []
        for perm in itertools.permutations(range(7)):
            c = conf[list(perm)]
            if np.all(np.diff(c) <= 0):
                errors = 1 - y[list(perm)]
                risks.append(np.cumsum(errors) / np.arange(1, 8))
        assert risk_coverage(conf, y)[1] == pytest.approx(np.mean(risks, axis=0))
    _, risk = risk_coverage([0.9, 0.5, 0.5], [1, 1, 0])
    assert risk == pytest.approx([0.0, 0.25, 1 / 3])


def test_prr_is_undefined_with_one_class():
    with pytest.warns(RuntimeWarning, match="PRR is undefined"):
        assert math.isnan(prr([0.2, 0.7], [1, 1]))
    assert aurc([0.2, 0.7], [1, 1]) == 0.0 and aurc([0.2, 0.7], [0, 0]) == 1.0


def test_log_loss_matches_scikit_learn_including_confidences_of_zero_and_one():
    rng = np.random.default_rng(3)
    conf = np.round(rng.random(200), 2)
    conf[:4] = [0.0, 1.0, 0.0, 1.0]
    y = rng.integers(0, 2, size=200)
    y[:4] = [0, 1, 1, 0]  # two right at the extremes, two confidently wrong
    assert log_loss(conf, y) == pytest.approx(sk_log_loss(y, conf, labels=[0, 1]), rel=1e-12)
    assert log_loss([0.5, 0.5], [1, 0]) == pytest.approx(math.log(2))
    assert log_loss([0.8, 0.1], [1, 0]) == pytest.approx(-(math.log(0.8) + math.log(0.9)) / 2)


def test_selective_metrics_are_registered_with_direction():
    assert METRICS.get("aurc").better == "lower" and METRICS.get("aurc").label == "AURC"
    assert METRICS.get("prr").better == "higher"
    assert METRICS.get("log_loss").better == "lower"
