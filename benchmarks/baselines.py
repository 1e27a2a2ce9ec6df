"""HonestyBench-mini baselines on the embedded default.

See docs/methods.md "Training-free estimators", "Verbalized answer-level confidence", "HonestyBench-mini".

Annotates the mini in-domain and OOD test sets and the dev slice (k=5), then
scores every training-free estimator and the five verbalized formats (Default)
and evaluates them per dataset and as size-weighted
in-domain / OOD averages with bootstrap 95% intervals. verbal-10 draws its
in-context examples from the dev slice of the training part. Last, it annotates
the training pool, which the EliCal and ADVICE benchmarks reuse.

Every stage caches under benchmarks/cache/mini, so a killed run resumes:

    nohup .venv/bin/python -m benchmarks.baselines > benchmarks/cache/baselines.log 2>&1 &

Writes benchmarks/results/baselines.json and benchmarks/results/baselines/ (the report).

``length`` (the answer-length baseline) fits its direction on the dev slice, never on test.

``--debias`` adds, for every method but ``length``, the same method scored with
``-O <method>.debias=length`` fitted on the dev slice, as ``<method>+debias``.
``--ensemble`` adds ``ensemble``: its members are chosen among the methods that
read the records only (no model), by greedy forward selection on the dev slice's
5-fold cross-validated AUROC of the stacked members (a method equal to a chosen
member on dev is skipped), and the stack is fitted on
the whole dev slice. Both fit on dev only; the test sets are scored once.
``--block NAME`` writes the run into key NAME of an existing ``--out`` file,
leaving everything else in it as it was (a run on other records beside a committed one).
``--merge`` adds the ``--methods`` to an existing ``--out`` file and leaves every number already
there as it is (no report folder is written), e.g. to add a new baseline to a committed run:

    python -m benchmarks.baselines --methods length --merge --skip-train \
        --scores benchmarks/cache/pages/confidences --out benchmarks/results/baselines_strong.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.common import CACHE, RESULTS, logger, setup_logging, write_json
from benchmarks.measure import peak_rss_mib
from benchmarks.mini import annotate_part, load_mini_or_exit
from candor.annotation.builder import AnnotateConfig
from candor.annotation.prompts import resolve_template
from candor.backends import load_backend
from candor.backends.base import SamplingParams
from candor.data.mini import IN_DOMAIN, OUT_OF_DOMAIN
from candor.estimators import get_estimator
from candor.estimators.confidences import ConfidenceRow, ConfidenceTable, score_into
from candor.estimators.stacking import fit_logistic
from candor.evaluation.metrics import auroc
from candor.evaluation.report import write_report
from candor.evaluation.summary import evaluate_table

METHODS = (
    "prob",
    "n-prob",
    "min-prob",
    "consis-lex",
    "consis-sem",
    "verbal-0",
    "verbal-10",
    "p-true",
    "verbal-letter",
    "verbal-number",
    "verbal-text",
    "verbal-float",
    "verbal-percent",
    "token-entropy-mean",
    "token-entropy-max",
    "prob-margin",
    "perplexity",
    "mc-entropy",
    "semantic-entropy",
    "semantic-entropy-discrete",
    "num-sem-sets",
    "eigv",
    "degree",
    "eccentricity",
    "kle",
    "cocoa",
    "eigenscore",
    "length",
)
MAIN_METRICS = ("auroc", "ece", "alignment", "brier", "aurc", "prr")
TABLE_METRICS = ("auroc", "ece", "alignment", "brier")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--test-size", type=int, default=200)
    p.add_argument("--train-pool", type=int, default=500)
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument(
        "--probe",
        type=Path,
        default=None,
        help="a trained answer probe (`candor train probe` on the training pool) to score as 'probe'",
    )
    p.add_argument("--bootstrap", type=int, default=1000)
    p.add_argument("--skip-train", action="store_true", help="do not annotate the training pool")
    p.add_argument("--cache", type=Path, default=CACHE / "mini")
    p.add_argument(
        "--scores", type=Path, default=None, help="folder for the confidences files (default: <cache>/confidences)"
    )
    p.add_argument("--out", type=Path, default=RESULTS / "baselines.json")
    p.add_argument(
        "--merge", action="store_true", help="add --methods to the existing --out, keeping every number already there"
    )
    p.add_argument("--debias", action="store_true", help="also score <method>+debias (length, fitted on dev)")
    p.add_argument("--ensemble", action="store_true", help="also score an ensemble chosen and fitted on dev")
    p.add_argument("--block", default=None, help="write into this key of the existing --out (no report folder)")
    return p.parse_args()


def main() -> None:
    setup_logging()
    args = parse_args()
    mini = load_mini_or_exit(args.data_dir, test_size=args.test_size, train_pool=args.train_pool)
    backend = load_backend(args.model)
    template = resolve_template("auto", args.model, backend)
    config = AnnotateConfig(k=args.k, params=SamplingParams(max_new_tokens=32))
    timings: dict[str, float] = {}

    start = time.perf_counter()
    tests = annotate_part({**mini.test_id, **mini.test_ood}, "test", backend, template, config, args.cache)
    timings["annotate_test"] = time.perf_counter() - start
    start = time.perf_counter()
    dev = annotate_part(mini.dev, "dev", backend, template, config, args.cache)
    timings["annotate_dev"] = time.perf_counter() - start

    methods = [m for m in args.methods.split(",") if m]
    # verbal-10's in-context examples and length's direction come from the dev slice of the training part,
    # never from test data.
    dev_records = [r for recs in dev.values() for r in recs]
    options = {"verbal-10": {"examples": dev_records}, "length": {"dev": dev_records}}
    if args.probe is not None:
        methods.append("probe")
        options["probe"] = {"path": str(args.probe)}
    options = {m: o for m, o in options.items() if m in methods}
    scores = args.scores or args.cache / "confidences"
    rows = []
    for dataset, records in tests.items():
        start = time.perf_counter()
        table = score_into(records, methods, scores / f"{dataset}.jsonl", backend, options=options)
        timings[f"score_{dataset}"] = time.perf_counter() - start
        rows.extend(table.rows)

    roles = {d: "id" for d in IN_DOMAIN} | {d: "ood" for d in OUT_OF_DOMAIN}
    roles = {d: r for d, r in roles.items() if d in tests}
    fits = {"length": get_estimator("length", **options["length"]).describe()} if "length" in methods else {}
    test_records = [r for recs in tests.values() for r in recs]
    if args.ensemble:
        start = time.perf_counter()
        members, search = choose_members(dev_records, [m for m in methods if not needs_model(m, options)], options)
        ens_options = {
            "ensemble": {
                "members": ",".join(members),
                "dev": dev_records,
                **{f"{m}.{k}": v for m in members for k, v in options.get(m, {}).items()},
            }
        }
        table = score_into(test_records, ["ensemble"], scores / "ensemble" / "all.jsonl", backend, options=ens_options)
        add_columns(rows, table, {"ensemble": "ensemble"})
        fits["ensemble"] = {**search, "weights": table.columns["ensemble"]["estimator"]["weights"]}
        timings["ensemble"] = time.perf_counter() - start
    if args.debias:
        start = time.perf_counter()
        # model-free methods first: a run killed in the slow model-based ones keeps them
        plain = sorted((m for m in methods if m != "length"), key=lambda m: needs_model(m, options))
        deb = {m: {**options.get(m, {}), "debias": "length", "debias_dev": dev_records} for m in plain}
        table = score_into(test_records, plain, scores / "debias" / "all.jsonl", backend, options=deb)
        add_columns(rows, table, {m: f"{m}+debias" for m in plain})
        fits["debias"] = {m: table.columns[m]["estimator"]["debias"] for m in plain}
        timings["debias"] = time.perf_counter() - start
    if args.block:
        write_block(args, evaluate_table(ConfidenceTable(rows), roles=roles, bootstrap=args.bootstrap), timings, fits)
        return
    if args.merge:
        merge_into(args, evaluate_table(ConfidenceTable(rows), roles=roles, bootstrap=args.bootstrap), timings, fits)
        return
    report = write_report(
        ConfidenceTable(rows),
        args.out.with_suffix(""),
        roles=roles,
        bootstrap=args.bootstrap,
        title=f"HonestyBench-mini baselines: {args.model}",
        records=[r for recs in tests.values() for r in recs],
        command=" ".join(["python -m benchmarks.baselines", *sys.argv[1:]]),
    )
    payload = results_payload(report.evaluation, args, timings)
    payload.update({"fits": fits} if fits else {})
    write_json(args.out, payload)
    print(markdown_table(payload))
    logger.info("wrote %s and %s", args.out, report.files["index"])
    if not args.skip_train:
        # The training pool is for the EliCal / ADVICE benchmarks; annotated last so results come first.
        annotate_part(mini.train, "train", backend, template, config, args.cache)


def needs_model(method: str, options: dict) -> bool:
    return get_estimator(method, **options.get(method, {})).needs_backend


def add_columns(rows: list[ConfidenceRow], table: ConfidenceTable, names: dict[str, str]) -> None:
    """Copy ``table``'s columns into ``rows`` (matched by id) under new names."""
    by_id = {r.id: r for r in table.rows}
    for row in rows:
        for old, new in names.items():
            row.confidence[new] = by_id[row.id].confidence[old]


def cv_auroc(features: np.ndarray, y: np.ndarray, folds: int = 5) -> float:
    """AUROC of out-of-fold stacked predictions (folds stratified by label, in a fixed order)."""
    fold = np.empty(y.size, dtype=int)
    for label in (0, 1):
        where = np.flatnonzero(y == label)
        fold[where] = np.arange(where.size) % folds
    predicted = np.empty(y.size)
    for k in range(folds):
        held = fold == k
        predicted[held] = fit_logistic(features[~held], y[~held], "ensemble search").predict(features[held])
    return auroc(predicted, y)


def choose_members(dev: list, candidates: list[str], options: dict, most: int = 4) -> tuple[list[str], dict]:
    """Greedy forward selection of ensemble members by dev cross-validated AUROC (dev only, never test)."""
    y = np.array([int(r.greedy_correct) for r in dev])
    scores = {m: get_estimator(m, **options.get(m, {})).estimate(dev) for m in candidates}
    chosen: list[str] = []
    path = []
    best = -1.0
    while len(chosen) < most:
        # a candidate equal to a chosen member on dev (perplexity is n-prob) adds nothing but a weaker penalty
        fresh = [m for m in candidates if not any(np.allclose(scores[m], scores[c]) for c in chosen)]
        trials = {m: cv_auroc(np.column_stack([scores[c] for c in [*chosen, m]]), y) for m in fresh}
        if not trials:
            break
        pick = max(trials, key=lambda m: trials[m])
        if len(chosen) >= 2 and trials[pick] <= best:
            break
        chosen.append(pick)
        best = trials[pick]
        path.append({"members": list(chosen), "dev_cv_auroc": round(best, 4)})
    logger.info("ensemble members chosen on dev: %s (5-fold CV AUROC %.3f)", chosen, best)
    return chosen, {"members": chosen, "search": path, "candidates": candidates, "dev_size": len(dev)}


def write_block(args: argparse.Namespace, ev, timings: dict[str, float], fits: dict) -> None:
    """Put this run into key ``--block`` of the existing ``--out``; everything else in it stays."""
    payload = json.loads(args.out.read_text())
    payload[args.block] = {**results_payload(ev, args, timings), "fits": fits}
    write_json(args.out, payload)
    print(markdown_table(payload[args.block]))
    logger.info("wrote block %r of %s", args.block, args.out)


def merge_into(args: argparse.Namespace, ev, timings: dict[str, float], fits: dict) -> None:
    """Add this run's methods to the existing results file; the numbers already there stay as they are."""
    payload = json.loads(args.out.read_text())
    new = results_payload(ev, args, timings)
    if new["sizes"] != payload["sizes"]:
        raise SystemExit(f"--merge: the test sets differ from {args.out} ({new['sizes']} vs {payload['sizes']})")
    if new["greedy_accuracy"] != payload["greedy_accuracy"]:  # other annotations: the numbers would not compare
        raise SystemExit(
            f"--merge: the records' greedy accuracy differs from {args.out}'s "
            f"({new['greedy_accuracy']} vs {payload['greedy_accuracy']}); rerun every method instead"
        )
    if new["bootstrap"] != payload["bootstrap"]:
        raise SystemExit(f"--merge: --bootstrap {new['bootstrap']} differs from {args.out}'s {payload['bootstrap']}")
    payload["methods"].update(new["methods"])
    payload.setdefault("fits", {}).update(fits)
    payload.setdefault("merged", []).append(
        {"methods": list(new["methods"]), "command": new["command"], "seconds": new["seconds"]}
    )
    write_json(args.out, payload)
    print(markdown_table(new))
    logger.info("added %s to %s", ", ".join(new["methods"]), args.out)


def results_payload(ev, args: argparse.Namespace, timings: dict[str, float]) -> dict:
    def pick(method: str, column: str) -> dict[str, float | None]:
        values = ev.metrics[method][column]
        return {m: _num(values.get(m)) for m in MAIN_METRICS}

    def ci(method: str, column: str) -> dict[str, list[float | None]]:
        cis = ev.ci.get(method, {}).get(column, {})
        return {m: [_num(lo), _num(hi)] for m, (lo, hi) in cis.items()}

    methods = {}
    for method in ev.methods:
        methods[method] = {
            "id": pick(method, "id"),
            "ood": pick(method, "ood"),
            "ci95": {"id": ci(method, "id"), "ood": ci(method, "ood")},
            "per_dataset": {d: pick(method, d) for d in ev.datasets},
        }
    return {
        "benchmark": "HonestyBench-mini baselines",
        "model": args.model,
        "k": args.k,
        "test_size": args.test_size,
        "sizes": ev.sizes,
        "greedy_accuracy": {d: _num(a) for d, a in ev.accuracy.items()},
        "methods": methods,
        "bootstrap": args.bootstrap,
        "seconds": {k: round(v, 1) for k, v in timings.items()},
        "peak_rss_mib": round(peak_rss_mib(), 1),
        "command": " ".join(["python -m benchmarks.baselines", *sys.argv[1:]]),
    }


def markdown_table(payload: dict) -> str:
    """The ID / OOD table for benchmarks/README.md (×100, 95% bootstrap intervals)."""
    head = "| method | ID AUROC | ID ECE | ID Alignment | ID Brier | OOD AUROC | OOD ECE | OOD Alignment | OOD Brier |"
    lines = [head, "|---|" + "---:|" * 8]
    for method, m in payload["methods"].items():
        cells = []
        for group in ("id", "ood"):
            for metric in TABLE_METRICS:
                value, (lo, hi) = m[group][metric], m["ci95"][group].get(metric, [None, None])
                cell = "–" if value is None else f"{100 * value:.1f}"
                if value is not None and lo is not None and hi is not None:
                    cell += f" [{100 * lo:.0f}, {100 * hi:.0f}]"
                cells.append(cell)
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _num(x: float | None) -> float | None:
    return None if x is None or x != x else round(float(x), 4)


if __name__ == "__main__":
    main()
