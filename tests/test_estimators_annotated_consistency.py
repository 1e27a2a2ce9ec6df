"""consis-lex and consis-sem on hand-built records with known strings and verdicts."""

from __future__ import annotations

import numpy as np
import pytest

from candor.annotation.records import Record
from candor.backends.base import Completion
from candor.data.items import QAItem
from candor.estimators import get_estimator
from candor.util.errors import CandorError


def record(
    rid: str, greedy: str, samples: list[str], consistency: list[int] | None = None, judge: str | None = None
) -> Record:
    item = QAItem(id=rid, dataset="toy", split="test", question="What is the capital of France?", answers=("Paris",))
    return Record(
        item=item,
        greedy=Completion(text=greedy, logprobs=[-0.1]),
        samples=[Completion(text=s) for s in samples],
        consistency=consistency,
        provenance={"consistency_judge": judge} if judge else {},
    )


def test_consis_lex_is_the_mean_rouge_l_f1():
    # "the capital is paris" vs "paris is the capital": LCS 2 ("the capital" or "is ...") of 4+4 tokens.
    rec = record("a", "the capital is paris", ["the capital is paris", "paris is the capital", "berlin"])
    out = get_estimator("consis-lex").estimate([rec])
    np.testing.assert_allclose(out, [(1.0 + 2 * 2 / 8 + 0.0) / 3])


def test_consis_lex_counts_an_empty_sample_as_zero():
    out = get_estimator("consis-lex").estimate([record("a", "Paris", ["Paris", ""])])
    np.testing.assert_allclose(out, [0.5])


def test_consis_sem_reads_the_recorded_verdicts():
    recs = [
        record("a", "x", ["p", "q", "r", "s"], consistency=[1, 0, 1, 1]),
        record("b", "x", ["p", "q"], consistency=[0, 0]),
    ]
    est = get_estimator("consis-sem")
    np.testing.assert_allclose(est.estimate(recs), [0.75, 0.0])
    assert est.judged == 0


def test_consis_sem_judges_records_without_verdicts():
    # Lexical judge: containment on word boundaries, or ROUGE-L F1 >= 0.5.
    recs = [
        record("a", "Paris", ["Paris, France", "London", "paris", "Lyon"]),  # 1, 0, 1, 0
        record("b", "x", ["y"], consistency=[1]),
    ]
    est = get_estimator("consis-sem")
    np.testing.assert_allclose(est.estimate(recs), [0.5, 1.0])
    assert est.judged == 1


def test_consis_sem_with_an_llm_judge_needs_a_backend():
    est = get_estimator("consis-sem", judge="llm")
    assert est.needs_backend
    with pytest.raises(CandorError, match="consis-sem"):
        est.estimate([record("a", "x", ["y"])])


def test_consis_sem_judges_with_the_judge_asked_for_not_the_stored_one(tiny_backend):
    from candor.annotation.judges import get_consistency_judge

    # Stored verdicts of the lexical judge (all 1) must not stand in for the llm judge's.
    recs = [
        record("a", "Paris", ["Paris", "Lyon"], [1, 1], judge="lexical"),
        record("b", "Rome", ["Rome", "Milan", "Turin"], [1, 1, 1], judge="lexical"),
    ]
    est = get_estimator("consis-sem", judge="llm")
    out = est.estimate(recs, tiny_backend)
    verdicts = get_consistency_judge("llm", backend=tiny_backend).judge(
        ["Paris", "Lyon", "Rome", "Milan", "Turin"],
        ["Paris", "Paris", "Rome", "Rome", "Rome"],
        ["What is the capital of France?"] * 5,
    )
    np.testing.assert_allclose(out, [np.mean(verdicts[:2]), np.mean(verdicts[2:])])
    assert not np.allclose(out, 1.0)  # the tiny model's judge disagrees with the stored verdicts
    assert est.judged == 2 and est.describe()["verdicts_by"] == ["llm"] and est.describe()["judge"] == "llm"
    # Verdicts the llm judge stored are read back as they are.
    stored = get_estimator("consis-sem", judge="llm")
    np.testing.assert_allclose(
        stored.estimate([record("c", "x", ["y", "z"], [1, 0], judge="llm")], tiny_backend), [0.5]
    )
    assert stored.judged == 0


def test_consis_sem_asked_for_the_llm_judge_without_a_model_refuses():
    recs = [record("a", "Paris", ["Paris", "Lyon"], [1, 1], judge="lexical")]
    with pytest.raises(CandorError, match="consis-sem.*needs a model backend"):
        get_estimator("consis-sem", judge="llm").estimate(recs)


def test_consis_sem_with_lexical_judge_rejudges_verdicts_of_another_judge():
    recs = [
        record("a", "Paris", ["Paris, France", "London", "paris", "Lyon"], [0, 0, 0, 0], judge="llm"),
        record("b", "x", ["y"], [1], judge="lexical"),
    ]
    est = get_estimator("consis-sem", judge="lexical")
    np.testing.assert_allclose(est.estimate(recs), [0.5, 1.0])
    assert est.judged == 1 and est.describe()["verdicts_by"] == ["lexical"]
    # Without a judge named, the stored verdicts are used whoever judged them, and said so.
    default = get_estimator("consis-sem")
    np.testing.assert_allclose(default.estimate(recs), [0.0, 1.0])
    assert default.describe() == {
        "name": "consis-sem",
        "level": "question",
        "judge": "as annotated",
        "verdicts_by": ["lexical", "llm"],
    }


def test_unknown_judge_is_named():
    with pytest.raises(CandorError, match="nonsense"):
        get_estimator("consis-sem", judge="nonsense").estimate([record("a", "x", ["y"])])


@pytest.mark.parametrize("name", ["consis-lex", "consis-sem"])
def test_records_without_samples_are_named(name):
    with pytest.raises(CandorError, match="'lonely'.*no sampled answers"):
        get_estimator(name).estimate([record("lonely", "Paris", [])])


@pytest.mark.parametrize("name", ["consis-lex", "consis-sem"])
def test_records_without_samples_name_the_estimator_too(name):
    with pytest.raises(CandorError, match=f"no sampled answers; {name} needs them$"):
        get_estimator(name).estimate([record("lonely", "Paris", [])])


def test_verdicts_without_a_recorded_judge_are_described_as_unrecorded():
    est = get_estimator("consis-sem")
    np.testing.assert_allclose(est.estimate([record("a", "Paris", ["Paris", "Rome"], consistency=[1, 0])]), [0.5])
    assert est.describe()["verdicts_by"] == ["unrecorded"] and est.judged == 0


def test_judge_options_without_a_judge_are_refused_not_ignored():
    # Before, threshold=0.99 returned the stored verdicts unchanged. The default judge (lexical-echo) takes
    # no threshold, so the options cannot be used: refused when the estimator is built, naming judge=.
    with pytest.raises(CandorError, match=r"judge options \['threshold'\] were given without judge=.*lexical-echo"):
        get_estimator("consis-sem", threshold=0.99)


def test_judge_options_always_judge_anew():
    # The stored verdicts claim the lexical judge found all four samples consistent; given an option, the
    # judge runs again (the provenance names a judge, not its settings) and only "Paris" matches.
    recs = [record("a", "Paris", ["Paris", "Lyon", "Rome", "Nice"], [1, 1, 1, 1], judge="lexical")]
    assert get_estimator("consis-sem", judge="lexical").estimate(recs)[0] == 1.0  # stored verdicts
    strict = get_estimator("consis-sem", judge="lexical", threshold=0.99)
    assert strict.estimate(recs)[0] == 0.25 and strict.judged == 1
    assert strict.describe()["judge_options"] == {"threshold": 0.99}


def test_score_cli_refuses_judge_options_without_a_judge(tmp_path):
    from typer.testing import CliRunner

    from candor.annotation.records import write_records
    from candor.cli import app

    path = tmp_path / "recs.jsonl"
    write_records(path, [record("a", "Paris", ["Paris", "Lyon"], [1, 1], judge="lexical-echo")])
    result = CliRunner().invoke(
        app,
        [
            "score",
            "-r",
            str(path),
            "-o",
            str(tmp_path / "c.jsonl"),
            "-e",
            "consis-sem",
            "-O",
            "consis-sem.threshold=0.99",
        ],
    )
    assert result.exit_code == 2, result.output
    assert "without judge=" in result.output and not (tmp_path / "c.jsonl").exists()
