"""ADVICE triplet builder (candor.advice.triplets)."""

from __future__ import annotations

import random

import pytest

from candor.advice.triplets import Triplet, build_triplets, read_triplets, write_triplets
from candor.backends.base import Completion
from candor.data.items import QAItem
from candor.errors import CandorError
from candor.judges import get_correctness_judge, normalize
from candor.records import Record

PROVENANCE = {"template": "fewshot", "correctness_judge": "contains",
              "decoding": {"samples": {"max_new_tokens": 8, "temperature": 1.0, "top_p": 0.95, "top_k": 50,
                                       "stop": ["\n"]}}}  # fmt: skip


def record(rid, answers, greedy, samples, greedy_correct=None, dataset="toy", sample_correct=None):
    """A record whose correctness comes from the contains judge unless given."""
    judge = get_correctness_judge("contains")
    item = QAItem(rid, dataset, "train", f"Question {rid}?", tuple(answers))
    texts = [s for s, _ in samples]
    if greedy_correct is None:
        greedy_correct = judge.judge([greedy], [item.answers])[0]
    if sample_correct is None:
        sample_correct = judge.judge(texts, [item.answers] * len(texts)) if texts else []
    comps = [Completion(text=t, logprobs=[lp]) for t, lp in samples]
    return Record(item, Completion(text=greedy, logprobs=[-0.1]), comps, greedy_correct, sample_correct,
                  [0] * len(comps), dict(PROVENANCE))  # fmt: skip


def test_hard_negative_is_the_most_likely_wrong_sample():
    rec = record("q1", ["Paris"], "Paris", [("Lyon", -2.0), ("Paris", -0.1), ("Marseille", -0.5), ("", -0.01)])
    built = build_triplets([rec])
    assert [(t.a_correct, t.a_wrong, t.source, t.wrong_from) for t in built.triplets] == [
        ("Paris", "Marseille", "sample", "q1")
    ]
    assert built.stats.as_dict() == {"records": 1, "eligible": 1, "from_samples": 1, "from_resamples": 0,
                                     "from_other_questions": 0, "dropped": 0}  # fmt: skip


def test_only_records_with_a_correct_greedy_answer():
    wrong = record("q1", ["Paris"], "Lyon", [("Nice", -1.0)])
    empty = record("q2", ["Paris"], "  ", [("Nice", -1.0)], greedy_correct=1)
    built = build_triplets([wrong, empty])
    assert built.triplets == [] and built.stats.eligible == 0


def test_never_the_same_answer_and_never_a_correct_one():
    # Annotation mistakes: a sample equal to the greedy answer, and a sample containing a gold
    # alias, both marked wrong; neither may become a_wrong.
    rec = record("q1", ["Paris"], "Paris", [("paris!", -0.1), ("Paris, France", -0.2), ("Rome", -3.0)],
                 sample_correct=[0, 0, 0])  # fmt: skip
    assert build_triplets([rec]).triplets[0].a_wrong == "Rome"
    # A judge that missed the greedy answer's correctness would also call its twin "wrong".
    twin = record("q3", ["the capital of France"], "Paris", [("paris", -0.1), ("Rome", -1.0)], greedy_correct=1)
    assert build_triplets([twin]).triplets[0].a_wrong == "Rome"
    only_bad = record("q2", ["Paris"], "Paris", [("The Paris", -0.1)], sample_correct=[0])
    built = build_triplets([only_bad])  # nothing usable and no other question: dropped
    assert built.triplets == [] and built.stats.dropped == 1


def test_a_sample_the_annotation_marked_correct_is_not_used():
    # The annotation's verdict counts too (e.g. an llm judge accepted a paraphrase).
    rec = record("q1", ["Paris"], "Paris", [("City of Light", -0.1), ("Rome", -2.0)], sample_correct=[1, 0])
    assert build_triplets([rec]).triplets[0].a_wrong == "Rome"


def test_last_resort_is_a_wrong_answer_from_the_same_dataset():
    lonely = record("q1", ["Paris"], "Paris", [("Paris", -0.1)])
    same = record("q2", ["Berlin"], "Paris", [("Paris", -0.2), ("Berlin", -0.3)])
    other = record("q3", ["Tokyo"], "Madrid", [], dataset="elsewhere")
    built = build_triplets([lonely, same, other])
    t = built.triplets[0]
    assert (t.a_correct, t.a_wrong, t.source, t.wrong_from) == ("Paris", "Berlin", "other-question", "q2")
    assert built.stats.from_other_questions == 1 and built.stats.dropped == 0


def test_more_samples_are_drawn_when_none_is_wrong(tiny_backend):
    rec = record("q1", ["Paris"], "Paris", [("Paris", -0.1)])
    built = build_triplets([rec], backend=tiny_backend, extra_samples=3, extra_rounds=2)
    t = built.triplets[0]
    # The tiny random model says anything but Paris, so one round is enough.
    assert t.source == "resample" and built.stats.from_resamples == 1
    assert t.a_wrong.strip() and normalize(t.a_wrong) != "paris"
    again = build_triplets([rec], backend=tiny_backend, extra_samples=3, extra_rounds=2)
    assert again.triplets == built.triplets  # seeded


def test_properties_on_random_records():
    rng = random.Random(0)
    words = ["Paris", "Rome", "Berlin", "Madrid", "paris", "Lyon", "The Paris", "", "Rome, Italy"]
    records = []
    for i in range(60):
        gold = rng.choice(["Paris", "Rome", "Berlin"])
        samples = [(rng.choice(words), -rng.random()) for _ in range(rng.randint(0, 4))]
        noisy = [rng.randint(0, 1) for _ in samples]  # annotation verdicts that may be wrong
        records.append(record(f"q{i}", [gold], rng.choice(words), samples, sample_correct=noisy))
    built = build_triplets(records)
    judge = get_correctness_judge("contains")
    assert built.triplets
    for t in built.triplets:
        assert normalize(t.a_wrong) != normalize(t.a_correct)
        assert judge.judge([t.a_wrong], [t.item.answers]) == [0]
        assert judge.judge([t.a_correct], [t.item.answers]) == [1]
    stats = built.stats
    assert stats.from_samples + stats.from_resamples + stats.from_other_questions + stats.dropped == stats.eligible


def test_multiple_choice_answers_are_option_letters():
    item = QAItem("m1", "mc", "train", "Capital of France?", ("B", "Paris"), choices=("Rome", "Paris", "Oslo"),
                  answer_index=1)  # fmt: skip
    rec = Record(item, Completion(text="B. Paris"), [Completion("(B)", logprobs=[-0.1]),
                 Completion("A", logprobs=[-0.5])], 1, [1, 0], [1, 0], dict(PROVENANCE))  # fmt: skip
    t = build_triplets([rec]).triplets[0]
    assert (t.a_correct, t.a_wrong) == ("B", "A")


def test_file_round_trip_and_errors(tmp_path):
    rec = record("q1", ["Paris"], "Paris", [("Lyon", -2.0)])
    triplets = build_triplets([rec]).triplets
    path = tmp_path / "triplets.jsonl"
    write_triplets(path, triplets)
    assert read_triplets(path) == triplets
    assert isinstance(triplets[0], Triplet)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(path.read_text() + '{"id": "x"}\n')
    with pytest.raises(CandorError, match=r"bad.jsonl:2: not a triplet"):
        read_triplets(bad)
    odd = tmp_path / "odd.jsonl"
    odd.write_text(path.read_text().replace('"sample"', '"guess"'))
    with pytest.raises(CandorError, match=r"odd.jsonl:1: unknown triplet source 'guess'"):
        read_triplets(odd)
