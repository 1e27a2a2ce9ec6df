"""The EliCal claim head, leave one domain out, on the compound-question generations (issue 56 part 1, goal P11).

For each domain of the compound prompts (starter, nq, hq, 2wikimultihopqa, pararel; one domain per prompt)
in turn: the claim head (``candor train elical-claims``: stage 1 on each claim's self-consistency over the
k samples, stage 2 on a budget of claim labels with the ``universal`` target's rule, the feature pooling
chosen on the dev slice) trains on the **other** domains' prompts only and stops early on a dev slice
carved from them; its claims are scored on the held-out domain (AUROC and bias-corrected ECE against the
claim labels, intervals bootstrapped by answer, n given). Nothing is selected on the held-out domain.

Beside it, the question head asked alone: EliCal (question level, the same budgets, target and protocol)
trained on the other domains' questions asked alone (``alone.jsonl``) and scored on the held-out domain's
questions asked alone. The P11 goal: the claim head within 3 AUROC points of it and ECE ≤ 5 at 100 labels.
When ``alone.jsonl`` does not exist yet (generation writes it after every compound prompt), that column is
reported as missing, with the reason.

Runs on whatever prompts ``benchmarks/cache/claims/compound.jsonl`` holds and says how many.

    python -m benchmarks.claims_head [--seeds 0] [--bootstrap 1000] [--out benchmarks/results/claims_head.json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.claims_data import CLAIMS_CACHE
from benchmarks.common import RESULTS, logger, setup_logging, write_json
from candor.annotation.judges import DEFAULT_CONSISTENCY_JUDGE
from candor.annotation.records import Record, read_records
from candor.evaluation.claims import claim_metrics
from candor.train.common import load_causal_lm
from candor.train.elical import WHOLE_POOL, Budget, EliCalConfig, carve_dev, train_elical
from candor.train.elical.claim_head import (
    ClaimRows,
    claim_rows,
    fit_claim_heads,
    fresh_head,
    prepare_claims,
    score_rows,
)
from candor.util.cpu import describe

MODEL = "smollm2-135m"
TEMPLATE = "compound"  # the prompts were generated with it (claims_data.py)
OUT = RESULTS / "claims_head.json"
BUDGETS: tuple[Budget, ...] = (Budget(25), Budget(50), Budget(100), Budget(200), WHOLE_POOL)
FEW = 10  # fewer correct (or wrong) claims than this: the row is marked few_of_a_class
TARGET_PROMPTS = 500  # what claims_generate is asked for (--prompts 500)
GOAL = {"budget": "100", "auroc_gap_points": 3.0, "ece_points": 5.0}


def domain_of(record: Record) -> str:
    return record.item.dataset.removeprefix("compound-")


def usable_budgets(n_labelled: int) -> list[Budget]:
    """The budgets the pool can give (a budget over the labelled claims is left out, never clipped)."""
    return [b for b in BUDGETS if b.is_all or b.count <= n_labelled]  # type: ignore[operator]


def metrics(conf: Sequence[float], labels: Sequence[int], groups: Sequence[str], bootstrap: int) -> dict[str, Any]:
    out = claim_metrics(conf, labels, groups, metrics=["auroc", "ece"], bootstrap=bootstrap)
    positives = int(np.sum(labels))
    # A convention, not a test: with fewer than FEW of either class an AUROC moves by whole points per claim.
    few = min(positives, len(labels) - positives) < FEW
    return {**out, "n": len(labels), "positives": positives, "answers": len(set(groups)), "few_of_a_class": few}


def claim_fold(
    records: list[Record], rows: ClaimRows, held_out: str, make_head: Any, config: EliCalConfig, bootstrap: int
) -> dict[str, Any]:
    """The claim head trained without ``held_out`` (dev slice carved from the other domains' prompts)."""
    others = [r for r in records if domain_of(r) != held_out]
    _, dev = carve_dev(others, seed=config.seed)
    dev_ids = {r.id for r in dev}
    domain = np.array([domain_of(records[i]) for i in rows.record])
    in_dev = np.array([records[i].id in dev_ids for i in rows.record], dtype=bool)
    train_rows = rows.take((domain != held_out) & ~in_dev)
    dev_rows = rows.take((domain != held_out) & in_dev)
    test_rows = rows.take((domain == held_out) & rows.scored)
    budgets = usable_budgets(int(train_rows.scored.sum()))
    fitted = fit_claim_heads(make_head, train_rows, dev_rows, config, budgets)
    by_budget = {}
    for key, fit in fitted.items():
        conf = score_rows(fit.head, test_rows, fit.pooling)
        by_budget[key] = {
            **metrics(conf.tolist(), test_rows.label.astype(int).tolist(), test_rows.ids, bootstrap),
            "pooling": fit.choice,
            "n_train_labels": fit.stages[1].n_train,
        }
    return {
        "train_prompts": len(others) - len(dev),
        "dev_prompts": len(dev),
        "train_claims": {"stage1": int(train_rows.has_consistency.sum()), "labelled": int(train_rows.scored.sum())},
        "budgets_left_out": [str(b) for b in BUDGETS if b not in budgets],
        "by_budget": by_budget,
    }


def question_fold(
    alone: list[Record], held_out: str, config: EliCalConfig, model: Any, tokenizer: Any, bootstrap: int
) -> dict[str, Any]:
    """The question head (EliCal) trained on the other domains' questions asked alone, scored on this one's."""
    others = [r for r in alone if r.item.meta.get("domain") != held_out]
    test = [r for r in alone if r.item.meta.get("domain") == held_out]
    pool, dev = carve_dev(others, seed=config.seed)
    budgets = [b for b in BUDGETS if b.is_all or b.count <= len(pool)]  # type: ignore[operator]
    by_budget = {}
    with tempfile.TemporaryDirectory(prefix="candor-claims-head-") as scratch:
        for budget in budgets:
            result = train_elical(
                pool,
                dev,
                method="elical",
                config=config,
                budget=budget,
                out_dir=Path(scratch) / str(budget),
                model=model,
                tokenizer=tokenizer,
            )
            conf = result.model.predict(test)
            labels = [int(bool(r.greedy_correct)) for r in test]
            by_budget[str(budget)] = metrics(conf.tolist(), labels, [r.id for r in test], bootstrap)
    return {"train_questions": len(pool), "dev_questions": len(dev), "by_budget": by_budget}


def alone_by_domain(records: list[Record]) -> list[Record]:
    """The questions asked alone (``alone.jsonl``), each tagged with its compound prompt's domain."""
    path = CLAIMS_CACHE / "alone.jsonl"
    if not path.exists():
        return []
    domain = {p["id"]: domain_of(r) for r in records for p in r.item.meta["parts"]}
    out = []
    for rec in read_records(path):
        if rec.id in domain:
            rec.item.meta["domain"] = domain[rec.id]
            out.append(rec)
    return out


def goal_rows(claims: dict[str, Any], questions: dict[str, Any] | None) -> dict[str, Any]:
    """Per held-out domain at the goal's budget: the AUROC gap and ECE against P11, and by how much it misses."""
    key = GOAL["budget"]
    out = {}
    for domain, fold in claims.items():
        cell = fold["by_budget"].get(key)
        if cell is None:
            out[domain] = {"note": f"no {key}-label budget: the other domains hold too few labelled claims"}
            continue
        auroc, ece = cell["auroc"]["value"], cell["ece"].get("corrected", cell["ece"]["value"])
        row: dict[str, Any] = {
            "claim_auroc": auroc,
            "claim_ece": ece,
            "n": cell["n"],
            "positives": cell["positives"],
            "few_of_a_class": cell["few_of_a_class"],
        }
        row["ece_miss_points"] = None if ece is None else max(0.0, 100 * ece - GOAL["ece_points"])
        q = (questions or {}).get(domain, {}).get("by_budget", {}).get(key)
        if q is None:
            row["question_auroc"] = None
            row["auroc_miss_points"] = None
        else:
            row["question_auroc"] = q["auroc"]["value"]
            gap = 100 * (q["auroc"]["value"] - auroc) if auroc is not None and q["auroc"]["value"] is not None else None
            row["auroc_gap_points"] = gap
            row["auroc_miss_points"] = None if gap is None else max(0.0, gap - GOAL["auroc_gap_points"])
        out[domain] = row
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (budgets drawn, heads initialized)")
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-epochs", type=int, default=None, help="cap each stage's epochs (a quick run)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    setup_logging()
    torch.set_num_threads(args.threads)
    started = time.time()
    records = read_records(CLAIMS_CACHE / "compound.jsonl")
    model, tokenizer = load_causal_lm(MODEL)
    labels = prepare_claims(records, tokenizer)
    domains = list(dict.fromkeys(domain_of(r) for r in records))
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = []
    for seed in seeds:
        config = EliCalConfig(model=MODEL, cal_target="hard", seed=seed, max_epochs=args.max_epochs)
        probe = fresh_head(model, tokenizer, TEMPLATE, config)
        rows = claim_rows(probe, records, DEFAULT_CONSISTENCY_JUDGE)

        def make(config: EliCalConfig = config) -> Any:
            return fresh_head(model, tokenizer, TEMPLATE, config)

        claims = {d: claim_fold(records, rows, d, make, config, args.bootstrap) for d in domains}
        alone = alone_by_domain(records)
        if alone:
            q_config = EliCalConfig(model=MODEL, seed=seed, max_epochs=args.max_epochs)
            questions: dict[str, Any] | None = {
                d: question_fold(alone, d, q_config, model, tokenizer, args.bootstrap) for d in domains
            }
            missing = None
        else:
            questions = None
            missing = "alone.jsonl not generated yet (claims_generate writes it after every compound prompt)"
        runs.append(
            {
                "seed": seed,
                "claim_head": claims,
                "question_head_alone": questions,
                "question_head_missing": missing,
                "goal": goal_rows(claims, questions),
            }
        )
    payload = {
        "model": MODEL,
        "machine": describe(),
        "partial": len(records) < TARGET_PROMPTS,
        "target_prompts": TARGET_PROMPTS,
        "size": {
            "prompts": len(records),
            "by_domain": {d: sum(domain_of(r) == d for r in records) for d in domains},
            **labels,
        },
        "protocol": (
            "leave one domain out: the claim head trains on the other domains' prompts (a seeded 10% of them carved "
            "as the dev slice for early stopping and the pooling choice) and is scored on the held-out domain's "
            "scored claims; ECE is the bias-corrected estimate when bootstrapped"
        ),
        "judge": DEFAULT_CONSISTENCY_JUDGE,
        "budgets": [str(b) for b in BUDGETS],
        "goal": GOAL,
        "runs": runs,
        "wall_s": round(time.time() - started, 1),
        "command": " ".join(["python -m benchmarks.claims_head", *sys.argv[1:]]),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    write_json(args.out, payload)
    logger.info("wrote %s", args.out)


if __name__ == "__main__":
    main()
