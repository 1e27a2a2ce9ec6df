"""Claim-level confidence on compound questions: the benchmark of docs/claims.md.

A claim set with exact labels that runs on a CPU: prompts of 2-4 questions
("Answer each question in one short sentence. 1. … 2. …", one fixed worked
example in the conversation), from the starter set and the HonestyBench-mini
in-domain test questions, answered by the embedded model (SmolLM2-135M). Each
sentence of an answer is a claim, labelled by the gold aliases of the question
at its position. Echoed questions, answers to another question of the prompt,
repeated lines and lines past the last question are detected, counted and left
out of the claim metrics (docs/claims.md "Labels").

Phase one (claims_generate.py) writes the answers; this script, phase two:

- scores every claim estimator (values cached per method in
  ``benchmarks/cache/claims/values.json``, so a killed run resumes), timing each;
- claim AUROC / ECE / PRR / AURC per estimator, intervals bootstrapped by answer;
- the same questions asked alone, scored by the matching answer-level estimator:
  the AUROC gap (in the answer minus alone), paired bootstrap by prompt;
- refinement: factual precision at 50 / 75 / 90% of claims kept;
- conformal factuality (benchmarks/claims_conformal.py): the claim threshold tuned on a dev half of the
  prompts for α = 0.1 / 0.2 / 0.3 (split conformal, and risk control at δ = 0.1), and on the test half the
  share of refined answers without a false claim (95% Clopper–Pearson) against 1 − α, with the share of
  claims and of text kept;
- cost per answer of each estimator against generating the answer;
- agreement with lm-polygraph's claim estimators (its own venv; skipped with a
  reason when absent).

    python -m benchmarks.claims_generate --prompts 96 --k 3
    python -m benchmarks.claims [--ccp-answers 24] [--bootstrap 1000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.claims_conformal import conformal_rows
from benchmarks.claims_data import CLAIMS_CACHE, TOKENS_PER_QUESTION
from benchmarks.common import RESULTS, logger, setup_logging, write_json
from benchmarks.measure import Timer
from benchmarks.polygraph import ABSENT, polygraph_python, run_polygraph
from candor.annotation.claim_labels import label_compound
from candor.annotation.claim_split import split_claims
from candor.annotation.prompts import TEMPLATES
from candor.annotation.records import Record, read_records
from candor.backends import load_backend
from candor.backends.base import SamplingParams
from candor.backends.default_model import resolve_embedded
from candor.estimators.base import get_estimator
from candor.estimators.claim_base import contexts_from_records
from candor.estimators.claim_ccp import ClaimCCP, is_functional, token_alternatives
from candor.estimators.claim_scoring import built
from candor.evaluation.claims import claim_metrics, paired_gap, precision_at_kept
from candor.util.cpu import describe

MODEL = "smollm2-135m"
OUT = RESULTS / "claims.json"
HEAD_RESULTS = RESULTS / "claims_head.json"  # benchmarks/claims_head.py, run first
VALUES = CLAIMS_CACHE / "values.json"
# The answer-level estimator each claim estimator is compared with on the questions asked alone.
ALONE = {
    "claim-prob": "prob",
    "claim-perplexity": "n-prob",
    "claim-max-entropy": "token-entropy-max",
    "claim-ptrue": "p-true",
    "claim-consistency": "consis-lex",
    "claim-ccp[lexical]": None,
    "claim-ccp[llm]": None,
}
# lm-polygraph's estimator for each row, and candor's confidence taken back to lm-polygraph's scale
# (-log for the exponentiated ones, so tiny probabilities are compared where they differ).
POLYGRAPH = {
    "claim-prob": ("MaximumClaimProbability", lambda c: -np.log(c)),
    "claim-perplexity": ("PerplexityClaim", lambda c: -np.log(c)),
    "claim-max-entropy": ("MaxTokenEntropyClaim", lambda c: -np.log(c)),
    "claim-ccp[lexical]": ("ClaimConditionedProbabilityClaim", lambda c: -c),
}


def load_compound(backend: Any) -> list[Record]:
    records = read_records(CLAIMS_CACHE / "compound.jsonl")
    for rec in records:
        rec.claims = split_claims(rec.greedy.text, rec.greedy, decode=backend.decode)
    return records


# The rows scored: (row name, estimator, options, answers limit). claim-ccp's default judge (the
# model itself) asks ~90 word pairs per answer: on this CPU it runs on a few answers only, and the
# lexical judge gives the row on every answer.
ROWS = [
    ("claim-prob", "claim-prob", {}, None),
    ("claim-perplexity", "claim-perplexity", {}, None),
    ("claim-max-entropy", "claim-max-entropy", {}, None),
    ("claim-ptrue", "claim-ptrue", {}, None),
    ("claim-consistency", "claim-consistency", {}, None),
    ("claim-ccp[lexical]", "claim-ccp", {"judge": "lexical"}, None),
    ("claim-ccp[llm]", "claim-ccp", {}, "ccp"),
]


def score_all(records: list[Record], backend: Any, ccp_answers: int) -> tuple[dict[str, list[list[float]]], dict]:
    """Every row's values per record (cached per row and record id, so runs resume), and its seconds."""
    cache = json.loads(VALUES.read_text()) if VALUES.exists() else {}
    out, seconds = {}, {}
    for row, name, options, limit in ROWS:
        subset = records[:ccp_answers] if limit == "ccp" else records
        entry = cache.setdefault(row, {"values": {}, "wall": 0.0, "cpu": 0.0, "answers": 0, "judge_pairs": 0})
        todo = [r for r in subset if r.id not in entry["values"]]
        for start in range(0, len(todo), 8):  # saved every 8 answers
            chunk = todo[start : start + 8]
            estimator = built(name, backend, dict(options))
            with Timer() as t:
                values = estimator.estimate(contexts_from_records(chunk, backend), backend)
            entry["values"].update({r.id: v.tolist() for r, v in zip(chunk, values, strict=True)})
            entry["wall"] += t.wall
            entry["cpu"] += t.cpu
            entry["answers"] += len(chunk)
            entry["judge_pairs"] += getattr(estimator, "asked", 0)
            VALUES.write_text(json.dumps(cache))
            logger.info("%s: %d more answers in %.1fs", row, len(chunk), t.wall)
        out[row] = [entry["values"][r.id] for r in subset]
        seconds[row] = {k: entry[k] for k in ("wall", "cpu", "answers", "judge_pairs")}
    return out, seconds


def flat(records: list[Record], values: list[list[float]]) -> tuple[list[float], list[int], list[str]]:
    """Scored claims only: (confidences, labels, answer ids)."""
    conf, y, g = [], [], []
    for rec, vals in zip(records, values, strict=False):
        for claim, v in zip(rec.claims or [], vals, strict=True):
            if claim.scored:
                conf.append(v)
                y.append(int(claim.label))  # type: ignore[arg-type]
                g.append(rec.id)
    return conf, y, g


def first_claims(records: list[Record], values: list[list[float]]) -> dict[tuple[str, int], tuple[float, int]]:
    """Per (prompt, question position): the first scored claim's value and label."""
    out: dict[tuple[str, int], tuple[float, int]] = {}
    for rec, vals in zip(records, values, strict=False):
        for claim, v in zip(rec.claims or [], vals, strict=True):
            if claim.scored and claim.question is not None:
                out.setdefault((rec.id, claim.question), (v, int(claim.label)))  # type: ignore[arg-type]
    return out


def alone_comparison(records, values, alone, backend, bootstrap) -> dict[str, Any]:
    """AUROC of each claim estimator in the answer against its answer-level match on the questions alone."""
    by_id = {r.id: r for r in alone}
    out: dict[str, Any] = {}
    for name, answer_level in ALONE.items():
        if answer_level is None or name not in values:
            out[name] = {"answer_level": None, "note": "no answer-level counterpart"}
            continue
        pairs = first_claims(records, values[name])
        matched = []
        for rec in records:
            for position, part in enumerate(rec.item.meta["parts"]):
                if (rec.id, position) in pairs and part["id"] in by_id:
                    matched.append((rec.id, pairs[(rec.id, position)], by_id[part["id"]]))
        alone_recs = [m[2] for m in matched]
        alone_conf = get_estimator(answer_level).estimate(alone_recs, backend)
        inside = ([m[1][0] for m in matched], [m[1][1] for m in matched], [m[0] for m in matched])
        outside = (alone_conf.tolist(), [int(r.greedy_correct) for r in alone_recs], [m[0] for m in matched])
        out[name] = {
            "answer_level": answer_level,
            "questions": len(matched),
            "in_answer": claim_metrics(*inside, metrics=["auroc"], bootstrap=bootstrap)["auroc"],
            "alone": claim_metrics(*outside, metrics=["auroc"], bootstrap=bootstrap)["auroc"],
            "gap_auroc": paired_gap(inside, outside, "auroc", bootstrap=bootstrap),
            "accuracy_in_answer": float(np.mean(inside[1])),
            "accuracy_alone": float(np.mean(outside[1])),
        }
    return out


def generation_cost(records: list[Record], backend: Any, n: int) -> dict[str, float]:
    """Seconds per answer to generate the greedy answer again, for ``n`` prompts (the cost baseline)."""
    template = TEMPLATES.get("compound")
    sample = records[:n]
    with Timer() as t:
        for rec in sample:
            size = len(rec.item.meta["parts"])
            backend.generate(
                [template(rec.item, backend)], 0, SamplingParams(max_new_tokens=TOKENS_PER_QUESTION * size)
            )
    return {"answers": len(sample), "wall_per_answer": t.wall / len(sample), "cpu_per_answer": t.cpu / len(sample)}


def polygraph_agreement(records: list[Record], values: dict, backend: Any, n: int) -> dict[str, Any]:
    """Max |candor − lm-polygraph| per estimator on the first ``n`` answers (lm-polygraph's venv)."""
    python = polygraph_python()
    if python is None:
        return {"skipped": ABSENT}
    sample = [r for r in records[:n] if r.claims]
    contexts = contexts_from_records(sample, backend)
    ccp = ClaimCCP(judge="lexical")
    decisions = ccp.decisions(contexts)
    answers = []
    for ctx, dec in zip(contexts, decisions, strict=True):
        answers.append(
            {
                "prompt_ids": backend.encode([ctx.prompt])[0],
                "answer_ids": list(ctx.answer.token_ids),
                "logprobs": list(ctx.answer.logprobs),
                "claims": [c.tokens for c in ctx.claims],
                "alternatives": token_alternatives(ctx.answer),
                "decisions": dec,
                "functional": [is_functional(t) for t in ctx.answer.tokens],
            }
        )
    theirs = run_polygraph(python, {"model_path": str(resolve_embedded(MODEL)), "answers": answers, "threads": 2})
    entropy = built("claim-max-entropy", backend, {})
    mine = {
        "claim-prob": built("claim-prob", None, {}).estimate(contexts),
        "claim-perplexity": built("claim-perplexity", None, {}).estimate(contexts),
        # one answer per forward pass, as lm-polygraph's child runs them (no padding in the batch)
        "claim-max-entropy": [entropy.estimate([c], backend)[0] for c in contexts],
        "claim-ccp[lexical]": ccp.estimate(contexts),
    }
    batched = to_theirs_entropy(np.concatenate(entropy.estimate(contexts, backend)))
    out: dict[str, Any] = {"answers": len(sample), "claims": sum(len(c.claims) for c in contexts)}
    for name, (theirs_name, to_theirs) in POLYGRAPH.items():
        a = to_theirs(np.concatenate([np.asarray(v) for v in mine[name]]))
        b = np.concatenate([np.asarray(v, dtype=float) for v in theirs[theirs_name]])
        out[name] = {"polygraph": theirs_name, "max_abs_diff": float(np.max(np.abs(a - b)))}
    out["ccp_judge"] = "lexical (the same decisions given to both)"
    theirs_entropy = np.concatenate([np.asarray(v, dtype=float) for v in theirs["MaxTokenEntropyClaim"]])
    out["claim-max-entropy"]["max_abs_diff_batched"] = float(np.max(np.abs(batched - theirs_entropy)))
    out["claim-max-entropy"]["note"] = (
        "max_abs_diff: candor's entropies from one answer per forward pass, as lm-polygraph's child runs; "
        "max_abs_diff_batched: from candor's batched (padded) pass, as the scoring above ran"
    )
    return out


def to_theirs_entropy(conf: np.ndarray) -> np.ndarray:
    return -np.log(conf)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--ccp-answers", type=int, default=2, help="answers scored by claim-ccp with its llm judge (slow)"
    )
    parser.add_argument(
        "--score-only", action="store_true", help="fill the values cache and stop (run beside generation)"
    )
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--polygraph-answers", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--polygraph-only", action="store_true", help="recompute only polygraph_agreement in an existing --out"
    )
    parser.add_argument(
        "--head-only",
        action="store_true",
        help="recompute only elical_claims (from claims_head.json) in an existing --out",
    )
    args = parser.parse_args()
    setup_logging()
    if args.head_only:
        payload = json.loads(args.out.read_text())
        payload["elical_claims"] = claim_head_rows(payload["size"]["prompts"])
        write_json(args.out, payload)
        return
    torch.set_num_threads(args.threads)
    backend = load_backend(MODEL, "hf")
    records = load_compound(backend)
    if args.polygraph_only:
        payload = json.loads(args.out.read_text())
        payload["polygraph_agreement"] = polygraph_agreement(records, {}, backend, args.polygraph_answers)
        payload["polygraph_agreement"]["command"] = " ".join(["python -m benchmarks.claims", *sys.argv[1:]])
        write_json(args.out, payload)
        return
    alone = read_records(CLAIMS_CACHE / "alone.jsonl") if (CLAIMS_CACHE / "alone.jsonl").exists() else []
    labels = label_compound(records)
    logger.info("claims: %s", labels)
    values, seconds = score_all(records, backend, args.ccp_answers)
    if args.score_only:
        return
    estimators, refinement = {}, {}
    for name, vals in values.items():
        scored = records[: len(vals)]
        conf, y, g = flat(scored, vals)
        estimators[name] = claim_metrics(conf, y, g, bootstrap=args.bootstrap) | {
            "claims": len(conf),
            "answers": len(set(g)),
        }
        refinement[name] = precision_at_kept(conf, y, g, bootstrap=args.bootstrap)
    gen = generation_cost(records, backend, 8)
    cost = {
        name: {
            **s,
            "wall_per_answer": s["wall"] / s["answers"],
            "cpu_per_answer": s["cpu"] / s["answers"],
            "wall_vs_generation": s["wall"] / s["answers"] / gen["wall_per_answer"],
        }
        for name, s in seconds.items()
    }
    payload = {
        "model": MODEL,
        "machine": describe(),
        "size": {
            "prompts": len(records),
            "by_source": count_by_source(records),
            **labels,
            "k": records[0].provenance.get("k") if records else None,
            "alone_questions": len(alone),
        },
        "estimators": estimators,
        "alone_vs_in_answer": alone_comparison(records, values, alone, backend, args.bootstrap),
        "refinement": refinement,
        "conformal": conformal_rows(records, values),
        "cost": {"generation": gen, "estimators": cost},
        "polygraph_agreement": polygraph_agreement(records, values, backend, args.polygraph_answers),
        "elical_claims": claim_head_rows(len(records)),
        "command": " ".join(
            [
                f"python -m benchmarks.claims_generate --prompts {len(records)} --k 3 &&",
                "python -m benchmarks.claims_head &&",
                "python -m benchmarks.claims",
                *sys.argv[1:],
            ]
        ),
        "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    write_json(args.out, payload)
    logger.info("wrote %s", args.out)


def claim_head_rows(prompts: int, path: Path = HEAD_RESULTS) -> dict[str, Any]:
    """The EliCal claim head's rows (benchmarks/claims_head.py, left one domain out) when its results file was made
    on these very generations; else why they are missing."""
    if not path.exists():
        return {"missing": f"no {path.name}: run `python -m benchmarks.claims_head` first"}
    head = json.loads(path.read_text())
    if head.get("partial") or head["size"]["prompts"] != prompts or "claim_head_pooled" not in head["runs"][0]:
        return {"missing": f"{path.name} was made on {head['size']['prompts']} prompts, not these {prompts}"}
    run = head["runs"][0]
    strip = ("values",)
    return {
        "source": f"results/{path.name}",
        "command": head["command"],
        "finished": head["finished"],
        "protocol": head["protocol"],
        "seed": run["seed"],
        "pooled": run["claim_head_pooled"],
        "by_domain": {
            domain: {b: {k: v for k, v in cell.items() if k not in strip} for b, cell in fold["by_budget"].items()}
            for domain, fold in run["claim_head"].items()
        },
        "same_questions": run["same_questions"],
        "conformal": run["conformal"],
        "goal": run["goal"],
    }


def count_by_source(records: list[Record]) -> dict[str, int]:
    out: dict[str, int] = {}
    for rec in records:
        out[rec.item.dataset] = out.get(rec.item.dataset, 0) + 1
    return out


if __name__ == "__main__":
    main()
