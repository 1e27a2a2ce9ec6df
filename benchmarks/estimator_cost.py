"""Scoring cost per record of the issue-14 estimators on already-annotated HonestyBench-mini records.

Times each estimator alone on the first ``--n`` records of one annotated file
(default: 50 records of benchmarks/cache/mini/test/nq.jsonl, k=5 samples) with
the embedded default model, and prints each cost as a ratio to ``consis-lex``
timed in the same run. The probe is timed when ``--probe DIR`` is given.

    PYTHONPATH=src OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks.estimator_cost

Writes benchmarks/results/estimator_cost.json. Timings on a shared CPU are noisy.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks.common import CACHE, RESULTS, logger, setup_logging, write_json
from candor.annotation.records import read_records
from candor.backends import load_backend
from candor.estimators import get_estimator

BASELINE = "consis-lex"
METHODS = (
    BASELINE,
    "n-prob",
    "perplexity",
    "token-entropy-mean",
    "token-entropy-max",
    "prob-margin",
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
)


def main() -> None:
    setup_logging()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=Path, default=CACHE / "mini" / "test" / "nq.jsonl")
    p.add_argument("--n", type=int, default=50)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--probe", type=Path, default=None)
    p.add_argument("--out", type=Path, default=RESULTS / "estimator_cost.json")
    args = p.parse_args()
    records = read_records(args.records)[: args.n]
    backend = load_backend(args.model)
    methods = [(m, {}) for m in METHODS]
    if args.probe is not None:
        methods.append(("probe", {"path": str(args.probe)}))
    seconds: dict[str, float] = {}
    for name, options in methods:
        est = get_estimator(name, **options)
        start = time.perf_counter()
        est.estimate(records, backend if est.needs_backend else None)
        seconds[name] = time.perf_counter() - start
        logger.info("%s: %.4f s/record", name, seconds[name] / len(records))
    base = seconds[BASELINE]
    rows = {m: {"seconds_per_record": s / len(records), "ratio_to_" + BASELINE: s / base} for m, s in seconds.items()}
    root = Path(__file__).resolve().parents[1]
    shown = args.records.resolve()
    shown = shown.relative_to(root) if shown.is_relative_to(root) else shown
    write_json(
        args.out,
        {
            "records": str(shown),
            "n": len(records),
            "model": args.model,
            "k": records[0].k if records else 0,
            "methods": rows,
            "command": "PYTHONPATH=src OMP_NUM_THREADS=1 python -m benchmarks.estimator_cost " + " ".join(sys.argv[1:]),
        },
    )
    for m, r in rows.items():
        print(f"{m:28s} {r['seconds_per_record'] * 1000:10.2f} ms/record  {r['ratio_to_' + BASELINE]:10.1f}x")


if __name__ == "__main__":
    main()
