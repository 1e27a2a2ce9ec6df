"""prob, n-prob and min-prob on hand-built records with known log-probs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from candor.annotation.records import Record
from candor.backends.base import Completion
from candor.data.items import QAItem
from candor.estimators import get_estimator
from candor.util.errors import CandorError


def record(rid: str, logprobs: list[float], text: str = "Paris") -> Record:
    item = QAItem(id=rid, dataset="toy", split="test", question="What is the capital of France?", answers=("Paris",))
    return Record(item=item, greedy=Completion(text=text, logprobs=logprobs), samples=[])


RECORDS = [record("a", [-1.0, -2.0, -3.0]), record("b", [0.0]), record("c", [-0.5, -0.1])]


def test_prob_is_exp_of_the_sum():
    out = get_estimator("prob").estimate(RECORDS)
    np.testing.assert_allclose(out, [math.exp(-6.0), 1.0, math.exp(-0.6)])


def test_n_prob_is_exp_of_the_mean():
    out = get_estimator("n-prob").estimate(RECORDS)
    np.testing.assert_allclose(out, [math.exp(-2.0), 1.0, math.exp(-0.3)])


def test_min_prob_is_the_smallest_token_probability():
    out = get_estimator("min-prob").estimate(RECORDS)
    np.testing.assert_allclose(out, [math.exp(-3.0), 1.0, math.exp(-0.5)])


def test_round_off_above_zero_is_clipped_to_one():
    out = get_estimator("n-prob").estimate([record("d", [1e-9, -1e-9])])
    assert out[0] == pytest.approx(1.0)
    assert out[0] <= 1.0


def test_missing_logprobs_name_the_record():
    recs = [RECORDS[0], record("empty", [], text="")]
    with pytest.raises(CandorError, match="'empty'.*no per-token log-probs"):
        get_estimator("prob").estimate(recs)


def test_non_finite_logprobs_name_the_record():
    with pytest.raises(CandorError, match="'nan'.*non-finite"):
        get_estimator("min-prob").estimate([record("nan", [-1.0, float("nan")])])


def test_no_records_give_an_empty_array():
    assert get_estimator("prob").estimate([]).shape == (0,)


def test_logprob_estimators_need_no_backend():
    for name in ("prob", "n-prob", "min-prob"):
        est = get_estimator(name)
        assert (est.needs_backend, est.level) == (False, "question")


def test_positive_round_off_counts_as_log_prob_zero():
    # Each token's log-prob is capped at 0 before reducing: round-off on many tokens adds up past the
    # estimator's 1e-6 tolerance in a sum.
    assert get_estimator("prob").estimate([record("e", [5e-7] * 10)])[0] == 1.0


def test_a_missing_token_log_prob_is_non_finite_not_a_crash():
    # An import that lost one value (JSON null) reads as NaN and is refused with the record's id.
    with pytest.raises(CandorError, match="'gap'.*non-finite"):
        get_estimator("n-prob").estimate([record("gap", [-0.5, None])])
