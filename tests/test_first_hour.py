"""What a newcomer trips on in the first hour: empty work, late checks, a silent Ctrl-C, small wrong messages.

Real components throughout: the CLI (in process, or as a process where a
signal or the imports are what is tested), the tiny model, real files.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import free_port, saved_elical_head, wait_healthy
from typer.testing import CliRunner

from candor.annotation.judges import get_correctness_judge
from candor.cli import app
from candor.data import load_items
from candor.util.errors import CandorError

SRC = str(Path(__file__).resolve().parents[1] / "src")
ENV = {**os.environ, "PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def qa_file(path: Path, n: int) -> Path:
    path.write_text(
        "".join(json.dumps({"question": f"What is {i} plus {i}?", "answer": [str(2 * i)]}) + "\n" for i in range(n))
    )
    return path


# ---------------------------------------------------------------- empty work is refused


def test_annotate_refuses_empty_work_before_the_model(tmp_path):
    out = tmp_path / "r.jsonl"
    for args, says in (
        (["--data", "starter", "--limit", "0"], "--limit 0 leaves no question to annotate"),
        (["--data", str(qa_file(tmp_path / "empty.jsonl", 0))], "no questions to annotate"),
        (["--data", "starter", "--k", "-1"], "cannot be negative"),
    ):
        result = CliRunner().invoke(app, ["annotate", *args, "--model", "no-such-model", "--out", str(out)])
        assert result.exit_code == 2 and says in result.output, (args, result.output)
        assert not out.exists()  # before: an empty records file, an empty table, exit 0


def test_score_refuses_an_empty_records_file(tmp_path):
    (tmp_path / "r.jsonl").write_text("")
    result = CliRunner().invoke(app, ["score", "-r", str(tmp_path / "r.jsonl"), "-o", str(tmp_path / "c.jsonl")])
    assert result.exit_code == 2 and "no records to score" in result.output, result.output
    assert not (tmp_path / "c.jsonl").exists()  # before: "wrote 0 methods × 0 records", exit 0


def test_annotate_with_k_0_says_n_a_for_the_sample_columns(tiny_model_dir, tmp_path):
    out = tmp_path / "r.jsonl"
    result = CliRunner().invoke(
        app,
        [
            "annotate",
            "--data",
            str(qa_file(tmp_path / "qa.jsonl", 2)),
            "--model",
            tiny_model_dir,
            "--k",
            "0",
            "--max-new-tokens",
            "2",
            "--out",
            str(out),
        ],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "│ toy" in line or "qa" in line and "│ 2" in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[-2:] == ["n/a", "n/a"], row  # before: "0.000", a sample accuracy nobody measured


# ---------------------------------------------------------------- checks before the model and the heavy imports


def run_cli_reporting_imports(args: list[str]) -> tuple[int, str, set[str]]:
    """Run the CLI in a fresh process; its exit code, stderr, and which heavy modules it had imported."""
    probe = (
        "import sys\nfrom candor.cli import run\ntry:\n    run(sys.argv[1:])\nexcept SystemExit as exit_:\n"
        "    heavy = [m for m in ('torch', 'transformers', 'sklearn') if m in sys.modules]\n"
        "    print(exit_.code, ','.join(heavy))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, *args], env=ENV, capture_output=True, text=True, timeout=300)
    code, _, heavy = done.stdout.strip().splitlines()[-1].partition(" ")
    return int(code), done.stderr, set(filter(None, heavy.split(",")))


def test_a_demo_typo_is_refused_before_the_pipeline_loads():
    code, err, heavy = run_cli_reporting_imports(["demo", "-e", "n-prob,verbal_letter"])
    assert code == 2 and "unknown estimator 'verbal_letter' (did you mean 'verbal-letter'" in err, err
    assert heavy == set()  # before: torch, transformers and the report's stack first (7.9 s)


def test_sweep_refuses_a_test_overlap_before_its_imports(tmp_path):
    from helpers import annotated_records

    from candor.annotation.records import write_records

    pool = annotated_records(20)
    write_records(tmp_path / "pool.jsonl", pool)
    write_records(tmp_path / "test.jsonl", pool[:3])
    code, err, heavy = run_cli_reporting_imports(
        ["sweep", "-r", str(tmp_path / "pool.jsonl"), "-t", str(tmp_path / "test.jsonl"), "-o", str(tmp_path / "sweep")]
    )
    assert code == 2 and "3 " in err and "pool.jsonl" in err, err
    assert heavy == set()  # before: the trainers and torch imported first (8.5 s)


# ---------------------------------------------------------------- Ctrl-C says what was saved and how to resume


def test_ctrl_c_during_annotate_says_what_was_saved_and_the_command_that_resumes(tiny_model_dir, tmp_path):
    out = tmp_path / "r.jsonl"
    args = [
        sys.executable,
        "-m",
        "candor.cli",
        "annotate",
        "--data",
        str(qa_file(tmp_path / "qa.jsonl", 5000)),
        "--model",
        tiny_model_dir,
        "--k",
        "1",
        "--batch-size",
        "2",
        "--max-new-tokens",
        "4",
        "--out",
        str(out),
    ]
    # A shell that runs the suite in the background ignores SIGINT, and its children inherit that:
    # the child gets the default back, as at an interactive terminal.
    proc = subprocess.Popen(
        args,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 240
    while not (out.exists() and out.read_text().count("\n") >= 1):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    saved = out.read_text().count("\n")
    assert f"interrupted: {saved} finished records are saved in {out}; resume with the same command:" in err, err
    assert f"candor annotate --data {tmp_path / 'qa.jsonl'}" in err and f"--out {out}" in err  # before: silent


# ---------------------------------------------------------------- small things a user sees


@pytest.mark.parametrize(
    ("response", "gold", "verdict"),
    [
        ("100.00", "100", 1),
        ("It was 1,000 people.", "1000", 1),
        ("3.50 m", "3.5", 1),
        ("-3.0 degrees", "-3", 1),
        ("15", "5", 0),
        ("100.5", "100", 0),
        ("v1.0", "1", 0),
        ("1000", "100", 0),
    ],
)
def test_contains_compares_numbers_as_numbers(response, gold, verdict):
    assert get_correctness_judge("contains").judge([response], [[gold]]) == [verdict]


def test_a_named_dataset_not_downloaded_says_how_to_get_it(tmp_path):
    with pytest.raises(CandorError, match=rf"get it with `candor datasets --download nq --data-dir {tmp_path}`"):
        load_items("nq", data_dir=tmp_path)


def test_export_says_head_once(tiny_model_dir, tmp_path):
    saved_elical_head(tiny_model_dir, tmp_path / "head")
    result = CliRunner().invoke(app, ["export", str(tmp_path / "head"), "--to", "seq-cls", str(tmp_path / "cls")])
    assert result.exit_code == 0, result.output
    assert "head head" not in result.output and "exported the EliCal head" in result.output


def test_serve_head_logs_a_line_per_request(tiny_model_dir, tmp_path):
    pytest.importorskip("fastapi")
    from candor.train.elical.export import export_seq_cls

    saved_elical_head(tiny_model_dir, tmp_path / "head")
    export_seq_cls(tmp_path / "head", tmp_path / "cls")
    port, log = free_port(), tmp_path / "serve-head.log"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "candor.cli", "serve-head", str(tmp_path / "cls"), "--port", str(port)],
            env=ENV,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", proc, log=log)
        body = json.dumps({"model": str(tmp_path / "cls"), "input": ["Question: 2+2?\nAnswer:"]}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/classify", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.status == 200
        deadline = time.monotonic() + 10
        while '"POST /classify HTTP/1.1" 200' not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()  # before: no request line at all
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_diagnose_page_warns_that_a_token_can_outweigh_the_change(tmp_path):
    from test_diagnose_page import committed_run

    from candor.diagnose.diagnosis_report import write_diagnosis_report

    doc, diagnoses, config = committed_run()
    html = write_diagnosis_report(diagnoses, tmp_path, config, doc["title"])["html"].read_text()
    assert 'id="ig-caveat"' in html and "can therefore be larger than the whole change" in html


def test_the_budget_curve_axis_reads_plain_budgets():
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from candor.train.elical.curve import label_budget_axis

    fig = Figure()
    ax = fig.subplots()
    ax.plot([20, 50, 100, 1000], [0.6, 0.65, 0.7, 0.72])
    label_budget_axis(ax, [20, 50, 100, 1000])
    FigureCanvasAgg(fig).draw()
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels == ["20", "50", "100", "1000"], labels  # before: "2×10¹"-style labels
    assert ax.get_xscale() == "log" and not [t.get_text() for t in ax.get_xticklabels(minor=True) if t.get_text()]


def test_a_worker_writes_its_shard_in_steps_a_progress_bar_can_show():
    from candor.annotation.builder import CALL_BATCHES, questions_per_call
    from candor.annotation.workers import PROGRESS_STEPS

    assert questions_per_call(100, 16) == 16 * CALL_BATCHES  # one process: unchanged
    per_call = questions_per_call(100, 16, PROGRESS_STEPS)  # a --workers 2 shard of 200 questions
    assert per_call == 16 and -(-100 // per_call) >= 7  # before: 64, so two writes: 0, then 64%, then done
    assert questions_per_call(5000, 16, PROGRESS_STEPS) == 16 * CALL_BATCHES  # large shards: full calls
    assert questions_per_call(3, 16, PROGRESS_STEPS) == 16  # never below one batch
