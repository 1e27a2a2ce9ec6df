"""The confidences file and incremental scoring into it (``candor score``), on hand-built records."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest
from conftest import build_tiny_model
from helpers import BlackBox
from typer.testing import CliRunner

import candor
from candor.annotation.contamination import Overlap, trained_folders, warn_contamination, write_manifest
from candor.annotation.records import Record, write_records
from candor.backends.base import Completion
from candor.cli import app
from candor.data.items import QAItem
from candor.estimators import score_records
from candor.estimators.confidences import (
    columns_path,
    read_confidences,
    score_into,
    table_from_records,
    write_confidences,
)
from candor.util.digests import records_digest
from candor.util.errors import CandorError
from candor.verbal.formats import distribution_from_prompts, format_prompt


def record(i: int, logprobs: list[float], consistency: list[int], correct: int) -> Record:
    item = QAItem(id=f"r:{i}", dataset="toy", split="test", question=f"question {i}", answers=("gold",))
    greedy = Completion("answer", token_ids=list(range(len(logprobs))), logprobs=logprobs)
    samples = [Completion("answer") for _ in consistency]
    provenance = {"model": "toy-model", "consistency_judge": "lexical"}
    return Record(
        item=item,
        greedy=greedy,
        samples=samples,
        greedy_correct=correct,
        sample_correct=[correct] * len(consistency),
        consistency=consistency,
        provenance=provenance,
    )


@pytest.fixture()
def records() -> list[Record]:
    return [
        record(0, [-1.0, -2.0, -3.0], [1, 1, 0, 0], 1),
        record(1, [-0.5], [1, 1, 1, 1], 0),
        record(2, [-0.1, -0.1], [0, 0, 0, 1], 1),
    ]


def test_score_into_writes_values_and_reuses_cached_columns(records, tmp_path, caplog):
    out = tmp_path / "conf.jsonl"
    table = score_into(records, ["n-prob", "consis-sem"], out)
    conf, correct = table.arrays("n-prob")
    assert conf == pytest.approx([math.exp(-2.0), math.exp(-0.5), math.exp(-0.1)])
    assert list(correct) == [1, 0, 1]
    assert table.arrays("consis-sem")[0] == pytest.approx([0.5, 1.0, 0.25])
    produced_by = read_confidences(out).provenance("n-prob")["produced_by"]
    assert produced_by["estimator"] == "n-prob" and len(produced_by["records"]) == 64

    # The same run again reuses the column; a new method is added after it.
    with caplog.at_level(logging.INFO, logger="candor.estimators.confidences"):
        again = score_into(records, ["n-prob", "prob"], out)
    assert "n-prob: reusing cached confidences" in caplog.text
    assert again.arrays("prob")[0] == pytest.approx([math.exp(-6.0), math.exp(-0.5), math.exp(-0.2)])
    assert read_confidences(out).methods == ["n-prob", "prob", "consis-sem"]  # the other column is kept
    # A hand-edited value is not vouched for by the provenance: recomputed.
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    rows[0]["confidence"]["n-prob"] = 0.123
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_confidences(out).provenance("n-prob") is None
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="candor.estimators.confidences"):
        assert score_into(records, ["n-prob"], out).arrays("n-prob")[0][0] == pytest.approx(math.exp(-2.0))
    assert "n-prob: recomputing (no recorded provenance)" in caplog.text
    # ... and force recomputes whatever is there.
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="candor.estimators.confidences"):
        forced = score_into(records, ["n-prob"], out, force=True)
    assert "n-prob: recomputing (--force)" in caplog.text
    assert forced.arrays("n-prob")[0][0] == pytest.approx(math.exp(-2.0))


def test_a_failing_method_loses_no_reusable_column(records, tmp_path):
    out = tmp_path / "conf.jsonl"
    score_into(records, ["n-prob"], out)
    # prob is scored and written, then verbal-letter fails (no model): n-prob, asked last, must still be there.
    with pytest.raises(CandorError, match="needs a model backend"):
        score_into(records, ["prob", "verbal-letter", "n-prob"], out)
    kept = read_confidences(out)
    assert kept.methods == ["prob", "n-prob"] and kept.provenance("n-prob") is not None


def test_a_column_present_for_only_some_records_is_not_reused(records, tmp_path, caplog):
    out = tmp_path / "conf.jsonl"
    score_into(records, ["n-prob"], out)
    # A table whose provenance is intact (re-signed) but whose column misses one record
    # and holds a sentinel elsewhere: reusing it would keep the sentinel.
    table = read_confidences(out)
    table.rows[0].confidence["n-prob"] = 0.123
    del table.rows[1].confidence["n-prob"]
    write_confidences(out, table)
    assert read_confidences(out).provenance("n-prob") is not None
    with caplog.at_level(logging.INFO, logger="candor.estimators.confidences"):
        again = score_into(records, ["n-prob"], out)
    assert "n-prob: recomputing (missing for 1 of 3 records)" in caplog.text
    assert again.arrays("n-prob")[0] == pytest.approx([math.exp(-2.0), math.exp(-0.5), math.exp(-0.1)])


def test_changed_options_or_records_recompute_and_say_what_changed(records, tmp_path, caplog):
    out = tmp_path / "conf.jsonl"
    stored = score_into(records, ["consis-sem"], out).arrays("consis-sem")[0]
    assert stored == pytest.approx([0.5, 1.0, 0.25])  # the annotation's verdicts
    with caplog.at_level(logging.INFO, logger="candor.estimators.confidences"):
        rejudged = score_into(
            records, ["consis-sem"], out, options={"consis-sem": {"judge": "lexical", "threshold": 0.9}}
        )
    assert "consis-sem: recomputing (changed: options)" in caplog.text
    # The lexical judge at another threshold judges "answer" vs "answer" anew: every verdict is 1.
    assert rejudged.arrays("consis-sem")[0] == pytest.approx([1.0, 1.0, 1.0])
    # Other records under the same ids: the records' content changed.
    edited = [record(0, [-3.0], [1, 1, 0, 0], 1), *records[1:]]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="candor.estimators.confidences"):
        table = score_into(
            edited, ["consis-sem", "n-prob"], out, options={"consis-sem": {"judge": "lexical", "threshold": 0.9}}
        )
    assert "consis-sem: recomputing (changed: records)" in caplog.text
    assert table.arrays("n-prob")[0][0] == pytest.approx(math.exp(-3.0))


def test_force_recomputes_the_requested_methods_and_keeps_the_files_other_columns(records, tmp_path, caplog):
    out = tmp_path / "conf.jsonl"
    score_into(records, ["n-prob", "consis-sem"], out)
    table = read_confidences(out)
    table.rows[0].confidence["n-prob"] = 0.123  # a value force must replace (re-signed, so it looks valid)
    write_confidences(out, table)
    with caplog.at_level(logging.INFO, logger="candor.estimators.confidences"):
        forced = score_into(records, ["n-prob"], out, force=True)
    assert "n-prob: recomputing (--force)" in caplog.text
    assert forced.arrays("n-prob")[0][0] == pytest.approx(math.exp(-2.0))
    kept = read_confidences(out)
    assert kept.methods == ["n-prob", "consis-sem"]
    assert kept.arrays("consis-sem")[0] == pytest.approx([0.5, 1.0, 0.25])


def test_a_column_made_by_another_candor_version_is_recomputed(records, tmp_path, caplog):
    out = tmp_path / "conf.jsonl"
    score_into(records, ["n-prob"], out)
    table = read_confidences(out)
    assert table.provenance("n-prob")["produced_by"]["candor_version"] == candor.__version__
    table.columns["n-prob"]["produced_by"]["candor_version"] = "0.0.1"
    write_confidences(out, table)
    with caplog.at_level(logging.INFO, logger="candor.estimators.confidences"):
        score_into(records, ["n-prob"], out)
    assert "n-prob: recomputing (changed: candor_version)" in caplog.text
    assert read_confidences(out).provenance("n-prob")["produced_by"]["candor_version"] == candor.__version__


def test_more_records_than_the_file_holds_recompute_the_column(records, tmp_path, caplog):
    out = tmp_path / "conf.jsonl"
    score_into(records[:2], ["n-prob"], out)
    with caplog.at_level(logging.INFO, logger="candor.estimators.confidences"):
        table = score_into(records, ["n-prob"], out)
    assert "n-prob: recomputing (missing for 1 of 3 records)" in caplog.text
    assert table.arrays("n-prob")[0] == pytest.approx([math.exp(-2.0), math.exp(-0.5), math.exp(-0.1)])


def test_other_columns_of_other_records_or_unknown_provenance_are_dropped(records, tmp_path, caplog):
    out = tmp_path / "conf.jsonl"
    score_into(records, ["n-prob", "consis-sem"], out)
    # The same ids holding other content: consis-sem, complete in every row, no longer describes them.
    edited = [record(0, [-3.0], [1, 1, 1, 1], 1), *records[1:]]
    with caplog.at_level(logging.INFO, logger="candor.estimators.confidences"):
        table = score_into(edited, ["n-prob"], out)
    assert "consis-sem: dropped from the file (not produced from these records" in caplog.text
    assert read_confidences(out).methods == table.methods == ["n-prob"]
    # A column with provenance but no produced_by (written by score_records, not score_into) is dropped too.
    bare = score_records(records, ["prob"], progress=False)
    assert "produced_by" not in bare.provenance("prob")
    write_confidences(out, bare)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="candor.estimators.confidences"):
        score_into(records, ["n-prob"], out)
    assert "prob: dropped from the file" in caplog.text
    assert read_confidences(out).methods == ["n-prob"]


def test_trained_folders_are_options_naming_a_manifest_folder_and_overlap_is_returned(records, tmp_path, monkeypatch):
    head = tmp_path / "head"
    write_manifest(head, ["Question 1!", "question 2", "not among the records"])
    write_manifest(tmp_path, ["question 0"])
    monkeypatch.chdir(tmp_path)  # an empty option value must not stand for the working folder and its manifest
    folders = trained_folders({"elical": {"head": str(head), "other": "", "judge": "lexical"}}, None)
    assert folders == {f"elical.head {head}": head}
    assert warn_contamination(records, folders) == {f"elical.head {head}": Overlap(2, 3, "question 1")}
    assert warn_contamination(records[:1], folders) == {}


def test_an_estimator_that_runs_the_model_only_with_some_options_keys_its_column_by_the_model(
    records, tiny_backend, tmp_path
):
    out = tmp_path / "conf.jsonl"
    options = {"consis-sem": {"judge": "llm"}}
    score_into(records, ["consis-sem", "n-prob"], out, tiny_backend, options=options, progress=False)
    table = read_confidences(out)
    llm_judged, plain = table.provenance("consis-sem")["produced_by"], table.provenance("n-prob")["produced_by"]
    assert (llm_judged["estimator"], llm_judged["model"]) == ("consis-sem", tiny_backend.model_name)
    assert llm_judged["weights"] is not None and llm_judged["records"] == records_digest(records)
    assert (plain["model"], plain["weights"], plain["records"]) == (None, None, records_digest(records))


def test_another_model_under_the_same_name_gets_its_own_column(records, tiny_backend, tokenizer, tmp_path, caplog):
    from candor.backends.hf import HFBackend

    out = tmp_path / "conf.jsonl"
    first = score_into(records, ["verbal-letter"], out, tiny_backend, progress=False).arrays("verbal-letter")[0]
    produced_by = read_confidences(out).provenance("verbal-letter")["produced_by"]
    assert (produced_by["estimator"], produced_by["model"]) == ("verbal-letter", tiny_backend.model_name)
    assert produced_by["records"] == records_digest(records)
    other = HFBackend(build_tiny_model(len(tokenizer), seed=3), tokenizer, model_name=tiny_backend.model_name)
    with caplog.at_level(logging.INFO, logger="candor.estimators.confidences"):
        second = score_into(records, ["verbal-letter"], out, other, progress=False).arrays("verbal-letter")[0]
    assert "verbal-letter: recomputing (changed: weights)" in caplog.text
    expected = score_into(records, ["verbal-letter"], tmp_path / "fresh.jsonl", other, progress=False)
    np.testing.assert_allclose(second, expected.arrays("verbal-letter")[0])
    assert not np.allclose(first, second)


def test_cli_score_with_an_adapter_does_not_reuse_the_base_models_column(records, tiny_model_dir, tmp_path, caplog):
    import torch
    from peft import LoraConfig, get_peft_model

    recs, conf, adapter = tmp_path / "records.jsonl", tmp_path / "conf.jsonl", tmp_path / "adapter"
    write_records(recs, records)
    peft_model = get_peft_model(build_tiny_model(49152), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():  # LoRA's B starts at zero; move it so the adapter changes the model
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    peft_model.save_pretrained(adapter)
    write_manifest(adapter, ["question 1", "an unrelated question"])
    base = ["score", "-r", str(recs), "-o", str(conf), "-e", "verbal-number", "--model", tiny_model_dir]
    runner = CliRunner()
    assert runner.invoke(app, base).exit_code == 0
    plain = read_confidences(conf).arrays("verbal-number")[0]
    with caplog.at_level(logging.INFO):
        result = runner.invoke(app, [*base, "--adapter", str(adapter)])
    assert result.exit_code == 0, result.output
    assert "verbal-number: recomputing (changed: adapter, weights)" in caplog.text
    # The adapter was trained on "question 1", one of the three records being scored.
    assert "contamination: 1 of 3 records being scored are among the training questions" in caplog.text
    assert "'question 1'" in caplog.text
    tuned = read_confidences(conf)
    assert not np.allclose(tuned.arrays("verbal-number")[0], plain)
    assert tuned.provenance("verbal-number")["produced_by"]["adapter"]["path"] == str(adapter)


def test_parse_fallbacks_are_stored_with_the_column(tiny_backend, tmp_path):
    items = [
        QAItem(id=f"q:{i}", dataset="toy", split="test", question=q, answers=("x",))
        for i, q in enumerate(["who wrote hamlet", "2+2?"])
    ]
    recs = [Record(item=item, greedy=Completion("Paris", token_ids=[1], logprobs=[-0.5]), samples=[]) for item in items]
    blind = BlackBox(tiny_backend)
    out = tmp_path / "conf.jsonl"
    score_into(recs, ["verbal-letter", "n-prob"], out, blind, progress=False)
    prompts = [format_prompt(blind, it, "Paris", "letter") for it in items]
    _, failures = distribution_from_prompts(blind, prompts, "letter")
    assert failures > 0  # the tiny random model states no letter
    table = read_confidences(out)
    assert table.parse_fallbacks("verbal-letter") == failures
    assert table.parse_fallbacks("n-prob") is None  # nothing parsed
    sidecar = json.loads(columns_path(out).read_text())
    assert sidecar["columns"]["verbal-letter"]["parse_fallbacks"] == failures


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
    for bad, why in (
        ("consis-sem.judge", "NAME.KEY=VALUE"),
        ("judge=lexical", "NAME.KEY=VALUE"),
        ("n-prob.x=1", "not among --estimators"),
    ):
        result = runner.invoke(app, [*base, "-O", bad])
        assert result.exit_code == 2 and why in result.output, (bad, result.output)


def test_cli_score_adapter_must_be_a_peft_folder(records, tiny_model_dir, tmp_path):
    recs = tmp_path / "records.jsonl"
    write_records(recs, records)
    not_adapter = tmp_path / "empty"
    not_adapter.mkdir()
    result = CliRunner().invoke(
        app,
        [
            "score",
            "--records",
            str(recs),
            "--out",
            str(tmp_path / "c.jsonl"),
            "-e",
            "verbal-letter",
            "--model",
            str(tiny_model_dir),
            "--adapter",
            str(not_adapter),
        ],
    )
    assert result.exit_code == 2 and "adapter_config.json" in result.output


# ------------------------------------------------------------ the confidences file itself


def test_confidences_rows_round_trip_with_dataset_labels_and_a_sidecar_name(records, tmp_path):
    table = table_from_records(records)
    table.add("n-prob", [r.id for r in records], [0.25, 0.5, 0.75])
    out = tmp_path / "conf.jsonl"
    write_confidences(out, table)
    first = json.loads(out.read_text().splitlines()[0])
    assert first == {"id": "r:0", "dataset": "toy", "correct": 1, "confidence": {"n-prob": 0.25}}
    assert columns_path(out) == tmp_path / "conf.jsonl.columns.json"
    back = read_confidences(out)
    assert [(r.id, r.dataset, r.correct, r.confidence) for r in back.rows] == [
        ("r:0", "toy", 1, {"n-prob": 0.25}),
        ("r:1", "toy", 0, {"n-prob": 0.5}),
        ("r:2", "toy", 1, {"n-prob": 0.75}),
    ]
    with pytest.raises(ValueError):
        table.add("n-prob", ["r:0"], [0.1, 0.2])  # one value per id, never silently fewer


def test_confidences_arrays_name_missing_values_and_labels(tmp_path):
    out = tmp_path / "conf.jsonl"
    out.write_text(
        '{"id": "a", "correct": true, "confidence": {"m": 0.5}}\n'  # no dataset: ""
        '{"id": "b", "dataset": "x", "correct": null, "confidence": {"m": 0.25, "k": 1}}\n'
    )
    table = read_confidences(out)
    assert [r.dataset for r in table.rows] == ["", "x"]
    with pytest.raises(CandorError, match="^method 'k' has no confidence for 1 rows, e.g. a$"):
        table.arrays("k")
    with pytest.raises(CandorError, match="^1 rows have no correctness label, e.g. b$"):
        table.arrays("m")
    conf, correct = table.arrays("m", dataset="")
    assert conf.tolist() == [0.5] and correct.tolist() == [1] and correct.dtype.kind == "i"
    out.write_text('{"id": "a", "confidence": {"m": 0.5}}\n{"id": "b"}\n')
    with pytest.raises(CandorError, match=r"conf.jsonl:2: not a confidences row"):
        read_confidences(out)


def test_score_refuses_a_file_about_other_records_unless_forced(records, tmp_path):
    # Test records scored first; then dev records (no id in common) into the same file would erase them.
    test_recs, dev_recs = tmp_path / "test.jsonl", tmp_path / "dev.jsonl"
    write_records(test_recs, records)
    dev = [
        Record(
            item=QAItem(id=f"dev:{r.id}", dataset="toy", split="dev", question=r.item.question, answers=r.item.answers),
            greedy=r.greedy,
            samples=r.samples,
            greedy_correct=r.greedy_correct,
            sample_correct=r.sample_correct,
            consistency=r.consistency,
            provenance=r.provenance,
        )
        for r in records
    ]
    write_records(dev_recs, dev)
    out = tmp_path / "conf.jsonl"
    runner = CliRunner()
    first = runner.invoke(app, ["score", "-r", str(test_recs), "-o", str(out), "-e", "n-prob,consis-sem"])
    assert first.exit_code == 0, first.output
    before = out.read_bytes()
    lost = runner.invoke(app, ["score", "-r", str(dev_recs), "-o", str(out), "-e", "prob"])
    assert lost.exit_code == 2, lost.output
    assert str(out) in lost.output.replace("\n", "") and "n-prob, consis-sem" in lost.output
    assert "Traceback" not in lost.output and out.read_bytes() == before  # nothing written
    with pytest.raises(CandorError, match="no id in common"):
        score_into(dev, ["prob"], out)
    forced = runner.invoke(app, ["score", "-r", str(dev_recs), "-o", str(out), "-e", "prob", "--force"])
    assert forced.exit_code == 0, forced.output
    assert f"wrote 1 method × 3 records to {out}" in forced.output.replace("\n", "")  # not "1 methods"
    assert read_confidences(out).methods == ["prob"] and read_confidences(out).rows[0].id == "dev:r:0"
