"""EigenScore's cost per record: each record's prompt run once for its k samples, against one run per sample.

On the first ``--n`` records of one annotated file (default: 20 records of
benchmarks/cache/mini/test/nq.jsonl, k=5) with the embedded default model, it
times, in the same run, the hidden states EigenScore reads computed two ways:

- ``one_by_one``: ``hidden_states`` on each ``prompt + sample`` text (the
  computation before the shared path; the prompt runs k times per record);
- ``shared``: ``continuation_hidden_states`` (the shared few-shot prefix once
  per call, each record's prompt once, the k samples' tokens as one batch),
  what the estimator now runs,

and reports seconds per record (CPU and wall), their ratio, and the largest
difference of the EigenScore confidences between the two.

    PYTHONPATH=src OMP_NUM_THREADS=2 .venv/bin/python -m benchmarks.eigenscore_cost

Writes benchmarks/results/eigenscore_cost.json. Timings on a shared CPU are noisy; CPU time less so.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from benchmarks.common import CACHE, RESULTS, logger, setup_logging, write_json
from benchmarks.measure import Timer
from candor.annotation.prompts import record_prompts
from candor.annotation.records import read_records
from candor.backends import load_backend
from candor.backends.base import continuation_hidden_states, hidden_states_one_by_one
from candor.estimators.eigenscore import eigenscore
from candor.estimators.hidden_layers import middle_layer

PATHS = {"one_by_one": hidden_states_one_by_one, "shared": continuation_hidden_states}


def main() -> None:
    setup_logging()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", type=Path, default=CACHE / "mini" / "test" / "nq.jsonl")
    p.add_argument("--n", type=int, default=20)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--out", type=Path, default=RESULTS / "eigenscore_cost.json")
    args = p.parse_args()
    if not args.records.exists():
        print(f"SKIP: no annotated records at {args.records}", file=sys.stderr)
        raise SystemExit(0)
    records = [r for r in read_records(args.records) if r.samples][: args.n]
    backend = load_backend(args.model)
    layer = middle_layer(backend)
    prompts, _ = record_prompts(records, backend)
    samples = [[s.text for s in r.samples] for r in records]
    backend.hidden_states(prompts[:1], layer=layer)  # warm-up: first-call allocations
    rows, confidences = {}, {}
    for name, path in PATHS.items():
        with Timer() as t:
            states = path(backend, prompts, samples, layer=layer)
        cpu, wall = t.cpu, t.wall
        confidences[name] = [1 / (1 + math.exp(eigenscore(s))) for s in states]
        rows[name] = {"cpu_seconds_per_record": cpu / len(records), "wall_seconds_per_record": wall / len(records)}
        logger.info("%s: %.3f s/record CPU, %.3f s/record wall", name, cpu / len(records), wall / len(records))
    diffs = [abs(a - b) for a, b in zip(confidences["shared"], confidences["one_by_one"], strict=True)]
    result = {
        "records": str(args.records),
        "n": len(records),
        "model": args.model,
        "k": records[0].k if records else 0,
        "layer": layer,
        "threads": os.environ.get("OMP_NUM_THREADS"),
        "load_average_1min": os.getloadavg()[0],
        "paths": rows,
        "speedup_cpu": rows["one_by_one"]["cpu_seconds_per_record"] / rows["shared"]["cpu_seconds_per_record"],
        "speedup_wall": rows["one_by_one"]["wall_seconds_per_record"] / rows["shared"]["wall_seconds_per_record"],
        "max_abs_confidence_difference": max(diffs),
        "command": "PYTHONPATH=src OMP_NUM_THREADS=2 python -m benchmarks.eigenscore_cost " + " ".join(sys.argv[1:]),
    }
    write_json(args.out, result)
    for name, r in rows.items():
        print(f"{name:12s} {r['cpu_seconds_per_record']:8.3f} s/record CPU {r['wall_seconds_per_record']:8.3f} wall")
    print(
        f"speedup {result['speedup_cpu']:.1f}x CPU, {result['speedup_wall']:.1f}x wall; "
        f"max |Δ confidence| {result['max_abs_confidence_difference']:.2e}"
    )


if __name__ == "__main__":
    main()
