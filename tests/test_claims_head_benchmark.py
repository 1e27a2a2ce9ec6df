"""benchmarks/claims_head.py's question-head column and goal rows, on a tiny model (the run lacked alone.jsonl)."""

from __future__ import annotations

import copy

import numpy as np

from benchmarks.claims_head import goal_rows, question_fold, same_questions
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


def test_the_goal_compares_both_heads_on_the_same_questions():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(1)
    records, claim_values, alone_values = [], [], {}
    for i in range(40):
        item = QAItem(id=f"p{i}", dataset="compound-nq", split="test", question="1. a? 2. b?", answers=())
        item.meta["parts"] = [{"id": f"p{i}.0"}, {"id": f"p{i}.1"}]
        records.append(Record(item=item, greedy=Completion("x"), samples=[]))
        for q in (0, 1):
            y = int(rng.uniform() < 0.4)
            claim_values.append([f"p{i}", 2 * q, q, float(rng.uniform()), y])
            claim_values.append([f"p{i}", 2 * q + 1, q, 0.99, 0])  # a second claim at the position: not the first
            alone_values[f"p{i}.{q}"] = [float(rng.uniform() * 0.5 + 0.5 * y), y]
    alone_values.pop("p0.0")  # a question never asked alone is left out of the pairs
    cell = {"auroc": {"value": 0.6}, "ece": {"value": 0.09, "corrected": 0.08}, "n": 160, "positives": 30}
    claims = {"nq": {"by_budget": {"100": {**cell, "few_of_a_class": False, "values": claim_values}}}}
    questions = {"nq": {"by_budget": {"100": {"values": alone_values}}}}
    same = same_questions(records, claims, questions, bootstrap=50)
    pair = same["100"]["by_domain"]["nq"]
    assert pair["questions"] == 79
    first = [v for v in claim_values if v[1] in (0, 2) and f"{v[0]}.{v[2]}" in alone_values]
    inside = roc_auc_score([v[4] for v in first], [v[3] for v in first])
    alone = roc_auc_score(
        [alone_values[f"{v[0]}.{v[2]}"][1] for v in first], [alone_values[f"{v[0]}.{v[2]}"][0] for v in first]
    )
    assert abs(pair["in_answer"]["value"] - inside) < 1e-12 and abs(pair["alone"]["value"] - alone) < 1e-12
    row = goal_rows(claims, same)["nq"]
    assert abs(row["auroc_gap_points"] - 100 * (alone - inside)) < 1e-9
    assert abs(row["auroc_miss_points"] - max(0.0, 100 * (alone - inside) - 3.0)) < 1e-9
    assert round(row["ece_miss_points"], 6) == 3.0  # the bias-corrected ECE, 8 points, against 5
    assert goal_rows(claims, same)["pooled"]["same_questions"] == 79
    assert "claim_ece" not in goal_rows(claims, same)["pooled"]  # no pooled cell given: no pooled ECE claimed
    pooled_cell = {**cell, "ece": {"value": 0.07, "corrected": 0.06}, "few_of_a_class": False}
    assert round(goal_rows(claims, same, {"100": pooled_cell})["pooled"]["ece_miss_points"], 6) == 1.0
    assert goal_rows(claims, None)["nq"]["question_auroc"] is None


def test_the_claim_heads_conformal_rows_add_up_over_domains():
    from benchmarks.claims_head import pooled_conformal
    from candor.serve.thresholds import clopper_pearson

    def cell(threshold: float, n: int, clean: int, kept: float) -> dict:
        return {
            "rule": "conformal",
            "alpha": 0.2,
            "delta": None,
            "threshold": threshold,
            "test_answers": n,
            "without_false": {"value": clean / n, "count": clean},
            "without_false_unrefined": 0.5,
            "claims_kept": kept,
            "text_kept": kept,
        }

    claims = {
        "nq": {"conformal": {"dev_answers": 40, "conformal@0.2": cell(0.3, 40, 34, 0.5)}},
        "hq": {"conformal": {"dev_answers": 20, "conformal@0.2": cell(0.6, 20, 15, 0.2)}},
        "starter": {
            "conformal": {
                "dev_answers": 3,
                "conformal@0.2": {"rule": "conformal", "alpha": 0.2, "delta": None, "refused": "few"},
            }
        },
        "pararel": {"conformal": None},  # no goal budget in this fold
    }
    row = pooled_conformal(claims)["conformal@0.2"]
    assert row["test_answers"] == 60 and row["without_false"]["count"] == 49
    assert row["without_false"]["ci95"] == clopper_pearson(49, 60)
    assert row["threshold"] == {"nq": 0.3, "hq": 0.6} and row["refused_domains"] == ["starter"]
    assert abs(row["claims_kept"] - (40 * 0.5 + 20 * 0.2) / 60) < 1e-12
