"""The ``length`` baseline: token counts, the default direction, and a direction fitted on dev only."""

from __future__ import annotations

import numpy as np
import pytest

from candor.annotation.records import Record, write_records
from candor.backends.base import Completion
from candor.data.items import QAItem
from candor.estimators import ESTIMATORS, get_estimator, score_records
from candor.util.errors import CandorError


def record(rid: str, n_tokens: int, correct: int | None = None, text: str = "an answer") -> Record:
    item = QAItem(id=rid, dataset="toy", split="test", question=f"Question {rid}?", answers=("x",))
    greedy = Completion(text=text if n_tokens else "", token_ids=list(range(n_tokens)))
    return Record(item=item, greedy=greedy, samples=[], greedy_correct=correct)


TEST = [record("a", 1), record("b", 3), record("c", 9)]
# On this dev set longer answers are the correct ones: the fitted direction must follow it.
DEV_LONGER = [record(f"d{i}", n, c) for i, (n, c) in enumerate([(2, 0), (3, 0), (8, 1), (12, 1), (5, 0), (9, 1)])]
DEV_SHORTER = [record(f"s{i}", n, c) for i, (n, c) in enumerate([(2, 1), (3, 1), (8, 0), (12, 0), (5, 1), (9, 0)])]


def test_registered_like_every_estimator():
    assert "length" in ESTIMATORS.names()
    est = get_estimator("length")
    assert est.level == "question" and not est.needs_backend


def test_without_dev_the_confidence_is_one_over_one_plus_length():
    np.testing.assert_allclose(get_estimator("length").estimate(TEST), [1 / 2, 1 / 4, 1 / 10])
    assert get_estimator("length").describe()["fit"] == "default"


def test_direction_fitted_on_dev_flips_the_ranking():
    est = get_estimator("length", dev=DEV_LONGER)
    assert est.direction == "longer"
    np.testing.assert_allclose(est.estimate(TEST), [1 / 2, 3 / 4, 9 / 10])
    assert est.describe() == {
        "name": "length",
        "level": "question",
        "direction": "longer",
        "fit": "dev",
        "dev_size": 6,
        "dev_auroc_shorter": 0.0,
    }


def test_dev_that_favours_short_answers_keeps_the_default():
    est = get_estimator("length", dev=DEV_SHORTER)
    assert est.direction == "shorter" and est.dev_auroc == pytest.approx(1.0)


def test_dev_from_a_records_file(tmp_path):
    path = tmp_path / "dev.jsonl"
    write_records(path, DEV_LONGER)
    assert get_estimator("length", dev=str(path)).direction == "longer"


def test_unlabelled_or_one_class_dev_is_refused():
    with pytest.raises(CandorError, match="both correct and wrong"):
        get_estimator("length", dev=[record("u", 3, 1), record("v", 4, 1), record("w", 2, None)])


def test_an_answer_without_tokens_names_the_record():
    bad = Record(item=TEST[0].item, greedy=Completion(text="Paris"), samples=[])
    with pytest.raises(CandorError, match="'a'.*no tokens"):
        get_estimator("length").estimate([bad])


def test_empty_answer_has_length_zero():
    assert get_estimator("length").estimate([record("e", 0)])[0] == 1.0


def test_scored_into_a_table_with_dev_as_an_option():
    table = score_records(TEST, ["length"], options={"length": {"dev": DEV_LONGER}})
    assert [r.confidence["length"] for r in table.rows] == pytest.approx([1 / 2, 3 / 4, 9 / 10])
