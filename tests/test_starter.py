"""The built-in starter set: size, shape and balance."""

from __future__ import annotations

import re
from pathlib import Path

import candor.data
from candor.data import count_by, load_items, load_starter, starter_path

TOPICS = {"geography", "science", "history", "literature", "arts", "sports", "technology"}


def test_starter_loads_offline_with_values():
    items = load_items("starter")
    assert len(items) >= 320
    first = items[0]
    assert (first.id, first.dataset, first.split) == ("starter:001", "starter", "test")
    assert (first.question, first.answers) == ("What is the capital of France?", ("Paris",))
    assert first.meta == {"difficulty": "easy", "topic": "geography"}
    assert [i.id for i in load_starter(limit=3)] == ["starter:001", "starter:002", "starter:003"]


def test_starter_ids_questions_and_aliases():
    items = load_starter()
    assert all(re.fullmatch(r"starter:\d{3}", i.id) for i in items)
    assert len({i.id for i in items}) == len(items)
    assert len({i.question.strip().lower() for i in items}) == len(items)
    for i in items:
        assert i.question.endswith(("?", "."))
        assert i.answers and all(a.strip() for a in i.answers)
        # Keyword answers, as a judge by containment needs.
        assert all(len(a.split()) <= 6 for a in i.answers), i.answers
        assert len(set(i.answers)) == len(i.answers), i.answers


def test_starter_difficulty_and_topic_mix():
    items = load_starter()
    by_difficulty = count_by(items, "difficulty")
    assert set(by_difficulty) == {"easy", "medium", "hard"}
    shares = {k: v / len(items) for k, v in by_difficulty.items()}
    assert 0.35 <= shares["easy"] <= 0.45
    assert 0.25 <= shares["medium"] <= 0.35
    assert 0.25 <= shares["hard"] <= 0.35
    by_topic = count_by(items, "topic")
    assert set(by_topic) == TOPICS
    assert min(by_topic.values()) >= 30


def test_starter_ships_inside_the_package():
    path = Path(starter_path())
    assert path.name == "starter.jsonl"
    assert path.parent == Path(candor.data.__file__).resolve().parent
