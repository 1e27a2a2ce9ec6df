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
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.claims_conformal import conformal_rows
from benchmarks.claims_data import CLAIMS_CACHE
from benchmarks.common import RESULTS, logger, setup_logging, write_json
from candor.annotation.judges import DEFAULT_CONSISTENCY_JUDGE
from candor.annotation.records import Record, read_records
from candor.evaluation.claims import claim_metrics, paired_gap
from candor.serve.thresholds import clopper_pearson
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
NAME = "elical-claims"
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
            # every scored held-out claim's confidence: (record id, claim index, claim's question, value, label)
            "values": [
                [records[i].id, int(j), records[i].claims[j].question, float(v), int(y)]  # type: ignore[index]
                for i, j, v, y in zip(test_rows.record, test_rows.claim, conf, test_rows.label, strict=True)
            ],
        }
    conformal = None
    if GOAL["budget"] in fitted:
        fit = fitted[GOAL["budget"]]
        held = [i for i, r in enumerate(records) if domain_of(r) == held_out]
        all_rows = rows.take(domain == held_out)
        values = {i: [0.0] * len(records[i].claims or []) for i in held}  # a claim on no token: never kept
        for i, j, v in zip(all_rows.record, all_rows.claim, score_rows(fit.head, all_rows, fit.pooling), strict=True):
            values[i][j] = float(v)
        conformal = conformal_rows([records[i] for i in held], {NAME: [values[i] for i in held]})[NAME]
    return {
        "train_prompts": len(others) - len(dev),
        "dev_prompts": len(dev),
        "conformal": conformal,
        "train_claims": {"stage1": int(train_rows.has_consistency.sum()), "labelled": int(train_rows.scored.sum())},
        "budgets_left_out": [str(b) for b in BUDGETS if b not in budgets],
        "by_budget": by_budget,
    }


def question_fold(
    alone: list[Record],
    held_out: str,
    config: EliCalConfig,
    model: Any,
    tokenizer: Any,
    bootstrap: int,
    asked: Sequence[Budget] = BUDGETS,
) -> dict[str, Any]:
    """The question head (EliCal) trained on the other domains' questions asked alone, scored on this one's."""
    others = [r for r in alone if r.item.meta.get("domain") != held_out]
    test = [r for r in alone if r.item.meta.get("domain") == held_out]
    pool, dev = carve_dev(others, seed=config.seed)
    budgets = [b for b in asked if b.is_all or b.count <= len(pool)]  # type: ignore[operator]
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
            by_budget[str(budget)] = {
                **metrics(conf.tolist(), labels, [r.id for r in test], bootstrap),
                "values": {r.id: [float(v), y] for r, v, y in zip(test, conf, labels, strict=True)},
            }
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


def pooled(claims: dict[str, Any], bootstrap: int) -> dict[str, Any]:
    """Per budget, every held-out domain's claims together (each scored by the head that never saw its domain)."""
    out: dict[str, Any] = {}
    for budget in (str(b) for b in BUDGETS):
        folds = [fold["by_budget"].get(budget) for fold in claims.values()]
        if any(f is None for f in folds):
            out[budget] = {"note": "a fold's other domains hold fewer labelled claims than this budget"}
            continue
        rows = [row for f in folds for row in f["values"]]  # type: ignore[index]
        out[budget] = metrics([r[3] for r in rows], [r[4] for r in rows], [r[0] for r in rows], bootstrap)
    return out


def pooled_conformal(claims: dict[str, Any]) -> dict[str, Any]:
    """Each rule's per-domain conformal rows (tuned on half of one domain's prompts, checked on its other half)
    added up over domains: test answers without a false claim over test answers, with a Clopper–Pearson interval.

    Per domain the head never saw that domain, so its dev and test halves are scored by one function trained on
    neither: the split-conformal exchangeability holds within a domain, and the pooled share is a mean of shares
    each promised at least 1 − α.
    """
    folds = {d: f["conformal"] for d, f in claims.items() if f.get("conformal")}
    out: dict[str, Any] = {"domains": sorted(folds), "dev_answers": sum(f["dev_answers"] for f in folds.values())}
    keys = sorted({k for f in folds.values() for k, v in f.items() if isinstance(v, dict) and "rule" in v})
    for key in keys:
        cells = [f[key] for f in folds.values() if key in f]
        done = [c for c in cells if "refused" not in c]
        first = cells[0]
        row: dict[str, Any] = {"rule": first["rule"], "alpha": first["alpha"], "delta": first["delta"]}
        row["refused_domains"] = [d for d, f in folds.items() if "refused" in f.get(key, {"refused": 1})]
        if not done:
            out[key] = {**row, "refused": "refused in every domain (too few dev answers)"}
            continue
        n = sum(c["test_answers"] for c in done)
        clean = sum(c["without_false"]["count"] for c in done)
        interval = clopper_pearson(clean, n)
        out[key] = {
            **row,
            "threshold": {d: f[key]["threshold"] for d, f in folds.items() if "threshold" in f.get(key, {})},
            "test_answers": n,
            "without_false": {"value": clean / n, "count": clean, "ci95": interval},
            "promised": 1 - row["alpha"],
            "interval_below_promise": interval[1] < 1 - row["alpha"],
            "without_false_unrefined": sum(c["without_false_unrefined"] * c["test_answers"] for c in done) / n,
            "claims_kept": sum(c["claims_kept"] * c["test_answers"] for c in done) / n,
            "text_kept": sum(c["text_kept"] * c["test_answers"] for c in done) / n,
        }
    return out


def first_claims(values: list[list[Any]]) -> dict[tuple[str, int], tuple[float, int]]:
    """Per (prompt id, question position): the first scored claim's value and label (claims in answer order)."""
    out: dict[tuple[str, int], tuple[float, int]] = {}
    for record_id, _, question, value, label in sorted(values, key=lambda r: (r[0], r[1])):
        if question is not None:
            out.setdefault((record_id, int(question)), (float(value), int(label)))
    return out


def same_questions(
    records: list[Record], claims: dict[str, Any], questions: dict[str, Any], bootstrap: int
) -> dict[str, Any]:
    """The claim head in the answer against the question head asked alone, on the same questions.

    Per budget, per held-out domain and pooled over domains: each question of a prompt whose answer holds a
    scored claim at its position (the first such claim) is paired with the same question asked alone;
    AUROC on both sides (each against its own label: the claim's, the alone answer's) and the gap, in the
    answer minus alone, with a paired bootstrap over prompts.
    """
    parts = {r.id: [p["id"] for p in r.item.meta["parts"]] for r in records}
    out: dict[str, Any] = {}
    for budget in (str(b) for b in BUDGETS):
        per_domain: dict[str, Any] = {}
        pairs_all: list[tuple[str, float, int, float, int]] = []
        for domain, fold in claims.items():
            cell = fold["by_budget"].get(budget)
            alone = questions.get(domain, {}).get("by_budget", {}).get(budget)
            if cell is None or alone is None:
                continue
            pairs = [
                (rid, v, y, *alone["values"][parts[rid][q]])
                for (rid, q), (v, y) in first_claims(cell["values"]).items()
                if q < len(parts[rid]) and parts[rid][q] in alone["values"]
            ]
            pairs_all.extend(pairs)
            per_domain[domain] = paired_row(pairs, bootstrap)
        if per_domain:
            out[budget] = {"by_domain": per_domain, "pooled": paired_row(pairs_all, bootstrap)}
    return out


def paired_row(pairs: list[tuple[str, float, int, float, int]], bootstrap: int) -> dict[str, Any]:
    """AUROC in the answer and alone over the same questions, and their paired gap (None when a side is one-class)."""
    if not pairs:
        return {"questions": 0}
    inside = ([p[1] for p in pairs], [p[2] for p in pairs], [p[0] for p in pairs])
    outside = ([p[3] for p in pairs], [p[4] for p in pairs], [p[0] for p in pairs])
    row: dict[str, Any] = {
        "questions": len(pairs),
        "correct_in_answer": int(sum(inside[1])),
        "correct_alone": int(sum(outside[1])),
        "in_answer": claim_metrics(*inside, metrics=["auroc"], bootstrap=bootstrap)["auroc"],
        "alone": claim_metrics(*outside, metrics=["auroc"], bootstrap=bootstrap)["auroc"],
    }
    one_class = len({*inside[1]}) < 2 or len({*outside[1]}) < 2
    row["gap_auroc"] = None if one_class else paired_gap(inside, outside, "auroc", bootstrap=bootstrap)
    return row


def goal_rows(
    claims: dict[str, Any], same: dict[str, Any] | None, pooled_cells: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Per held-out domain (and pooled) at the goal's budget: the claim head's AUROC gap to the question head asked
    alone on the same questions, its ECE, and by how much each misses P11."""
    key = GOAL["budget"]
    out = {}
    for domain, fold in claims.items():
        cell = fold["by_budget"].get(key)
        if cell is None:
            out[domain] = {"note": f"no {key}-label budget: the other domains hold too few labelled claims"}
            continue
        out[domain] = {**ece_goal(cell), **auroc_goal((same or {}).get(key, {}).get("by_domain", {}).get(domain))}
    if same and key in same:
        cell = (pooled_cells or {}).get(key)
        out["pooled"] = {**(ece_goal(cell) if cell else {}), **auroc_goal(same[key]["pooled"])}
    return out


def ece_goal(cell: dict[str, Any]) -> dict[str, Any]:
    """The ECE half of P11 on one cell of claims: its AUROC and bias-corrected ECE, and the ECE's miss."""
    auroc, ece = cell["auroc"]["value"], cell["ece"].get("corrected", cell["ece"]["value"])
    return {
        "claim_auroc": auroc,
        "claim_ece": ece,
        "n": cell["n"],
        "positives": cell["positives"],
        "few_of_a_class": cell["few_of_a_class"],
        "ece_miss_points": None if ece is None else max(0.0, 100 * ece - GOAL["ece_points"]),
    }


def auroc_goal(pair: dict[str, Any] | None) -> dict[str, Any]:
    """The AUROC half of P11 on the same questions: the question head alone minus the claim head, and the miss."""
    if not pair or pair.get("gap_auroc") is None or pair["gap_auroc"]["value"] is None:
        return {"question_auroc": None, "auroc_gap_points": None, "auroc_miss_points": None}
    gap = -100 * pair["gap_auroc"]["value"]  # alone minus in the answer: positive when the claim head is behind
    return {
        "same_questions": pair["questions"],
        "claim_auroc_same_questions": pair["in_answer"]["value"],
        "question_auroc": pair["alone"]["value"],
        "auroc_gap_points": gap,
        "auroc_gap_ci_points": [-100 * c for c in reversed(pair["gap_auroc"]["ci"])] if pair["gap_auroc"]["ci"] else [],
        "auroc_miss_points": max(0.0, gap - GOAL["auroc_gap_points"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (budgets drawn, heads initialized)")
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-epochs", type=int, default=None, help="cap each stage's epochs (a quick run)")
    parser.add_argument(
        "--question-budgets",
        default=",".join(str(b) for b in BUDGETS),
        help="budgets of the question head asked alone (each retrains stage 1: about 1.5 min per budget and domain)",
    )
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--goal-only",
        action="store_true",
        help="recompute only each run's goal rows from the cells already in --out (no training)",
    )
    args = parser.parse_args()
    setup_logging()
    if args.goal_only:
        payload = json.loads(args.out.read_text())
        for run in payload["runs"]:
            run["goal"] = goal_rows(run["claim_head"], run["same_questions"], run["claim_head_pooled"])
        payload["goal_recomputed"] = " ".join(["python -m benchmarks.claims_head", *sys.argv[1:]])
        write_json(args.out, payload)
        return
    torch.set_num_threads(args.threads)
    started = time.time()
    records = read_records(CLAIMS_CACHE / "compound.jsonl")
    model, tokenizer = load_causal_lm(MODEL)
    labels = prepare_claims(records, tokenizer)
    domains = list(dict.fromkeys(domain_of(r) for r in records))
    seeds = [int(s) for s in args.seeds.split(",")]
    question_budgets = [Budget.parse(b) for b in args.question_budgets.split(",") if b]
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
                d: question_fold(alone, d, q_config, model, tokenizer, args.bootstrap, question_budgets)
                for d in domains
            }
            missing = None
            same = same_questions(records, claims, questions, args.bootstrap)  # type: ignore[arg-type]
        else:
            questions, same = None, None
            missing = "alone.jsonl not generated yet (claims_generate writes it after every compound prompt)"
        pooled_cells = pooled(claims, args.bootstrap)
        runs.append(
            {
                "seed": seed,
                "claim_head": claims,
                "claim_head_pooled": pooled_cells,
                "conformal": pooled_conformal(claims),
                "question_head_alone": questions,
                "question_head_missing": missing,
                "same_questions": same,
                "goal": goal_rows(claims, same, pooled_cells),
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
