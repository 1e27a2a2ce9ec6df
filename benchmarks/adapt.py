"""`candor adapt` meets a new domain: HonestyBench-mini, leave one domain out (issue 43).

For each in-domain dataset D in turn (the folds of the EliCal rule selection):

- the **starting head** is EliCal (head mode, stage 1 and stage 2 on the whole pool) trained on the
  other three datasets' pools only, saved as the served honest-model folder;
- D's pool questions are the deployment's **traffic**: written as a served log (the records
  ``candor serve --log-records`` writes, with their annotated samples), and N of them, drawn per
  seed, get a label derived from gold (the greedy answer's correctness; ``label_source: "gold"``);
- ``candor adapt``'s own code (:func:`candor.serve.adaptation.adapt_model`, what the command runs
  after loading) turns log + labels into the adapted head and its risk-control threshold;
- three arms are scored on D's test questions (never read before): **adapted**, **unadapted**
  (the starting head) and **cal_only** (stage 2 from scratch on the same stage-2 labels), each
  with a threshold by the same risk-control rule on the same held-out labels: AUROC, ECE, the
  coverage and the answered error rate at that threshold (null when it answers nothing) against
  alpha. The guarantee's verdict per cell is "not exercised (0 answered)" when no run answered
  anything, never "yes" (:func:`guarantee_verdict`);
- adapt's own **promotion** check (issue 64: the adapted head against the starting one on the
  held-out labels, paired by question at level delta) is counted against the test questions: how
  often a head whose test AUROC is below the unadapted head's was marked promotable (goal 0);
- the **smallest α 100 labels certify** per domain (a grid to 0.99, read from the held-out labels in
  every seed) and the guarantee row at that level (the head does not depend on α, only its
  threshold, so every level is scored from the same runs).

Sizes are smaller than HonestyBench-mini's pool so it runs on 2 shared cores: the traffic is the
first ``--pool`` (150) training-part questions per dataset, k = 5, so 200 labels (more than the
traffic) are not run; test 200 per dataset, greedy only. Intervals: 95% Student-t over
seeds (per domain), and over the per-seed means across domains (the means).

    nohup nice -n 10 python -m benchmarks.adapt --annotate test,pool   # the annotation cache (resumable)
    nohup nice -n 10 python -m benchmarks.adapt                        # the folds (cached per run)
    python -m benchmarks.adapt --reverdict   # the verdicts and the goal again, from the results file's table

Writes benchmarks/results/adapt.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from benchmarks.common import CACHE, RESULTS, logger, setup_logging, write_json
from benchmarks.mini import annotate_part, load_mini_or_exit
from candor.annotation.builder import AnnotateConfig
from candor.annotation.label_selection import select_labels
from candor.annotation.prompts import resolve_template
from candor.annotation.records import Record, read_records
from candor.annotation.served_labels import append_label, read_served
from candor.backends import load_backend
from candor.backends.base import SamplingParams
from candor.data.mini import IN_DOMAIN
from candor.data.splits import seeded_shuffle
from candor.evaluation.metrics import auroc, ece
from candor.serve import HonestModel
from candor.serve.adaptation import (
    STAGE_DEV_FRACTION,
    AdaptSettings,
    adapt_model,
    certify,
    head_confidences,
    split_labels,
)
from candor.serve.confidence_sources import HeadSource
from candor.train.elical import ConfidenceHead, EliCalConfig, train_elical
from candor.train.elical.model import HeadConfig
from candor.train.elical.pipeline import train_stage
from candor.train.elical.pool import carve_dev
from candor.util.files import atomic_write_json

MODEL = "smollm2-135m"
LABEL_SOURCE = "gold"  # the benchmark's labels: the greedy answer's correctness against gold
NOT_EXERCISED = "not exercised (0 answered)"


def annotate_mini(data_dir: str | None, parts: list[str], pool: int, datasets: list[str]) -> None:
    """The first ``pool`` training questions of each in-domain dataset (k = 5, in annotate_mini.py's cache and
    settings) and the test parts (greedy only)."""
    mini = load_mini_or_exit(data_dir, test_size=200, train_pool=500)
    backend = load_backend(MODEL)
    template = resolve_template("auto", MODEL, backend)
    if "test" in parts:  # the head scores test questions from the question alone: greedy correctness is all they need
        greedy_only = AnnotateConfig(k=0, params=SamplingParams(max_new_tokens=32), batch_size=32)
        tests = {d: mini.test_id[d] for d in datasets}
        annotate_part(tests, "test", backend, template, greedy_only, CACHE / "adapt")
    config = AnnotateConfig(k=5, params=SamplingParams(max_new_tokens=32))
    if "pool" in parts:
        annotate_part({d: mini.train[d][:pool] for d in datasets}, "train", backend, template, config, CACHE / "mini")


ARMS = ("adapted", "unadapted", "cal_only")
METRICS = ("auroc", "ece", "answered_error", "coverage")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--annotate", default=None, help="test,pool: fill the annotation cache, then stop")
    p.add_argument("--time-cli", action="store_true", help="time the real command once and add it to --out")
    p.add_argument(
        "--reverdict",
        action="store_true",
        help="recompute the guarantee verdicts and the goal from --out's table (no run)",
    )
    p.add_argument("--pool", type=int, default=150, help="training-part questions per dataset (the traffic)")
    p.add_argument("--datasets", default=",".join(IN_DOMAIN), help="--annotate: these datasets only")
    p.add_argument("--labels", default="25,50,100")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--alpha", type=float, default=0.7)
    p.add_argument("--delta", type=float, default=0.1)
    p.add_argument("--folds", default=",".join(IN_DOMAIN))
    p.add_argument("--cache", type=Path, default=CACHE / "adapt")
    p.add_argument("--out", type=Path, default=RESULTS / "adapt.json")
    return p.parse_args()


def load_records(args: argparse.Namespace) -> tuple[dict, dict]:
    """(pool, test) per dataset from the annotation cache; pool = the first --pool training questions."""
    mini = load_mini_or_exit(args.data_dir, test_size=200, train_pool=500)
    pool: dict[str, list[Record]] = {}
    test: dict[str, list[Record]] = {}
    for dataset in IN_DOMAIN:
        parts = (
            (pool, mini.train[dataset][: args.pool], CACHE / "mini" / "train"),
            (test, mini.test_id[dataset], args.cache / "test"),
        )
        for target, items, folder in parts:
            by_id = {r.id: r for r in read_records(folder / f"{dataset}.jsonl")}
            missing = [it.id for it in items if it.id not in by_id]
            if missing:
                raise SystemExit(f"{folder}/{dataset}.jsonl lacks {len(missing)} items: run --annotate test,pool")
            target[dataset] = [by_id[it.id] for it in items]
    return pool, test


def head_settings(args: argparse.Namespace, seed: int = 0) -> EliCalConfig:
    return EliCalConfig(mode="head", model=MODEL, seed=seed, feature_cache=str(args.cache / "features"))


def starting_folder(args, fold: str, pool: dict, backend) -> Path:
    """The honest model served before adapting: EliCal trained without ``fold`` (cached), early-stopped on a
    seeded 10% of the other datasets' pools."""
    folder = args.cache / "start" / fold
    if not (folder / "honest.json").exists():
        train, dev_slice = carve_dev([r for d in IN_DOMAIN if d != fold for r in pool[d]], 0.1, 0)
        head_dir = args.cache / "start-head" / fold
        train_elical(train, dev_slice, method="elical", config=head_settings(args), out_dir=head_dir)
        HonestModel(backend, HeadSource(head_dir), template="fewshot").save_pretrained(folder)
    return folder


def served_log(path: Path, traffic: list[Record], n_labels: int, seed: int) -> None:
    """The traffic as a served log, and gold-derived labels on ``n_labels`` of it (drawn by ``seed``)."""
    with path.open("w") as fh:
        for rec in traffic:
            served = {"id": f"bench-{rec.id}", "indexes": [0], "returned": [rec.greedy.text]}
            row = rec.to_dict()
            row["item"]["answers"] = []  # a served question has no gold
            row["greedy_correct"] = row["sample_correct"] = None
            row["provenance"] = {**row["provenance"], "served": served}
            fh.write(json.dumps(row) + "\n")
    for rec in seeded_shuffle(traffic, f"labels:{seed}")[:n_labels]:
        append_label(path, f"bench-{rec.id}", 0, bool(rec.greedy_correct), LABEL_SOURCE)


def arm_metrics(conf_test, y_test, conf_held, y_held, alpha: float, delta: float) -> dict[str, Any]:
    threshold = certify(conf_held, y_held, alpha, delta)
    return test_metrics(conf_test, y_test, threshold.value)


def test_metrics(conf, y, threshold: float) -> dict[str, Any]:
    answered = conf >= threshold
    return {
        "auroc": float(auroc(conf, y)),
        "ece": float(ece(conf, y)),
        "answered_error": float(1 - y[answered].mean()) if answered.any() else None,
        "coverage": float(answered.mean()),
        "threshold": float(threshold),
    }


def cal_only(args, held_split, seed: int, backbone) -> ConfidenceHead:
    """Stage 2 from scratch on the same stage-2 labels, stopped on the same slice as adapt's."""
    stage2, _ = held_split
    config = EliCalConfig(
        mode="head", model=MODEL, cal_target="hard", seed=seed, feature_cache=str(args.cache / "features")
    )
    head = ConfidenceHead.create(*backbone, HeadConfig(backbone=MODEL, template="fewshot"), seed=seed)
    s2_train, s2_dev = carve_dev(stage2, STAGE_DEV_FRACTION, seed)
    train_stage(head, s2_train, s2_dev, "cal", config, fresh=True, full_set=False)
    return head


def one_run(
    args, fold: str, n: int, seed: int, model: HonestModel, start: ConfidenceHead, traffic, test, backbone
) -> dict[str, Any]:
    path = args.cache / "runs" / f"{fold}-{n}-{seed}.json"
    if path.exists():
        return json.loads(path.read_text())
    log_path = args.cache / "logs" / f"{fold}-{n}-{seed}.jsonl"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    served_log(log_path, traffic, n, seed)
    settings = AdaptSettings(
        alpha=args.alpha,
        delta=args.delta,
        seed=seed,
        feature_cache=str(args.cache / "features"),
        label_sources=(LABEL_SOURCE,),
    )
    log = read_served(log_path)
    began = time.perf_counter()
    adapted = adapt_model(model, log, settings)
    seconds = time.perf_counter() - began
    stage2, held = split_labels(select_labels(log.answers, settings.label_sources).records, settings)  # adapt's split
    gold = {r.item.question: r.greedy_correct for r in traffic}
    y_held = np.array([gold[r.item.question] for r in held])
    y_test = np.array([r.greedy_correct for r in test])
    cache = settings.feature_cache
    result: dict[str, Any] = {
        "fold": fold,
        "labels": n,
        "seed": seed,
        "adapt_seconds": round(seconds, 2),
        "summary": adapted.summary,
    }
    conf_test = head_confidences(adapted.head, test, cache)
    result["adapted"] = test_metrics(conf_test, y_test, adapted.threshold.value)
    result["unadapted"] = arm_metrics(
        head_confidences(start, test, cache),
        y_test,
        head_confidences(start, held, cache),
        y_held,
        args.alpha,
        args.delta,
    )
    scratch = cal_only(args, (stage2, held), seed, backbone)
    result["cal_only"] = arm_metrics(
        head_confidences(scratch, test, cache),
        y_test,
        head_confidences(scratch, held, cache),
        y_held,
        args.alpha,
        args.delta,
    )
    result["promotion"] = promotion_outcome(adapted.summary["promotion"], result)
    result["scores"] = {  # the adapted head's, so every level of the grid is scored again without a model
        "held_out": [round(float(x), 6) for x in head_confidences(adapted.head, held, cache)],
        "held_out_correct": [int(x) for x in y_held],
        "test": [round(float(x), 6) for x in conf_test],
        "test_correct": [int(x) for x in y_test],
    }
    atomic_write_json(path, result)
    logger.info(
        "%s n=%d seed=%d: AUROC adapted %.3f unadapted %.3f cal-only %.3f; %s%s (adapt %.0f s)",
        fold,
        n,
        seed,
        result["adapted"]["auroc"],
        result["unadapted"]["auroc"],
        result["cal_only"]["auroc"],
        result["promotion"]["status"],
        " (worse on test)" if result["promotion"]["worse_on_test"] else "",
        seconds,
    )
    return result


# The levels an operator might set: 0.05 … 0.95, then 0.96 … 0.99 (a 135M model answers 2–20% right).
ALPHA_GRID = tuple(round(0.05 * i, 2) for i in range(1, 20)) + (0.96, 0.97, 0.98, 0.99)


def promotion_outcome(mark: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    """adapt's held-out decision, and whether the head it judged is worse than the unadapted one on the test
    questions (its AUROC below the unadapted head's: the test labels were never read by adapt)."""
    return {
        "status": mark["status"],
        "p_value": mark["p_value"],
        "held_out_difference": mark["difference"],
        "test_difference": round(result["adapted"]["auroc"] - result["unadapted"]["auroc"], 6),
        "worse_on_test": result["adapted"]["auroc"] < result["unadapted"]["auroc"],
    }


def by_alpha(scores: dict[str, list], delta: float) -> dict[str, Any]:
    """At every α of the grid: how many held-out labels the risk-control threshold answers, and the test metrics
    at that threshold. The adapted head does not depend on α (only its threshold does), so one run serves all."""
    conf_held, y_held = np.array(scores["held_out"]), np.array(scores["held_out_correct"])
    conf_test, y_test = np.array(scores["test"]), np.array(scores["test_correct"])
    out = {}
    for alpha in ALPHA_GRID:
        threshold = certify(conf_held, y_held, alpha, delta)
        entry = test_metrics(conf_test, y_test, threshold.value)
        out[f"{alpha:g}"] = {
            "held_out_answered": int((conf_held >= threshold.value).sum()),
            "coverage": entry["coverage"],
            "answered_error": entry["answered_error"],
        }
    return out


def smallest_certifiable(grid: dict[str, Any]) -> float | None:
    """The smallest α of the grid whose threshold answers at least one of the run's held-out labels."""
    return next((a for a in ALPHA_GRID if grid[f"{a:g}"]["held_out_answered"] > 0), None)


def promotion_counts(rows: list[dict]) -> dict[str, Any]:
    """Of these runs: promoted, kept, worse than the unadapted head on the test questions, and worse yet promoted."""
    promoted = [r for r in rows if r["promotion"]["status"] == "promotable"]
    return {
        "runs": len(rows),
        "promoted": len(promoted),
        "kept": len(rows) - len(promoted),
        "worse_on_test": sum(r["promotion"]["worse_on_test"] for r in rows),
        "worse_promoted": sum(r["promotion"]["worse_on_test"] for r in promoted),
    }


def top_correct(scores: dict[str, list]) -> bool:
    """Whether the adapted head's most confident held-out answer is correct."""
    return bool(scores["held_out_correct"][int(np.argmax(scores["held_out"]))])


def certified_levels(runs: list[dict], folds: list[str], delta: float, labels: int = 100) -> dict[str, Any]:
    """Per domain, the smallest α that ``labels`` labels certify in every seed (from the held-out labels only, never
    the test ones), and the guarantee row of the adapted head at that level."""
    out: dict[str, Any] = {}
    for d in folds:
        rows = [r for r in runs if r["fold"] == d and r["labels"] == labels]
        grids = [by_alpha(r["scores"], delta) for r in rows]
        per_seed = {str(r["seed"]): smallest_certifiable(g) for r, g in zip(rows, grids, strict=True)}
        levels = [a for a in per_seed.values() if a is not None]
        alpha = max(levels) if levels and len(levels) == len(rows) else None
        entry: dict[str, Any] = {
            "labels": labels,
            "delta": delta,
            "smallest_alpha_by_seed": per_seed,
            # one risk-control sequence from the most confident held-out answer ends there when it is wrong (adapt's
            # single sequence before issue 64); its other two sequences start at half and at all of them answered
            "most_confident_held_out_correct_runs": sum(top_correct(r["scores"]) for r in rows),
            "runs": len(rows),
            "held_out_right_by_seed": {str(r["seed"]): sum(r["scores"]["held_out_correct"]) for r in rows},
            "held_out": len(rows[0]["scores"]["held_out_correct"]) if rows else 0,
            "alpha": alpha,
        }
        if alpha is None:
            uncertified = [seed for seed, a in per_seed.items() if a is None]
            entry["why"] = (
                f"seed(s) {', '.join(uncertified)} certify no alpha of the grid (up to 0.99): the adapted head's "
                f"held-out answers are right {', '.join(str(k) for k in entry['held_out_right_by_seed'].values())} "
                f"times of {entry['held_out']} per seed, too few for any of the three sequences to reject "
                f"'answered error > 0.99' at delta/3"
            )
        if alpha is not None:
            at = [g[f"{alpha:g}"] for g in grids]
            answered = sum(a["answered_error"] is not None for a in at)
            above = sum((a["answered_error"] or 0) > alpha for a in at)
            entry.update(
                coverage=interval([a["coverage"] for a in at]),
                answered_error=interval([a["answered_error"] for a in at]),
                runs=len(at),
                answered_runs=answered,
                error_above_alpha_runs=above,
                guarantee=guarantee_verdict(len(at), answered, above),
            )
        out[d] = entry
    return out


def interval(values: list[float], bounds: tuple[float, float] | None = (0.0, 1.0)) -> dict[str, Any]:
    """Mean and 95% Student-t interval (None when fewer than two values), clipped to ``bounds``."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return {"mean": None, "ci95": [None, None], "n": 0}
    mean = float(np.mean(vals))
    if len(vals) < 2:
        return {"mean": round(mean, 4), "ci95": [None, None], "n": 1}
    half = float(stats.t.ppf(0.975, len(vals) - 1) * np.std(vals, ddof=1) / math.sqrt(len(vals)))
    low, high = mean - half, mean + half
    if bounds is not None:  # a metric in [0, 1]: three seeds give wide t-intervals
        low, high = max(low, bounds[0]), min(high, bounds[1])
    return {"mean": round(mean, 4), "ci95": [round(low, 4), round(high, 4)], "n": len(vals)}


def guarantee_verdict(runs: int, answered_runs: int, error_above_alpha_runs: int) -> str:
    """Whether the answered error stayed within α: "not exercised (0 answered)" when no run answered anything."""
    if answered_runs == 0:
        return NOT_EXERCISED
    if error_above_alpha_runs == 0:
        return f"yes ({answered_runs} of {runs} runs answered)"
    return f"no ({error_above_alpha_runs} of {answered_runs} answered runs above α)"


def guarantee_counts(rows: list[dict], arm: str, alpha: float) -> dict[str, Any]:
    """The runs of a cell, those that answered anything, those whose answered error passed α, and the verdict."""
    answered = sum(r[arm]["answered_error"] is not None for r in rows)
    above = sum((r[arm]["answered_error"] or 0) > alpha for r in rows)
    return {
        "alpha": alpha,
        "runs": len(rows),
        "answered_runs": answered,
        "error_above_alpha_runs": above,
        "guarantee": guarantee_verdict(len(rows), answered, above),
    }


def summarize(runs: list[dict], alpha: float, label_counts: list[int], folds: list[str]) -> dict[str, Any]:
    def cell(rows: list[dict], arm: str) -> dict[str, Any]:
        out: dict[str, Any] = {m: interval([r[arm][m] for r in rows]) for m in METRICS}
        out.update(guarantee_counts(rows, arm, alpha))
        return out

    by_domain = {
        d: {
            "by_labels": {
                str(n): {arm: cell([r for r in runs if r["fold"] == d and r["labels"] == n], arm) for arm in ARMS}
                for n in label_counts
            },
            "promotion": {
                str(n): promotion_counts([r for r in runs if r["fold"] == d and r["labels"] == n]) for n in label_counts
            },
        }
        for d in folds
    }
    by_labels: dict[str, Any] = {}
    for n in label_counts:
        by_labels[str(n)] = {}
        for arm in ARMS:
            rows = [r for r in runs if r["labels"] == n]
            seeds = sorted({r["seed"] for r in rows})
            entry: dict[str, Any] = {}
            for m in METRICS:  # per seed, the mean over domains; the interval is over seeds
                per_seed = [
                    np.mean([r[arm][m] for r in rows if r["seed"] == s and r[arm][m] is not None] or [np.nan])
                    for s in seeds
                ]
                entry[m] = interval([float(x) for x in per_seed])
            entry.update(guarantee_counts(rows, arm, alpha))
            by_labels[str(n)][arm] = entry
    promotion = {
        "test": runs[0]["summary"]["promotion"]["test"] if runs and "summary" in runs[0] else None,
        "level": runs[0]["summary"]["promotion"]["level"] if runs and "summary" in runs[0] else None,
        "worse_means": "the adapted head's AUROC on the domain's test questions is below the unadapted head's",
        "by_labels": {str(n): promotion_counts([r for r in runs if r["labels"] == n]) for n in label_counts},
        "all": promotion_counts(runs),
    }
    return {"by_labels": by_labels, "by_domain": by_domain, "promotion": promotion}


def goal(payload: dict[str, Any], folds: list[str]) -> dict[str, Any]:
    """The issue's goal at 100 labels, checked from the table (never tuned to it)."""
    at = payload["by_labels"].get("100")
    if at is None:
        return {"checked": False}
    gain = {
        d: (payload["by_domain"][d]["by_labels"]["100"]["adapted"]["auroc"]["mean"] or 0)
        - (payload["by_domain"][d]["by_labels"]["100"]["unadapted"]["auroc"]["mean"] or 0)
        for d in folds
    }
    mean_gain = float(np.mean(list(gain.values())))
    ece_ok = (at["adapted"]["ece"]["mean"] or 1) <= 0.05
    cells = [payload["by_domain"][d]["by_labels"]["100"]["adapted"] for d in folds]
    runs, answered = sum(c["runs"] for c in cells), sum(c["answered_runs"] for c in cells)
    verdict = guarantee_verdict(runs, answered, sum(c["error_above_alpha_runs"] for c in cells))
    return {
        "auroc_gain_by_domain": {d: round(g, 4) for d, g in gain.items()},
        "mean_auroc_gain": round(mean_gain, 4),
        "mean_gain_at_least_0.05": mean_gain >= 0.05,
        "no_domain_below_unadapted": all(g >= 0 for g in gain.values()),
        "adapted_ece_at_most_0.05": ece_ok,
        "adapted_coverage": at["adapted"]["coverage"]["mean"],
        # True only when some run answered and none passed α: a guarantee no run exercised is not "held"
        "answered_error_within_alpha_every_run": answered > 0 and verdict.startswith("yes"),
        "answered_error_within_alpha": verdict,
        # issue 64: no run's worse head marked promotable (over every domain, seed and label count)
        "worse_promoted_runs": payload["promotion"]["all"]["worse_promoted"] if "promotion" in payload else None,
        "no_worse_head_promoted": payload["promotion"]["all"]["worse_promoted"] == 0
        if "promotion" in payload
        else None,
    }


def reverdict(payload: dict[str, Any]) -> dict[str, Any]:
    """The verdicts of every cell and the goal, from the table's counts (the runs behind it need not be here)."""
    folds, seeds = payload["sizes"]["folds"], payload["sizes"]["seeds"]
    alpha = payload["alpha"]
    cells = [(len(folds) * seeds, arms) for arms in payload["by_labels"].values()]
    cells += [(seeds, arms) for d in folds for arms in payload["by_domain"][d]["by_labels"].values()]
    for runs, arms in cells:
        for entry in arms.values():
            entry.update(
                alpha=alpha,
                runs=runs,
                guarantee=guarantee_verdict(runs, entry["answered_runs"], entry["error_above_alpha_runs"]),
            )
    payload["notes"] = [NOTE_SAMPLES, NOTE_NULL]
    payload["goal_at_100_labels"] = goal(payload, folds)
    payload["verdicts_recomputed"] = {
        "command": "python -m benchmarks.adapt --reverdict",
        "note": "the verdicts and the goal were recomputed from this file's counts; the runs are the ones measured. "
        "Each domain's 150 traffic questions are distinct after normalization and carry only gold labels, so "
        "the split by question and the label selection of later candor adapt make the same split as these runs",
    }
    return payload


NOTE_SAMPLES = (
    "the traffic's served log keeps the annotated samples (k=5, lexical-echo consistency), so adapt "
    "regenerates none here; the test suite covers regeneration"
)
NOTE_PROMOTION = (
    "promotion: candor adapt's own held-out check (the adapted head against the starting head on the run's held-out "
    "labels: a one-sided paired bootstrap by question of the AUROC difference, at level delta); a run's head counts "
    "as worse when its AUROC on the domain's test questions, which adapt never reads, is below the unadapted head's"
)
NOTE_CERTIFIED = (
    "certified_alpha_at_100_labels: per domain, the smallest alpha of a grid (0.05 to 0.95 by 0.05, then 0.96 to "
    "0.99) whose risk-control threshold (adapt's: three fixed sequences, from the most confident held-out answers, "
    "from half of them and from all of them, each at delta/3) "
    "answers at least one held-out label in every seed at 100 labels, and the adapted head's guarantee row at it. "
    "The level is read from the held-out labels (never the test ones), which the threshold is fitted on too: it is "
    "a level an operator with these labels could reach, not one fixed in advance, so the row is a check, not a test"
)
NOTE_NULL = (
    "answered_error is null for a run whose threshold answers nothing: the guarantee is then not exercised, "
    "and a cell where no run answered says 'not exercised (0 answered)'; answered_runs counts the others"
)


def time_cli(args: argparse.Namespace, fold: str = "pararel", n: int = 100) -> None:
    """The real command on one fold's log with ``n`` labels, timed from a cold start (model loads and features
    included, no feature cache), added to the results file."""
    log, honest = args.cache / "logs" / f"{fold}-{n}-0.jsonl", args.cache / "start" / fold
    out = args.cache / "cli" / f"{fold}-{n}"
    command = [
        sys.executable,
        "-m",
        "candor.cli",
        "adapt",
        str(log),
        "--honest",
        str(honest),
        "-o",
        str(out),
        "--alpha",
        str(args.alpha),
        "--delta",
        str(args.delta),
        "--label-sources",
        LABEL_SOURCE,
    ]
    began = time.perf_counter()
    subprocess.run(command, check=True)
    seconds = time.perf_counter() - began
    payload = json.loads(args.out.read_text())
    shown = (
        f"candor adapt LOG --honest START -o OUT --alpha {args.alpha} --delta {args.delta} "
        f"--label-sources {LABEL_SOURCE}"
    )
    payload["cli_adapt"] = {
        "fold": fold,
        "labels": n,
        "seconds": round(seconds, 1),
        "mode": "head",
        "command": shown,
        "load_average": [round(x, 1) for x in os.getloadavg()],
    }
    write_json(args.out, payload)
    logger.info("candor adapt (%s, %d labels) took %.1f s from a cold start", fold, n, seconds)


def main() -> None:
    setup_logging()
    args = parse_args()
    if args.time_cli:
        time_cli(args)
        return
    if args.reverdict:
        write_json(args.out, reverdict(json.loads(args.out.read_text())))
        logger.info("wrote the verdicts into %s", args.out)
        return
    if args.annotate:
        annotate_mini(args.data_dir, args.annotate.split(","), args.pool, args.datasets.split(","))
        logger.info("annotation done")
        return
    label_counts = [int(x) for x in args.labels.split(",")]
    folds = args.folds.split(",")
    pool, test = load_records(args)
    backend = (
        load_backend(MODEL) if not all((args.cache / "start" / f / "honest.json").exists() for f in folds) else None
    )
    runs = []
    began = time.perf_counter()
    for fold in folds:
        cached = [args.cache / "runs" / f"{fold}-{n}-{seed}.json" for seed in range(args.seeds) for n in label_counts]
        if all(path.exists() for path in cached):  # summarizing again: no model to load
            runs.extend(json.loads(path.read_text()) for path in cached)
            continue
        model = HonestModel.from_pretrained(starting_folder(args, fold, pool, backend), backend=backend)
        start = ConfidenceHead.from_pretrained(args.cache / "start-head" / fold)
        backbone = (start.backbone, start.tokenizer)
        traffic = pool[fold]
        for seed in range(args.seeds):
            for n in label_counts:
                runs.append(one_run(args, fold, n, seed, model, start, traffic, test[fold], backbone))
    payload = {
        "benchmark": "candor adapt on a held-out domain (HonestyBench-mini, leave one domain out)",
        "model": MODEL,
        "alpha": args.alpha,
        "delta": args.delta,
        "sizes": {
            "traffic_per_domain": args.pool,
            "test_per_domain": 200,
            "k": 5,
            "label_counts": label_counts,
            "seeds": args.seeds,
            "folds": folds,
        },
        **summarize(runs, args.alpha, label_counts, folds),
        "certified_alpha_at_100_labels": certified_levels(runs, folds, args.delta) if 100 in label_counts else None,
        "adapt_seconds": {
            str(n): interval([r["adapt_seconds"] for r in runs if r["labels"] == n], None) for n in label_counts
        },
        "seconds": round(time.perf_counter() - began, 1),  # this invocation: a few when every run was cached
        "command": "python -m benchmarks.adapt",
        "notes": [NOTE_SAMPLES, NOTE_NULL, NOTE_PROMOTION, NOTE_CERTIFIED],
    }
    payload["goal_at_100_labels"] = goal(payload, folds)
    if args.out.exists() and "cli_adapt" in json.loads(args.out.read_text()):  # measured by --time-cli
        payload["cli_adapt"] = json.loads(args.out.read_text())["cli_adapt"]
    write_json(args.out, payload)
    logger.info("wrote %s", args.out)


if __name__ == "__main__":
    main()
