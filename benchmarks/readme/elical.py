"""README parts on EliCal: the budget table, stage 2's rule and targets, and the head's cost."""

from __future__ import annotations

from pathlib import Path

from candor.train.elical.selection import factor_range

from .formatting import (
    DASH,
    Json,
    bold_best,
    estimate,
    gib,
    load,
    md_table,
    notes_for,
    pct,
    points,
    ratio,
    signed,
    with_ci,
)

ELICAL_ROWS = [  # (results key, README label)
    ("Eli-Only", "Eli-Only (no labels)"),
    *[
        (f"{m}@{b}", f"{m}@{b}" + (" (1800)" if b == "all" else ""))
        for b in ("100", "250", "500", "1000", "all")
        for m in ("Cal-Only", "EliCal")
    ],
    *[(f"EliCal@{b} (plain resume)", f"EliCal@{b}, plain resume") for b in ("100", "1000")],
    ("Eli-Only (lora)", "Eli-Only, lora (1 epoch)"),
    ("EliCal@1000 (lora)", "EliCal@1000, lora (1+1 epochs)"),
    ("N-Prob", "N-Prob"),
    ("Min-Prob", "Min-Prob"),
    ("Prob", "Prob"),
    ("Consis-Sem", "Consis-Sem"),
    ("Consis-Lex", "Consis-Lex"),
    ("Verbal-0", "Verbal-0"),
]


# The lora rows a run without lora carries over from the file it replaces (benchmarks/elical.py keep_previous_lora).
CARRIED_MARK = " †"
CARRIED_NOTE = (
    "† carried over from an earlier run of the benchmark, not rerun with the rows above: it predates the re-judged "
    "consistency verdicts and the stage-2 rule change, so it does not compare like with like."
)

TRAINING_FREE = ("Prob", "Min-Prob", "Consis-Lex", "Consis-Sem", "N-Prob")


def _corrected(m: Json, group: str, metric: str) -> float | None:
    """A biased metric's bias-corrected estimate where the results file holds one (written since issue 56)."""
    return (m.get("corrected") or {}).get(group, {}).get(metric)


def elical(r: Path) -> dict[str, str]:
    d = load("elical", r)
    methods = d["methods"]
    carried = bool((d.get("lora") or {}).get("carried_over"))
    rows, id_auroc, id_ece = [], [], []
    for key, label in ELICAL_ROWS:
        if key not in methods:  # a baseline not scored in this run (e.g. Verbal-0) is left out
            continue
        m = methods[key]
        rows.append(
            [
                label + (CARRIED_MARK if carried and key.endswith(" (lora)") else ""),
                with_ci(m["id"]["auroc"], m["ci95"]["id"]["auroc"]),
                signed(m["delta_vs_n_prob"]["id"]["auroc"]),
                estimate(m["id"]["ece"], m["ci95"]["id"]["ece"], "ece", corrected=_corrected(m, "id", "ece")),
                with_ci(m["id"]["alignment"], m["ci95"]["id"]["alignment"]),
                with_ci(m["ood"]["auroc"], m["ci95"]["ood"]["auroc"]),
                pct(m["ood"]["ece"]),
            ]
        )
        # a row carried over from an earlier run competes for no bold: it was not measured with the others
        old = carried and key.endswith(" (lora)")
        id_auroc.append(None if old else m["id"]["auroc"])
        id_ece.append(None if old else m["id"]["ece"])
    bold_best(rows, 1, id_auroc, lower=False)
    bold_best(rows, 3, id_ece, lower=True)
    n_id = sum(n for ds, n in d["sizes"]["test"].items() if d["roles"].get(ds) == "id")
    n_ood = sum(n for ds, n in d["sizes"]["test"].items() if d["roles"].get(ds) == "ood")
    table = md_table(
        ["method", f"ID AUROC (n = {n_id})", "Δ", "ID ECE", "ID Alignment", f"OOD AUROC (n = {n_ood})", "OOD ECE"],
        "lrrrrrr",
        rows,
    ) + notes_for(
        [r[3] for r in rows], corrected=any(_corrected(methods[k], "id", "ece") for k, _ in ELICAL_ROWS if k in methods)
    )
    if carried and any(k.endswith(" (lora)") for k in methods):
        table += f"\n\n{CARRIED_NOTE}"

    def auroc(key: str) -> float:
        return methods[key]["id"]["auroc"]

    gaps = {b: auroc(f"EliCal@{b}") - auroc(f"Cal-Only@{b}") for b in ("100", "250", "500", "1000", "all")}
    n_all = d["n_labels"]["all"]
    e100, c100 = methods["EliCal@100"]["id"], methods["Cal-Only@100"]["id"]
    ci_e, ci_c = methods["EliCal@100"]["ci95"]["id"]["auroc"], methods["Cal-Only@100"]["ci95"]["id"]["auroc"]
    ece100 = e100["ece"]
    ece_cmp = ", ".join(
        f"{name} {pct(methods[name]['id']['ece'])} ({ratio(methods[name]['id']['ece'], ece100)})"
        for name in sorted(TRAINING_FREE, key=lambda n: methods[n]["id"]["ece"])
    )
    lora_runs = [run for run in d["training_runs"] if run["mode"] == "lora"]
    stage = {run["method"]: run["cost"]["wall_s"] for run in lora_runs}
    head_runs = len(d["seeds"]) * (1 + 2 * len(d["budgets"]))  # Eli-Only, then Cal-Only and EliCal per budget
    return {
        "table:elical": table,
        **elical_rule(d),
        "value:elical-gap-100": (
            f"{points(gaps['100'])} AUROC points in-domain ({with_ci(e100['auroc'], ci_e)} "
            f"vs {with_ci(c100['auroc'], ci_c)})"
        ),
        "value:elical-gaps": (
            f"{points(gaps['250'])} at 250, {points(gaps['500'])} at 500, and "
            f"{points(gaps['1000'])} at 1000 and {points(gaps['all'])} at {n_all}"
        ),
        "value:elical-ece-vs-training-free": f"{pct(ece100)} at 100 labels, against {ece_cmp}",
        "value:elical-lora-cost": (
            f"stage 1 on {n_all} prompts took {stage['eli-only']:.0f} s, stage 2 on "
            f"{d['lora']['budget']} took {stage['elical']:.0f} s, peak RSS "
            f"{gib(d['lora']['peak_memory_mib'])}"
        ),
        "value:elical-sweep-time": (
            f"the whole {len(d['seeds'])}-seed sweep ({head_runs} runs) in {d['seconds']['head_sweep']:.1f} s"
        ),
    }


def elical_rule(d: Json) -> dict[str, str]:
    """Stage 2's rule (issue 25): the held-out-domain selection, its folds, the in-domain check, before/after."""
    rule = d.get("stage2_rule")
    if rule is None or "held_out_selection" not in rule:
        return {}
    sel, check = rule["held_out_selection"], rule["in_domain_check"]
    budgets, first, last = sel["budgets"], sel["budgets"][0], sel["budgets"][-1]
    rows = []
    for name, c in sel["candidates"].items():
        gap = c["last_vs_first"]
        rows.append(
            [
                f"**{name}**" if name == sel["selected"] else name,
                *(pct(c["by_budget"][b]["auroc"]) for b in budgets),
                pct(c["mean_auroc"]),
                *(pct(c["by_budget"][b]["ece"]) for b in budgets),
                f"{signed(gap['auroc_diff'])} [{signed(gap['ci95'][0])}, {signed(gap['ci95'][1])}]",
            ]
        )
    eli = sel["eli_only"]
    rows.append(
        [
            "Eli-Only (stage 1 alone)",
            *(pct(eli["auroc"]) for _ in budgets),
            pct(eli["auroc"]),
            *(pct(eli["ece"]) for _ in budgets),
            DASH,
        ]
    )
    selection = md_table(
        [
            "stage-2 rule",
            *(f"AUROC @{b}" for b in budgets),
            "mean",
            *(f"ECE @{b}" for b in budgets),
            f"AUROC @{last} − @{first} [95%]",
        ],
        "l" + "r" * (2 * len(budgets) + 2),
        rows,
    )
    chosen, before = sel["selected"], rule["before"]["name"]
    fold_rows = []
    for domain, sizes in sel["folds"].items():
        cells = [domain, str(sizes["n_scored"]), str(sizes["n_correct"]), pct(eli["by_fold"][domain]["auroc"])]
        for name in dict.fromkeys([chosen, before]):
            cells += [pct(sel["candidates"][name]["by_budget"][b]["by_fold"][domain]["auroc"]) for b in (first, last)]
        fold_rows.append(cells)
    fold_head = ["held out", "dev questions", "correct", "Eli-Only"]
    for name in dict.fromkeys([chosen, before]):
        fold_head += [f"{name} @{first}", f"@{last}"]
    folds = md_table(fold_head, "lrrr" + "r" * (len(fold_head) - 4), fold_rows)
    check_rows = [
        [
            b,
            pct(r["chosen"]["auroc"]),
            pct(r["before"]["auroc"]),
            f"{signed(r['auroc_diff'])} [{signed(r['ci95'][0])}, {signed(r['ci95'][1])}]",
            pct(r["chosen"]["ece"]),
            pct(r["before"]["ece"]),
        ]
        for b, r in check.get("by_budget", {}).items()
    ]
    in_domain = md_table(
        [
            "budget",
            f"AUROC {check['chosen']}",
            f"AUROC {check['before']}",
            "Δ [95% paired]",
            f"ECE {check['chosen']}",
            f"ECE {check['before']}",
        ],
        "lrrrrr",
        check_rows,
    )
    before_m, after = d["before"]["methods"], d["methods"]
    ba_rows = []
    for key in ["Eli-Only", *(f"EliCal@{b}" for b in d["budgets"])]:
        cells = [key]
        for g in ("id", "ood"):
            for side in (before_m, after):
                cells.append(with_ci(side[key][g]["auroc"], side[key]["ci95"][g]["auroc"]))
        for g in ("id", "ood"):
            cells += [pct(before_m[key][g]["ece"]), pct(after[key][g]["ece"])]
        ba_rows.append(cells)
    # the columns name their rules: "before" and "after" changed meaning when the curve moved to the default target
    b, a = rule["before"]["name"], rule["after"]["name"]
    head = ["method", f"ID AUROC {b}", a, f"OOD AUROC {b}", a, f"ID ECE {b}", a, f"OOD ECE {b}", a]
    n_correct = ", ".join(f"{k} {v['n_correct']} of {v['n']}" for k, v in check.get("scored_on", {}).items())
    return {
        "table:elical-lodo-rules": selection,
        "table:elical-lodo-folds": folds,
        "table:elical-in-domain-check": in_domain,
        "table:elical-before-after": md_table(head, "l" + "r" * 8, ba_rows),
        "value:elical-selected": rule["after"]["name"],
        "value:elical-heldout-gaps": "; ".join(
            f"{name} {signed(c['last_vs_first']['auroc_diff'])} [{signed(c['last_vs_first']['ci95'][0])}, "
            f"{signed(c['last_vs_first']['ci95'][1])}]"
            for name, c in sel["candidates"].items()
        ),
        "value:elical-eli-heldout": f"{pct(eli['auroc'])} (ECE {pct(eli['ece'])})",
        "value:elical-lodo-correct": n_correct,
    }


def elical_targets(r: Path) -> dict[str, str]:
    """Stage 2 by the claim's quantifier (issue 46): each rule's 100→all change on each held-out domain,
    the tolerances, and each target's pick."""
    rule = load("elical", r).get("stage2_rule", {})
    if "selected_by_target" not in rule:
        return {}
    sel, tol = rule["held_out_selection"], rule["tolerance"]["by_domain"]
    picks, choice = rule["selected_by_target"], rule["universal_choice"]
    first, last = sel["budgets"][0], sel["budgets"][-1]
    curve_rule = rule.get("curve_rule", rule["after"]["name"])
    default = rule.get("library_default", {}).get("name", picks["universal"])
    low, high = factor_range(sel["candidates"], tol)
    rows = [["tolerance (−)", *(signed(-t) for t in tol.values()), DASH, DASH, DASH]]
    for name, c in sel["candidates"].items():
        cells = [
            signed(c["domain_change"][d]["change"]) + (" ✗" if d in choice["losing_domains"][name] else "") for d in tol
        ]
        marks = [t for t, pick in picks.items() if pick == name]
        label = f"**{name}** ({', '.join(marks)})" if marks else name
        rows.append(
            [
                label,
                *cells,
                signed(choice["worst_domain_change"][name]),
                pct(c["mean_auroc"]),
                "yes" if name in choice["qualified"] else "no",
            ]
        )
    head = [
        f"rule (Δ AUROC @{first} → @{last})",
        *(f"{d} ({sel['folds'][d]['n_correct']} of {sel['folds'][d]['n_scored']} correct)" for d in tol),
        "worst",
        "mean AUROC",
        "qualifies",
    ]
    return {
        "table:elical-targets": md_table(head, "l" + "r" * (len(tol) + 2) + "l", rows),
        "value:elical-target-universal": picks["universal"],
        "value:elical-target-in-domain": picks["in-domain"],
        "value:elical-universal-how": choice["how"],
        "value:elical-tolerance": ", ".join(f"{d} {100 * t:.1f}" for d, t in tol.items()),
        "value:elical-curve-rule": curve_rule,
        "value:elical-tolerance-range": (
            f"{low:.2f} to {high:.2f} standard errors" if high != float("inf") else f"{low:.2f} standard errors or more"
        ),
        "value:elical-default-curve": (
            f"{default} (the library default) has its test-set budget curve below"
            if default == curve_rule
            else f"{default} (the library default) has no test-set budget curve: not measured; the curve below "
            f"is {curve_rule}'s"
        ),
    }


def elical_cost(r: Path) -> dict[str, str]:
    d = load("elical_cost", r)
    cpu, drift = d["cpu_seconds_per_question"], d["bf16_vs_float32"]
    return {
        "value:elical-cost": (
            f"annotating one question (k = {d['k']}) costs {cpu['annotate_k5']:.3f} CPU s; the float32 head "
            f"{cpu['head_shared_prefix']:.4f} (ratio {d['ratio_head_to_annotate_cpu']:.3f} CPU, "
            f"{d['ratio_head_to_annotate']:.3f} wall), the bf16 head {cpu['head_bf16']:.4f} (ratio "
            f"{d['ratio_head_bf16_to_annotate_cpu']:.3f} CPU, {d['ratio_head_bf16_to_annotate']:.3f} wall), "
            f"and the head before the shared prefix {cpu['head_left_padded']:.4f} (ratio "
            f"{d['ratio_left_padded_head_to_annotate']:.3f} wall)"
        ),
        "value:elical-bf16-drift": (
            f"largest confidence change {drift['max_abs_confidence_difference']:.1e}, mean "
            f"{drift['mean_abs_confidence_difference']:.1e}, Spearman {drift['spearman']:.4f} over "
            f"{d['questions']} questions"
        ),
    }
