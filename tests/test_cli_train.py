"""`candor train`, `candor sweep` and scoring with a trained head, end to end on the tiny model."""

from __future__ import annotations

import json

import pytest
from helpers import annotated_records
from typer.testing import CliRunner

from candor.cli import app
from candor.confidences import read_confidences
from candor.elical import EliCalConfig
from candor.errors import CandorError
from candor.records import write_records
from candor.trainers import TRAINERS, build_config, parse_settings


@pytest.fixture(scope="module")
def tiny_dir(tiny_model, tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny-llama")
    tiny_model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_settings_are_converted_to_the_config_field_types():
    config = build_config(
        EliCalConfig,
        parse_settings(["mode=lora", "learning_rate=1e-4", "max_epochs=3", "recenter_bias=false",
                        "lora_targets=q_proj,v_proj", "dtype=none"]),
        model="m", seed=7,
    )
    assert (config.mode, config.learning_rate, config.max_epochs, config.recenter_bias) == ("lora", 1e-4, 3, False)
    assert config.lora_targets == ("q_proj", "v_proj") and config.dtype is None and config.seed == 7


@pytest.mark.parametrize(
    ("pairs", "message"),
    [
        (["learning_rate"], "KEY=VALUE"),
        (["no_such=1"], "unknown setting 'no_such'"),
        (["max_epochs=three"], "max_epochs='three'"),
        (["recenter_bias=maybe"], "recenter_bias='maybe'"),
        (["seed=3"], "--seed"),
    ],
)
def test_bad_settings_are_named(pairs, message):
    with pytest.raises(CandorError, match=message):
        build_config(EliCalConfig, parse_settings(pairs), model="m", seed=0)


def test_every_documented_method_is_registered():
    assert {"elical", "eli-only", "cal-only"} <= set(TRAINERS.names())


def test_train_then_score_with_the_head_then_sweep(tiny_dir, tmp_path):
    pool, test = tmp_path / "pool.jsonl", tmp_path / "test.jsonl"
    write_records(pool, annotated_records(40))
    write_records(test, annotated_records(12, start=100, dataset="a") + annotated_records(12, start=200, dataset="b"))
    runner = CliRunner()
    head = tmp_path / "head"
    result = runner.invoke(app, ["train", "cal-only", "-r", str(pool), "-o", str(head), "--model", tiny_dir,
                                 "-s", "budget=20", "-s", "max_epochs=2"])
    assert result.exit_code == 0, result.output
    training = json.loads((head / "training.json").read_text())
    assert training["budget"] == 20 and (head / "head.safetensors").exists()

    conf = tmp_path / "conf.jsonl"
    result = runner.invoke(app, ["score", "-r", str(test), "-o", str(conf), "-e", "elical,consis-sem",
                                 "-O", f"elical.head={head}"])
    assert result.exit_code == 0, result.output
    values = read_confidences(conf).arrays("elical")[0]
    assert len(values) == 24 and ((values > 0) & (values < 1)).all() and len(set(values.round(6))) > 1

    too_big = runner.invoke(app, ["train", "cal-only", "-r", str(pool), "-o", str(tmp_path / "x"),
                                  "--model", tiny_dir, "-s", "budget=1000"])
    assert too_big.exit_code == 2 and "1000" in too_big.output

    curve = tmp_path / "sweep"
    result = runner.invoke(app, ["sweep", "-r", str(pool), "-t", str(test), "-o", str(curve), "--model", tiny_dir,
                                 "--budgets", "10,all", "--seeds", "0", "--ood", "b", "--bootstrap", "0"])
    assert result.exit_code == 0, result.output
    summary = json.loads((curve / "curve.json").read_text())
    assert {"Cal-Only@10", "EliCal@all", "Eli-Only"} <= set(summary["methods"])
    assert (curve / "budget_curve.png").stat().st_size > 0
    assert "OOD AUROC" in result.output
    bad_ood = runner.invoke(app, ["sweep", "-r", str(pool), "-t", str(test), "-o", str(curve), "--model", tiny_dir,
                                  "--ood", "nope"])
    assert bad_ood.exit_code == 2 and "nope" in bad_ood.output


def test_cli_diagnose_writes_the_report(tiny_dir, tmp_path):
    recs = tmp_path / "records.jsonl"
    write_records(recs, annotated_records(4, dataset="a") + annotated_records(4, start=10, dataset="b"))
    out = tmp_path / "diag"
    result = CliRunner().invoke(app, ["diagnose", "-r", str(recs), "-o", str(out), "--model", tiny_dir,
                                      "--stages", "sensitivity,masking", "--candidates", "5"])
    assert result.exit_code == 0, result.output
    assert "share_jsd_le_0.1" in result.output
    summary = json.loads((out / "diagnose.json").read_text())
    assert "base" in json.dumps(summary) and (out / "diagnose.md").exists() and (out / "masking.png").exists()
    bad = CliRunner().invoke(app, ["diagnose", "-r", str(recs), "-o", str(out), "--model", tiny_dir,
                                   "--stages", "vibes"])
    assert bad.exit_code == 2 and "vibes" in bad.output
