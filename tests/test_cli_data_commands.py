"""The `datasets` and `demo` commands, run through the CLI as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from candor.annotation.records import read_records
from candor.cli import app


def lines_by_name(output: str) -> dict[str, str]:
    return {line.split(" ", 1)[0]: line for line in output.splitlines() if line.strip()}


def test_cli_datasets_lists_every_name_and_where_it_resolves(tmp_path):
    (tmp_path / "nq").mkdir()
    (tmp_path / "nq" / "test.jsonl").write_text(json.dumps({"question": "q", "answer": ["a"]}) + "\n")
    result = CliRunner().invoke(app, ["datasets", "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    listed = lines_by_name(result.output)
    assert {"nq", "hq", "squad", "musique", "pararel", "logiqa", "starter"} <= set(listed)
    assert listed["nq"].endswith(str(tmp_path / "nq" / "test.jsonl"))
    assert "[in-domain]" in listed["nq"]
    assert "not in the data dir; get it with `candor datasets --download squad --data-dir" in listed["squad"]
    assert "[ood]" in listed["squad"]
    assert listed["starter"].endswith("starter.jsonl") and "[demo]" in listed["starter"]
    assert "(also: hotpotqa)" in listed["hq"]


def test_cli_datasets_on_the_real_data(shared_data):
    result = CliRunner().invoke(app, ["datasets", "--data-dir", str(shared_data / "honestybench")])
    assert result.exit_code == 0, result.output
    listed = lines_by_name(result.output)
    assert "get it with" not in listed["nq"] and listed["nq"].endswith("nq/test.jsonl")
    assert listed["logiqa"].endswith("logiqa2/test.jsonl")


def test_cli_datasets_missing_data_dir_says_so_per_name(tmp_path):
    result = CliRunner().invoke(app, ["datasets", "--data-dir", str(tmp_path / "absent")])
    assert result.exit_code == 0  # listing is how a user finds out what is missing
    listed = lines_by_name(result.output)
    # the missing data dir is said once, on its own line; each dataset's line says how to get it
    assert result.output.count("data dir not found") == 1 and "data dir not found" in listed["data"]
    absent = tmp_path / "absent"
    assert listed["nq"].endswith(f"not downloaded; get it with `candor datasets --download nq --data-dir {absent}`")
    assert "get it with" not in listed["starter"]


def test_cli_demo_on_the_tiny_model(tiny_model_dir, tmp_path):
    out = tmp_path / "demo"
    args = [
        "demo",
        "--out-dir",
        str(out),
        "--model",
        str(tiny_model_dir),
        "--limit",
        "4",
        "--k",
        "2",
        "--estimators",
        "n-prob,consis-lex",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    (report,) = [line.removeprefix("report: ") for line in result.output.splitlines() if line.startswith("report: ")]
    assert Path(report).is_file() and Path(report).parent == out / "report"
    records = read_records(out / "records.jsonl")
    assert [r.id for r in records] == ["starter:001", "starter:002", "starter:003", "starter:004"]
    assert {r.k for r in records} == {2}
    rows = [json.loads(line) for line in (out / "confidences.jsonl").read_text().splitlines()]
    assert [row["id"] for row in rows] == [r.id for r in records]
    # Issue 23, defect 11: the demo leaves a tuned honest model that `candor serve --honest` loads.
    from candor.serve import HonestModel

    honest = HonestModel.from_pretrained(out / "honest", device="cpu")
    assert honest.threshold is not None and honest.threshold.rule == "coverage" and honest.threshold.n_dev == 4
    assert honest.template.name == "chat" and honest.method == "n-prob"
    assert f"candor serve --honest {out / 'honest'}" in result.output


def test_cli_demo_tunes_for_the_system_prompt_file(tiny_model_dir, tmp_path):
    """Issue 54 part 4: every starter question asked after the system prompt, the threshold tuned for it."""
    from candor.serve import HonestModel
    from candor.serve.shapes import system_shape

    system = "You are a concise assistant.\nAnswer in a few words."
    (tmp_path / "system.txt").write_text(system + "\n", encoding="utf-8")
    out = tmp_path / "demo"
    args = ["demo", "--out-dir", str(out), "--model", str(tiny_model_dir), "--limit", "4", "--k", "2", "-e", "n-prob"]
    result = CliRunner().invoke(app, [*args, "--system-prompt-file", str(tmp_path / "system.txt")])
    assert result.exit_code == 0, result.output
    shape = system_shape(system)
    records = read_records(out / f"records-system-{shape.removeprefix('system:')}.jsonl")
    assert len(records) == 4 and {r.item.history for r in records} == {(("system", system),)}
    assert not (out / "records.jsonl").exists()
    honest = HonestModel.from_pretrained(out / "honest", device="cpu")
    assert honest.tuned_on == (shape,) and honest.system_prompts == {shape: system}
    prompted = honest.prepare(records[0].item.question, history=records[0].item.history)
    assert system in prompted.prompt and prompted.shape == shape  # rendered as the server renders the request


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--estimators", "n-prob,nosuch"], "unknown estimator 'nosuch'"),
        (["--limit", "-1"], "limit must be >= 0"),
        (["--system-prompt-file", "no-such-prompt.txt"], "--system-prompt-file no-such-prompt.txt: cannot read it"),
    ],
)
def test_cli_demo_bad_options_exit_2_with_one_line(tmp_path, extra, needle):
    result = CliRunner().invoke(app, ["demo", "--out-dir", str(tmp_path / "d"), *extra])
    assert result.exit_code == 2
    assert result.output.strip() == result.output.strip().splitlines()[-1]
    assert needle in result.output and "Traceback" not in result.output
