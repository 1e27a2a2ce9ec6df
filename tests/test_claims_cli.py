"""``candor claims`` end to end in a subprocess: split, label by position, score, metrics by answer, report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from candor.annotation.records import Record, write_records
from candor.backends.base import Completion
from candor.data.items import QAItem

SRC = str(Path(__file__).resolve().parents[1] / "src")
PARTS = [
    ("What is the capital of France?", ["Paris"]),
    ("Who wrote Hamlet?", ["Shakespeare"]),
    ("What is the chemical symbol for gold?", ["Au"]),
]
LINES = [
    ("The capital of France is Paris.", "The capital of France is Lyon."),
    ("Hamlet was written by Shakespeare.", "Hamlet was written by Marlowe."),
    ("The chemical symbol for gold is Au.", "The chemical symbol for gold is Ag."),
]


def record(i: int, rng: np.random.Generator) -> Record:
    right = rng.uniform(size=3) < 0.5
    text = "\n".join(f"{k + 1}. {LINES[k][0 if right[k] else 1]}" for k in range(3))
    pieces = [" " + text[:5]] + [text[a : a + 6] for a in range(5, len(text), 6)]
    # right lines get higher log-probs on average, so claim-prob carries signal
    lp = []
    at = -1
    for piece in pieces:
        line = text[: max(0, at) + 1].count("\n")
        lp.append(float(-0.2 - (0.0 if right[min(line, 2)] else 0.6) - rng.uniform(0, 0.5)))
        at += len(piece)
    item = QAItem(
        id=f"c{i}",
        dataset="compound-test",
        split="test",
        question="\n".join(q for q, _ in PARTS),
        answers=(),
        meta={"parts": [{"id": f"q{k}", "question": q, "answers": a} for k, (q, a) in enumerate(PARTS)]},
    )
    greedy = Completion(text=text, token_ids=list(range(len(pieces))), tokens=pieces, logprobs=lp)
    return Record(item=item, greedy=greedy, samples=[])


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SRC}
    return subprocess.run(
        [sys.executable, "-m", "candor.cli", "claims", *args], capture_output=True, text=True, env=env, timeout=300
    )


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    rng = np.random.default_rng(0)
    folder = tmp_path_factory.mktemp("claims")
    write_records(folder / "records.jsonl", [record(i, rng) for i in range(30)])
    done = run_cli(
        "-r",
        str(folder / "records.jsonl"),
        "-o",
        str(folder / "out"),
        "-e",
        "claim-prob,claim-perplexity",
        "--bootstrap",
        "100",
    )
    assert done.returncode == 0, done.stderr
    return folder / "out", done


def test_metrics_match_the_claim_confidences_written(report):
    out, done = report
    rows = [json.loads(line) for line in (out / "claim_confidences.jsonl").read_text().splitlines()]
    assert len(rows) == 90 and all(r["failure"] is None for r in rows)
    metrics = json.loads((out / "claim_metrics.json").read_text())
    y = [r["correct"] for r in rows]
    for method in ("claim-prob", "claim-perplexity"):
        expected = roc_auc_score(y, [r["confidence"][method] for r in rows])
        assert metrics["methods"][method]["auroc"]["value"] == pytest.approx(expected)
        lo, hi = metrics["methods"][method]["auroc"]["ci"]
        assert lo <= expected <= hi
        assert set(metrics["methods"][method]["refinement"]) == {"100%", "50%", "75%", "90%"}
    assert metrics["answers"] == 30 and "claim-prob: AUROC" in done.stdout
    assert "chart-refinement" in (out / "report" / "report.html").read_text()
    # the records come back with their claims and labels
    first = json.loads((out / "claims.jsonl").read_text().splitlines()[0])
    assert [c["question"] for c in first["claims"]] == [0, 1, 2]


def test_free_answers_without_a_judge_and_unknown_methods_are_refused(tmp_path):
    plain = Record(
        item=QAItem(id="x", dataset="d", split="test", question="Tell me about Paris.", answers=("Paris",)),
        greedy=Completion(text="Paris is big.", token_ids=[1, 2], tokens=[" Paris", " is big."], logprobs=[-0.1, -0.2]),
        samples=[],
    )
    write_records(tmp_path / "free.jsonl", [plain])
    done = run_cli("-r", str(tmp_path / "free.jsonl"), "-o", str(tmp_path / "o"), "-e", "claim-prob")
    assert done.returncode == 2 and "pass --judge-model" in done.stderr and "Traceback" not in done.stderr
    done = run_cli("-r", str(tmp_path / "free.jsonl"), "-o", str(tmp_path / "o"), "-e", "claim-nope")
    assert done.returncode == 2 and "unknown claim estimator" in done.stderr
