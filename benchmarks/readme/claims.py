"""README parts on claim-level confidence, from results/claims.json."""

from __future__ import annotations

from pathlib import Path

from .formatting import SMALL_MARK, Json, estimate, load, md_table, notes_for


def _pct(cell: Json | None, metric: str = "auroc", n: int | None = None) -> str:
    """``75.6 [68, 82]`` (×100, interval in whole points); a dash when undefined; ECE bias-corrected
    (:func:`~.formatting.estimate`); the n < 30 mark alone on fewer than 30 items."""
    if not cell or cell.get("value") is None:
        return "–" if n is None or n >= 30 else "–" + SMALL_MARK
    return estimate(cell["value"], cell.get("ci"), metric, corrected=cell.get("corrected"), n=n)


def _signed(cell: Json) -> str:
    if cell.get("value") is None:
        return "–"
    v, ci = 100 * cell["value"], cell.get("ci") or [None, None]
    text = f"{v:+.1f}".replace("-", "−")
    if None not in ci:
        text += f" [{100 * ci[0]:+.0f}, {100 * ci[1]:+.0f}]".replace("-", "−")
    return text


def _batched(cell: Json) -> str:
    """The entropy agreement when candor's pass was batched (padded), where the results hold it."""
    if "max_abs_diff_batched" not in cell:
        return ""
    return f" (from candor's batched, padded pass: {cell['max_abs_diff_batched']:.1e})"


GOAL_BUDGET = "100"  # the claim head's conformal rows use its head at the P11 goal's budget (claims_head.py)


def conformal_table(d: Json) -> str:
    """The conformal rows (benchmarks/claims_conformal.py): test share without a false claim against 1 − α."""
    if "conformal" not in d:
        return "_Not in `results/claims.json` yet: the next `python -m benchmarks.claims` run adds these rows._"
    rows = []
    tables = dict(d["conformal"])
    head = d.get("elical_claims", {})
    if head.get("conformal"):
        tables[f"elical-claims@{GOAL_BUDGET} (tuned per held-out domain)"] = head["conformal"]
    for name, by_rule in tables.items():
        for r in by_rule.values():
            if not isinstance(r, dict) or "rule" not in r:
                continue
            rule = f"{r['rule']} α={r['alpha']:g}" + (f" δ={r['delta']:g}" if r.get("delta") is not None else "")
            if "refused" in r:
                rows.append(
                    [f"`{name}`", rule, str(by_rule["dev_answers"]), "–", f"refused: {r['refused']}", "", "", ""]
                )
                continue
            held, ci = r["without_false"], r["without_false"]["ci95"]
            rows.append(
                [
                    f"`{name}`",
                    rule,
                    f"{by_rule['dev_answers']} / {r['test_answers']}",
                    _threshold(r["threshold"]),
                    f"{100 * held['value']:.1f} [{100 * ci[0]:.0f}, {100 * ci[1]:.0f}] vs {100 * r['promised']:.0f}",
                    f"{100 * r['without_false_unrefined']:.0f}",
                    f"{100 * r['claims_kept']:.0f}",
                    f"{100 * r['text_kept']:.0f}",
                ]
            )
    return md_table(
        [
            "claim confidence",
            "rule",
            "dev / test answers",
            "threshold",
            "test answers without a false claim [95% CP] vs 1 − α (%)",
            "before refining (%)",
            "claims kept (%)",
            "text kept (%)",
        ],
        "llrrrrrr",
        rows,
    )


def claims_section(results: Path) -> dict[str, str]:
    d = load("claims", results)
    gen = d["cost"]["generation"]
    rows = []
    for name, m in d["estimators"].items():
        ref, cost = d["refinement"][name], d["cost"]["estimators"][name]
        rows.append(
            [
                f"`{name}`",
                f"{m['answers']} / {m['claims']}",
                _pct(m["auroc"], "auroc", m["claims"]),
                _pct(m["ece"], "ece", m["claims"]),
                _pct(m["prr"], "prr", m["claims"]),
                " / ".join(f"{100 * ref[k]['value']:.0f}" for k in ("50%", "75%", "90%", "100%"))
                if m["claims"] >= 30
                else "–" + SMALL_MARK,
                f"{cost['wall_per_answer']:.2f} ({cost['wall_vs_generation']:.2f}×)",
            ]
        )
    for budget, cell in d.get("elical_claims", {}).get("pooled", {}).items():
        if "n" not in cell:
            continue
        rows.append(
            [
                f"`elical-claims` @{budget} (each domain held out)",
                f"{cell['answers']} / {cell['n']}",
                _pct(cell["auroc"], "auroc", cell["n"]),
                _pct(cell["ece"], "ece", cell["n"]),
                "–",
                "–",
                "–",
            ]
        )
    alone = []
    for name, a in d["alone_vs_in_answer"].items():
        if not a.get("answer_level"):
            continue
        alone.append(
            [
                f"`{name}` vs `{a['answer_level']}`",
                str(a["questions"]),
                _pct(a["in_answer"], "auroc", a["questions"]),
                _pct(a["alone"], "auroc", a["questions"]),
                _signed(a["gap_auroc"]),
                f"{100 * a['accuracy_in_answer']:.0f}% / {100 * a['accuracy_alone']:.0f}%",
            ]
        )
    size = d["size"]
    failures = ", ".join(f"{k} {v} ({100 * v / size['claims']:.0f}% of claims)" for k, v in size["failures"].items())
    poly = d["polygraph_agreement"]
    poly_text = (
        poly.get("skipped")
        or "; ".join(
            f"`{k}` vs `{v['polygraph']}` max |diff| {v['max_abs_diff']:.1e}" + _batched(v)
            for k, v in poly.items()
            if isinstance(v, dict)
        )
        + f" ({poly.get('answers')} answers, {poly.get('claims')} claims)"
    )
    return {
        "table:claims": md_table(
            [
                "claim confidence",
                "answers / claims",
                "AUROC",
                "ECE",
                "PRR",
                "precision at 50/75/90/100% kept",
                f"s per answer (× generating it, {gen['wall_per_answer']:.2f} s)",
            ],
            "lrrrrrr",
            rows,
        )
        + notes_for(
            [c for r in rows for c in r],
            corrected=any(m["ece"].get("corrected") is not None for m in d["estimators"].values()),
        ),
        "table:claims-alone": md_table(
            [
                "in the answer vs asked alone",
                "questions",
                "AUROC in the answer",
                "AUROC alone",
                "gap",
                "accuracy in / alone",
            ],
            "lrrrrr",
            alone,
        ),
        "value:claims-size": (
            f"{size['prompts']} prompts ({', '.join(f'{k} {v}' for k, v in size['by_source'].items())}), "
            f"{size['claims']} claims, {size['scored']} scored ({size['correct']} correct); "
            f"left out as failure modes: {failures}; "
            f"{size['questions_answered']} of {size['questions_asked']} questions answered"
        ),
        "value:claims-polygraph": poly_text,
        "table:claims-conformal": conformal_table(d),
    }


def _head_cell(cell: Json | None, metric: str) -> str:
    """One claim-head cell: the metric with its interval, or why there is none (budget over the labels, n < 30)."""
    if cell is None or "note" in cell:
        return "–"
    m = cell[metric]
    text = estimate(m["value"], m.get("ci"), metric, corrected=m.get("corrected"), n=cell["n"])
    return text + ("²" if cell.get("few_of_a_class") and metric == "auroc" else "")


FEW_NOTE = "² fewer than 10 correct (or wrong) claims: the AUROC moves by whole points per claim."


def _head_table(run: Json, budgets: list[str], metric: str) -> str:
    folds = {**run["claim_head"], "pooled": None}
    rows = []
    for domain, fold in folds.items():
        by_budget = run["claim_head_pooled"] if fold is None else fold["by_budget"]
        first = next((c for c in by_budget.values() if c and "n" in c), None)
        size = "–" if first is None else f"{first['n']} / {first['positives']}"
        rows.append(
            [
                f"**{domain}**" if fold is None else domain,
                size,
                *(_head_cell(by_budget.get(b), metric) for b in budgets),
            ]
        )
    cells = [c for r in rows for c in r]
    notes = notes_for(cells, corrected=metric == "ece")
    if any(c.endswith("²") for c in cells):
        notes += f"\n\n{FEW_NOTE}"
    return (
        md_table(["held out", "claims / correct", *(f"@{b}" for b in budgets)], "lr" + "r" * len(budgets), rows) + notes
    )


def _goal_table(run: Json, budget: str) -> str:
    rows = []
    for domain, g in run["goal"].items():
        if "note" in g:
            rows.append([domain, "–", "–", "–", "–", g["note"], "–"])
            continue
        gap = g.get("auroc_gap_points")
        ci = g.get("auroc_gap_ci_points") or []
        gap_text = "–" if gap is None else f"{gap:+.1f}".replace("-", "−")
        if gap is not None and len(ci) == 2:
            gap_text += f" [{ci[0]:+.0f}, {ci[1]:+.0f}]".replace("-", "−")
        ece = g.get("claim_ece")
        rows.append(
            [
                f"**{domain}**" if domain == "pooled" else domain,
                str(g.get("same_questions", "–")),
                "–" if g.get("claim_auroc_same_questions") is None else f"{100 * g['claim_auroc_same_questions']:.1f}",
                "–" if g.get("question_auroc") is None else f"{100 * g['question_auroc']:.1f}",
                gap_text,
                "–" if ece is None else f"{100 * ece:.1f}" + ("" if g.get("n", 30) >= 30 else SMALL_MARK),
                "; ".join(
                    text
                    for text in (
                        _miss("AUROC", g.get("auroc_miss_points")),
                        _miss("ECE", g.get("ece_miss_points")),
                    )
                    if text
                )
                or "met",
            ]
        )
    return md_table(
        [
            f"held out (@{budget} claim labels)",
            "same questions",
            "claim head AUROC (in the answer)",
            "question head AUROC (asked alone)",
            "gap, alone − in the answer [95%]",
            "claim ECE (all claims)",
            "P11 missed by",
        ],
        "lrrrrrl",
        rows,
    )


def _threshold(value: float | str) -> str:
    """A conformal threshold as printed: the smallest positive float (keep every claim above exactly 0) as "> 0"."""
    if not isinstance(value, float):
        return "one per domain"
    return "> 0" if 0 < value < 1e-300 else f"{value:.3g}"


def _shift_table(run: Json, budget: str) -> str:
    """Per held-out domain: its share of correct claims against the head's mean confidence on them, and the
    head's AUROC on its own domains' dev slice (the pooling it chose) against the held-out domain's."""
    rows = []
    for domain, fold in run["claim_head"].items():
        cell = fold["by_budget"].get(budget)
        if cell is None:
            continue
        values = cell["values"]  # [prompt id, claim index, question, confidence, label]
        confidence = sum(v[3] for v in values) / len(values)
        correct = sum(v[4] for v in values)
        choice = cell["pooling"]
        rows.append(
            [
                domain,
                f"{len(values)} / {correct}",
                f"{100 * correct / len(values):.1f}",
                f"{100 * confidence:.1f}",
                f"{100 * choice['dev_auroc'][choice['pooling']]:.1f} ({choice['pooling']})",
                f"{100 * cell['auroc']['value']:.1f}",
            ]
        )
    return md_table(
        [
            f"held out (@{budget} claim labels)",
            "claims / correct",
            "% correct",
            "mean confidence ×100",
            "AUROC on the training domains' dev slice (pooling)",
            "AUROC on the held-out domain",
        ],
        "lrrrrr",
        rows,
    )


def _miss(what: str, points: float | None) -> str:
    if points is None:
        return ""
    return "" if points <= 0 else f"{what} {points:.1f} points"


def claims_head_section(results: Path) -> dict[str, str]:
    """The EliCal claim head left one domain out (results/claims_head.json, benchmarks/claims_head.py)."""
    d = load("claims_head", results)
    run = d["runs"][0]
    if "claim_head_pooled" not in run:
        missing = "_Not in `results/claims_head.json` yet: the next `python -m benchmarks.claims_head` run adds it._"
        return {
            "table:claims-head-auroc": missing,
            "table:claims-head-ece": missing,
            "table:claims-head-goal": missing,
            "table:claims-head-shift": missing,
            "value:claims-head-size": f"{d['size']['prompts']} prompts (an older run)",
        }
    size = d["size"]
    budgets = d["budgets"]
    return {
        "table:claims-head-auroc": _head_table(run, budgets, "auroc"),
        "table:claims-head-ece": _head_table(run, budgets, "ece"),
        "table:claims-head-goal": _goal_table(run, d["goal"]["budget"]),
        "table:claims-head-shift": _shift_table(run, d["goal"]["budget"]),
        "value:claims-head-size": (
            f"{size['prompts']} prompts ({', '.join(f'{k} {v}' for k, v in size['by_domain'].items())}), "
            f"{size['claims']} claims, {size['scored']} scored, {size['correct']} correct; seed {run['seed']}, "
            f"{d['wall_s'] / 60:.0f} min on {d['machine']['logical_cores']} cores"
            + (" (partial: fewer prompts than the benchmark's 500)" if d["partial"] else "")
        ),
    }
