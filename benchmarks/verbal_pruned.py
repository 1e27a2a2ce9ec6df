"""verbal-percent with the opt-in trie pruning (``min_mass``) against exact verbal-percent and verbal-number, one run.

On the first ``--n`` annotated records (default 200 HonestyBench-mini NQ
training records; the bound is a property of the method, not tuned) with the
embedded default model it times ``verbal-number``, exact ``verbal-percent`` and
``verbal-percent`` at each ``--min-mass``, a warm-up call first, and compares
each pruned μ with the exact μ: max and mean |Δμ|, the stated per-record bound
(:func:`candor.verbal.formats.mu_error_bound`) and how many records exceed it
(beyond 1e-5 of float round-off; it must be 0).

    PYTHONPATH=src python -m benchmarks.verbal_pruned --records benchmarks/cache/mini/train/nq.jsonl

Writes benchmarks/results/verbal_pruned.json. Timings on a shared CPU are noisy: read the CPU ratios.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import CACHE, RESULTS, logger, setup_logging, write_json
from benchmarks.measure import Timer

MODEL = "smollm2-135m"
ROUND_OFF = 1e-5


def timed(name: str, records: list, backend: Any, **options: Any) -> tuple[np.ndarray, Any, Timer]:
    from candor.estimators import get_estimator

    est = get_estimator(name, **options)
    est.estimate(records[:2], backend)  # warm-up
    with Timer() as t:
        values = est.estimate(records, backend)
    logger.info("%s %s: %.3f CPU s/record", name, options or "", t.cpu / len(records))
    return values, est, t


def per_record(t: Timer, n: int) -> dict[str, float]:
    return {"cpu_seconds_per_record": t.cpu / n, "wall_seconds_per_record": t.wall / n}


def main() -> None:
    setup_logging()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=Path, default=CACHE / "mini" / "train" / "nq.jsonl")
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--min-mass", type=float, nargs="+", default=[0.01, 0.003, 0.001])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=RESULTS / "verbal_pruned.json")
    args = p.parse_args()
    if not args.records.exists():
        print(f"SKIP: no annotated records at {args.records}", file=sys.stderr)
        raise SystemExit(0)

    import torch

    from candor.annotation.records import read_records
    from candor.backends.hf import HFBackend

    torch.set_num_threads(args.threads)
    records = read_records(args.records)[: args.n]
    backend = HFBackend.from_pretrained(MODEL)
    _, _, number = timed("verbal-number", records, backend)
    exact, _, exact_t = timed("verbal-percent", records, backend)
    runs = {}
    for min_mass in args.min_mass:
        mu, est, t = timed("verbal-percent", records, backend, min_mass=min_mass)
        diff, bound = np.abs(mu - exact), est.last_error_bound
        runs[str(min_mass)] = {
            **per_record(t, len(records)),
            "cpu_ratio_to_number": t.cpu / number.cpu,
            "wall_ratio_to_number": t.wall / number.wall,
            "max_abs_mu_difference": float(diff.max()),
            "mean_abs_mu_difference": float(diff.mean()),
            "max_bound": float(bound.max()),
            "mean_bound": float(bound.mean()),
            "records_over_bound": int((diff > bound + ROUND_OFF).sum()),
        }
    result = {
        "model": MODEL,
        "records": str(args.records),
        "n": len(records),
        "torch_threads": args.threads,
        "load_average_1min": os.getloadavg()[0],
        "number": per_record(number, len(records)),
        "percent_exact": {
            **per_record(exact_t, len(records)),
            "cpu_ratio_to_number": exact_t.cpu / number.cpu,
            "wall_ratio_to_number": exact_t.wall / number.wall,
        },
        "percent_pruned": runs,
        "bound": "|μ - μ_exact| <= u · max_c |value(c) - μ|, u = U / (A + U): U the probability of the trie nodes "
        "left unexpanded, A that of the labels kept",
        "command": "PYTHONPATH=src python -m benchmarks.verbal_pruned " + " ".join(sys.argv[1:]),
    }
    write_json(args.out, result)
    print(f"exact percent/number: {result['percent_exact']['cpu_ratio_to_number']:.2f}x CPU")
    for m, r in runs.items():
        print(
            f"min_mass {m}: {r['cpu_ratio_to_number']:.2f}x CPU, |Δμ| max {r['max_abs_mu_difference']:.4f} "
            f"mean {r['mean_abs_mu_difference']:.4f}, bound max {r['max_bound']:.3f}, over {r['records_over_bound']}"
        )


if __name__ == "__main__":
    main()
