"""self-consistency: agreement by hand, option letters, and sampling on the tiny model."""

from __future__ import annotations

import numpy as np
import pytest

from candor.annotation.records import Record
from candor.backends.base import Completion
from candor.data.items import QAItem
from candor.estimators import get_estimator
from candor.estimators.answers import option_letter, record_answer, stated_answer
from candor.util.errors import CandorError

OPEN = QAItem(id="o1", dataset="toy", split="test", question="What is the capital of France?", answers=("Paris",))
MC = QAItem(
    id="m1",
    dataset="toy",
    split="test",
    question="Which city is in France?",
    answers=("B", "Paris"),
    choices=("Rome", "Paris", "Berlin", "Madrid"),
    answer_index=1,
)


def record(item: QAItem, greedy: str, rid: str | None = None) -> Record:
    if rid is not None:
        item = QAItem(
            id=rid,
            dataset=item.dataset,
            split=item.split,
            question=item.question,
            answers=item.answers,
            choices=item.choices,
            answer_index=item.answer_index,
        )
    return Record(item=item, greedy=Completion(text=greedy, logprobs=[-0.2]), samples=[])


@pytest.mark.parametrize(
    ("reply", "letter"),
    [
        ("B", "B"),
        ("(B) Paris", "B"),
        ("B. Paris", "B"),
        ("**C**", "C"),
        ("The answer is D.", "D"),
        ("Answer: A", "A"),
        ("Paris", None),
        ("E", None),  # not one of the four options
        ("Based on the passage", None),
    ],
)
def test_option_letter(reply, letter):
    assert option_letter(reply, MC) == letter


def test_stated_answer_for_open_and_multiple_choice():
    assert stated_answer("  Paris \n", OPEN) == "Paris"
    assert option_letter("B", OPEN) is None
    assert stated_answer("The answer is B", MC) == "B"
    assert stated_answer("Paris", MC) == "Paris"  # no letter: kept as it is
    assert record_answer(record(MC, "(C) Berlin")) == "C"


def test_agreement_by_hand_for_open_qa():
    est = get_estimator("self-consistency")
    samples = [["Paris", "Paris, France", "London", "", "the city of Paris"]]
    # Lexical judge: containment on word boundaries or ROUGE-L >= 0.5; empty never agrees.
    np.testing.assert_allclose(est.agreement([record(OPEN, "Paris")], samples), [3 / 5])


def test_agreement_by_hand_for_multiple_choice():
    est = get_estimator("self-consistency")
    samples = [["B", "(B) Paris", "C", "The answer is B", ""]]
    np.testing.assert_allclose(est.agreement([record(MC, "B. Paris")], samples), [3 / 5])


def test_samples_on_the_tiny_model_are_seeded_per_record(tiny_backend):
    recs = [record(OPEN, "Paris", "a"), record(MC, "B", "b"), record(OPEN, "Lyon", "c")]
    est = get_estimator("self-consistency", m=3, max_new_tokens=6)
    out = est.estimate(recs, tiny_backend)
    assert set(np.round(out * 3).tolist()) <= {0.0, 1.0, 2.0, 3.0}
    # A record's confidence does not depend on the batch it is scored in.
    alone = est.estimate(recs[1:2], tiny_backend)
    np.testing.assert_allclose(alone, out[1:2])
    qa = get_estimator("self-consistency", m=2, prompt="qa", max_new_tokens=4).estimate(recs, tiny_backend)
    assert ((qa >= 0) & (qa <= 1)).all()


def test_self_consistency_options_are_checked():
    with pytest.raises(CandorError, match="at least one sample"):
        get_estimator("self-consistency", m=0)
    with pytest.raises(CandorError, match="prompt must be one of format, qa"):
        get_estimator("self-consistency", prompt="chatty")
    with pytest.raises(CandorError, match="unknown consistency judge 'magic'"):
        get_estimator("self-consistency", judge="magic")
    with pytest.raises(CandorError, match="'self-consistency' needs a model backend"):
        get_estimator("self-consistency").estimate([record(OPEN, "Paris")])
