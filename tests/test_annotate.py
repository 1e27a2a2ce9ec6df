"""The annotator end to end on a tiny random model: records, resume, kill -9, shards, errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from candor.annotate import AnnotateConfig, Shard, annotate, merge_shards
from candor.backends.base import SamplingParams
from candor.cli import app
from candor.data.items import QAItem
from candor.errors import CandorError
from candor.judges import get_correctness_judge, normalize
from candor.prompts import TEMPLATES
from candor.records import from_honestybench, read_records, to_honestybench

FEWSHOT = TEMPLATES.get("fewshot")
QUESTIONS = [
    ("What is the capital of France?", ["Paris"]),
    ("Who wrote Hamlet?", ["William Shakespeare", "Shakespeare"]),
    ("What is the chemical symbol for gold?", ["Au"]),
    ("How many legs does a spider have?", ["8", "eight"]),
    ("Which planet is known as the Red Planet?", ["Mars"]),
    ("What is the boiling point of water in Celsius?", ["100"]),
    ("Who painted The Starry Night?", ["Vincent van Gogh", "van Gogh"]),
]


def make_items() -> list[QAItem]:
    return [QAItem(f"t:{i}", "toy", "test", q, tuple(a)) for i, (q, a) in enumerate(QUESTIONS)]


def config(k: int = 2) -> AnnotateConfig:
    return AnnotateConfig(k=k, params=SamplingParams(max_new_tokens=6), batch_size=3, seed=1)


def comparable(records) -> list[dict]:
    """Records as dicts; log-probs rounded because batch padding moves them by ~1e-6 (tokens stay identical)."""
    out = []
    for rec in records:
        d = rec.to_dict()
        d["provenance"] = {k: v for k, v in d["provenance"].items() if k != "shard"}
        for comp in [d["greedy"], *d["samples"]]:
            comp["logprobs"] = [round(x, 4) for x in comp["logprobs"]]
            # Top-k alternatives: the same tokens (their log-probs move by ~1e-6 like the others).
            comp["top_logprobs"] = [sorted(pos) for pos in comp.get("top_logprobs", [])]
        out.append(d)
    return out


def test_annotate_writes_complete_records(tiny_backend, tmp_path):
    out = tmp_path / "records.jsonl"
    result = annotate(make_items(), tiny_backend, out, FEWSHOT, config(k=3), progress=False)
    assert (result.written, result.skipped, result.total) == (7, 0, 7)
    records = read_records(out)
    assert [r.id for r in records] == [f"t:{i}" for i in range(7)]
    judge = get_correctness_judge("contains")
    for rec in records:
        assert rec.k == 3 and len(rec.sample_correct) == 3 and len(rec.consistency) == 3
        assert len(rec.greedy.logprobs) == len(rec.greedy.token_ids) > 0
        assert all(lp <= 0 for lp in rec.greedy.logprobs)
        assert rec.greedy_correct == judge.judge([rec.greedy.text], [rec.item.answers])[0]
        assert rec.sample_correct == judge.judge([s.text for s in rec.samples], [rec.item.answers] * 3)
        assert rec.provenance["template"] == "fewshot" and rec.provenance["k"] == 3
        assert "\n" in rec.provenance["decoding"]["samples"]["stop"]


def test_greedy_answer_marked_correct_when_it_matches_gold(tiny_backend, tmp_path):
    first = read_records_after(tiny_backend, tmp_path / "a.jsonl", make_items()[:2])
    # Reuse the model's own greedy answer as gold: contains must then say correct.
    items = [QAItem(r.id, "toy", "test", r.item.question, (r.greedy.text or "x",)) for r in first]
    second = read_records_after(tiny_backend, tmp_path / "b.jsonl", items)
    assert [r.greedy_correct for r in second] == [1 if normalize(r.greedy.text) else 0 for r in first]


def read_records_after(backend, out, items):
    annotate(items, backend, out, FEWSHOT, config(), progress=False)
    return read_records(out)


def test_resume_skips_done_items_and_equals_single_run(tiny_backend, tmp_path):
    items = make_items()
    single = tmp_path / "single.jsonl"
    annotate(items, tiny_backend, single, FEWSHOT, config(), progress=False)

    resumed = tmp_path / "resumed.jsonl"
    annotate(items[:4], tiny_backend, resumed, FEWSHOT, config(), progress=False)
    # Simulate a write cut mid-line by kill -9: a partial trailing line.
    with resumed.open("a") as fh:
        fh.write('{"item": {"id": "t:4", "quest')
    result = annotate(items, tiny_backend, resumed, FEWSHOT, config(), progress=False)
    assert (result.written, result.skipped) == (3, 4)
    assert comparable(read_records(resumed)) == comparable(read_records(single))


def test_rerun_with_other_settings_is_refused(tiny_backend, tmp_path):
    out = tmp_path / "r.jsonl"
    annotate(make_items()[:2], tiny_backend, out, FEWSHOT, config(k=2), progress=False)
    with pytest.raises(CandorError, match="other settings"):
        annotate(make_items(), tiny_backend, out, FEWSHOT, config(k=3), progress=False)
    assert len(read_records(out)) == 2  # nothing already written is lost


def test_shards_then_merge_equal_single_run(tiny_backend, tmp_path):
    items = make_items()
    single = tmp_path / "single.jsonl"
    annotate(items, tiny_backend, single, FEWSHOT, config(), progress=False)
    parts = []
    for i in (2, 0, 1):  # any order
        part = tmp_path / f"shard{i}.jsonl"
        annotate(items, tiny_backend, part, FEWSHOT, config(), shard=Shard(i, 3), progress=False)
        parts.append(part)
    merged = tmp_path / "merged.jsonl"
    assert merge_shards(parts, merged) == len(items)
    assert comparable(read_records(merged)) == comparable(read_records(single))


def test_merge_refuses_duplicates_and_mixed_settings(tiny_backend, tmp_path):
    items = make_items()[:3]
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    annotate(items, tiny_backend, a, FEWSHOT, config(), progress=False)
    annotate(items, tiny_backend, b, FEWSHOT, config(), progress=False)
    with pytest.raises(CandorError, match="already in another shard"):
        merge_shards([a, b], tmp_path / "m.jsonl")
    annotate(items, tiny_backend, c, FEWSHOT, config(k=1), progress=False)
    with pytest.raises(CandorError, match="other settings"):
        merge_shards([a, c], tmp_path / "m.jsonl")


@pytest.mark.parametrize("text", ["1/1", "3/2", "x", "-1/2", "0/0"])
def test_bad_shard_spec(text):
    with pytest.raises(CandorError):
        Shard.parse(text)


def test_duplicate_input_ids_are_refused(tiny_backend, tmp_path):
    items = make_items()[:2]
    with pytest.raises(CandorError, match="twice"):
        annotate([*items, items[0]], tiny_backend, tmp_path / "r.jsonl", FEWSHOT, config(), progress=False)


def test_honestybench_round_trip(tiny_backend, tmp_path):
    out = tmp_path / "r.jsonl"
    annotate(make_items()[:3], tiny_backend, out, FEWSHOT, config(k=2), progress=False)
    for rec in read_records(out):
        exported = to_honestybench(rec)
        assert exported["greedy_cumulative_logprobs"][-1] == pytest.approx(sum(rec.greedy.logprobs))
        back = from_honestybench(json.loads(json.dumps(exported)))
        assert back.id == rec.id and back.item.answers == rec.item.answers
        assert back.greedy.text == rec.greedy.text
        assert back.greedy.logprobs == pytest.approx(rec.greedy.logprobs)
        assert [s.text for s in back.samples] == [s.text for s in rec.samples]
        assert (back.greedy_correct, back.sample_correct, back.consistency) == (
            rec.greedy_correct, rec.sample_correct, rec.consistency)


def test_honestybench_import_from_cumulative_logprobs():
    rec = from_honestybench({
        "question": "q", "answer": ["a"], "greedy_response": "a b", "greedy_correctness": True,
        "greedy_cumulative_logprobs": [-0.5, -1.5], "sampling_response": ["a", "c"],
        "sampling_correctness": [1, 0], "consistency_judgement": ["True", "False"],
    }, dataset="nq", index=3)
    assert rec.id == "nq:3" and rec.greedy_correct == 1
    assert rec.greedy.logprobs == pytest.approx([-0.5, -1.0])
    assert rec.consistency == [1, 0] and rec.sample_accuracy == 0.5


# ------------------------------------------------------------------- CLI



def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_cli_annotate_and_rerun(tiny_model_dir, tmp_path):
    data = write_jsonl(tmp_path / "qa.jsonl", [{"question": q, "answer": a} for q, a in QUESTIONS[:4]])
    out = tmp_path / "out.jsonl"
    args = ["annotate", "--data", str(data), "--out", str(out), "--model", str(tiny_model_dir),
            "--k", "2", "--max-new-tokens", "5", "--template", "fewshot", "--batch-size", "2"]
    runner = CliRunner()
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    before = out.read_text()
    second = runner.invoke(app, args)
    assert second.exit_code == 0, second.output
    assert out.read_text() == before and len(before.splitlines()) == 4


@pytest.mark.parametrize(
    ("rows", "needle"),
    [
        (['{"question": "a", "answer": ["b"]}', '{"question": "c", "answer": '], ":2:"),
        (['{"question": "a", "answer": ["b"]}', '{"answer": ["b"]}'], ":2:"),
        (['{"question": "a"}'], ":1:"),
        (['{"question": "a", "answer": []}'], ":1:"),
    ],
)
def test_cli_bad_input_exits_2_naming_file_and_line(tiny_model_dir, tmp_path, rows, needle):
    data = write_jsonl(tmp_path / "bad.jsonl", rows)
    result = CliRunner().invoke(app, ["annotate", "--data", str(data), "--out", str(tmp_path / "o.jsonl"),
                                      "--model", str(tiny_model_dir)])
    assert result.exit_code == 2
    assert "bad.jsonl" in result.output and needle in result.output
    assert "Traceback" not in result.output


def test_cli_unknown_model_and_dataset_exit_2(tmp_path):
    data = write_jsonl(tmp_path / "qa.jsonl", [{"question": "q", "answer": ["a"]}])
    runner = CliRunner()
    result = runner.invoke(app, ["annotate", "--data", str(data), "--out", str(tmp_path / "o.jsonl"),
                                 "--model", str(tmp_path / "no-such-model")])
    assert result.exit_code == 2 and "no-such-model" in result.output
    result = runner.invoke(app, ["annotate", "--data", "no-such-dataset", "--out", str(tmp_path / "o.jsonl")])
    assert result.exit_code == 2 and "no-such-dataset" in result.output


def test_kill_9_mid_run_then_resume(tiny_model_dir, tmp_path):
    rows = [{"question": f"Question number {i}: what is {i} plus {i}?", "answer": [str(2 * i)]} for i in range(40)]
    data = write_jsonl(tmp_path / "qa.jsonl", rows)
    out = tmp_path / "out.jsonl"
    cmd = [sys.executable, "-m", "candor.cli", "annotate", "--data", str(data), "--out", str(out),
           "--model", str(tiny_model_dir), "--k", "2", "--max-new-tokens", "8", "--template", "fewshot",
           "--batch-size", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 120
    while time.time() < deadline and (not out.exists() or len(out.read_bytes().splitlines()) < 3):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    partial = len(read_records(out))
    assert 0 < partial < 40, "the run should have been killed part-way"
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    records = read_records(out)
    assert [r.item.question for r in records] == [r["question"] for r in rows]


def test_cli_export_then_import_round_trip(tiny_backend, tmp_path):
    recs = tmp_path / "r.jsonl"
    annotate(make_items()[:3], tiny_backend, recs, FEWSHOT, config(k=2), progress=False)
    hb = tmp_path / "hb" / "toy.jsonl"
    runner = CliRunner()
    assert runner.invoke(app, ["export", str(recs), "--out", str(hb)]).exit_code == 0
    exported = [json.loads(line) for line in hb.read_text().splitlines()]
    assert [e["greedy_response"] for e in exported] == [r.greedy.text for r in read_records(recs)]
    back = tmp_path / "back.jsonl"
    assert runner.invoke(app, ["import", str(hb), "--out", str(back)]).exit_code == 0
    for a, b in zip(read_records(recs), read_records(back), strict=True):
        assert (a.id, a.greedy.text, a.greedy_correct, a.consistency) == (b.id, b.greedy.text, b.greedy_correct,
                                                                          b.consistency)
    hb.write_text(hb.read_text() + '{"question": "q"}\n')
    bad = runner.invoke(app, ["import", str(hb), "--out", str(tmp_path / "x.jsonl")])
    assert bad.exit_code == 2 and "toy.jsonl:4:" in bad.output
