"""README parts on the baselines and the judges: the baseline tables, length-debiasing, judge agreement and noise."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from candor.evaluation.judge_noise import HandLabels
from candor.evaluation.trust import dropped_draws

from .formatting import (
    DATASET_NAMES,
    METRIC_LABELS,
    Json,
    estimate,
    gib,
    load,
    md_table,
    notes_for,
    pct,
    shown_command,
    with_ci,
)


def judge_agreement(r: Path) -> dict[str, str]:
    d = load("judge_agreement", r)
    agree = round(d["agreement"] * d["n"])
    row = [f"`{d['judge']}`", f"**{agree} / {d['n']}**", str(len(d["false_positives"])), str(len(d["false_negatives"]))]
    return {
        "table:judge-agreement": md_table(["judge", "agreement", "false positives", "false negatives"], "lrrr", [row])
    }


BASELINE_METRICS = ("auroc", "ece", "alignment", "brier")


def _cell(m: Json, group: str, metric: str) -> str:
    """One metric of one method: ECE bias-corrected where the file holds it (:func:`~.formatting.estimate`)."""
    corrected = (m.get("corrected") or {}).get(group, {}).get(metric)
    return estimate(m[group][metric], m["ci95"][group].get(metric), metric, corrected=corrected)


def _any_corrected(d: Json) -> bool:
    return any((m.get("corrected") or {}) for m in d["methods"].values())


def baselines(r: Path) -> dict[str, str]:
    d = load("baselines", r)
    header = ["method"] + [f"{g.upper()} {METRIC_LABELS[m]}" for g in ("id", "ood") for m in BASELINE_METRICS]
    rows = []
    for method, m in d["methods"].items():
        rows.append([method] + [_cell(m, g, k) for g in ("id", "ood") for k in BASELINE_METRICS])
    acc = d["greedy_accuracy"]
    per = ", ".join(f"{DATASET_NAMES.get(ds, ds)} {pct(acc[ds])}%" for ds in DATASET_NAMES if ds in acc)
    correct = {ds: round(acc[ds] * d["sizes"][ds]) for ds in ("squad", "musique")}
    return {
        "table:baselines": md_table(header, "l" + "r" * 8, rows)
        + notes_for([c for r in rows for c in r], corrected=_any_corrected(d)),
        "value:baselines-accuracy": f"{per} (in-domain {pct(acc['id'])}%, OOD {pct(acc['ood'])}%)",
        "value:baselines-bootstrap": str(d["bootstrap"]),
        "value:baselines-ood-correct": f"SQuAD has {correct['squad']} and MuSiQue {correct['musique']} correct "
        f"answers out of {d['sizes']['squad']}",
        "value:baselines-peak": gib(d["peak_rss_mib"]),
    }


STRONG_METRICS = ("auroc", "ece", "aurc", "prr")


STRONG_LABELS = {"auroc": "AUROC", "ece": "ECE", "aurc": "AURC", "prr": "PRR"}


def baselines_strong(r: Path) -> dict[str, str]:
    """The strong-baseline run (benchmarks/results/baselines_strong.json), sorted by in-domain AUROC."""
    d = load("baselines_strong", r)
    header = ["method"] + [f"{g.upper()} {STRONG_LABELS[m]}" for g in ("id", "ood") for m in STRONG_METRICS]
    ranked = sorted(d["methods"].items(), key=lambda kv: -(kv[1]["id"]["auroc"] or 0.0))
    rows = [[method] + [_cell(m, g, k) for g in ("id", "ood") for k in STRONG_METRICS] for method, m in ranked]
    best, best_m = ranked[0]
    return {
        "table:baselines-strong": md_table(header, "l" + "r" * 8, rows)
        + notes_for([c for r in rows for c in r], corrected=_any_corrected(d)),
        "value:baselines-strong-best": f"`{best}` ({pct(best_m['id']['auroc'])} "
        f"[{pct(best_m['ci95']['id']['auroc'][0], 0)}, "
        f"{pct(best_m['ci95']['id']['auroc'][1], 0)}])",
        "value:baselines-strong-command": f"`{shown_command(d['command'])}`",
        "value:baselines-strong-seconds": f"{sum(d['seconds'].values()) / 60:.0f} minutes",
    }


DEBIAS_BLOCK = "ensemble_debias"  # baselines_strong.json: the run with the ensemble and the +debias rows


def baselines_debias(r: Path) -> dict[str, str]:
    """Each estimator's AUROC before and after length-debiasing, and the dev-chosen ensemble against its members."""
    block = load("baselines_strong", r)[DEBIAS_BLOCK]
    methods = block["methods"]
    plain = sorted(
        (m for m in methods if not m.endswith("+debias") and m != "ensemble"),
        key=lambda m: -(methods[m]["id"]["auroc"] or 0.0),
    )

    def auroc(method: str, group: str) -> str:
        m = methods.get(method)
        return "–" if m is None else with_ci(m[group]["auroc"], m["ci95"][group].get("auroc"))

    header = ["method", "ID AUROC", "ID AUROC +debias", "OOD AUROC", "OOD AUROC +debias"]
    members = block["fits"]["ensemble"]["members"]
    rows = [[f"**ensemble** ({', '.join(members)})", auroc("ensemble", "id"), "", auroc("ensemble", "ood"), ""]]
    for m in plain:
        label = f"{m} (member)" if m in members else m
        rows.append([label, auroc(m, "id"), auroc(f"{m}+debias", "id"), auroc(m, "ood"), auroc(f"{m}+debias", "ood")])
    weights = block["fits"]["ensemble"]["weights"]
    return {
        "table:baselines-debias": md_table(header, "lrrrr", rows),
        "value:baselines-debias-command": f"`{shown_command(block['command'])}`",
        "value:baselines-debias-sizes": f"{block['sizes']['id']} in-domain and {block['sizes']['ood']} OOD test "
        f"records ({block['test_size']} per dataset; in-domain accuracy "
        f"{pct(block['greedy_accuracy']['id'])}%)",
        "value:baselines-debias-weights": ", ".join(f"{k} {v:+.2f}" for k, v in weights.items()),
        "value:baselines-debias-search": ", ".join(
            f"{'+'.join(step['members'])} {pct(step['dev_cv_auroc'])}" for step in block["fits"]["ensemble"]["search"]
        ),
    }


# judge_noise.json files written before issue 56 hold neither the draws per interval nor the hand labels' datasets:
# the benchmark's default resamples, and its hand-label file, whose ids name their dataset ("nq:123").
DEFAULT_DRAWS = 1000
HAND_LABELS = Path(__file__).resolve().parents[1] / "judge_labels.json"


def hand_label_notes(d: Json, r: Path) -> dict[str, str | None]:
    """Each accuracy row's note on where its sensitivity and specificity come from (candor's own wording)."""
    out: dict[str, str | None] = {}
    for ds, e in d["accuracy"].items():
        if "hand_labels_note" in e:
            out[ds] = e["hand_labels_note"]
            continue
        ids = [x["id"] for x in json.loads(HAND_LABELS.read_text(encoding="utf-8"))["labels"]]
        labels = HandLabels(np.zeros(len(ids)), np.zeros(len(ids)), datasets=tuple(i.split(":", 1)[0] for i in ids))
        out[ds] = labels.note_for(d["datasets"] if ds == "all" else [ds])
    return out


def judge_noise(r: Path) -> dict[str, str]:
    """Accuracy corrected for the `contains` judge's measured errors, and how far they could move AUROC."""
    d = load("judge_noise", r)
    notes = hand_label_notes(d, r)
    rows = [
        [
            DATASET_NAMES.get(ds, ds),
            str(e["n"]),
            pct(e["observed"]),
            "–" if e["corrected"] is None else with_ci(e["corrected"], e["ci"]),
            dropped_draws(e) if "draws" in e else f"{e['draws_dropped']} of {DEFAULT_DRAWS}",
            "; ".join(n for n in (e["undefined"], notes[ds]) if n),
        ]
        for ds, e in d["accuracy"].items()
    ]
    spreads = {m: per["all"]["sd"] for m, per in d["auroc_flip"].items() if per["all"]["sd"] is not None}
    widest = max(spreads, key=lambda m: spreads[m])
    hand, cons = d["hand_labels"], d["consistency_judge"]
    return {
        "table:judge-noise": md_table(
            ["dataset", "n", "judged accuracy", "corrected accuracy", "bootstrap draws dropped", "note"],
            "lrrrrl",
            rows,
        ),
        "value:judge-noise-rates": f"sensitivity {pct(hand['sensitivity'])}%, specificity "
        f"{pct(hand['specificity'])}% ({hand['n']} hand labels)",
        "value:judge-noise-auroc": f"{pct(min(spreads.values()))}–{pct(spreads[widest])} AUROC points "
        f"(widest: `{widest}`)",
        "value:judge-noise-consistency": f"sensitivity {pct(cons['sensitivity'])}%, specificity "
        f"{pct(cons['specificity'])}% on its {cons['n']} labels",
        "value:judge-noise-command": f"`{shown_command(d['command'])}`",
    }
