"""``annotate --workers``: real worker processes on the tiny model, against a single run; refusals; kill and resume."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch
from test_annotate import QUESTIONS, assert_same_records, config, make_items, write_jsonl
from typer.testing import CliRunner

from candor.annotation.builder import Shard, annotate
from candor.annotation.records import read_records
from candor.annotation.workers import (
    BackendRecipe,
    RecordCount,
    annotate_with_workers,
    available_cores,
    check_cpu_backend,
    check_workers,
    part_path,
    parts_folder,
    refuse_gpu,
    threads_per_worker,
)
from candor.cli import app
from candor.data.items import QAItems
from candor.util.errors import CandorError


def recipe_for(model_dir: str) -> BackendRecipe:
    return BackendRecipe(model=model_dir, backend="hf", options={"batch_size": 3, "seed": 1}, template="fewshot")


def test_two_workers_write_what_one_process_writes(tiny_model_dir, tmp_path):
    items = QAItems(make_items())
    items.skipped = 2  # rows the loader dropped: the records' provenance says so, from every worker
    single = tmp_path / "single.jsonl"
    answering, _, template = recipe_for(tiny_model_dir).load()
    annotate(items, answering, single, template, config(), progress=False)
    out = tmp_path / "workers.jsonl"
    result = annotate_with_workers(items, recipe_for(tiny_model_dir), out, config(), 2, threads=1, progress=False)
    assert (result.written, result.skipped, result.total) == (len(items), 0, len(items))
    assert_same_records(read_records(out), read_records(single))
    assert {r.provenance["skipped_items"] for r in read_records(out)} == {2}
    # The shards stay as the run's state, each its contiguous slice of the input.
    parts = [part_path(out, Shard(i, 2)) for i in range(2)]
    assert [[r.id for r in read_records(p)] for p in parts] == [["t:0", "t:1", "t:2"], ["t:3", "t:4", "t:5", "t:6"]]
    # A rerun has nothing left to generate and merges the same file again.
    before = out.read_text()
    again = annotate_with_workers(items, recipe_for(tiny_model_dir), out, config(), 2, threads=1, progress=False)
    assert (again.written, again.skipped) == (0, len(items)) and out.read_text() == before


def test_a_worker_that_fails_is_named_and_its_error_reaches_the_user(tmp_path):
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(CandorError, match=r"^worker \d \(shard \d/2\): .*no-such-model"):
        annotate_with_workers(
            make_items(), recipe_for(missing), tmp_path / "o.jsonl", config(), 2, threads=1, progress=False
        )
    assert not (tmp_path / "o.jsonl").exists()


def test_what_a_worker_run_cannot_resume_is_refused(tmp_path):
    out = tmp_path / "o.jsonl"
    with pytest.raises(CandorError, match=r"--workers 1: a worker run needs at least 2"):
        check_workers(1, out)
    out.write_text("")
    with pytest.raises(CandorError, match=r"o\.jsonl exists and was not written by a worker run"):
        check_workers(2, out)
    out.unlink()
    parts_folder(out).mkdir()
    (parts_folder(out) / "shard-0-of-3.jsonl").write_text("")
    with pytest.raises(CandorError, match=r"holds the shards of a run with --workers 3"):
        check_workers(2, out)
    check_workers(3, out)
    with pytest.raises(CandorError, match=r"the openai backend batches on its own"):
        check_cpu_backend(BackendRecipe(model="m", backend="openai"))
    check_cpu_backend(BackendRecipe(model="m", backend="hf"))


def test_a_worker_whose_model_lands_on_a_gpu_refuses(tiny_backend):
    refuse_gpu(tiny_backend)  # the tiny model is on the CPU
    with pytest.raises(CandorError, match=r"this model runs on cuda:0, where one process batches better"):
        refuse_gpu(SimpleNamespace(device=torch.device("cuda:0")))


def test_each_worker_gets_its_share_of_the_cores(monkeypatch, caplog):
    assert threads_per_worker(2, cores=16) == 8 and threads_per_worker(3, cores=16) == 5
    assert threads_per_worker(2, cores=2) == 1 and not caplog.records
    with caplog.at_level(logging.WARNING):
        assert threads_per_worker(3, cores=2) == 1
    assert "3 workers on 2 cores" in caplog.text
    monkeypatch.setenv("OMP_NUM_THREADS", "6")
    assert available_cores() == 6
    monkeypatch.setenv("OMP_NUM_THREADS", "")
    assert available_cores() >= 1


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--shard", "0/2"], "use it without --shard"),
        (["--backend", "openai", "--base-url", "http://127.0.0.1:9/v1"], "the openai backend batches on its own"),
        (["--workers", "0"], "--workers 0: a worker run needs at least 2"),
    ],
)
def test_cli_refuses_workers_where_they_cannot_run(tmp_path, extra, needle):
    data = write_jsonl(tmp_path / "qa.jsonl", [{"question": "q", "answer": ["a"]}])
    args = ["annotate", "--data", str(data), "--out", str(tmp_path / "o.jsonl"), "--workers", "2", *extra]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and needle in result.output, result.output
    assert not (tmp_path / "o.jsonl").exists()


def test_cli_workers_killed_mid_run_resume_to_a_single_runs_records(tiny_model_dir, tmp_path):
    rows = [{"question": f"Question number {i}: what is {i} plus {i}?", "answer": [str(2 * i)]} for i in range(24)]
    rows += [{"question": q, "answer": a} for q, a in QUESTIONS]
    data = write_jsonl(tmp_path / "qa.jsonl", rows)
    out, single = tmp_path / "out.jsonl", tmp_path / "single.jsonl"
    common = [
        "--data",
        str(data),
        "--model",
        str(tiny_model_dir),
        "--k",
        "2",
        "--max-new-tokens",
        "8",
        "--template",
        "fewshot",
        "--batch-size",
        "2",
    ]
    cmd = [sys.executable, "-m", "candor.cli", "annotate", "--out", str(out), "--workers", "2", *common]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    parts = [part_path(out, Shard(i, 2)) for i in range(2)]
    deadline = time.time() + 120
    while time.time() < deadline and sum(len(p.read_bytes().splitlines()) for p in parts if p.exists()) < 4:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the parent and its workers, as a terminal's kill would
    proc.wait()
    assert not out.exists(), "the run should have been killed before its merge"
    assert 0 < sum(len(read_records(p)) for p in parts if p.exists()) < len(rows)
    finished = subprocess.run(cmd, capture_output=True, text=True)
    assert finished.returncode == 0, finished.stderr[-2000:]
    subprocess.run(
        [sys.executable, "-m", "candor.cli", "annotate", "--out", str(single), *common],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    assert_same_records(read_records(out), read_records(single))


def test_the_progress_count_reads_whole_records_as_they_are_appended(tmp_path):
    path = tmp_path / "shard-0-of-2.jsonl"
    count = RecordCount(path)
    assert count.update() == 0  # not written yet
    path.write_text('{"a": 1}\n{"a": 2}\n{"a"')
    assert count.update() == 2  # a record half written is not counted
    with path.open("a") as f:
        f.write(': 3}\n{"a": 4}\n')
    assert count.update() == 4 and count.update() == 4
