"""Records and the released HonestyBench format: import, export, round trips, bad lines.

The fixture ``data/honestybench/nq.jsonl`` follows the shapes the official
repository's README documents (docs/methods.md "Generation and judging"): ``greedy_response: [str]``,
``greedy_tokens: [[str]]``, ``greedy_logprobs: [[number]]`` per token,
``greedy_cumulative_logprobs: [number]`` (the sequence total) and 20 samples
with their correctness and consistency verdicts. Its third line has only the
total, no per-token log-probs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from candor.annotation.records import (
    HONESTYBENCH_FIELDS,
    from_honestybench,
    read_honestybench,
    read_records,
    to_honestybench,
    write_records,
)
from candor.cli import app
from candor.estimators import get_estimator
from candor.util.errors import CandorError

FIXTURE = Path(__file__).parent / "data" / "honestybench" / "nq.jsonl"


def fixture_lines() -> list[dict]:
    return [json.loads(line) for line in FIXTURE.read_text().splitlines()]


def write_lines(path: Path, objects: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objects))
    return path


def test_documented_line_imports_with_its_values():
    hamlet, canberra, iron = read_honestybench(FIXTURE)
    assert (hamlet.id, hamlet.item.dataset) == ("nq:1", "nq")  # dataset from the file's stem
    assert hamlet.item.question == "Who wrote the play Hamlet?"
    assert hamlet.item.answers == ("William Shakespeare", "Shakespeare")
    assert hamlet.greedy.text == "William Shakespeare"
    assert hamlet.greedy.tokens == ["William", " Shakespeare"]
    assert hamlet.greedy.logprobs == [-0.4308, -0.0052]
    assert hamlet.greedy_total_logprob == -0.436
    assert hamlet.greedy_correct == 1 and hamlet.k == 20
    assert hamlet.samples[17].text == "Christopher Marlowe"
    assert hamlet.sample_correct[17] == 0 and hamlet.consistency[17] == 0
    assert hamlet.sample_accuracy == pytest.approx(18 / 20)
    assert hamlet.consistency_rate == pytest.approx(18 / 20)
    assert canberra.greedy.text == "Sydney" and canberra.greedy_correct == 0
    assert canberra.greedy.logprobs == [-0.9163, -0.0282, -0.0008]
    assert canberra.consistency_rate == pytest.approx(10 / 20)
    # Only the total: no per-token log-probs, and none invented from the total.
    assert iron.greedy.text == "Iron" and iron.greedy.logprobs == [] and iron.greedy.tokens == []
    assert iron.greedy_total_logprob == -0.0105
    assert {r.provenance["imported_from"] for r in (hamlet, canberra, iron)} == {"honestybench"}


def test_logprob_estimators_use_the_per_token_logprobs():
    hamlet, canberra, _ = read_honestybench(FIXTURE)
    recs = [hamlet, canberra]
    per_token = [np.array([-0.4308, -0.0052]), np.array([-0.9163, -0.0282, -0.0008])]
    np.testing.assert_allclose(get_estimator("n-prob").estimate(recs), [math.exp(lp.mean()) for lp in per_token])
    np.testing.assert_allclose(get_estimator("prob").estimate(recs), [math.exp(lp.sum()) for lp in per_token])
    np.testing.assert_allclose(get_estimator("min-prob").estimate(recs), [math.exp(lp.min()) for lp in per_token])


@pytest.mark.parametrize("name", ["prob", "n-prob", "min-prob"])
def test_logprob_estimators_refuse_a_record_with_only_the_total(name):
    hamlet, _, iron = read_honestybench(FIXTURE)
    with pytest.raises(CandorError, match=r"record 'nq:3': the greedy answer 'Iron' has no per-token log-probs"):
        get_estimator(name).estimate([hamlet, iron])


def test_export_writes_exactly_the_documented_shape(tmp_path):
    original = fixture_lines()
    exported = [to_honestybench(r) for r in read_honestybench(FIXTURE)]
    for line in exported:
        assert list(line) == list(HONESTYBENCH_FIELDS)
    # Lines with every field come back identical, values and nesting alike.
    assert exported[:2] == original[:2]
    # The line without per-token values keeps its total and gets empty per-token lists.
    assert exported[2] == {**original[2], "greedy_tokens": [[]], "greedy_logprobs": [[]]}


def test_import_export_import_round_trip(tmp_path):
    first = read_honestybench(FIXTURE)
    out = tmp_path / "export" / "nq.jsonl"
    result = CliRunner().invoke(app, ["export", str(write_records_file(tmp_path, first)), "--out", str(out)])
    assert result.exit_code == 0, result.output
    again = read_honestybench(out)
    assert [r.to_dict() for r in again] == [r.to_dict() for r in first]
    assert [json.loads(line) for line in out.read_text().splitlines()] == [to_honestybench(r) for r in first]


def write_records_file(tmp_path: Path, records) -> Path:
    path = tmp_path / "records.jsonl"
    write_records(path, records)
    return path


def test_candor_records_read_back_with_their_total(tmp_path):
    recs = read_honestybench(FIXTURE)
    back = read_records(write_records_file(tmp_path, recs))
    assert [r.to_dict() for r in back] == [r.to_dict() for r in recs]
    assert back[2].greedy_total_logprob == -0.0105


def test_records_reader_imports_honestybench_lines_directly():
    assert [r.to_dict() for r in read_records(FIXTURE)] == [r.to_dict() for r in read_honestybench(FIXTURE)]


@pytest.mark.parametrize("answer", [[""], [], None, ["", " "]])
def test_item_without_alias_in_the_middle_is_skipped_and_counted(tmp_path, caplog, answer):
    lines = fixture_lines()
    blank = {**lines[0], "question": "Who painted it?", "answer": answer}
    path = write_lines(tmp_path / "nq.jsonl", [lines[0], blank, lines[1], lines[2]])
    with caplog.at_level("WARNING"):
        recs = read_honestybench(path)
    assert [r.id for r in recs] == ["nq:1", "nq:3", "nq:4"]
    assert {r.provenance["skipped_items"] for r in recs} == {1}
    warnings = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(warnings) == 1 and "skipped 1 item(s)" in warnings[0] and "(lines 2)" in warnings[0]
    with pytest.raises(CandorError, match=r"nq\.jsonl:2: no non-empty answer alias"):
        read_honestybench(path, strict=True)
    # read_records imports the same lines the same way: skipping by default, refusing when strict.
    assert [r.to_dict() for r in read_records(path)] == [r.to_dict() for r in recs]
    with pytest.raises(CandorError, match=r"nq\.jsonl:2: no non-empty answer alias"):
        read_records(path, strict=True)


def test_a_file_whose_every_item_is_skipped_is_an_error_not_an_empty_list(tmp_path):
    blank = {**fixture_lines()[0], "answer": [""]}
    path = write_lines(tmp_path / "nq.jsonl", [blank, blank])
    for read in (read_records, read_honestybench):
        with pytest.raises(CandorError, match=r"nq\.jsonl:1: no item can be judged: all 2 have no non-empty"):
            read(path)


BAD_LINES = [
    # candor's old guessed shape: a bare per-token list and a running sum.
    ({"greedy_logprobs": [-0.4308, -0.0052]}, "'greedy_logprobs' must be a list holding one entry"),
    ({"greedy_logprobs": [-0.4308]}, "'greedy_logprobs' must be [[...]]"),
    ({"greedy_cumulative_logprobs": [-0.4308, -0.436]}, "'greedy_cumulative_logprobs' must be a list holding one"),
    ({"greedy_response": ["a", "b"]}, "'greedy_response' must be a list holding one entry"),
    ({"greedy_tokens": [["William"]]}, "1 tokens but 'greedy_logprobs' 2 values"),
    ({"sampling_correctness": [1, 0]}, "'sampling_correctness' must be a list of 20 verdicts"),
    ({"consistency_judgement": [1] * 21}, "'consistency_judgement' must be a list of 20 verdicts"),
    ({"answer": {"text": "Shakespeare"}}, "'answer' must be [str], got {'text': 'Shakespeare'}"),
]


@pytest.mark.parametrize(("change", "message"), BAD_LINES)
def test_lines_not_in_the_documented_shape_name_file_and_line(tmp_path, change, message):
    lines = fixture_lines()
    path = write_lines(tmp_path / "nq.jsonl", [lines[1], {**lines[0], **change}])
    with pytest.raises(CandorError) as err:
        read_honestybench(path)
    assert "nq.jsonl:2: not a HonestyBench annotation" in str(err.value)
    assert message in str(err.value)


def test_missing_required_field_names_it(tmp_path):
    line = fixture_lines()[0]
    del line["greedy_response"]
    with pytest.raises(CandorError, match=r"nq\.jsonl:1: .*'greedy_response'"):
        read_honestybench(write_lines(tmp_path / "nq.jsonl", [line]))


def test_from_honestybench_accepts_a_bare_response_string_and_string_verdicts():
    rec = from_honestybench(
        {
            "question": "q",
            "answer": ["a"],
            "greedy_response": "a b",
            "greedy_correctness": True,
            "sampling_response": ["a", "c"],
            "sampling_correctness": [1, 0],
            "consistency_judgement": ["True", "False"],
        },
        dataset="nq",
        index=3,
    )
    assert (rec.id, rec.greedy.text, rec.greedy_correct, rec.consistency) == ("nq:3", "a b", 1, [1, 0])
    assert rec.greedy.logprobs == [] and rec.greedy_total_logprob is None
    assert to_honestybench(rec)["greedy_cumulative_logprobs"] == [None]  # unknown, not 0


# ------------------------------------------------------------------- CLI


def test_cli_import_names_dataset_and_skips(tmp_path):
    lines = fixture_lines()
    path = write_lines(tmp_path / "Qwen2.5-7B" / "hotpot.jsonl", [lines[0], {**lines[1], "answer": [""]}])
    out = tmp_path / "r.jsonl"
    runner = CliRunner()
    result = runner.invoke(app, ["import", str(path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "imported 1 records" in result.output
    (rec,) = read_records(out)
    assert (rec.id, rec.item.dataset, rec.provenance["skipped_items"]) == ("hotpot:1", "hotpot", 1)
    strict = runner.invoke(app, ["import", str(path), "--out", str(out), "--strict"])
    assert strict.exit_code == 2 and "hotpot.jsonl:2: no non-empty answer alias" in strict.output
    assert len(strict.output.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("command", "content", "needle"),
    [
        ("import", '{"question": "q", "answer": ["a"], "greedy_response": ["x"]}\n{"question"', "in.jsonl:2:"),
        ("import", '{"question": "q", "answer": ["a"]}\n', "in.jsonl:1: not a HonestyBench annotation"),
        ("import", None, "in.jsonl: no such file"),
        ("export", '{"item": {"id": "x"}}\n', "in.jsonl:1: not a record"),
        ("export", None, "in.jsonl: no such file"),
    ],
)
def test_cli_import_export_bad_input_exit_2_with_one_line(tmp_path, command, content, needle):
    source = tmp_path / "in.jsonl"
    if content is not None:
        source.write_text(content)
    result = CliRunner().invoke(app, [command, str(source), "--out", str(tmp_path / "out.jsonl")])
    assert result.exit_code == 2
    assert needle in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out.jsonl").exists()


def test_every_documented_verdict_spelling_reads_as_its_bit():
    """Verdicts arrive as bools, numbers (≥ 0.5 is 1) or words; anything else is a bad line."""
    yes = ["1", "true", "yes", "correct", "certain", "consistent", " Yes ", "CERTAIN"]
    no = ["0", "false", "no", "uncertain", "maybe"]
    rec = from_honestybench(
        {
            "question": "q",
            "answer": ["a"],
            "greedy_response": "a",
            "greedy_correctness": 0.5,
            "sampling_response": ["x"] * (len(yes) + len(no)),
            "sampling_correctness": yes + no,
            "consistency_judgement": [0.49, 0.5, 1, 0, True, False, 1.0, 0.0, "1", "0", "correct", "no", "consistent"],
        }
    )
    assert rec.greedy_correct == 1
    assert rec.sample_correct == [1] * len(yes) + [0] * len(no)
    assert rec.consistency == [0, 1, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1]
    with pytest.raises(ValueError, match=r"^cannot read \[1\] as 0/1$"):
        from_honestybench({"question": "q", "answer": ["a"], "greedy_response": "a", "greedy_correctness": [1]})


def test_import_fields_and_their_defaults_and_the_appender_writes_utf8_into_new_folders(tmp_path):
    from candor.annotation.records import RecordAppender

    base = {"question": "q", "greedy_response": ["Zürich"]}
    rec = from_honestybench({**base, "answers": ["Zürich"], "id": "x7", "dataset": "hq", "split": "test"})
    assert (rec.id, rec.item.dataset, rec.item.split, rec.item.answers) == ("x7", "hq", "test", ("Zürich",))
    plain = from_honestybench({**base, "answer": ["a"]})
    assert (plain.id, plain.item.dataset, plain.item.split) == ("hb:0", "", "")
    assert from_honestybench({**base, "answer": ["a"]}, index=4).id == "hb:4"
    with pytest.raises(ValueError, match=r"^'sampling_response' must be \[str\], got \['a', 3\]$"):
        from_honestybench({**base, "answer": ["a"], "sampling_response": ["a", 3]})
    with pytest.raises(ValueError, match=r"^'greedy_response' must be \[str\], got \[3\]$"):
        from_honestybench({**base, "answer": ["a"], "greedy_response": [3]})
    path = tmp_path / "new" / "deeper" / "records.jsonl"
    with RecordAppender(path) as out:
        out.append([rec])
    assert "Zürich" in path.read_text(encoding="utf-8")  # written as UTF-8, not \u escapes
    assert read_records(path)[0].greedy.text == "Zürich"


def test_read_records_skips_unjudgeable_imported_lines_by_default(tmp_path):
    """Pins ``read_records``' ``strict=False`` default: every command that reads records (score, eval, train)
    keeps going past an imported item with no answer alias, counting it; only ``strict=True`` refuses."""
    import inspect

    assert inspect.signature(read_records).parameters["strict"].default is False
    lines = fixture_lines()
    path = write_lines(tmp_path / "nq.jsonl", [lines[0], {**lines[1], "answer": [""]}])
    (rec,) = read_records(path)
    assert rec.id == "nq:1" and rec.provenance["skipped_items"] == 1
