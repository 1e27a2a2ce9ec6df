"""EliCal under a 2-process CPU launch (gloo) ends where the single-process run ends, and saves once.

``accelerate launch --multi_gpu --num_processes 2`` starts two processes through
torch.distributed; candor's training arguments ask for the CPU when there is no
GPU, so accelerate joins them with the gloo backend (MULTI_CPU). Each process
trains on half of every batch, so the per-process batch is half the single run's
and the optimization is the same up to the order of the examples.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_elical_train import make_records

from candor.annotation.records import write_records

ACCELERATE = shutil.which("accelerate", path=str(Path(sys.executable).parent))


def train(out: Path, records: Path, dev: Path, model: str, launcher: list[str], batch_size: int) -> dict:
    cmd = [
        *launcher,
        "-m",
        "candor.cli",
        "train",
        "eli-only",
        "-r",
        str(records),
        "--dev",
        str(dev),
        "-o",
        str(out),
        "-m",
        model,
        "-s",
        "mode=head",
        "-s",
        "max_epochs=4",
        "-s",
        f"batch_size={batch_size}",
        "-s",
        "feature_cache=none",
        "-s",
        "head_learning_rate=0.01",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "training.json").read_text())


@pytest.mark.skipif(ACCELERATE is None, reason="the accelerate launcher is not installed beside this Python")
def test_two_process_elical_matches_one_process_and_writes_one_checkpoint(tiny_model_dir, tmp_path):
    write_records(tmp_path / "pool.jsonl", make_records(32))
    write_records(tmp_path / "dev.jsonl", make_records(8, 100))
    single = train(
        tmp_path / "single",
        tmp_path / "pool.jsonl",
        tmp_path / "dev.jsonl",
        tiny_model_dir,
        [sys.executable],
        batch_size=8,
    )
    launcher = [
        ACCELERATE,
        "launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
    ]
    double = train(
        tmp_path / "ddp", tmp_path / "pool.jsonl", tmp_path / "dev.jsonl", tiny_model_dir, launcher, batch_size=4
    )
    loss_1 = single["stages"][-1]["history"][-1]["dev_loss"]
    loss_2 = double["stages"][-1]["history"][-1]["dev_loss"]
    assert abs(loss_2 - loss_1) <= 0.05 * loss_1, (loss_1, loss_2)
    # One checkpoint: the head folder once, no half-written copies beside it.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ddp", "dev.jsonl", "pool.jsonl", "single"]
    assert {"elical_config.json", "head.safetensors", "training_questions.json", "training.json"} <= {
        p.name for p in (tmp_path / "ddp").iterdir()
    }
