"""benchmarks/serve_conversations.py's numbers (against hand computations) and its README table."""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score


@pytest.fixture(scope="module")
def bench():
    return importlib.import_module("benchmarks.serve_conversations")


def shape(confidence, correct, answers):
    return {"confidence": np.array(confidence, dtype=float), "correct": np.array(correct), "answer": answers}


def test_each_shape_and_the_paired_difference_match_a_hand_computation(bench):
    arrays = {
        "single": shape([0.9, 0.8, 0.3, 0.2], [1, 0, 1, 0], ["a", "b", "c", "d"]),
        "2-turn": shape([0.9, 0.2, 0.8, 0.3], [1, 0, 1, 0], ["a", "x", "c", "d"]),
        "3-turn": shape([0.9, 0.8, 0.3, 0.2], [1, 0, 1, 0], ["a", "b", "c", "d"]),
    }
    out = bench.summarize(arrays, bootstrap=200, seed=0)
    single, chat = out["shapes"]["single"], out["shapes"]["2-turn"]
    # AUROC: of the 4 (correct, wrong) pairs, 0.3 < 0.8 is the one ranked wrong; each point alone in its bin
    # for ECE: (|0.9-1| + |0.8-0| + |0.3-1| + |0.2-0|) / 4.
    assert single["auroc"] == pytest.approx(0.75) == roc_auc_score([1, 0, 1, 0], [0.9, 0.8, 0.3, 0.2])
    assert single["ece"] == pytest.approx(0.45) and single["accuracy"] == 0.5 and single["n"] == 4
    assert chat["auroc"] == pytest.approx(1.0) and chat["ece"] == pytest.approx((0.1 + 0.2 + 0.2 + 0.3) / 4)
    gap = out["minus_single"]["2-turn"]
    assert gap["auroc"]["value"] == pytest.approx(0.25) and gap["ece"]["value"] == pytest.approx(-0.25)
    assert gap["answers_changed"] == 1
    # Paired: a chat that moved nothing differs by exactly 0 in every resample (an unpaired bootstrap would not).
    same = out["minus_single"]["3-turn"]
    assert same["auroc"]["ci95"] == [0.0, 0.0] and same["ece"]["ci95"] == [0.0, 0.0]
    low, high = single["ci95"]["ece"]
    assert low < single["ece"] < high


def test_the_earlier_turns_are_other_questions_drawn_by_the_seed(bench):
    partners = bench.draw_partners(12, seed=3)
    assert partners == bench.draw_partners(12, seed=3) != bench.draw_partners(12, seed=4)
    assert all(i not in pair and pair[0] != pair[1] and max(pair) < 12 for i, pair in enumerate(partners))


def test_the_shapes_are_compared_on_the_questions_all_of_them_answered(bench):
    rows = [
        {"turns": t, "id": i, "confidence": 0.5, "correct": 1, "answer": "x"}
        for t in (1, 2, 3)
        for i in ("q1", "q2")
        if (t, i) != (3, "q2")
    ]
    arrays = bench.shape_arrays(rows)
    assert [len(a["correct"]) for a in arrays.values()] == [1, 1, 1]


def conversation_results() -> dict:
    def cell(auroc, ece, acc, n=4):
        return {
            "n": n,
            "auroc": auroc,
            "ece": ece,
            "accuracy": acc,
            "ci95": {"auroc": [0.6, 0.9], "ece": [0.1, 0.3], "accuracy": [0.3, 0.7]},
        }

    def gap(value):
        return {"value": value, "ci95": [value - 0.05, value + 0.05]}

    method = {
        "n": 4,
        "shapes": {"single": cell(0.75, 0.2, 0.5), "2-turn": cell(0.7, 0.25, 0.5), "3-turn": cell(0.65, 0.3, 0.25)},
        "minus_single": {
            "2-turn": {"auroc": gap(-0.05), "ece": gap(0.05), "accuracy": gap(0.0), "answers_changed": 1},
            "3-turn": {"auroc": gap(-0.1), "ece": gap(0.1), "accuracy": gap(-0.25), "answers_changed": 2},
        },
    }
    return {
        "methods": {"n-prob": method},
        "datasets": ["nq", "hq"],
        "judge": "contains",
        "ece_bins": 10,
        "bootstrap": 1000,
        "command": "python benchmarks/serve_conversations.py --summarize-only",
        "answered_by": "python benchmarks/serve_conversations.py --per-dataset 2",
    }


def test_the_readme_table_is_generated_from_the_json(tmp_path, readme_generator):
    rt = readme_generator("serving")
    (tmp_path / "serve_conversations.json").write_text(json.dumps(conversation_results()))
    parts = rt.serve_conversations(tmp_path)
    lines = parts["table:serve-conversations"].splitlines()
    assert lines[0].startswith("| method | asked | n | accuracy | AUROC | ECE | Δ AUROC |")
    assert lines[2] == "| `n-prob` | single | 4 | 50.0 | 75.0 [60, 90] | 20.0 [10, 30] | – | – | – | – |"
    assert lines[4] == (
        "| `n-prob` | 3-turn | 4 | 25.0 | 65.0 [60, 90] | 30.0 [10, 30] | −10.0 [−15.0, −5.0] "
        "| +10.0 [+5.0, +15.0] | −25.0 [−30.0, −20.0] | 2 / 4 |"
    )
    # The fixture's commands are recorded the way runs before the package were; the README shows them as run now.
    assert parts["value:serve-conversations-run"].startswith(
        "`python -m benchmarks.serve_conversations --per-dataset 2` (4 questions answered in all three ways, "
        "taken in turn from the in-domain test sets NQ, HotpotQA; judge `contains`"
    )
    assert parts["value:serve-conversations-shifts"] == (
        "`n-prob` AUROC −5.0 [−10.0, 0.0] after one earlier turn and −10.0 [−15.0, −5.0] after two, "
        "ECE +5.0 [0.0, +10.0] and +10.0 [+5.0, +15.0]"
    )


def test_a_row_torn_by_a_killed_run_is_dropped_and_the_cache_continues(bench, tmp_path):
    path = tmp_path / "answers.jsonl"
    whole = {"method": "n-prob", "turns": 1, "id": "q1", "earlier": []}
    path.write_text(json.dumps(whole) + '\n{"method": "n-prob", "tu', encoding="utf-8")
    cache = bench.AnswerCache(path)
    assert list(cache.rows) == [("n-prob", 1, "q1", (), None)]  # (no system prompt)
    cache.add([{"method": "n-prob", "turns": 2, "id": "q1", "earlier": ["q2"]}])
    assert len(bench.AnswerCache(path).rows) == 2
    path.write_text('{"bad\n' + json.dumps(whole) + "\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="answers.jsonl:1: not a JSON row"):
        bench.AnswerCache(path)


def test_the_readme_says_which_differences_the_intervals_tell_from_zero(tmp_path, readme_generator):
    rt = readme_generator("serving")
    results = conversation_results()
    (tmp_path / "serve_conversations.json").write_text(json.dumps(results))
    verdict = rt.serve_conversations(tmp_path)["value:serve-conversations-verdict"]
    # 2-turn's intervals end at 0 (included); 3-turn's lie wholly on one side of it.
    assert verdict.startswith("the intervals exclude 0 for `n-prob` AUROC 3-turn, `n-prob` ECE 3-turn; ")
    assert "greedy answer itself in 25–50% of the questions" in verdict
    for gap in results["methods"]["n-prob"]["minus_single"]["3-turn"].values():
        if isinstance(gap, dict):
            gap["ci95"] = [-0.2, 0.2]
    (tmp_path / "serve_conversations.json").write_text(json.dumps(results))
    assert rt.serve_conversations(tmp_path)["value:serve-conversations-verdict"].startswith(
        "every interval of an AUROC or ECE difference includes 0"
    )


# ---------------------------------------------------------------- the "system prompt" row (issue 54 part 4)


def system_prompt_rows(bench, test_correct):
    """Dev answers alone (overconfident), dev and test answers after the system prompt (confidence = accuracy)."""
    from types import SimpleNamespace

    from candor.data.items import QAItem

    def item(i, split):
        return QAItem(id=f"{split}{i}", dataset="nq", split=split, question=f"q{i}", answers=("a",))

    devs, tests = [item(i, "dev") for i in range(40)], [item(i, "test") for i in range(40)]
    shape = bench.system_shape(bench.SYSTEM_PROMPT)
    rows = []
    for i in range(40):
        low = i < 20
        rows.append({"turns": 1, "id": f"dev{i}", "confidence": 0.9 if low else 0.95, "correct": int(i % 10 == 0)})
        sys_conf, sys_correct = (0.2, int(i % 5 == 0)) if low else (0.6, int(i % 5 != 0))
        rows.append({"turns": 1, "id": f"dev{i}", "system": shape, "confidence": sys_conf, "correct": sys_correct})
        rows.append({"turns": 1, "id": f"test{i}", "system": shape, "confidence": sys_conf, "correct": test_correct(i)})
    args = SimpleNamespace(seed=0, bootstrap=100)
    return bench.system_prompt_row(rows, devs, tests, args)


def test_the_system_prompt_row_fits_on_dev_and_evaluates_on_test(bench):
    from candor.evaluation.calibration import get_calibrator
    from candor.evaluation.metrics import ece

    def same_as_dev(i):
        return int(i % 5 == 0) if i < 20 else int(i % 5 != 0)

    out = system_prompt_rows(bench, same_as_dev)
    assert out["shape"] == bench.system_shape(bench.SYSTEM_PROMPT) and out["n_test"] == 40
    alone, tuned = out["tuned"]["alone"], out["tuned"]["system_prompt"]
    assert alone["n_dev"] == tuned["n_dev"] == 40
    # By hand: Platt fitted on the dev answers asked after the system prompt, applied to the test answers.
    conf = np.array([0.2] * 20 + [0.6] * 20)
    correct = np.array([same_as_dev(i) for i in range(40)])
    fitted = get_calibrator("platt").fit(conf, correct)
    assert tuned["ece"]["value"] == pytest.approx(ece(fitted.predict(conf), correct), abs=1e-4)
    assert tuned["ece"]["value"] < alone["ece"]["value"]  # the lone questions taught the wrong scale
    # Alone, every dev confidence (0.9, 0.95) lies above the test ones: the threshold answers none of them.
    assert alone["coverage"]["value"] == 0.0 and tuned["coverage"]["value"] == pytest.approx(0.5)
    gap = out["system_prompt_minus_alone"]
    assert gap["ece"]["value"] == pytest.approx(tuned["ece"]["value"] - alone["ece"]["value"], abs=1e-3)
    # Nothing is fitted on test: other test labels change the test numbers, never the thresholds.
    flipped = system_prompt_rows(bench, lambda i: 1 - same_as_dev(i))
    assert flipped["tuned"]["system_prompt"]["threshold"] == tuned["threshold"]
    assert flipped["tuned"]["system_prompt"]["ece"]["value"] != tuned["ece"]["value"]


def test_the_system_prompt_table_is_generated_from_the_json(bench, tmp_path, readme_generator):
    rt = readme_generator("serving")
    results = conversation_results()
    row = system_prompt_rows(bench, lambda i: int(i % 2 == 0))
    results["system_prompt"] = {"methods": {"n-prob": row}, "per_dataset": 10, "command": "c", "answered_by": None}
    (tmp_path / "serve_conversations.json").write_text(json.dumps(results))
    parts = rt.serve_conversations(tmp_path)
    lines = parts["table:serve-system-prompt"].splitlines()
    assert lines[0].startswith("| method | calibrator and threshold tuned on | dev n | test n | AUROC | ECE |")
    assert [line.split(" | ")[1] for line in lines[2:]] == [
        "not tuned (the raw value)",
        "questions alone",
        "the same system prompt",
    ]
    assert row["shape"] in parts["value:serve-system-prompt-run"]
    assert parts["value:serve-system-prompt-verdict"].startswith("tuned with the system prompt minus tuned alone: ")
    del results["system_prompt"]  # a results file from before the row: the conversations table alone
    (tmp_path / "serve_conversations.json").write_text(json.dumps(results))
    assert "table:serve-system-prompt" not in rt.serve_conversations(tmp_path)
