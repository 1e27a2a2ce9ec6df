"""benchmarks/claims_head.py's question-head column and goal rows, on a tiny model (the run lacked alone.jsonl)."""

from __future__ import annotations

import copy

import numpy as np

from benchmarks.claims_head import goal_rows, question_fold
from candor.annotation.records import Record
from candor.backends.base import Completion
from candor.data.items import QAItem
from candor.train.elical import EliCalConfig


def alone_records(n: int) -> list[Record]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        domain = "nq" if i % 2 else "hq"
        right = int(rng.uniform() < 0.4)
        item = QAItem(id=f"{domain}:{i}", dataset=domain, split="test", question=f"What is fact {i}?", answers=("x",))
        item.meta["domain"] = domain
        out.append(
            Record(
                item=item,
                greedy=Completion("x"),
                samples=[Completion("x")] * 3,
                greedy_correct=right,
                sample_correct=[right, 0, 1],
                consistency=[1, right, 0],
                provenance={"template": "fewshot"},
            )
        )
    return out


def test_the_question_head_is_trained_without_the_held_out_domain_and_scored_on_it(
    tiny_model, tokenizer, tiny_model_dir
):
    config = EliCalConfig(model=tiny_model_dir, max_epochs=1)
    # A copy: training freezes the backbone's parameters, and the session's tiny model is shared.
    fold = question_fold(alone_records(80), "nq", config, copy.deepcopy(tiny_model), tokenizer, bootstrap=0)
    assert fold["train_questions"] + fold["dev_questions"] == 40  # the hq half only
    assert set(fold["by_budget"]) == {"25", "all"}  # 50 and more exceed the 36 pool questions
    assert all(cell["n"] == 40 for cell in fold["by_budget"].values())  # every nq question scored
    claims = {
        "nq": {
            "by_budget": {
                "100": {
                    "auroc": {"value": 0.6},
                    "ece": {"value": 0.09, "corrected": 0.08},
                    "n": 50,
                    "positives": 5,
                    "few_of_a_class": True,
                }
            }
        }
    }
    questions = {"nq": {"by_budget": {"100": {"auroc": {"value": 0.7}}}}}
    row = goal_rows(claims, questions)["nq"]
    assert round(row["auroc_gap_points"], 6) == 10.0 and round(row["auroc_miss_points"], 6) == 7.0
    assert round(row["ece_miss_points"], 6) == 3.0  # the bias-corrected ECE, 8 points, against 5
    assert goal_rows(claims, None)["nq"]["question_auroc"] is None
