"""Abstention-aware scores against hand computations (docs/methods.md "Abstention-aware scores")."""

from __future__ import annotations

import math

import numpy as np
import pytest

from candor.estimators.confidences import ConfidenceRow, ConfidenceTable
from candor.evaluation.abstention import abstention_counts, abstention_scores, abstention_table, format_score
from candor.util.errors import CandorError

CONF = np.array([0.9, 0.8, 0.7, 0.4, 0.3, 0.2])
CORRECT = np.array([1, 0, 1, 1, 0, 0])


def test_counts_and_scores_at_a_threshold_by_hand():
    # Answered at 0.5: the first three (right, wrong, right); the other three abstain.
    out = abstention_scores(CONF, CORRECT, 0.5, bootstrap=0)
    assert (out["correct"], out["incorrect"], out["abstained"], out["n"]) == (2, 1, 3, 6)
    assert out["overall_correct"] == pytest.approx(2 / 6)
    assert out["correct_given_attempted"] == pytest.approx(2 / 3)
    assert out["simpleqa_f"] == pytest.approx(2 * (1 / 3) * (2 / 3) / (1 / 3 + 2 / 3))  # 4/9
    assert out["overall_incorrect"] == pytest.approx(1 / 6)  # incorrect over all
    # AA-Omniscience's: incorrect over not correct, 1 / (1 + 3); under its own name, the old key gone
    assert out["omniscience_hallucination_rate"] == pytest.approx(1 / 4)
    assert "hallucination_rate" not in out
    assert out["penalized_score"] == pytest.approx((2 - 1) / 6)
    assert out["ci"] == {}


def test_answering_everything_and_nothing():
    everything = abstention_scores(CONF, CORRECT, 0.0, bootstrap=0)
    assert (everything["correct"], everything["incorrect"], everything["abstained"]) == (3, 3, 0)
    assert everything["penalized_score"] == 0.0 and everything["overall_incorrect"] == 0.5
    assert everything["omniscience_hallucination_rate"] == 1.0  # every wrong one was answered
    assert everything["simpleqa_f"] == pytest.approx(0.5)
    nothing = abstention_scores(CONF, CORRECT, 0.95, bootstrap=0)
    assert (nothing["correct"], nothing["incorrect"], nothing["abstained"]) == (0, 0, 6)
    assert nothing["correct_given_attempted"] is None  # undefined: nothing attempted
    assert nothing["simpleqa_f"] == 0.0 and nothing["penalized_score"] == 0.0 and nothing["overall_incorrect"] == 0.0
    assert nothing["omniscience_hallucination_rate"] == 0.0  # abstained on all it did not know


def test_a_confidence_equal_to_the_threshold_answers():
    assert abstention_counts(CONF, CORRECT, 0.7) == abstention_counts(CONF, CORRECT, 0.65)


def test_bootstrap_interval_is_the_percentile_of_resampled_rows():
    out = abstention_scores(CONF, CORRECT, 0.5, bootstrap=300, seed=3)
    rows = np.random.default_rng(3).integers(0, 6, size=(300, 6))
    answered = CONF >= 0.5
    penalized = [((answered & (CORRECT == 1))[r].sum() - (answered & (CORRECT == 0))[r].sum()) / 6 for r in rows]
    assert out["ci"]["penalized_score"] == pytest.approx(list(np.quantile(penalized, [0.025, 0.975])))
    low, high = out["ci"]["overall_incorrect"]
    assert low <= 1 / 6 <= high
    low, high = out["ci"]["omniscience_hallucination_rate"]
    assert low <= 1 / 4 <= high


def test_the_omniscience_rate_is_undefined_when_every_answer_is_right():
    out = abstention_scores([0.9, 0.8], [1, 1], 0.5, bootstrap=0)
    assert out["omniscience_hallucination_rate"] is None and out["overall_incorrect"] == 0.0


def test_per_dataset_and_pooled():
    rows = [
        ConfidenceRow(f"r{i}", "a" if i < 3 else "b", int(y), {"m": float(c)})
        for i, (c, y) in enumerate(zip(CONF, CORRECT, strict=True))
    ]
    out = abstention_table(ConfidenceTable(rows), {"m": 0.5}, bootstrap=0)
    assert (out["m"]["a"]["correct"], out["m"]["a"]["incorrect"], out["m"]["a"]["abstained"]) == (2, 1, 0)
    assert (out["m"]["b"]["correct"], out["m"]["b"]["abstained"]) == (0, 3)
    assert out["m"]["all"]["penalized_score"] == pytest.approx(1 / 6)


def test_format_and_bad_input():
    assert (
        format_score({"penalized_score": -0.125, "ci": {"penalized_score": [-0.2, -0.04]}}, "penalized_score")
        == "-12.5 [-20, -4]"
    )
    assert format_score({"simpleqa_f": math.nan}, "simpleqa_f") == "–"
    with pytest.raises(CandorError):
        abstention_scores([0.2, 1.5], [1, 0], 0.5)
