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


def conformal_table(d: Json) -> str:
    """The conformal rows (benchmarks/claims_conformal.py): test share without a false claim against 1 − α."""
    if "conformal" not in d:
        return "_Not in `results/claims.json` yet: the next `python -m benchmarks.claims` run adds these rows._"
    rows = []
    for name, by_rule in d["conformal"].items():
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
                    f"{r['threshold']:.3g}",
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
    failures = ", ".join(f"{k} {v}" for k, v in size["failures"].items())
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
