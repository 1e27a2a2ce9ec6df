"""Incremental scoring into a confidences file, and the demo pipeline end to end on a tiny model."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from candor.backends.base import Completion
from candor.cli import app
from candor.confidences import read_confidences
from candor.data.items import QAItem
from candor.demo import run_demo
from candor.records import Record, write_records
from candor.scoring import score_into


def record(i: int, logprobs: list[float], consistency: list[int], correct: int) -> Record:
    item = QAItem(f"r:{i}", "toy", "test", f"question {i}", ("gold",))
    greedy = Completion("answer", token_ids=list(range(len(logprobs))), logprobs=logprobs)
    samples = [Completion("answer") for _ in consistency]
    return Record(item, greedy, samples, correct, [correct] * len(consistency), consistency)


@pytest.fixture()
def records() -> list[Record]:
    return [
        record(0, [-1.0, -2.0, -3.0], [1, 1, 0, 0], 1),
        record(1, [-0.5], [1, 1, 1, 1], 0),
        record(2, [-0.1, -0.1], [0, 0, 0, 1], 1),
    ]


def test_score_into_writes_values_and_reuses_cached_columns(records, tmp_path):
    out = tmp_path / "conf.jsonl"
    table = score_into(records, ["n-prob", "consis-sem"], out)
    conf, correct = table.arrays("n-prob")
    assert conf == pytest.approx([math.exp(-2.0), math.exp(-0.5), math.exp(-0.1)])
    assert list(correct) == [1, 0, 1]
    assert table.arrays("consis-sem")[0] == pytest.approx([0.5, 1.0, 0.25])

    # Plant a sentinel in the cached column: a rerun must keep it (no recompute) ...
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    rows[0]["confidence"]["n-prob"] = 0.123
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    again = score_into(records, ["n-prob", "prob"], out)
    assert again.arrays("n-prob")[0][0] == pytest.approx(0.123)
    assert again.arrays("prob")[0] == pytest.approx([math.exp(-6.0), math.exp(-0.5), math.exp(-0.2)])
    assert read_confidences(out).methods[:2] == ["n-prob", "prob"]
    # ... and force recomputes it.
    forced = score_into(records, ["n-prob"], out, force=True)
    assert forced.arrays("n-prob")[0][0] == pytest.approx(math.exp(-2.0))


def test_cli_score_then_eval(records, tmp_path):
    recs = tmp_path / "records.jsonl"
    write_records(recs, records)
    conf = tmp_path / "conf.jsonl"
    runner = CliRunner()
    result = runner.invoke(app, ["score", "--records", str(recs), "--out", str(conf), "-e", "prob,n-prob"])
    assert result.exit_code == 0, result.output
    assert read_confidences(conf).methods == ["prob", "n-prob"]
    result = runner.invoke(app, ["eval", "--confidences", str(conf), "--out-dir", str(tmp_path / "rep")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "rep" / "index.md").exists() and (tmp_path / "rep" / "metrics.json").exists()
    bad = runner.invoke(app, ["score", "--records", str(recs), "--out", str(conf), "-e", "no-such-method"])
    assert bad.exit_code == 2 and "no-such-method" in bad.output



def test_demo_runs_end_to_end_and_reuses_its_cache(tiny_model_dir, tmp_path):
    methods = ("n-prob", "consis-lex", "p-true", "verbal-letter")
    first = run_demo(tmp_path, model=str(tiny_model_dir), k=2, limit=6, estimators=methods, batch_size=4)
    assert len(first.table.rows) == 6 and first.table.methods == list(methods)
    assert first.report.files["index"].exists()
    assert set(first.report.reliability) == set(methods)
    before = (first.records.read_text(), first.confidences.read_text())
    second = run_demo(tmp_path, model=str(tiny_model_dir), k=2, limit=6, estimators=methods, batch_size=4)
    assert (second.records.read_text(), second.confidences.read_text()) == before


def test_cli_score_estimator_options_reach_the_estimator_and_bad_ones_fail(records, tmp_path):
    recs = tmp_path / "records.jsonl"
    write_records(recs, records)
    conf = tmp_path / "conf.jsonl"
    runner = CliRunner()
    base = ["score", "--records", str(recs), "--out", str(conf), "-e", "consis-sem"]
    ok = runner.invoke(app, [*base, "-O", "consis-sem.judge=lexical"])
    assert ok.exit_code == 0, ok.output
    assert read_confidences(conf).arrays("consis-sem")[0] == pytest.approx([0.5, 1.0, 0.25])
    unknown_judge = runner.invoke(app, [*base, "--force", "-O", "consis-sem.judge=oracle"])
    assert unknown_judge.exit_code == 2 and "oracle" in unknown_judge.output
    for bad, why in (("consis-sem.judge", "NAME.KEY=VALUE"), ("judge=lexical", "NAME.KEY=VALUE"),
                     ("n-prob.x=1", "not among --estimators")):
        result = runner.invoke(app, [*base, "-O", bad])
        assert result.exit_code == 2 and why in result.output, (bad, result.output)


def test_cli_score_adapter_must_be_a_peft_folder(records, tiny_model_dir, tmp_path):
    recs = tmp_path / "records.jsonl"
    write_records(recs, records)
    not_adapter = tmp_path / "empty"
    not_adapter.mkdir()
    result = CliRunner().invoke(app, ["score", "--records", str(recs), "--out", str(tmp_path / "c.jsonl"),
                                      "-e", "verbal-letter", "--model", str(tiny_model_dir),
                                      "--adapter", str(not_adapter)])
    assert result.exit_code == 2 and "adapter_config.json" in result.output
