"""README parts on ADVICE and its diagnostics: the small run, issue 13's budget run, the starter set, diagnose."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from statistics import fmean

from candor.data.mini import IN_DOMAIN

from .formatting import (
    DASH,
    DATASET_NAMES,
    LEGACY_MARK,
    Json,
    bold_best,
    estimate,
    gib,
    load,
    md_table,
    notes_for,
    pct,
    ratio,
    shown_command,
    with_ci,
)

ADVICE_ROWS = [
    ("Default", "ScoreLetter"),
    ("Prompting", "ScoreLetter"),
    ("Self-Consistency", "ScoreLetter"),
    ("ConfTuner", "ScoreLetter"),
    ("ADVICE", "ScoreLetter"),
    ("ADVICE+ConfTuner", "ScoreLetter"),
    ("Default", "ScoreNumber"),
    ("ConfTuner", "ScoreNumber"),
    ("ADVICE", "ScoreNumber"),
]


UNSEEN = ("ScoreText", "ScoreFloat", "ScorePercent")


def advice(r: Path) -> dict[str, str]:
    d = load("advice_small", r)
    methods = d["methods"]
    rows, id_ece = [], []
    for method, fmt in ADVICE_ROWS:
        b = methods[method][fmt]
        shown_fmt = "(any)" if method == "Self-Consistency" else fmt
        rows.append(
            [
                method,
                shown_fmt,
                pct(b["id"]["ece"]),
                pct(b["id"]["auroc"]),
                pct(b["ood"]["ece"]),
                pct(b["logiqa"]["ece"]),
            ]
        )
        id_ece.append(b["id"]["ece"])
    bold_best(rows, 2, id_ece, lower=True)
    for fmt in UNSEEN:
        a, b = methods["Default"][fmt], methods["ADVICE"][fmt]
        rows.append(
            ["Default → ADVICE", f"{fmt} (unseen)"]
            + [
                f"{pct(a[g][k])} → {pct(b[g][k])}"
                for g, k in (("id", "ece"), ("id", "auroc"), ("ood", "ece"), ("logiqa", "ece"))
            ]
        )
    table = md_table(["method", "format", "ID ECE", "ID AUROC", "OOD ECE", "LogiQA ECE"], "llrrrr", rows)

    ablation = "; ".join(
        f"{label if not label.startswith('all, lr') else 'all at the paper' + chr(39) + 's lr 1e-5'} "
        f"{pct(block['ScoreLetter']['ece'])} / {pct(block['ScoreNumber']['ece'])}"
        for label, block in d["ablation"].items()
    )
    dl, al = methods["Default"]["ScoreLetter"], methods["ADVICE"]["ScoreLetter"]
    dn, an = methods["Default"]["ScoreNumber"], methods["ADVICE"]["ScoreNumber"]
    unseen = [
        methods["Default"][f][g]["ece"] / methods["ADVICE"][f][g]["ece"]
        for f in UNSEEN
        for g in ("id", "ood", "logiqa")
    ]
    ood = dl["ood"]
    return {
        "table:advice": table,
        "value:advice-ablation": ablation,
        "value:advice-cut": (
            f"It cuts it {ratio(dl['id']['ece'], al['id']['ece'])} on ScoreLetter in-domain "
            f"({pct(dl['id']['ece'])} → {pct(al['id']['ece'])}) and "
            f"{ratio(dl['ood']['ece'], al['ood']['ece'])} OOD ({pct(dl['ood']['ece'])} → "
            f"{pct(al['ood']['ece'])}), {ratio(dn['id']['ece'], an['id']['ece'])} on ScoreNumber, "
            f"and {min(unseen):.1f}–{max(unseen):.1f}× (in-domain, OOD and LogiQA) on the three "
            "formats it never saw"
        ),
        "value:advice-ood-small": (
            f"OOD ({ood['n']} questions, {round(ood['n'] * ood['accuracy'])} correct) and "
            f"LogiQA ({dl['logiqa']['n']} questions)"
        ),
        "value:advice-id": (
            f"in-domain {dl['id']['n']} questions, {100 * dl['id']['accuracy']:.2f}% correct "
            f"({round(dl['id']['n'] * dl['id']['accuracy'])})"
        ),
    }


GROUP_NAMES = {"id": "in-domain", "ood": "OOD", "logiqa": "LogiQA"}


def advice_budget(r: Path) -> dict[str, str]:
    """Issue 13's ADVICE run (results/advice.json): whichever methods and formats it holds."""
    d = load("advice", r)
    methods, pool, trip = d["methods"], d["training_pool"], d["triplets"]
    rows = []
    for fmt in next(iter(methods.values())):
        for method, per_format in methods.items():
            b = per_format[fmt]
            rows.append(
                [method, fmt]
                + [
                    estimate(b[g][k], b[g].get(f"{k}_ci"), k, corrected=b[g].get(f"{k}_corrected")) if g in b else DASH
                    for g in GROUP_NAMES
                    for k in ("ece", "auroc")
                ]
            )
    table = md_table(
        ["method", "format", "ID ECE", "ID AUROC", "OOD ECE", "OOD AUROC", "LogiQA ECE", "LogiQA AUROC"],
        "llrrrrrr",
        rows,
    ) + notes_for([c for r in rows for c in r], corrected=any("‡" not in r[2] and "[" in r[2] for r in rows))
    factor_rows = []
    for method, per_format in d["ece_factor_vs_default"].items():
        for fmt, groups in per_format.items():
            factor_rows.append([method, fmt] + [_factor(groups.get(g)) for g in GROUP_NAMES])
    factors = md_table(["method", "format", "in-domain", "OOD", "LogiQA"], "llrrr", factor_rows)
    accuracy = "; ".join(f"{m}: {_accuracy(per_dataset)}" for m, per_dataset in d["task_accuracy"].items())
    train = "; ".join(
        f"{name}: {run['examples']} examples, {run['epochs']:g} epoch(s) at lr {run['learning_rate']:g}, "
        f"{run['wall_s']:.0f} s, peak RSS {gib(run['peak_rss_mib'])}"
        for name, run in d["training"].items()
    )
    lr = d["learning_rate"]
    first = next(iter(methods.values()))
    n_id = first[next(iter(first))]["id"]
    pool_sizes = ", ".join(f"{k} {v['questions']}" for k, v in pool["by_dataset"].items())
    pool_correct = sum(v["greedy_correct"] for v in pool["by_dataset"].values())
    trip_sizes = ", ".join(f"{k} {v}" for k, v in trip["by_dataset"].items())
    dev_brier = ", ".join(f"{k} {v:.4f}" for k, v in lr.get("dev_mean_brier", {}).items())
    eval_sizes = ", ".join(
        f"{k} {v['all_formats']} (ScorePercent {v['ScorePercent']})" for k, v in d["eval_sizes"].items()
    )
    return {
        "table:advice13": table,
        "table:advice13-factor": factors,
        "value:advice13-pool": (
            f"{pool['questions']} training-part questions ({pool_sizes}), {pool_correct} answered correctly"
        ),
        "value:advice13-triplets": (
            f"{trip['eligible'] - trip['dropped']} triplets ({trip['from_samples']} with a wrong sample, "
            f"{trip['from_resamples']} after drawing more samples, {trip['from_other_questions']} borrowed from "
            f"another question, {trip['dropped']} dropped; by dataset: {trip_sizes})"
        ),
        "value:advice13-lr": f"{lr['chosen']:g} ({lr['how']}; dev mean Brier: {dev_brier})",
        "value:advice13-training": train,
        "value:advice13-accuracy": accuracy or "no trained method scored yet",
        "value:advice13-eval": (
            f"in-domain {n_id['n']} questions ({100 * n_id['accuracy']:.1f}% answered "
            f"correctly); per dataset {eval_sizes}"
        ),
        "value:advice13-command": f"`{shown_command(d['command'])}`",
        "value:advice13-unseen": _unseen13(r),
        "value:advice13-auroc-by-dataset": _auroc_by_dataset(methods, d["groups"]["id"]),
        "value:advice13-mean-confidence": _mean_confidence(methods),
        "value:advice13-ablation": _ablation13(d.get("ablation", {})),
        "value:advice13-constant": _constant13(d.get("constant_reference")),
        "value:advice13-terms": "; ".join(
            f"{name}: {_term_moves(run['curve'])}" for name, run in d["training"].items()
        ),
        "value:advice13-scope": (
            f"methods {', '.join(methods)}; formats {', '.join(first)}; "
            + ("complete" if d.get("complete") else "a partial run (the remaining methods are not scored yet)")
        ),
    }


def _ece_inline(block: Json) -> str:
    """A block's ECE in a sentence: as :func:`_ece`, the legacy mark spelled out."""
    return _ece(block).replace(LEGACY_MARK, " (plug-in; its percentile interval not shown)")


def _ece(block: Json) -> str:
    """A block's ECE: the bias-corrected estimate with its interval, or the plug-in marked (legacy files)."""
    return estimate(block["ece"], block.get("ece_ci"), "ece", corrected=block.get("ece_corrected"))


def _ablation13(ablation: Json) -> str:
    """In-domain ECE (with its interval) of each loss set, ScoreLetter / ScoreNumber."""
    if not ablation:
        return "not run"
    return "; ".join(
        f"{label}: {_ece_inline(b['ScoreLetter'])} / {_ece_inline(b['ScoreNumber'])}" for label, b in ablation.items()
    )


def _auroc_by_dataset(methods: Json, in_domain: Sequence[str] = IN_DOMAIN) -> str:
    """AUROC ×100 within each in-domain dataset, Default → each trained method, so a pooled gain that only
    sorts the datasets by their base rates cannot pass for ranking within a dataset."""
    default, out = methods.get("Default", {}), []
    for method, per_format in methods.items():
        if method in ("Default", "Prompting", "Self-Consistency"):
            continue
        for fmt in ("ScoreLetter", "ScoreNumber"):
            if fmt not in per_format or fmt not in default:
                continue
            before, after = default[fmt]["per_dataset"], per_format[fmt]["per_dataset"]
            cells = ", ".join(
                f"{DATASET_NAMES.get(ds, ds)} {pct(before[ds]['auroc'])} → {pct(after[ds]['auroc'])}"
                for ds in in_domain
                if ds in after
            )
            out.append(f"{method} {fmt}: {cells}")
    return "; ".join(out) or "no trained method scored"


def _mean_confidence(methods: Json) -> str:
    """In-domain mean confidence against accuracy (nce_signed = accuracy − mean confidence), per method and format."""
    out = []
    for method, per_format in methods.items():
        for fmt in ("ScoreLetter", "ScoreNumber"):
            if fmt in per_format:
                b = per_format[fmt]["id"]
                out.append(f"{method} {fmt} {pct(b['accuracy'] - b['nce_signed'])}")
    accuracy = next(iter(next(iter(methods.values())).values()))["id"]["accuracy"]
    return f"{'; '.join(out)} (accuracy {pct(accuracy)})"


def _unseen13(r: Path) -> str:
    """Default → ADVICE on the formats it was not trained on (results/advice_unseen.json), with the ECE factor."""
    if not (r / "advice_unseen.json").exists():
        return "not run"
    d = load("advice_unseen", r)
    default, trained, factors = d["methods"]["Default"], d["methods"]["ADVICE"], d["ece_factor_vs_default"]["ADVICE"]
    return "; ".join(
        f"{fmt} {GROUP_NAMES[g]} ECE {pct(default[fmt][g]['ece'])} → {pct(trained[fmt][g]['ece'])} "
        f"({_factor(factors[fmt][g])}), AUROC {pct(default[fmt][g]['auroc'])} → {pct(trained[fmt][g]['auroc'])}"
        for fmt in trained
        for g in GROUP_NAMES
    )


def _constant13(ref: Json | None) -> str:
    """ECE of the one-number confidence (the training pool's accuracy), per group."""
    if not ref:
        return "not computed"
    groups = [g for g in GROUP_NAMES if g in ref]
    cells = ", ".join(f"{GROUP_NAMES[g]} {_ece_inline(ref[g])}" for g in groups)
    return f"confidence {100 * ref['confidence']:.1f}% for every question: ECE {cells}"


def _term_moves(curve: list[Json], window: int = 5) -> str:
    """Each loss term's mean over the first and the last ``window`` logged steps: did it move?"""
    head, tail = curve[:window], curve[-window:]
    terms = [k for k in curve[0] if k.startswith("loss_")]
    return ", ".join(f"{k[5:]} {fmean(r[k] for r in head):.3f} → {fmean(r[k] for r in tail):.3f}" for k in terms)


def _factor(cell: Json | None) -> str:
    if not cell or cell["factor"] is None:
        return DASH
    low, high = cell["ci"]
    return f"{cell['factor']:.2f}× [{low:.2f}, {high:.2f}]" if low is not None else f"{cell['factor']:.2f}×"


def _accuracy(per_dataset: Json) -> str:
    n = sum(v["n"] for v in per_dataset.values())
    mine = sum(v["accuracy"] * v["n"] for v in per_dataset.values())
    base = sum(v["base_accuracy"] * v["n"] for v in per_dataset.values())
    return f"{100 * mine / n:.1f}% of {n} questions answered correctly (base model {100 * base / n:.1f}%)"


def advice_balanced(r: Path) -> dict[str, str]:
    """ADVICE on the starter set (issue 46): each arm on the starter test part, and the hypothesis's verdict."""
    d = load("advice_balanced", r)
    rows = []
    arms = [("default", "Default", d)]
    arms += [
        (k, label, d)
        for k, label in (("conftuner", "ConfTuner"), ("advice", "ADVICE"), ("advice_conftuner", "ADVICE+ConfTuner"))
        if k in d
    ]
    mini = d.get("honestybench_mini_trained") or {}
    arms += [
        (k, f"{label} (HonestyBench-mini-trained)", mini)
        for k, label in (("conftuner", "ConfTuner"), ("advice", "ADVICE"), ("advice_conftuner", "ADVICE+ConfTuner"))
        if k in mini
    ]
    for key, label, source in arms:
        entry = source[key]
        for fmt, b in entry["by_format"].items():
            factor = entry.get("ece_ratio_to_default", {}).get(fmt)
            rows.append(
                [
                    label,
                    fmt,
                    str(b["seeds"]),
                    _ece(b),
                    with_ci(b["auroc"], b["auroc_ci"]),
                    with_ci(b["mean_confidence"], b["mean_confidence_ci"]),
                    pct(b["accuracy"]),
                    DASH
                    if factor is None
                    else f"{factor['ratio']:.2f} [{factor['ci95'][0]:.2f}, {factor['ci95'][1]:.2f}]",
                ]
            )
    test, train = d["split"]["test"], d["split"]["train"]
    triplets = d.get("triplets", {})
    return {
        "table:advice-balanced": md_table(
            [
                "method",
                "format",
                "seeds",
                "ECE [95%]",
                "AUROC [95%]",
                "mean confidence [95%]",
                "accuracy",
                "ECE / Default [95%]",
            ],
            "llrrrrrr",
            rows,
        )
        + notes_for([c for r in rows for c in r], corrected=any("‡" not in r[3] and "[" in r[3] for r in rows)),
        "value:advice-balanced-split": (
            f"train {train['n']} questions ({100 * train['accuracy']:.0f}% answered "
            f"correctly), dev {d['split']['dev']['n']} (held back), test {test['n']} "
            f"({test['n_correct']} correct, {100 * test['accuracy']:.0f}%)"
        ),
        "value:advice-balanced-triplets": (f"{triplets.get('n', 0)} triplets ({triplets.get('sources', {})})"),
        "value:advice-balanced-settings": (
            f"lr {d['settings']['learning_rate']:g}, {d['settings']['epochs']:g} "
            f"epochs, {d['settings']['pairs_per_step']} pairs per step, seeds "
            f"{d['settings']['seeds']}"
        ),
        "value:advice-balanced-verdict": d["hypothesis"] + ("" if d.get("complete") else " (partial run)"),
        "value:advice-balanced-command": f"`{shown_command(d['command'])}`",
        "value:advice-balanced-cost": "; ".join(
            f"{seed}: "
            + ", ".join(
                f"{name} {run['wall_s'] / 60:.0f} min on {run['examples']} examples" for name, run in by_run.items()
            )
            for seed, by_run in d.get("training", {}).items()
        )
        or DASH,
    }


DIAGNOSE13 = {"diagnose_advice13": "advice13", "diagnose_advicect13": "advicect13"}


DIAGNOSE13_LABELS = {"base": "base model", "advice13": "ADVICE", "advicect13": "ADVICE+ConfTuner"}


def diagnose13(r: Path) -> dict[str, str]:
    """Diagnostics of issue 13's adapters beside the base model (one results file per adapter)."""
    runs: dict[str, Json] = {}
    for name, key in DIAGNOSE13.items():
        if (r / f"{name}.json").exists():
            d = load(name, r)
            runs.setdefault("base", d["base"])
            runs[key] = d[key]
    rows = []
    for key, run in runs.items():
        s, m, ro = run["sensitivity"], run["masking"], run["rollout"]["excl_bos"]
        rows.append(
            [
                DIAGNOSE13_LABELS[key],
                pct(s["share_jsd_le_0.1"]),
                f"{s['mean_jsd']:.4f}",
                pct(s["auroc_mu_correct"]),
                f"{s['within_question_corr_mu_correct']:.3f}",
                f"{m['mask_shift']:.3f}",
                f"{ro['answer']:.1e}",
            ]
        )
    header = [
        "model",
        "pairs with JSD ≤ 0.1 (%)",
        "mean JSD (nats)",
        "AUROC of μ for the candidate",
        "within-question corr(μ, correct)",
        "answer masked: mean abs Δμ",
        "rollout to the answer (excl. BOS)",
    ]
    return {"table:diagnose13": md_table(header, "lrrrrrr", rows)}
