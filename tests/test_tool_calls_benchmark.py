"""benchmarks/tool_calls.py: what makes a score (agreement, n-prob, the split), that calibration reads only the
cal split and metrics only the test split, and that a run resumes from its cache (the tiny model, real decoding)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from benchmarks import tool_calls as bench
from candor.tool_calls import Tool
from candor.tool_calls.bfcl import Item

CALL = '{"name": "f", "arguments": {"x": 1}}'


def item(item_id: str, category: str = "simple") -> Item:
    tool = Tool(
        name="f", description="Add one.", parameters={"type": "object", "properties": {"x": {"type": "integer"}}}
    )
    return Item(
        id=item_id,
        category=category,
        messages=[{"role": "user", "content": f"question {item_id}"}],
        tools=[tool],
        functions=[{"name": "f", "parameters": {"type": "dict", "properties": {"x": {"type": "integer"}}}}],
        answers=None if category == "irrelevance" else [{"f": {"x": [1]}}],
    )


def test_agreement_of_replies():
    assert bench.agrees('{"name": "f", "arguments": {"x": 1.0}}', CALL)
    assert bench.agrees("It is sunny.", "I cannot help with that.")  # both plain answers: no call either way
    assert not bench.agrees(CALL, "It is sunny.")
    assert not bench.agrees('{"name": "f", "arguments": {"x": 2}}', CALL)
    assert not bench.agrees('{"name": "f", "argum', '{"name": "f", "argum')  # a broken call agrees with nothing
    assert bench.outcome("{oops") == bench.INVALID and bench.outcome("fine") == ""


def test_n_prob_is_the_geometric_mean_token_probability():
    assert bench.n_prob({"logprobs": [math.log(0.5), math.log(0.125)]}) == pytest.approx(0.25)
    assert bench.n_prob({"logprobs": [], "stop_logprob": math.log(0.9)}) == pytest.approx(0.9)


def test_the_split_is_by_item_id_and_fixed():
    ids = [f"simple_python_{i}" for i in range(400)]
    splits = [bench.split_of(i) for i in ids]
    assert splits == [bench.split_of(i) for i in ids]
    shares = {name: splits.count(name) / len(ids) for name in bench.SPLITS}
    assert 0.4 < shares["train"] < 0.6 and 0.12 < shares["cal"] < 0.28 and 0.22 < shares["test"] < 0.38


def test_the_cache_key_changes_with_what_determines_a_result():
    one = item("simple_python_0")
    base = bench.cache_key({"backend": "hf"}, "free", one, "prompt", 5)
    assert base == bench.cache_key({"backend": "hf"}, "free", one, "prompt", 5)
    others = [
        bench.cache_key({"backend": "openai"}, "free", one, "prompt", 5),
        bench.cache_key({"backend": "hf"}, "grammar", one, "prompt", 5),
        bench.cache_key({"backend": "hf"}, "free", one, "prompt!", 5),
        bench.cache_key({"backend": "hf"}, "free", one, "prompt", 4),
        bench.cache_key({"backend": "hf"}, "free", item("simple_python_1"), "prompt", 5),
    ]
    assert len({base, *others}) == 6


def rows_for(seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(300):
        item_id = f"multiple_{i}"
        score = float(rng.uniform(0.05, 0.95))
        rows.append(
            {
                "id": item_id,
                "category": "irrelevance" if i % 5 == 0 else "multiple",
                "split": bench.split_of(item_id),
                "correct": int(rng.uniform() < score),
                "called": i % 5 != 0 or score > 0.5,
                "n-prob": score,
                "consistency": score,
                "head": score,
            }
        )
    return rows


def test_scores_calibrate_on_cal_and_are_measured_out_of_sample():
    """Platt on cal; the head (fitted on train) measured on test only, the training-free scores on train + test."""
    rows = rows_for(0)
    result = bench.score_rows(rows, bootstrap=20)
    json.dumps(result)  # the results file takes it (a numpy count once failed the run at its end)
    test = [row for row in rows if row["split"] == "test"]
    held = [row for row in rows if row["split"] != "cal"]
    assert result["head"]["n"] == len(test) and result["head"]["correct"] == sum(r["correct"] for r in test)
    assert result["n-prob"]["n"] == len(held) and result["n-prob"]["correct"] == sum(r["correct"] for r in held)
    assert result["n-prob"]["evaluated_on"] == ["train", "test"] and result["head"]["evaluated_on"] == ["test"]
    assert result["n-prob"]["platt"]["n_cal"] == sum(row["split"] == "cal" for row in rows)
    assert result["n-prob"]["auroc"]["value"] > 0.6  # the score predicts the label it drew
    # Changing train rows changes nothing the head is measured on; cal rows move the calibration, not the AUROC.
    changed = [dict(row, correct=1 - row["correct"]) if row["split"] == "train" else row for row in rows]
    assert bench.score_rows(changed, bootstrap=20)["head"] == result["head"]
    recal = [dict(row, **{"n-prob": row["n-prob"] ** 3}) if row["split"] == "cal" else row for row in rows]
    moved = bench.score_rows(recal, bootstrap=20)["n-prob"]
    assert moved["platt"] != result["n-prob"]["platt"] and moved["auroc"] == result["n-prob"]["auroc"]
    irrelevance = result["n-prob"]["irrelevance"]
    assert irrelevance["n"] == sum(row["category"] == "irrelevance" for row in held)
    assert irrelevance["no_call"] <= irrelevance["abstained"] <= irrelevance["n"]


def test_a_run_resumes_from_its_cache(tiny_backend, tokenizer, tmp_path):
    runner = bench.Runner(
        backend=tiny_backend, kind="hf", identity={"backend": "hf", "model": "tiny"}, tokenizer=tokenizer
    )
    items = [item("simple_python_0"), item("irrelevance_3", "irrelevance")]
    path = tmp_path / "run.jsonl"
    bench.annotate(runner, items[:1], ["free"], 2, path, batch=4)
    first = path.read_text().splitlines()
    assert len(first) == 1
    bench.annotate(runner, items, ["free"], 2, path, batch=4)
    lines = path.read_text().splitlines()
    assert lines[:1] == first and len(lines) == 2  # only the new item was generated
    rows = [json.loads(line) for line in lines]
    assert [row["id"] for row in rows] == ["simple_python_0", "irrelevance_3"]
    assert all(len(row["samples"]) == 2 and row["tokens"] > 0 for row in rows)
    summary = bench.arm_summary(bench.item_rows(items, {row["id"]: row for row in rows}))
    assert summary["n"] == 2 and summary["tokens"] == sum(row["tokens"] for row in rows)


def test_speed_reads_the_latest_probe_only(tmp_path):
    path = tmp_path / "speed.jsonl"
    rows = [
        {"run": "1", "id": "a", "arm": "free", "tokens": 10, "seconds": 10.0},
        {"run": "2", "id": "a", "arm": "free", "tokens": 100, "seconds": 4.0},
        {"run": "2", "id": "a", "arm": "required", "tokens": 30, "seconds": 2.0},
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = bench.speed(path)
    assert result["free"]["tokens_per_s"] == 25.0 and result["required"]["tokens_per_s"] == 15.0
    assert result["ratio_schema_over_free"] == pytest.approx(0.6) and result["items"] == 1
    assert bench.speed(tmp_path / "none.jsonl") is None
