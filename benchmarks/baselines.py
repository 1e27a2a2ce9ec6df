"""HonestyBench-mini baselines on the embedded default.

See docs/methods.md "Training-free estimators", "Verbalized answer-level confidence", "HonestyBench-mini".

Annotates the mini in-domain and OOD test sets and the dev slice (k=5), then
scores every training-free estimator and the five verbalized formats (Default)
and evaluates them per dataset and as size-weighted
in-domain / OOD averages with bootstrap 95% intervals. verbal-10 draws its
in-context examples from the dev slice of the training part. Last, it annotates
the training pool, which the EliCal and ADVICE benchmarks reuse.

Every stage caches under benchmarks/cache/mini, so a killed run resumes:

    nohup .venv/bin/python benchmarks/baselines.py > benchmarks/cache/baselines.log 2>&1 &

Writes benchmarks/results/baselines.json and benchmarks/results/baselines/ (the report).

``length`` (the answer-length baseline) fits its direction on the dev slice, never on test.
``--merge`` adds the ``--methods`` to an existing ``--out`` file and leaves every number already
there as it is (no report folder is written), e.g. to add a new baseline to a committed run:

    python benchmarks/baselines.py --methods length --merge --skip-train \
        --scores benchmarks/cache/pages/confidences --out benchmarks/results/baselines_strong.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from common import CACHE, RESULTS, annotate_part, load_mini_or_exit, logger, peak_rss_mib, setup_logging, write_json

from candor.annotation.builder import AnnotateConfig
from candor.annotation.prompts import resolve_template
from candor.backends import load_backend
from candor.backends.base import SamplingParams
from candor.data.mini import IN_DOMAIN, OUT_OF_DOMAIN
from candor.estimators import get_estimator
from candor.estimators.confidences import ConfidenceTable, score_into
from candor.evaluation.report import write_report
from candor.evaluation.summary import evaluate

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
    p.add_argument("--probe", type=Path, default=None,
                   help="a trained answer probe (`candor train probe` on the training pool) to score as 'probe'")
    p.add_argument("--bootstrap", type=int, default=1000)
    p.add_argument("--skip-train", action="store_true", help="do not annotate the training pool")
    p.add_argument("--cache", type=Path, default=CACHE / "mini")
    p.add_argument("--scores", type=Path, default=None,
                   help="folder for the confidences files (default: <cache>/confidences)")
    p.add_argument("--out", type=Path, default=RESULTS / "baselines.json")
    p.add_argument("--merge", action="store_true",
                   help="add --methods to the existing --out, keeping every number already there")
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
    if args.merge:
        merge_into(args, evaluate(ConfidenceTable(rows), roles=roles, bootstrap=args.bootstrap), timings, fits)
        return
    report = write_report(ConfidenceTable(rows), args.out.with_suffix(""), roles=roles, bootstrap=args.bootstrap,
                          title=f"HonestyBench-mini baselines: {args.model}",
                          records=[r for recs in tests.values() for r in recs],
                          command=" ".join(["python benchmarks/baselines.py", *sys.argv[1:]]))
    payload = results_payload(report.evaluation, args, timings)
    payload.update({"fits": fits} if fits else {})
    write_json(args.out, payload)
    print(markdown_table(payload))
    logger.info("wrote %s and %s", args.out, report.files["index"])
    if not args.skip_train:
        # The training pool is for the EliCal / ADVICE benchmarks; annotated last so results come first.
        annotate_part(mini.train, "train", backend, template, config, args.cache)


def merge_into(args: argparse.Namespace, ev, timings: dict[str, float], fits: dict) -> None:
    """Add this run's methods to the existing results file; the numbers already there stay as they are."""
    payload = json.loads(args.out.read_text())
    new = results_payload(ev, args, timings)
    if new["sizes"] != payload["sizes"]:
        raise SystemExit(f"--merge: the test sets differ from {args.out} ({new['sizes']} vs {payload['sizes']})")
    if new["greedy_accuracy"] != payload["greedy_accuracy"]:  # other annotations: the numbers would not compare
        raise SystemExit(f"--merge: the records' greedy accuracy differs from {args.out}'s "
                         f"({new['greedy_accuracy']} vs {payload['greedy_accuracy']}); rerun every method instead")
    if new["bootstrap"] != payload["bootstrap"]:
        raise SystemExit(f"--merge: --bootstrap {new['bootstrap']} differs from {args.out}'s {payload['bootstrap']}")
    payload["methods"].update(new["methods"])
    payload.setdefault("fits", {}).update(fits)
    payload.setdefault("merged", []).append({"methods": list(new["methods"]), "command": new["command"],
                                             "seconds": new["seconds"]})
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
        "command": " ".join(["python benchmarks/baselines.py", *sys.argv[1:]]),
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
