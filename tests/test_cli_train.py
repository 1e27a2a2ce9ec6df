"""`candor train`, `candor sweep` and scoring with a trained head, end to end on the tiny model."""

from __future__ import annotations

import json

import pytest
from helpers import annotated_records
from typer.testing import CliRunner

from candor.annotation.contamination import fingerprints, read_manifest
from candor.annotation.records import write_records
from candor.cli import app
from candor.estimators.confidences import read_confidences
from candor.train.elical import Budget, EliCalConfig, carve_dev
from candor.train.settings import build_config, parse_settings
from candor.train.trainers import TRAINERS
from candor.util.errors import CandorError


def test_settings_are_converted_to_the_config_field_types():
    config = build_config(
        EliCalConfig,
        parse_settings(
            [
                "mode=lora",
                "learning_rate=1e-4",
                "max_epochs=3",
                "recenter_bias=false",
                "lora_targets=q_proj,v_proj",
                "dtype=none",
            ]
        ),
        model="m",
        seed=7,
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
    assert {"elical", "eli-only", "cal-only", "advice", "conftuner", "advice+conftuner"} <= set(TRAINERS.names())


def test_train_then_score_with_the_head_then_sweep(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("CANDOR_CACHE", str(tmp_path / "cache"))
    pool, test = tmp_path / "pool.jsonl", tmp_path / "test.jsonl"
    write_records(pool, annotated_records(40))
    write_records(test, annotated_records(12, start=100, dataset="a") + annotated_records(12, start=200, dataset="b"))
    runner = CliRunner()
    head = tmp_path / "head"
    result = runner.invoke(
        app,
        [
            "train",
            "cal-only",
            "-r",
            str(pool),
            "-o",
            str(head),
            "--model",
            tiny_model_dir,
            "-s",
            "budget=20",
            "-s",
            "max_epochs=2",
        ],
    )
    assert result.exit_code == 0, result.output
    training = json.loads((head / "training.json").read_text())
    assert training["budget"] == 20 and (head / "head.safetensors").exists()
    # The manifest: the 20 budget questions and the 4 carved dev questions (early stopping chose on them).
    rest, carved = carve_dev(annotated_records(40), seed=0)
    drawn = Budget(20).draw(rest, seed=0)
    assert read_manifest(head) == fingerprints(r.item.question for r in drawn + carved)
    assert len(read_manifest(head)) == 24
    assert any((tmp_path / "cache" / "features").rglob("*")), "head-mode features are cached under $CANDOR_CACHE"

    conf = tmp_path / "conf.jsonl"
    result = runner.invoke(
        app, ["score", "-r", str(test), "-o", str(conf), "-e", "elical,consis-sem", "-O", f"elical.head={head}"]
    )
    assert result.exit_code == 0, result.output
    values = read_confidences(conf).arrays("elical")[0]
    assert len(values) == 24 and ((values > 0) & (values < 1)).all() and len(set(values.round(6))) > 1

    too_big = runner.invoke(
        app,
        [
            "train",
            "cal-only",
            "-r",
            str(pool),
            "-o",
            str(tmp_path / "x"),
            "--model",
            tiny_model_dir,
            "-s",
            "budget=1000",
        ],
    )
    assert too_big.exit_code == 2 and "1000" in too_big.output

    curve = tmp_path / "sweep"
    result = runner.invoke(
        app,
        [
            "sweep",
            "-r",
            str(pool),
            "-t",
            str(test),
            "-o",
            str(curve),
            "--model",
            tiny_model_dir,
            "--budgets",
            "10,all",
            "--seeds",
            "0",
            "--ood",
            "b",
            "--bootstrap",
            "0",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((curve / "curve.json").read_text())
    assert {"Cal-Only@10", "EliCal@all", "Eli-Only"} <= set(summary["methods"])
    assert (curve / "budget_curve.png").stat().st_size > 0
    assert "OOD AUROC" in result.output
    bad_ood = runner.invoke(
        app, ["sweep", "-r", str(pool), "-t", str(test), "-o", str(curve), "--model", tiny_model_dir, "--ood", "nope"]
    )
    assert bad_ood.exit_code == 2 and "nope" in bad_ood.output


def test_cli_diagnose_writes_the_report(tiny_model_dir, tmp_path):
    recs = tmp_path / "records.jsonl"
    write_records(recs, annotated_records(4, dataset="a") + annotated_records(4, start=10, dataset="b"))
    out = tmp_path / "diag"
    result = CliRunner().invoke(
        app,
        [
            "diagnose",
            "-r",
            str(recs),
            "-o",
            str(out),
            "--model",
            tiny_model_dir,
            "--stages",
            "sensitivity,masking",
            "--candidates",
            "5",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "share_jsd_le_0.1" in result.output
    summary = json.loads((out / "diagnose.json").read_text())
    assert "base" in json.dumps(summary) and (out / "diagnose.md").exists() and (out / "masking.png").exists()
    bad = CliRunner().invoke(
        app, ["diagnose", "-r", str(recs), "-o", str(out), "--model", tiny_model_dir, "--stages", "vibes"]
    )
    assert bad.exit_code == 2 and "vibes" in bad.output


def verbal_records(n: int) -> list:
    """Records whose correct greedy answers each have a different, wrong sample (what ADVICE pairs)."""
    from candor.annotation.records import Record
    from candor.backends.base import Completion
    from candor.data.items import QAItem

    out = []
    for i in range(n):
        item = QAItem(
            id=f"v:{i}", dataset="toy", split="train", question=f"Which colour is item {i}?", answers=("red",)
        )
        greedy = "red" if i % 2 == 0 else "blue"
        correct = int(greedy == "red")
        samples = [Completion(greedy, logprobs=[-0.2]), Completion("green", logprobs=[-1.0])]
        out.append(
            Record(
                item=item,
                greedy=Completion(greedy, logprobs=[-0.1]),
                samples=samples,
                greedy_correct=correct,
                sample_correct=[correct, 0],
                consistency=[1, 0],
            )
        )
    return out


def test_cli_train_advice_with_an_ablation_setting_gives_a_loadable_adapter(tiny_model_dir, tmp_path):
    pool = tmp_path / "pool.jsonl"
    write_records(pool, verbal_records(8))
    out = tmp_path / "advice"
    result = CliRunner().invoke(
        app,
        [
            "train",
            "advice",
            "-r",
            str(pool),
            "-o",
            str(out),
            "--model",
            tiny_model_dir,
            "-s",
            "epochs=1",
            "-s",
            "batch_size=2",
            "-s",
            "gradient_accumulation=1",
            "-s",
            "extra_samples=0",
            "-s",
            "weights.sum=0",
            "-s",
            "formats=number",
        ],
    )
    assert result.exit_code == 0, result.output
    # Only the 4 questions with a correct greedy answer gave ADVICE pairs; they alone are in the manifest.
    assert read_manifest(out) == fingerprints(f"Which colour is item {i}?" for i in (0, 2, 4, 6))
    saved = json.loads((out / "training.json").read_text())
    assert saved["config"]["weights"]["sum"] == 0.0 and saved["config"]["weights"]["jsd"] == 1.0
    assert saved["config"]["formats"] == ["number"] and saved["n_train"] == 4
    conf = tmp_path / "conf.jsonl"
    scored = CliRunner().invoke(
        app,
        [
            "score",
            "-r",
            str(pool),
            "-o",
            str(conf),
            "-e",
            "verbal-letter",
            "--model",
            tiny_model_dir,
            "--adapter",
            str(out),
        ],
    )
    assert scored.exit_code == 0, scored.output
    assert len(read_confidences(conf).arrays("verbal-letter")[0]) == 8
    bad = CliRunner().invoke(
        app,
        [
            "train",
            "conftuner",
            "-r",
            str(pool),
            "-o",
            str(tmp_path / "c"),
            "--model",
            tiny_model_dir,
            "-s",
            "weights.vibes=1",
        ],
    )
    assert bad.exit_code == 2 and "vibes" in bad.output


def one_error_line(result) -> str:
    """The CLI's message for a user mistake: exit 2, one line, no traceback."""
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


@pytest.fixture()
def leaky_files(tmp_path):
    """A pool of 40 records, and test files of which three questions are pool questions (one respelled)."""
    pool, test = tmp_path / "pool.jsonl", tmp_path / "test.jsonl"
    write_records(pool, annotated_records(40))
    write_records(test, annotated_records(2, start=38) + annotated_records(5, start=100))
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"question": "what is FACT number 7 about toy", "answer": ["x"]}) + "\n")
    return pool, test, qa


@pytest.mark.parametrize("method", ["elical", "eli-only", "cal-only", "advice", "conftuner", "advice+conftuner"])
def test_every_trainer_refuses_a_pool_that_overlaps_its_test_files(leaky_files, tmp_path, method):
    pool, test, qa = leaky_files
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app,
        [
            "train",
            method,
            "-r",
            str(pool),
            "-o",
            str(out),
            "--model",
            "no-such-model",
            "--test",
            str(test),
            "--test",
            str(qa),
        ],
    )
    line = one_error_line(result)
    assert f"{pool}: 3 of 40 questions are also in the test files" in line
    assert "e.g. 'What is fact number 7 about toy?'" in line and str(qa) in line
    assert not out.exists(), "nothing is trained or written"


def test_a_dev_file_that_overlaps_the_test_files_is_refused(leaky_files, tmp_path):
    pool, test, _ = leaky_files
    clean, dev = tmp_path / "clean.jsonl", tmp_path / "dev.jsonl"
    write_records(clean, annotated_records(30))
    write_records(dev, annotated_records(5, start=98))  # 100, 101, 102 are test questions
    result = CliRunner().invoke(
        app, ["train", "cal-only", "-r", str(clean), "--dev", str(dev), "-o", str(tmp_path / "o"), "-t", str(test)]
    )
    assert f"{dev}: 3 of 5 questions are also in the test files" in one_error_line(result)


def test_the_sweep_refuses_a_pool_that_overlaps_its_test_files(leaky_files, tmp_path):
    pool, test, _ = leaky_files
    other = tmp_path / "other.jsonl"
    write_records(other, annotated_records(4, start=300, dataset="b"))
    result = CliRunner().invoke(
        app,
        [
            "sweep",
            "-r",
            str(pool),
            "-t",
            str(other),
            "-t",
            str(test),
            "-o",
            str(tmp_path / "s"),
            "--model",
            "no-such-model",
        ],
    )
    line = one_error_line(result)
    assert f"{pool}: 2 of 40 questions are also in the test files ({other}, {test})" in line
    assert "e.g. 'What is fact number 38 about toy?'" in line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seeds", "x"], "--seeds: 'x' is not an integer"),
        (["--seeds", ","], "--seeds ',': expected a comma-separated list"),
        (["--budgets", "0"], "a label budget must be at least 1, got 0"),
        (["--budgets", "ten"], "a label budget is a positive number or 'all', got 'ten'"),
        (["--bootstrap", "-1", "--seeds", "0", "--budgets", "5"], "bootstrap resamples must be at least 0"),
        (["--mode", "vibes"], "unknown EliCal mode 'vibes'"),
    ],
)
def test_bad_sweep_input_is_one_line_and_exit_2(leaky_files, tmp_path, args, message):
    _, test, _ = leaky_files
    clean = tmp_path / "clean.jsonl"
    write_records(clean, annotated_records(30))
    result = CliRunner().invoke(
        app, ["sweep", "-r", str(clean), "-t", str(test), "-o", str(tmp_path / "s"), "--model", "no-such-model", *args]
    )
    assert message in one_error_line(result)


@pytest.mark.parametrize(
    ("method", "setting", "message"),
    [
        ("cal-only", "no_such=1", "unknown setting 'no_such' for EliCalConfig"),
        ("cal-only", "budget=x", "a label budget is a positive number or 'all', got 'x'"),
        ("cal-only", "budget=0", "a label budget must be at least 1"),
        ("cal-only", "batch_size=0", "batch_size=0 must be at least 1"),
        ("elical", "learning_rate=-1", "learning_rate=-1.0 must be a positive number"),
        ("eli-only", "max_epochs=-2", "max_epochs=-2 must be at least 1"),
        ("cal-only", "warmup_ratio=2", "warmup_ratio=2.0 must be in [0, 1)"),
        ("advice", "no_such=1", "unknown setting 'no_such' for AdviceConfig"),
        ("advice", "epochs=-1", "epochs=-1.0 must be a positive number"),
        ("conftuner", "lora_r=0", "lora_r=0 must be at least 1"),
        ("conftuner", "learning_rate=fast", "setting learning_rate='fast': expected float"),
        ("advice+conftuner", "weights.brier=x", "setting weights.brier='x': expected float"),
        ("advice", "weights.vibes=1", "unknown setting 'weights.vibes'"),
        ("conftuner", "method=advice", "not by a 'method' setting"),
    ],
)
def test_bad_train_settings_are_one_line_and_exit_2_before_any_model_loads(tmp_path, method, setting, message):
    pool = tmp_path / "pool.jsonl"
    write_records(pool, annotated_records(30))
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app, ["train", method, "-r", str(pool), "-o", str(out), "--model", "no-such-model", "-s", setting]
    )
    assert message in one_error_line(result)
    assert not out.exists()


def test_each_verbal_method_has_its_own_config_class():
    from candor.train.advice import AdviceConfig, ConfTunerConfig, method_config

    assert type(method_config("advice")) is AdviceConfig and type(method_config("conftuner")) is ConfTunerConfig
    both = method_config("advice+conftuner")
    assert type(both) is AdviceConfig and both.method == "advice+conftuner" and both.weights.brier == 1.0
    with pytest.raises(CandorError, match="not by a 'method' setting"):
        method_config("conftuner", method="advice")


def test_train_elical_prints_the_held_out_domain_auroc_of_a_multi_dataset_pool(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("CANDOR_CACHE", str(tmp_path / "cache"))
    pool, single = tmp_path / "pool.jsonl", tmp_path / "single.jsonl"
    write_records(pool, annotated_records(24, 0, "a") + annotated_records(24, 100, "b"))
    write_records(single, annotated_records(24, 0, "a"))
    runner = CliRunner()
    args = ["--model", tiny_model_dir, "-s", "max_epochs=2", "-s", "budget=10"]
    result = runner.invoke(app, ["train", "elical", "-r", str(pool), "-o", str(tmp_path / "h"), *args])
    assert result.exit_code == 0, result.output
    assert "held-out-domain AUROC" in result.output and "a " in result.output and "mean" in result.output
    assert "stage 2: target universal (no held-out domain loses AUROC" in result.output  # the default target
    assert "→ rule L2-SP 1" in result.output and "overridden" not in result.output
    report = json.loads((tmp_path / "h" / "training.json").read_text())["held_out_domains"]
    # each dataset scored on all its records (pool and carved dev), none of which its fold trained on
    assert {d: v["n"] for d, v in report["domains"].items()} == {"a": 24, "b": 24}
    assert all(0.0 <= v["auroc"] <= 1.0 for v in report["domains"].values())
    one = runner.invoke(
        app, ["train", "elical", "-r", str(single), "-o", str(tmp_path / "s"), *args, "-s", "target=in-domain"]
    )
    assert one.exit_code == 0, one.output
    assert "stage 2: target in-domain (the best mean held-out AUROC" in one.output and "→ rule L2-SP 0.1" in one.output
    saved = json.loads((tmp_path / "s" / "training.json").read_text())["config"]
    assert (saved["target"], saved["cal_anchor"]) == ("in-domain", 0.1)
    assert "held-out-domain" not in one.output
    assert "held_out_domains" not in json.loads((tmp_path / "s" / "training.json").read_text())


def test_sweep_select_chooses_a_rule_on_held_out_domains_and_reads_no_test(tiny_model_dir, tmp_path):
    pool, extra = tmp_path / "pool.jsonl", tmp_path / "extra.jsonl"
    write_records(pool, annotated_records(24, 0, "a") + annotated_records(24, 100, "b"))
    write_records(extra, annotated_records(9, 500, "a") + annotated_records(9, 600, "b"))
    runner = CliRunner()
    base = [
        "sweep",
        "--select",
        "-r",
        str(pool),
        "--held-out-dev",
        str(extra),
        "-o",
        str(tmp_path / "sel"),
        "--model",
        tiny_model_dir,
        "--budgets",
        "all",
        "--seeds",
        "0",
    ]
    result = runner.invoke(app, [*base, "--rules", "loss-stop,bias-scale"])
    assert result.exit_code == 0, result.output
    chosen = json.loads((tmp_path / "sel" / "selection.json").read_text())
    assert set(chosen["candidates"]) == {"loss-stop", "bias-scale"}
    picks = chosen["selected_by_target"]
    assert f"target universal: {picks['universal']}" in result.output and "held out a:" in result.output
    assert f"target in-domain: {picks['in-domain']}" in result.output and "per held-out domain" in result.output
    with_test = runner.invoke(app, [*base, "-t", str(extra)])
    assert with_test.exit_code == 2 and "no --test" in with_test.output
    bad_rule = runner.invoke(app, [*base, "--rules", "nope"])
    assert bad_rule.exit_code == 2 and "unknown stage-2 rules" in bad_rule.output
    stray = runner.invoke(app, ["sweep", "-r", str(pool), "-o", str(tmp_path / "x"), "--rules", "loss-stop"])
    assert stray.exit_code == 2 and "belong to --select" in stray.output
