"""`candor rejudge` and the one (greedy, sample) pairing that every consistency judgement goes through."""

from __future__ import annotations

from typer.testing import CliRunner

from candor.annotation.judges import get_consistency_judge, judge_consistency
from candor.annotation.records import Record, read_records, write_records
from candor.backends.base import Completion
from candor.cli import app
from candor.data.items import QAItem


class Recorder:
    """A consistency judge that records its calls and says 1 when the texts are equal."""

    name = "recorder"

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], list[str], list[str] | None]] = []

    def judge(self, a, b, questions=None):
        self.calls.append((list(a), list(b), None if questions is None else list(questions)))
        return [int(x == y) for x, y in zip(a, b, strict=True)]

    def describe(self):
        return {"name": self.name}


def test_judge_consistency_pairs_each_sample_with_its_own_greedy_and_question():
    rec = Recorder()
    out = judge_consistency(rec, ["g1", "g2", "g3"], [["g1", "x"], [], ["y", "g3", "g3"]], ["q1", "q2", "q3"])
    assert out == [[1, 0], [], [0, 1, 1]]
    assert rec.calls == [(["g1", "x", "y", "g3", "g3"], ["g1", "g1", "g3", "g3", "g3"], ["q1", "q1", "q3", "q3", "q3"])]


def record(i: int, question: str, greedy: str, samples: list[str], consistency: list[int]) -> Record:
    item = QAItem(id=f"toy:{i}", dataset="toy", split="test", question=question, answers=("x",))
    return Record(
        item=item,
        greedy=Completion(greedy),
        samples=[Completion(s) for s in samples],
        greedy_correct=0,
        sample_correct=[0] * len(samples),
        consistency=consistency,
        provenance={"model": "m", "consistency_judge": "lexical"},
    )


def test_rejudge_cli_recomputes_verdicts_and_names_the_judge(tmp_path):
    # lexical says "Santa Claus" ~ "Santa Claus, joseph thomas" (containment); lexical-echo drops the question's
    # words first, so an answer that only repeats the question is not equivalent to one that answers it.
    question = "Who played Santa Claus in the film?"
    recs = [
        record(0, question, "Santa Claus", ["Santa Claus, joseph thomas", "Santa Claus"], [1, 1]),
        record(1, "Capital of France?", "Paris", ["Paris", "Lyon"], [1, 0]),
    ]
    lexical = get_consistency_judge("lexical")
    assert lexical.judge(["Santa Claus, joseph thomas"], ["Santa Claus"]) == [1]
    write_records(tmp_path / "r.jsonl", recs)
    result = CliRunner().invoke(
        app,
        ["rejudge", "-r", str(tmp_path / "r.jsonl"), "-o", str(tmp_path / "o.jsonl"), "--consistency", "lexical-echo"],
    )
    assert result.exit_code == 0, result.output
    out = read_records(tmp_path / "o.jsonl")
    echo = get_consistency_judge("lexical-echo")
    expected = judge_consistency(
        echo,
        [r.greedy.text for r in recs],
        [[s.text for s in r.samples] for r in recs],
        [r.item.question for r in recs],
    )
    assert [r.consistency for r in out] == expected
    assert out[0].consistency[0] == 0 and out[1].consistency == [1, 0]
    assert {r.provenance["consistency_judge"] for r in out} == {"lexical-echo"}
    bad = CliRunner().invoke(
        app, ["rejudge", "-r", str(tmp_path / "r.jsonl"), "-o", str(tmp_path / "x.jsonl"), "--consistency", "oracle"]
    )
    assert bad.exit_code == 2
    assert not (tmp_path / "x.jsonl").exists()
