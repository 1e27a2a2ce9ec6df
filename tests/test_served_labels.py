"""The label format shared by POST /v1/feedback, `candor label` and `candor adapt` (issue 43).

tests/data/served_log.jsonl is four lines a real `candor serve --log-records` wrote on the embedded
model (consis-lex; the last request asked n=2), with ``provenance.served.id`` and ``indexes`` set to
the response ids the official client received, in the documented format.
"""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest
from served_log_fixture import FIXTURE, IDS, copy_served_log

from candor.annotation.label_selection import labelled_records
from candor.annotation.records import read_records
from candor.annotation.served_labels import append_label, read_served, served_records
from candor.util.errors import CandorError


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return copy_served_log(tmp_path)


def test_a_served_log_reads_one_answer_per_choice_index(log: Path) -> None:
    served = read_served(log)
    assert [a.key for a in served.answers] == [(IDS[0], 0), (IDS[1], 0), (IDS[2], 0), (IDS[3], 0), (IDS[3], 1)]
    assert served.answers[3].record is served.answers[4].record
    assert [r.item.question for r in served_records(served)][0] == "What is the capital of France?"
    assert len(served_records(served)) == 4 and not served.labelled() and served.bad_lines == 0


def test_labels_fold_onto_answers_and_the_later_one_wins(log: Path) -> None:
    append_label(log, IDS[0], 0, True, "human")
    append_label(log, IDS[1], 0, True, "feedback")
    append_label(log, IDS[1], 0, False, "judge:gpt")  # later: wins
    served = read_served(log)
    by_key = {a.key: a for a in served.answers}
    assert (by_key[(IDS[0], 0)].label, by_key[(IDS[0], 0)].label_source) == (True, "human")
    assert (by_key[(IDS[1], 0)].label, by_key[(IDS[1], 0)].label_source) == (False, "judge:gpt")
    assert by_key[(IDS[2], 0)].label is None
    lines = log.read_text().splitlines()
    last = json.loads(lines[-1])["label"]
    assert set(last) == {"id", "index", "correct", "label_source", "time"} and last["correct"] is False
    records = {r.item.question: r.greedy_correct for r in labelled_records(served.answers)}
    assert records == {"What is the capital of France?": 1, "Who wrote Hamlet?": 0}


def test_a_record_at_two_indexes_takes_its_latest_label(log: Path) -> None:
    append_label(log, IDS[3], 1, False, "human")
    append_label(log, IDS[3], 0, True, "human")
    (rec,) = labelled_records(read_served(log).answers)
    assert rec.item.question == "Who painted the Mona Lisa?" and rec.greedy_correct == 1


def test_of_two_labels_with_one_timestamp_the_later_line_wins(log: Path) -> None:
    """Labels appended within one millisecond share their time: the log's order decides, not the index order."""
    from candor.annotation.served_labels import Label

    with log.open("a", encoding="utf-8") as fh:
        for index, correct in ((1, True), (0, False)):
            fh.write(Label(id=IDS[3], index=index, correct=correct, label_source="human", time=1764770000.0).to_line())
    (rec,) = labelled_records(read_served(log).answers)
    assert rec.greedy_correct == 0
    answers = {a.key: a for a in read_served(log).answers}
    assert answers[(IDS[3], 0)].label_line > answers[(IDS[3], 1)].label_line


def test_read_records_passes_over_label_lines(log: Path) -> None:
    append_label(log, IDS[0], 0, True, "human")
    records = read_records(log)
    assert [r.greedy.text for r in records] == ["Paris", "William Shakespeare", "Jupiter", "Leonardo da Vinci"]


def test_bad_lines_and_orphan_labels_are_skipped_and_counted(log: Path) -> None:
    with log.open("a") as fh:
        fh.write("{not json\n")
        fh.write(json.dumps({"label": {"id": IDS[0], "index": -1, "correct": True, "label_source": "human"}}) + "\n")
        fh.write('{"label": {"id": "chatcmpl-unknown", "index": 0, "correct": true, "label_source": "human"}}\n')
        fh.write('{"item": {"id": "cut')  # a write cut short by a kill
    append_label(log, IDS[2], 0, True, "human")  # starts on a line of its own
    served = read_served(log)
    assert (served.bad_lines, served.orphan_labels) == (3, 1)
    assert [a.key for a in served.labelled()] == [(IDS[2], 0)]


def test_a_record_without_a_response_id_is_named_by_its_item_id(tmp_path: Path) -> None:
    path = tmp_path / "annotated.jsonl"
    first = json.loads(FIXTURE.read_text().splitlines()[0])
    del first["provenance"]["served"]
    path.write_text(json.dumps(first) + "\n")
    append_label(path, first["item"]["id"], 0, False, "human")
    (answer,) = read_served(path).answers
    assert (answer.id, answer.index, answer.label) == ("q-115049a298532be2", 0, False)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("", 0, True, "human"), "'id'"),
        (("c", -1, True, "human"), "'index'"),
        (("c", True, True, "human"), "'index'"),
        (("c", 0, 1, "human"), "'correct'"),
        (("c", 0, True, ""), "'label_source'"),
    ],
)
def test_a_bad_label_is_refused_before_writing(log: Path, args: tuple, field: str) -> None:
    before = log.read_bytes()
    with pytest.raises(CandorError, match=field):
        append_label(log, *args)
    assert log.read_bytes() == before


def _append_many(path: str, worker: int) -> None:
    for i in range(40):
        append_label(path, f"chatcmpl-{worker}-{i}-" + "x" * 220, i, i % 2 == 0, "feedback")  # ids up to 256


def test_labels_from_many_processes_land_whole(log: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    workers = [ctx.Process(target=_append_many, args=(str(log), w)) for w in range(6)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    lines = log.read_text().splitlines()
    labels = [json.loads(line)["label"] for line in lines[4:]]  # every line parses
    assert len(labels) == 240
    expected = {(str(w), i) for w in range(6) for i in range(40)}
    assert {(lab["id"].split("-")[1], lab["index"]) for lab in labels} == expected
    assert read_served(log).orphan_labels == 240
