"""The estimator registry, the backend checks and score_records."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import BlackBox

from candor.annotation.records import Record
from candor.backends.base import Completion
from candor.data.items import QAItem
from candor.estimators import ESTIMATORS, Estimator, get_estimator, score_records
from candor.util.errors import CandorError

QUESTION_LEVEL = ["prob", "n-prob", "min-prob", "consis-lex", "consis-sem", "verbal-0", "verbal-10"]
ANSWER_LEVEL = ["p-true", "self-consistency"] + [
    f"verbal-{f}{v}" for f in ("letter", "number", "text", "float", "percent") for v in ("", "-prompting")
]


def record(rid: str, logprobs: list[float], correct: int = 1) -> Record:
    item = QAItem(id=rid, dataset="toy", split="test", question=f"Question {rid}?", answers=("Paris",))
    return Record(
        item=item,
        greedy=Completion(text="Paris", logprobs=logprobs),
        samples=[Completion(text="Paris"), Completion(text="Rome")],
        greedy_correct=correct,
        consistency=[1, 0],
    )


class NeedsHiddenStates(Estimator):
    name = "probe"
    needs_backend = True
    needs_hidden_states = True

    def _estimate(self, records, backend):
        return np.asarray(backend.hidden_states([r.item.question for r in records]))[:, 0] * 0.0


def test_every_documented_estimator_is_registered_with_its_level():
    for name in QUESTION_LEVEL:
        assert get_estimator(name).level == "question", name
    for name in ANSWER_LEVEL:
        est = get_estimator(name)
        assert (est.level, est.needs_backend) == ("answer", True), name
        assert est.name == name
    assert set(QUESTION_LEVEL + ANSWER_LEVEL) <= set(ESTIMATORS.names())


def test_unknown_estimator_lists_the_known_ones():
    with pytest.raises(CandorError, match="unknown estimator 'n-porb'.*n-prob"):
        get_estimator("n-porb")


def test_bad_option_names_the_estimator():
    with pytest.raises(CandorError, match="estimator 'n-prob': bad options"):
        get_estimator("n-prob", temperature=2)


def test_missing_backend_names_the_estimator():
    with pytest.raises(CandorError, match="'verbal-0' needs a model backend"):
        get_estimator("verbal-0").estimate([record("a", [-1.0])])


def test_hidden_states_on_a_black_box_backend_fail_clearly(tiny_backend):
    recs = [record("a", [-1.0])]
    with pytest.raises(CandorError, match="'probe' needs hidden states.*BlackBox"):
        NeedsHiddenStates().estimate(recs, BlackBox(tiny_backend))
    np.testing.assert_allclose(NeedsHiddenStates().estimate(recs, tiny_backend), [0.0])


def test_score_records_fills_one_column_per_estimator():
    recs = [record("a", [-1.0, -3.0], 1), record("b", [-0.2], 0)]
    table = score_records(recs, ["n-prob", "consis-sem", "min-prob"], progress=False)
    assert table.methods == ["n-prob", "consis-sem", "min-prob"]
    conf, correct = table.arrays("n-prob")
    np.testing.assert_allclose(conf, [math.exp(-2.0), math.exp(-0.2)])
    np.testing.assert_array_equal(correct, [1, 0])
    np.testing.assert_allclose(table.arrays("consis-sem")[0], [0.5, 0.5])


def test_score_records_checks_the_backend_before_any_work():
    with pytest.raises(CandorError, match="'p-true' needs a model backend"):
        score_records([record("a", [-1.0])], ["n-prob", "p-true"], progress=False)


def test_score_records_rejects_duplicate_ids():
    with pytest.raises(CandorError, match="'a'.*more than once"):
        score_records([record("a", [-1.0]), record("a", [-2.0])], ["prob"], progress=False)


def test_score_records_passes_options_and_chunks_backend_estimators(tiny_backend):
    recs = [record(str(i), [-1.0]) for i in range(5)]
    whole = score_records(recs, ["p-true"], tiny_backend, progress=False, chunk_size=100)
    chunked = score_records(recs, ["p-true"], tiny_backend, progress=False, chunk_size=2)
    np.testing.assert_allclose(chunked.arrays("p-true")[0], whole.arrays("p-true")[0], atol=1e-6)
    with pytest.raises(CandorError, match="verbal-10 needs 10 example records"):
        score_records(recs, ["verbal-10"], tiny_backend, progress=False, options={"verbal-10": {"examples": recs}})
