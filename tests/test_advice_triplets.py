"""ADVICE triplet builder (candor.train.advice.triplets)."""

from __future__ import annotations

import json
import random
import string

import pytest

from candor.annotation.judges import get_correctness_judge
from candor.annotation.prompts import TEMPLATES, resolve_template
from candor.annotation.records import Record
from candor.annotation.text_matching import normalize
from candor.backends.base import Completion, SamplingParams
from candor.data.items import QAItem
from candor.train.advice.triplets import Triplet, build_triplets, read_triplets, write_triplets
from candor.util.errors import CandorError
from candor.util.seeds import item_seed

PROVENANCE = {
    "template": "fewshot",
    "correctness_judge": "contains",
    "decoding": {"samples": {"max_new_tokens": 8, "temperature": 1.0, "top_p": 0.95, "top_k": 50, "stop": ["\n"]}},
}


def record(rid, answers, greedy, samples, greedy_correct=None, dataset="toy", sample_correct=None):
    """A record whose correctness comes from the contains judge unless given."""
    judge = get_correctness_judge("contains")
    item = QAItem(id=rid, dataset=dataset, split="train", question=f"Question {rid}?", answers=tuple(answers))
    texts = [s for s, _ in samples]
    if greedy_correct is None:
        greedy_correct = judge.judge([greedy], [item.answers])[0]
    if sample_correct is None:
        sample_correct = judge.judge(texts, [item.answers] * len(texts)) if texts else []
    comps = [Completion(text=t, logprobs=[lp]) for t, lp in samples]
    return Record(
        item=item,
        greedy=Completion(text=greedy, logprobs=[-0.1]),
        samples=comps,
        greedy_correct=greedy_correct,
        sample_correct=sample_correct,
        consistency=[0] * len(comps),
        provenance=dict(PROVENANCE),
    )


def test_hard_negative_is_the_most_likely_wrong_sample():
    rec = record("q1", ["Paris"], "Paris", [("Lyon", -2.0), ("Paris", -0.1), ("Marseille", -0.5), ("", -0.01)])
    built = build_triplets([rec])
    assert [(t.a_correct, t.a_wrong, t.source, t.wrong_from) for t in built.triplets] == [
        ("Paris", "Marseille", "sample", "q1")
    ]
    assert built.stats.as_dict() == {
        "records": 1,
        "eligible": 1,
        "from_samples": 1,
        "from_resamples": 0,
        "from_other_questions": 0,
        "dropped": 0,
    }


def test_only_records_with_a_correct_greedy_answer():
    wrong = record("q1", ["Paris"], "Lyon", [("Nice", -1.0)])
    empty = record("q2", ["Paris"], "  ", [("Nice", -1.0)], greedy_correct=1)
    built = build_triplets([wrong, empty])
    assert built.triplets == [] and built.stats.eligible == 0


def test_never_the_same_answer_and_never_a_correct_one():
    # Annotation mistakes: a sample equal to the greedy answer, and a sample containing a gold
    # alias, both marked wrong; neither may become a_wrong.
    rec = record(
        "q1", ["Paris"], "Paris", [("paris!", -0.1), ("Paris, France", -0.2), ("Rome", -3.0)], sample_correct=[0, 0, 0]
    )
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
    item = QAItem(
        id="m1",
        dataset="mc",
        split="train",
        question="Capital of France?",
        answers=("B", "Paris"),
        choices=("Rome", "Paris", "Oslo"),
        answer_index=1,
    )
    rec = Record(
        item=item,
        greedy=Completion(text="B. Paris"),
        samples=[Completion("(B)", logprobs=[-0.1]), Completion("A", logprobs=[-0.5])],
        greedy_correct=1,
        sample_correct=[1, 0],
        consistency=[1, 0],
        provenance=dict(PROVENANCE),
    )
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


# ------------------------------------------------------------ cases the mutation run found untested


class Recorder:
    """The tiny backend, with every ``generate`` call's arguments kept."""

    def __init__(self, inner) -> None:
        self.inner, self.model_name, self.calls = inner, inner.model_name, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def generate(self, prompts, n, params, *, greedy=True, seeds=None):
        self.calls.append({"prompts": list(prompts), "n": n, "params": params, "greedy": greedy, "seeds": seeds})
        return self.inner.generate(prompts, n, params, greedy=greedy, seeds=seeds)


def test_resampling_uses_the_records_template_decoding_and_fresh_seeds(tiny_backend):
    decoding = {"samples": {"max_new_tokens": 6, "temperature": 0.7, "top_p": 0.9, "top_k": 20, "stop": ["###"]}}
    rec = record("q1", ["Paris"], "Paris", [("Paris", -0.1)])
    rec.provenance = {"template": "fewshot", "decoding": decoding}
    bare = record("q2", ["Rome"], "Rome", [("Rome", -0.1)])
    bare.provenance = {}  # no template, no decoding, no judge: auto template, default decoding, contains
    backend = Recorder(tiny_backend)
    built = build_triplets([rec, bare], backend=backend)  # defaults: 5 more samples, 2 rounds, seed 0
    assert built.stats.from_resamples == 2 and len(backend.calls) == 2  # one call per template, one round
    by_prompt = {c["prompts"][0]: c for c in backend.calls}
    fewshot = by_prompt[TEMPLATES.get("fewshot")(rec.item, backend)]
    assert fewshot["params"] == SamplingParams(max_new_tokens=6, temperature=0.7, top_p=0.9, top_k=20, stop=("###",))
    assert (fewshot["n"], fewshot["greedy"], fewshot["seeds"]) == (5, False, [item_seed("triplets", 0, 0, "q1")])
    auto = resolve_template("auto", tiny_backend.model_name, tiny_backend)
    plain = by_prompt[auto(bare.item, backend)]
    assert plain["params"] == SamplingParams(stop=tuple(auto.stop))
    assert plain["seeds"] == [item_seed("triplets", 0, 0, "q2")]


def test_resampling_rounds_and_the_records_left_without_a_wrong_answer(tiny_backend):
    # Stopping at any printable character leaves every new sample empty, so q1 and q2 never get a wrong answer.
    never = [record(f"q{i}", ["Paris"], "Paris", [("Paris", -0.1)], dataset=f"d{i}") for i in (1, 2)]
    for rec in never:
        rec.provenance = {"template": "fewshot", "decoding": {"samples": {"stop": list(string.printable)}}}
    good = record("q3", ["Rome"], "Rome", [("Oslo", -0.5)], dataset="d3")
    backend = Recorder(tiny_backend)
    built = build_triplets([*never, good], backend=backend, extra_samples=1, seed=4)
    assert [len(c["prompts"]) for c in backend.calls] == [2, 2]  # two rounds, only the records still missing
    assert backend.calls[0]["seeds"] == [item_seed("triplets", 4, 0, f"q{i}") for i in (1, 2)]
    assert backend.calls[1]["seeds"] == [item_seed("triplets", 4, 1, f"q{i}") for i in (1, 2)]
    assert built.stats.dropped == 2 and [t.a_wrong for t in built.triplets] == ["Oslo"]
    backend.calls.clear()
    build_triplets(never, backend=backend, extra_samples=0)
    assert backend.calls == []


def test_the_judge_comes_from_the_records_provenance_else_contains():
    rec = record("q1", ["Paris"], "Paris", [("Paris, France", -0.1)], sample_correct=[0])
    rec.provenance = {"correctness_judge": "exact"}  # exact: "Paris, France" is wrong
    assert [t.a_wrong for t in build_triplets([rec]).triplets] == ["Paris, France"]
    rec.provenance = {}  # contains: it is right, so there is no wrong answer
    assert build_triplets([rec]).stats.dropped == 1


def test_the_llm_judge_is_given_the_backend(tiny_backend):
    rec = record("q1", ["Paris"], "Paris", [("Rome", -0.1)])
    built = build_triplets([rec], judge="llm", backend=tiny_backend, extra_samples=0)
    assert built.stats.eligible == 1  # built without a "needs a backend" error


def test_the_hard_negative_ranks_by_mean_log_prob_and_keeps_the_first_of_a_tie():
    pick = lambda samples: build_triplets([record("q1", ["Paris"], "Paris", samples)]).triplets[0].a_wrong  # noqa: E731
    assert pick([("Aachen", -0.1), ("Zurich", -2.0)]) == "Aachen"
    assert pick([("Berlin", -0.5), ("Rome", -0.5)]) == "Berlin"
    rec = record("q1", ["Paris"], "Paris", [("Oslo", 0.0), ("Rome", -3.0)])
    rec.samples[0] = Completion("Oslo", logprobs=[])  # no log-probs: least likely, not NaN
    assert build_triplets([rec]).triplets[0].a_wrong == "Rome"


def test_other_question_candidates_stop_at_the_cap():
    lonely = record("q1", ["Paris"], "Paris", [])
    # 200 candidates from one record (greedy + 199 samples), one of them wrong for q1.
    big = record("big", ["x"], "Berlin", [("Paris", -0.1)] * 199)
    assert build_triplets([lonely, big]).triplets[0].wrong_from == "big"
    # Seeded order for two others is (big, small): 200 candidates that are all q1's own answer fill the
    # cap, so the wrong answer of the next record is never reached.
    small = record("small", ["x"], "Oslo", [])
    full = record("big", ["x"], "Paris", [("Paris", -0.1)] * 199)
    assert build_triplets([lonely, small, full]).stats.dropped == 1
    # The pick among other questions is seeded.
    others = [record(f"o{i}", ["x"], f"City{i}", []) for i in range(6)]
    assert build_triplets([lonely, *others]).triplets[0].wrong_from == "o4"
    assert build_triplets([lonely, *others], seed=1).triplets[0].wrong_from == "o2"


def test_triplet_files_carry_the_id_and_read_old_lines_without_wrong_from(tmp_path):
    rec = record("q1", ["Paris"], "Paris", [("Lyon", -2.0)])
    path = tmp_path / "t.jsonl"
    write_triplets(path, build_triplets([rec]).triplets)
    row = json.loads(path.read_text())
    assert row["id"] == "q1"
    del row["wrong_from"]
    path.write_text(json.dumps(row) + "\n")
    assert read_triplets(path)[0].wrong_from == ""
    path.write_text(json.dumps({**row, "source": "guess"}) + "\n")
    with pytest.raises(CandorError, match="known: sample, resample, other-question$"):
        read_triplets(path)
