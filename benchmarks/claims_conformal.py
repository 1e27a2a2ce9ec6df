"""The conformal rows of the claims benchmark: a claim threshold tuned on dev answers, checked on test answers.

For each claim estimator, the compound answers are split by prompt (seeded) into a dev half and a test half.
On the dev half, :mod:`candor.serve.factuality` tunes the claim threshold for each α (split conformal, and
risk control at δ); on the test half, never seen by the tuning, each row reports the share of refined answers
(of more than one claim) holding no false claim, with its 95% Clopper–Pearson interval, against the promised
1 − α, the same share before refining, and how much is kept: the share of claims and of the answers' text
(characters of the refined text over the answer's). A claim with no label (a failure mode) counts as false,
on dev and on test alike, as the guarantee counts it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from candor.annotation.claims import refine
from candor.annotation.records import Record
from candor.data.splits import seeded_shuffle
from candor.evaluation.claim_report import claim_rows
from candor.serve import factuality as fa
from candor.serve.thresholds import clopper_pearson
from candor.util.errors import CandorError

ALPHAS = (0.1, 0.2, 0.3)
DELTA = 0.1
SEED = "claims-conformal"


def split_by_prompt(records: Sequence[Record], seed: int | str = SEED) -> tuple[list[Record], list[Record]]:
    """(dev, test): the prompts shuffled by ``seed`` and cut in half (each record is one prompt's answer)."""
    ids = seeded_shuffle(sorted({r.id for r in records}), seed)
    dev_ids = set(ids[: len(ids) // 2])
    return [r for r in records if r.id in dev_ids], [r for r in records if r.id not in dev_ids]


def text_kept(records: Sequence[Record], values: Sequence[Sequence[float]], threshold: float) -> float:
    """Characters of the refined answers over the answers' characters (answers of more than one claim)."""
    kept = total = 0
    for rec, vals in zip(records, values, strict=True):
        if len(rec.claims or []) > 1:
            refined = refine(rec.greedy.text, rec.claims, vals, threshold, "remove").text  # type: ignore[arg-type]
            kept, total = kept + len(refined), total + len(rec.greedy.text)
    return kept / total if total else 0.0


def on_test(
    guarantee: fa.FactualityGuarantee, test: Sequence[Record], values: Sequence[Sequence[float]], name: str
) -> dict[str, Any]:
    """What the tuned threshold gives on the test answers (see the module docstring)."""
    claims = fa.labelled_claims(claim_rows(test, {name: list(values)}), name)
    n = claims.n_answers
    if n == 0:
        return {"refused": "no test answer of more than one claim"}
    clean, kept = fa.refined_outcome(claims, guarantee.threshold)
    before, _ = fa.refined_outcome(claims, 0.0)
    interval = clopper_pearson(clean, n)
    return {
        "test_answers": n,
        "without_false": {"value": clean / n, "count": clean, "ci95": interval},
        "promised": 1 - guarantee.alpha,
        "interval_below_promise": interval[1] < 1 - guarantee.alpha,
        "without_false_unrefined": before / n,
        "claims_kept": kept,
        "text_kept": text_kept(test, values, guarantee.threshold),
    }


def conformal_rows(
    records: Sequence[Record],
    values: dict[str, list[list[float]]],
    *,
    alphas: Sequence[float] = ALPHAS,
    delta: float = DELTA,
    seed: int | str = SEED,
) -> dict[str, Any]:
    """Per estimator, per rule and α: the threshold tuned on the dev half and what it gives on the test half.

    ``values[name]`` holds the claim values of ``records[: len(values[name])]`` (an estimator run on fewer
    answers covers a prefix). A rule refused on too few dev answers says so in its row.
    """
    out: dict[str, Any] = {}
    for name, vals in values.items():
        scored = list(records[: len(vals)])
        by_id = {r.id: v for r, v in zip(scored, vals, strict=True)}
        dev, test = split_by_prompt(scored, seed)
        dev_claims = fa.labelled_claims(claim_rows(dev, {name: [by_id[r.id] for r in dev]}), name)
        rows: dict[str, Any] = {"dev_answers": dev_claims.n_answers, "dev_counts": dev_claims.counts}
        for rule, rule_delta in (("conformal", None), ("risk", delta)):
            for alpha in alphas:
                key = f"{rule}@{alpha:g}"
                try:
                    g = fa.tune(dev_claims, name, alpha, rule_delta)
                except CandorError as exc:
                    rows[key] = {"rule": rule, "alpha": alpha, "delta": rule_delta, "refused": str(exc)}
                    continue
                rows[key] = {
                    "rule": rule,
                    "alpha": alpha,
                    "delta": rule_delta,
                    "threshold": g.threshold,
                    "guarantee": g.statement,
                    "dev_without_false": g.dev_without_false,
                    "dev_claims_kept": g.dev_claims_kept,
                    **on_test(g, test, [by_id[r.id] for r in test], name),
                }
        out[name] = rows
    return out
