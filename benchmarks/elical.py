"""EliCal on HonestyBench-mini with the embedded default (docs/methods.md "EliCal", "HonestyBench-mini").

Reuses the annotations and baseline confidences of benchmarks/baselines.py
(benchmarks/cache/mini: train 4x450, dev 4x50 carved from the training pool,
test 6x200, k=5) and trains nothing the baselines already measured:

- ``head`` mode (frozen backbone, cached last-token features): Eli-Only once
  per seed, then Cal-Only@N and EliCal@N for N in 100, 250, 500, 1000, all,
  over 3 seeds (budgets drawn per seed, nested);
- ``lora`` mode (the paper's): EliCal@1000 and its Eli-Only stage, one seed,
  with the epochs of each stage capped (``--lora-epochs``, default 1): at
  about 0.35 s per training question on 2 CPU cores, one epoch of stage 1
  over the 1800-question pool is ~10 minutes. Skip it with ``--skip-lora``.

Stage 2's rule is chosen first, on training and dev questions only (issue 25;
:mod:`candor.train.elical.selection`): each candidate rule trains with one
in-domain dataset left out (stages 1 and 2 on the other three datasets' pool)
and is scored on the held-out dataset's dev questions (its dev slice, its
``lodo`` part from annotate_mini.py and, with ``--score-pool``, its own pool
questions). Each target picks its rule (candor.train.elical.rules): ``universal``
(the default) the best mean held-out AUROC among the rules that lose no held-out
domain's AUROC from 100 to all labels beyond that domain's seed noise,
``in-domain`` the best mean (ties by ECE). An in-domain check on the ``lodo``
questions reports the universal pick against the in-domain one (report only).
No test part is read until the rules are fixed (``--only select`` stops there).

Early stopping watches the 200-question dev slice (its consistency rates in
stage 1, its sample accuracies in stage 2); no test item is ever used. Each
method is reported as the mean over seeds with a 95% bootstrap interval of
that mean, beside the training-free baselines measured on the same test
items (N-Prob, Consis-Sem, Consis-Lex, Verbal-0), and as differences against
N-Prob.

Every run is cached under benchmarks/cache/elical (features, test
confidences, heads), so a killed run resumes and a rerun only re-summarizes:

    .venv/bin/python -m benchmarks.elical               # everything
    .venv/bin/python -m benchmarks.elical --skip-lora   # head mode and baselines only
    .venv/bin/python -m benchmarks.elical --quick       # 1 seed, budgets 100 and all, no lora
    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.elical --only select   # the rule selection alone

On shared, busy cores run it with ``OMP_NUM_THREADS=1``: with two torch threads
competing with other processes, the feature extraction burned about 7x the CPU
time for the same prompts (measured on this machine at load ~12).

Measured on 2 shared CPU cores (load ~4): features of the 3,200 prompts
~9 min once (then cached); the head-mode sweep (33 runs) and 1000-resample
intervals 3.5 min; with the grown ``lodo`` part (8,614 prompts), the whole
``--skip-lora`` run from an empty cache in 15.5 min, most of it features; the
lora run ~25 min on idle cores (0.35 s per training question, 0.15 s per scored
one), up to an hour on busy ones; peak memory
0.7 GB (head) and 3.1 GiB (lora; see results/elical.json, lora.peak_memory_mib).

Writes benchmarks/results/elical.json and benchmarks/results/elical_budget.png
(``--quick``: elical_quick.json and elical_quick_budget.png).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import CACHE, RESULTS, logger, setup_logging, write_json
from benchmarks.elical_choice import claim_fields
from benchmarks.measure import peak_rss_mib
from candor.annotation.records import Record, read_records
from candor.data.mini import IN_DOMAIN, OUT_OF_DOMAIN
from candor.estimators.confidences import read_confidences
from candor.evaluation.aggregate import Group, metric_differences
from candor.train.elical import Budget, EliCalConfig
from candor.train.elical.rules import DEFAULT_TARGET, RULES, StageTwoRule, target_rule
from candor.train.elical.selection import select_rule
from candor.train.elical.sweep import CONFIDENCES, SweepData, plot_sweep, run_sweep
from candor.train.elical.targets import targets

BASELINES = {
    "N-Prob": "n-prob",
    "Min-Prob": "min-prob",
    "Prob": "prob",
    "Consis-Sem": "consis-sem",
    "Consis-Lex": "consis-lex",
    "Verbal-0": "verbal-0",
}
REFERENCE = "N-Prob"
# The baselines computed from the annotated records alone (greedy log-probabilities, stored consistency verdicts).
RECORD_ONLY = ("prob", "n-prob", "min-prob", "consis-lex", "consis-sem")
# Every candidate (candor.train.elical.rules.RULES) is compared by leaving one in-domain dataset out (issue 25);
# each target picks its own (issue 46). The budget curve is run with the default target's pick ("after") and
# the in-domain target's ("before": the mean rule of issue 25); stage1 and heads are shared by rule name.
SELECT_BUDGETS = "100,all"
METRICS = ("auroc", "ece", "alignment")
LORA_SUFFIX = " (lora)"
PLAIN_SUFFIX = " (plain resume)"
GIB_24 = 24 * 1024


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--annotations", type=Path, default=CACHE / "mini", help="benchmarks/baselines.py's cache")
    p.add_argument("--cache", type=Path, default=CACHE / "elical")
    p.add_argument("--budgets", default="100,250,500,1000,all")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--bootstrap", type=int, default=1000)
    p.add_argument("--max-epochs", type=int, default=None, help="cap on head-mode epochs (default: the paper's rule)")
    p.add_argument("--skip-lora", action="store_true", help="skip the lora-mode run")
    p.add_argument("--lora-budget", default="1000")
    p.add_argument("--lora-epochs", type=int, default=1, help="epochs per stage in lora mode (CPU cap)")
    p.add_argument("--quick", action="store_true", help="1 seed, budgets 100 and all, 100 resamples, no lora")
    p.add_argument("--select-budgets", default=SELECT_BUDGETS, help="budgets of the held-out-domain rule selection")
    p.add_argument(
        "--only",
        choices=("select", "before", "sweep"),
        default=None,
        help="run only the held-out-domain rule selection (prints it), only the before sweep, or only the "
        "curves of the before rule and --report-rules (to fill the cache), then stop",
    )
    p.add_argument(
        "--report-rules",
        default="",
        help="comma-separated candidates not selected to sweep anyway, reported apart (never selected)",
    )
    p.add_argument(
        "--candidates",
        default=None,
        help=f"comma-separated stage-2 rules to compare (default: all of {', '.join(RULES)})",
    )
    p.add_argument(
        "--lodo",
        default=",".join(IN_DOMAIN),
        help="in-domain datasets whose extra dev questions (the lodo part) are read; '' for none",
    )
    p.add_argument(
        "--score-pool",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="held-out-domain folds also score the held-out dataset's training-pool questions",
    )
    p.add_argument("--plain-budgets", default="100,1000", help="budgets of the plain-resume comparison")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--plot", type=Path, default=None)
    args = p.parse_args()
    if args.quick:
        args.seeds, args.budgets, args.bootstrap, args.skip_lora = "0", "100,all", 100, True
    stem = "elical_quick" if args.quick else "elical"
    args.out = args.out or RESULTS / f"{stem}.json"
    args.plot = args.plot or RESULTS / f"{stem}_budget.png"
    return args


# ---------------------------------------------------------------- inputs


def load_part(root: Path, part: str, datasets: tuple[str, ...]) -> dict[str, list[Record]]:
    """Cached annotations of one part, or exit telling how to make them."""
    out = {}
    for dataset in datasets:
        path = root / part / f"{dataset}.jsonl"
        if not path.exists():
            sys.exit(
                f"missing {path}: run `python -m benchmarks.annotate_mini` (it annotates and caches HonestyBench-mini)"
            )
        out[dataset] = read_records(path)
    return out


def baseline_dir(args: argparse.Namespace, tests: dict[str, list[Record]]) -> Path:
    """baselines.py's confidences when it has scored every test set; else the baselines that need only the
    records (no model), scored here into this benchmark's own cache (Verbal-0 is then left out)."""
    shared = args.annotations / "confidences"
    if all((shared / f"{dataset}.jsonl").exists() for dataset in tests):
        return shared
    from candor.estimators.confidences import score_into

    logger.info("no baselines.py confidences under %s: scoring %s from the records", shared, ", ".join(RECORD_ONLY))
    for dataset, records in tests.items():
        score_into(records, RECORD_ONLY, args.cache / "confidences" / f"{dataset}.jsonl", None, progress=False)
    return args.cache / "confidences"


def load_baselines(folder: Path, tests: dict[str, list[Record]]) -> dict[str, dict[str, Any]]:
    """Baseline name → dataset → confidences in the test records' order (from ``folder``, see baseline_dir)."""
    import numpy as np

    out: dict[str, dict[str, Any]] = {name: {} for name in BASELINES}
    for dataset, records in tests.items():
        path = folder / f"{dataset}.jsonl"
        if not path.exists():
            sys.exit(f"missing {path}: run `python -m benchmarks.baselines` (it scores the training-free baselines)")
        rows = {row.id: row for row in read_confidences(path).rows}
        for name, column in BASELINES.items():
            missing = [r.id for r in records if r.id not in rows or column not in rows[r.id].confidence]
            if missing:
                out[name] = None  # a baseline not scored on every test set is left out, not half-reported
                continue
            if out[name] is not None:
                out[name][dataset] = np.array([rows[r.id].confidence[column] for r in records])
    skipped = [name for name, v in out.items() if v is None]
    if REFERENCE in skipped:
        sys.exit(f"no {BASELINES[REFERENCE]!r} confidences under {folder}; run `python -m benchmarks.baselines`")
    if skipped:
        logger.warning("baselines without cached confidences, left out: %s", ", ".join(skipped))
    return {name: v for name, v in out.items() if v is not None}


# ---------------------------------------------------------------- runs


def head_config(args: argparse.Namespace, rule: StageTwoRule, **changes: Any) -> EliCalConfig:
    base = EliCalConfig(
        mode="head", model=args.model, max_epochs=args.max_epochs, feature_cache=str(args.cache / "features"), **changes
    )
    return rule.apply(base)


def load_lodo(root: Path, datasets: list[str]) -> list[Record]:
    """The extra dev questions of ``datasets`` (annotate_mini.py's ``lodo`` part), those that exist."""
    out = []
    for dataset in datasets:
        path = root / "lodo" / f"{dataset}.jsonl"
        if not path.exists():
            logger.warning("missing %s: the %s fold is scored without extra dev questions", path, dataset)
            continue
        out.extend(read_records(path))
    return out


def lodo_selection(args: argparse.Namespace, data: SweepData, lodo: list[Record]) -> dict[str, Any]:
    """Every candidate rule with one in-domain dataset held out in turn (the library's protocol; no test item).

    A fold scores the held-out dataset's dev slice and extra dev questions and, with ``--score-pool``, its
    training-pool questions too: that fold never trains or stops on them, so they are dev questions for it.
    """
    names = args.candidates.split(",") if args.candidates else list(RULES)
    scored = [*lodo, *data.train] if args.score_pool else lodo
    return select_rule(
        data.train,
        data.dev,
        scored,
        out_dir=args.cache / "lodo",
        config=head_config(args, RULES["loss-stop"]),
        rules=names,
        budgets=[Budget.parse(b) for b in args.select_budgets.split(",") if b],
        seeds=args.seeds,
    )


def in_domain_check(
    args: argparse.Namespace, data: SweepData, lodo: list[Record], chosen: str, before: str
) -> dict[str, Any]:
    """The chosen rule against ``before`` in domain, on dev questions only: heads trained on the whole pool
    (all four datasets), scored on the extra dev questions of all four (never trained or stopped on).

    A report: ``worse_beyond_interval_at`` lists the budgets where the chosen rule's in-domain AUROC is below
    ``before``'s beyond the paired bootstrap interval (the interval's upper end below zero); what in-domain use
    gives up for the universal claim.
    """
    by_dataset: dict[str, list[Record]] = {}
    for r in lodo:
        by_dataset.setdefault(r.item.dataset, []).append(r)
    if not by_dataset:
        return {
            "chosen": chosen,
            "before": before,
            "skipped": "no extra dev questions (lodo part) read",
            "worse_beyond_interval_at": [],
        }
    scored = SweepData(data.train, data.dev, by_dataset, {d: "id" for d in by_dataset})
    labels = {d: targets(recs, "hard", what=f"lodo {d}").astype(int) for d, recs in by_dataset.items()}
    budgets = [Budget.parse(b) for b in args.select_budgets.split(",") if b]
    sweeps = {
        name: run_sweep(
            scored,
            out_dir=args.cache / "in-domain-check" / _slug(name),
            config=head_config(args, RULES[name]),
            budgets=budgets,
            seeds=args.seeds,
            methods=("elical",),
            bootstrap=0,
            stage1_dir=args.cache / "in-domain-check" / "stage1",
        )["methods"]
        for name in dict.fromkeys([chosen, before])
    }
    group = [Group("id", tuple(by_dataset))]
    rows = {}
    for b in budgets:
        new, old = sweeps[chosen][f"EliCal@{b}"], sweeps[before][f"EliCal@{b}"]
        gap = metric_differences(
            new[CONFIDENCES], old[CONFIDENCES], labels, groups=group, bootstrap=max(args.bootstrap, 1)
        )["id"]
        rows[str(b)] = {
            "chosen": {m: _num(new["id"][m]) for m in ("auroc", "ece")},
            "before": {m: _num(old["id"][m]) for m in ("auroc", "ece")},
            "auroc_diff": _num(gap.value),
            "ci95": [_num(x) for x in gap.ci],
        }
    worse = [b for b, row in rows.items() if row["ci95"][1] is not None and row["ci95"][1] < 0]
    return {
        "chosen": chosen,
        "before": before,
        "scored_on": {d: {"n": len(recs), "n_correct": int(labels[d].sum())} for d, recs in by_dataset.items()},
        "by_budget": rows,
        "worse_beyond_interval_at": worse,
        "protocol": "heads trained on the whole in-domain pool (stages 1 and 2) and stopped on the dev slice, "
        "scored on the extra in-domain dev questions (training-part questions outside the pool, greedy only); "
        "paired bootstrap of the AUROC difference (chosen - before), questions resampled per dataset. "
        "No test item is used.",
    }


def head_sweep(
    args: argparse.Namespace, data: SweepData, baselines: dict, rule: StageTwoRule, out_dir: Path
) -> dict[str, Any]:
    config = head_config(args, rule)
    return run_sweep(
        data,
        out_dir=out_dir,
        config=config,
        budgets=args.budgets,
        seeds=args.seeds,
        bootstrap=args.bootstrap,
        baselines=baselines,
        stage1_dir=args.cache / "head" / "stage1",  # every rule's curve resumes the same stage 1
    )


def plain_resume_sweep(args: argparse.Namespace, data: SweepData, rule: StageTwoRule) -> dict[str, Any]:
    """EliCal with the paper's plain resume (no bias re-centring in stage 2), to show what that choice does."""
    config = head_config(args, rule, recenter_bias=False)
    return run_sweep(
        data,
        out_dir=args.cache / "head-plain" / _slug(rule.name),
        config=config,
        budgets=[Budget.parse(b) for b in args.plain_budgets.split(",") if b],
        seeds=args.seeds,
        methods=("elical",),
        eli_only=False,
        bootstrap=args.bootstrap,
        stage1_dir=args.cache / "head" / "stage1",
    )


def lora_sweep(args: argparse.Namespace, data: SweepData) -> dict[str, Any]:
    config = EliCalConfig(mode="lora", model=args.model, max_epochs=args.lora_epochs)
    return run_sweep(
        data,
        out_dir=args.cache / "lora",
        config=config,
        budgets=[args.lora_budget],
        seeds=[args.seeds[0]],
        methods=("elical",),
        bootstrap=args.bootstrap,
    )


# ---------------------------------------------------------------- results


def results_payload(
    args: argparse.Namespace,
    head: dict,
    plain: dict,
    lora: dict | None,
    data: SweepData,
    seconds: dict[str, float],
) -> dict[str, Any]:
    methods = {
        name: method_entry(entry, "head" if name not in BASELINES else "training-free")
        for name, entry in head["methods"].items()
    }
    methods.update({name + PLAIN_SUFFIX: method_entry(entry, "head") for name, entry in plain["methods"].items()})
    if lora is not None:
        methods.update({name + LORA_SUFFIX: method_entry(entry, "lora") for name, entry in lora["methods"].items()})
    reference = methods[REFERENCE]
    for entry in methods.values():
        entry["delta_vs_n_prob"] = {g: {m: _diff(entry[g][m], reference[g][m]) for m in METRICS} for g in ("id", "ood")}
    runs = [run for entry in methods.values() for run in entry.pop("runs", [])]
    # On a GPU what must fit 24 GiB is the GPU peak; on a CPU, the process's resident memory.
    lora_peaks = [r["cost"].get("peak_gpu_mib", r["cost"]["peak_rss_mib"]) for r in runs if r["mode"] == "lora"]
    return {
        "benchmark": "HonestyBench-mini EliCal",
        "model": args.model,
        "sizes": {
            "train_pool": len(data.train),
            "dev": len(data.dev),
            "test": {ds: len(recs) for ds, recs in data.tests.items()},
        },
        "roles": dict(data.roles),
        "budgets": head["budgets"],
        "n_labels": head["n_labels"],
        "seeds": head["seeds"],
        "bootstrap": args.bootstrap,
        "methods": methods,
        "training_runs": runs,
        "lora": None
        if lora is None
        else {
            "budget": args.lora_budget.as_json(),
            "epochs_per_stage": args.lora_epochs,
            "seed": args.seeds[0],
            "peak_memory_mib": max(lora_peaks, default=None),
            "fits_24_gib": bool(lora_peaks) and max(lora_peaks) < GIB_24,
        },
        "notes": [
            "Early stopping (patience 4) on the 200-question dev slice carved from the training pool; "
            "its labels are used only to stop, and no test item is used.",
            "Stage-1 targets are consistency rates from the re-judged records (default consistency judge "
            "lexical-echo; see results/consistency_agreement.json), so Eli-Only and EliCal differ from earlier "
            "versions of this file; the 'before' curve is rerun on the same records so before/after compare like "
            "with like.",
            "Stage 2 follows the rule in stage2_rule.after: the pick of the default target 'universal' "
            "(stage2_rule.criterion: no held-out domain loses AUROC from 100 labels to all labels beyond "
            "stage2_rule.tolerance, then the best mean), chosen by leaving one in-domain dataset out "
            "(stage2_rule.held_out_selection: train on three datasets' pool, score on the fourth's dev questions; "
            "stage2_rule.domain_change: each rule's change per domain). The 'before' section is the same sweep with "
            "the in-domain target's rule (the best mean held-out AUROC, issue 25); stage2_rule.in_domain_check "
            "compares the two in domain on dev questions.",
            "EliCal re-centres the head's bias on the stage-2 targets when stage 2 starts (recenter_bias, "
            "chosen on dev-slice loss); the '(plain resume)' rows are the paper's plain resume, for comparison.",
            "head mode: frozen backbone, last-layer last-token features, head lr 1e-3, batch 32, up to the paper's "
            "epochs (10 on the full set: stage 1 and budget 'all'; else 50 up to 10k labels).",
            f"lora mode: r=8, alpha=16 on q,k,v,o,gate,up,down, lr 5e-5 (head 1e-3), batch 8, "
            f"{args.lora_epochs} epoch(s) per stage (CPU cap), one seed.",
            "Intervals: 95% bootstrap of the seed mean (test items resampled per dataset).",
        ],
        "hyperparameters": {"head": head["config"], "lora": None if lora is None else lora["config"]},
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "command": "python -m benchmarks.elical"
        + (" --quick" if args.quick else "")
        + (" --skip-lora" if args.skip_lora and not args.quick else "")
        + (f" --report-rules '{args.report_rules}'" if args.report_rules else "")
        + (f" --cache {args.cache}" if args.cache != CACHE / "elical" else "")
        + ("" if args.score_pool else " --no-score-pool")
        + (f" --lodo '{args.lodo}'" if args.lodo != ",".join(IN_DOMAIN) else ""),
    }


def add_rule_change(
    payload: dict, before: dict, selection: dict, check: dict, rule: StageTwoRule, before_rule: StageTwoRule
) -> None:
    """The stage-2 rule of each target (after: the default target's, before: the in-domain one), the
    held-out-domain evidence that chose them (criterion, tolerance, each domain's 100→all change per rule), the
    in-domain check, and the before curve."""
    payload["stage2_rule"] = {
        "before": {"name": before_rule.name, "target": "in-domain", **before_rule.settings()},
        "after": {"name": rule.name, "target": DEFAULT_TARGET, **rule.settings()},
        **claim_fields(selection),
        "held_out_selection": selection,
        "in_domain_check": check,
    }
    payload["before"] = {
        "rule": before_rule.name,
        "methods": {
            name: {k: v for k, v in method_entry(entry, "head").items() if k != "runs"}
            for name, entry in before["methods"].items()
            if name not in BASELINES
        },
    }


def keep_previous_lora(payload: dict, path: Path) -> None:
    """Without a lora run, carry the previous file's lora rows over unchanged (they predate this run)."""
    if not path.exists():
        return
    previous = json.loads(path.read_text())
    rows = {k: v for k, v in previous.get("methods", {}).items() if k.endswith(LORA_SUFFIX)}
    if not rows:
        return
    payload["methods"].update(rows)
    payload["training_runs"] += [r for r in previous.get("training_runs", []) if r.get("mode") == "lora"]
    payload["lora"] = {**previous["lora"], "carried_over": True}
    payload["notes"].append(
        "The '(lora)' rows are carried over from the previous run: they predate the re-judged consistency "
        "verdicts (lexical-echo) and the stage-2 rule change, so they are not comparable with the head rows."
    )


def method_entry(entry: dict[str, Any], mode: str) -> dict[str, Any]:
    out: dict[str, Any] = {g: {m: _num(entry[g][m]) for m in METRICS} for g in ("id", "ood")}
    out["ci95"] = {
        g: {m: [_num(x) for x in entry.get("ci95", {}).get(g, {}).get(m, [None, None])] for m in METRICS}
        for g in ("id", "ood")
    }
    out["seed_std"] = {g: {m: _num(v) for m, v in entry["seed_std"][g].items()} for g in ("id", "ood")}
    out["per_dataset"] = {ds: {m: _num(v) for m, v in values.items()} for ds, values in entry["per_dataset"].items()}
    out["mode"] = mode
    if "training" in entry:
        out["budget"] = entry["budget"]
        out["cost"] = entry["cost"]
        out["runs"] = [
            {
                "method": entry["method"],
                "budget": entry["budget"],
                "seed": seed,
                "mode": mode,
                "cost": t["cost"],
                "stages": [
                    {k: s[k] for k in ("name", "n_train", "n_dev", "epochs_run", "best_epoch", "stopped_early", "cost")}
                    for s in t["stages"]
                ],
            }
            for seed, t in zip(entry["seeds"], entry["training"], strict=True)
        ]
    return out


def markdown_table(payload: dict[str, Any]) -> str:
    """Main table: ×100, seed mean [95% CI], and ΔAUROC against N-Prob."""
    head = "| method | ID AUROC | ΔAUROC | ID ECE | ID Align | OOD AUROC | ΔAUROC | OOD ECE | OOD Align | train s |"
    lines = [head, "|---|" + "---:|" * 9]
    for name, m in payload["methods"].items():
        cells = []
        for g in ("id", "ood"):
            cells.append(_cell(m[g]["auroc"], m["ci95"][g]["auroc"]))
            cells.append(_signed(m["delta_vs_n_prob"][g]["auroc"]))
            cells.extend(_cell(m[g][k], m["ci95"][g][k]) for k in ("ece", "alignment"))
        cost = m.get("cost", {}).get("wall_s_mean")
        cells.append("–" if cost is None else f"{cost:.0f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(value: float | None, ci: list[float | None]) -> str:
    if value is None:
        return "–"
    text = f"{100 * value:.1f}"
    if ci[0] is not None and ci[1] is not None:
        text += f" [{100 * ci[0]:.0f}, {100 * ci[1]:.0f}]"
    return text


def _signed(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:+.1f}"


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 4)


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in ".-" else "_" for c in name)


def _num(x: float | None) -> float | None:
    return None if x is None or x != x else round(float(x), 4)


def main() -> None:
    setup_logging()
    args = parse_args()
    args.budgets = [Budget.parse(b) for b in args.budgets.split(",") if b]
    args.seeds = [int(s) for s in args.seeds.split(",") if s]
    args.lora_budget = Budget.parse(args.lora_budget)
    train = [r for recs in load_part(args.annotations, "train", IN_DOMAIN).values() for r in recs]
    dev = [r for recs in load_part(args.annotations, "dev", IN_DOMAIN).values() for r in recs]
    seconds: dict[str, float] = {}

    if args.only not in ("before", "sweep"):
        # The rule is chosen before any test part is read: training pool, dev slice and extra dev questions only.
        lodo = load_lodo(args.annotations, [d for d in args.lodo.split(",") if d])
        pool = SweepData(train, dev, {}, {})
        start = time.perf_counter()
        selection = lodo_selection(args, pool, lodo)
        seconds["held_out_selection"] = time.perf_counter() - start
        start = time.perf_counter()
        picks = selection["selected_by_target"]
        rule, before_rule = RULES[picks[DEFAULT_TARGET]], RULES[picks["in-domain"]]
        check = in_domain_check(args, pool, lodo, rule.name, before_rule.name)
        seconds["in_domain_check"] = time.perf_counter() - start
        if args.only == "select":
            print(
                json.dumps(
                    {"selection": selection, "in_domain_check": check, "rule": rule.name}, indent=2, default=float
                )
            )
            return
    tests = load_part(args.annotations, "test", IN_DOMAIN + OUT_OF_DOMAIN)
    roles = {d: "id" for d in IN_DOMAIN} | {d: "ood" for d in OUT_OF_DOMAIN}
    data = SweepData(train, dev, tests, roles)
    baselines = load_baselines(baseline_dir(args, tests), tests)
    if args.only in ("before", "sweep"):
        extra = [n for n in args.report_rules.split(",") if n and args.only == "sweep"]
        names = [target_rule("in-domain").name, *extra]
        for name in names:
            head_sweep(args, data, baselines, RULES[name], args.cache / "head" / _slug(name))
        return
    for target, name in picks.items():
        if target_rule(target).name != name:
            logger.warning(
                "target %s ships rule %s, the selection chose %s: update candor.train.elical.rules.TARGETS",
                target,
                target_rule(target).name,
                name,
            )
    start = time.perf_counter()
    before = head_sweep(args, data, baselines, before_rule, args.cache / "head" / _slug(before_rule.name))
    seconds["head_sweep_before"] = time.perf_counter() - start
    start = time.perf_counter()
    head = head_sweep(args, data, baselines, rule, args.cache / "head" / _slug(rule.name))
    seconds["head_sweep"] = time.perf_counter() - start
    start = time.perf_counter()
    plain = plain_resume_sweep(args, data, rule)
    seconds["plain_resume_sweep"] = time.perf_counter() - start
    report_only = {}
    for name in [n for n in args.report_rules.split(",") if n and n != rule.name]:
        start = time.perf_counter()
        report_only[name] = head_sweep(args, data, {}, RULES[name], args.cache / "head" / _slug(name))
        seconds[f"head_sweep {name}"] = time.perf_counter() - start
    lora = None
    if not args.skip_lora:
        start = time.perf_counter()
        lora = lora_sweep(args, data)
        seconds["lora"] = time.perf_counter() - start

    payload = results_payload(args, head, plain, lora, data, seconds)
    add_rule_change(payload, before, selection, check, rule, before_rule)
    payload["stage2_rule"]["report_only"] = {
        name: {
            "note": "not selected on held-out domains; swept for the record only (test/OOD never fed a choice)",
            "methods": {
                k: {g: v[g] for g in ("id", "ood", "ci95")}
                for k, v in ((k, method_entry(e, "head")) for k, e in sweep["methods"].items())
            },
        }
        for name, sweep in report_only.items()
    }
    if lora is None:
        keep_previous_lora(payload, args.out)
    write_json(args.out, payload)
    plot_sweep(head, args.plot, references=["N-Prob", "Consis-Sem"])
    print(markdown_table(payload))
    logger.info("wrote %s and %s", args.out, args.plot)


if __name__ == "__main__":
    main()
