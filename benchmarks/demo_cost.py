"""Where ``candor demo`` spends its time: annotation and each estimator, on the first N starter questions.

One process, the embedded default model, the demo's own settings (starter
set, ``auto`` template, k=5, batch 16). Annotation and every estimator of the
former and the current default set are timed on the same records (wall and
process CPU seconds, model loading outside), and the two sets' totals are
compared: on a machine shared with other jobs, CPU seconds are the steadier
measure of the work, and the ratio of the two totals is the number to read.
The projection to the full starter set scales the per-question CPU time and
divides by 2 cores (an upper bound on the speed; model loading and the report
come on top). Results: ``benchmarks/results/demo_cost.json``.

    python -m benchmarks.demo_cost [--questions 48]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from benchmarks.common import RESULTS, write_json

OUT = RESULTS / "demo_cost.json"
MODEL = "smollm2-135m"
# The default set before this change (11 estimators, four verbalized formats and verbal-0).
FORMER_DEFAULT = (
    "prob",
    "n-prob",
    "min-prob",
    "consis-lex",
    "consis-sem",
    "verbal-0",
    "p-true",
    "verbal-letter",
    "verbal-number",
    "verbal-text",
    "verbal-float",
)
STARTER_SIZE = 475


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--questions", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()

    import torch

    from candor.annotation.builder import AnnotateConfig, annotate
    from candor.annotation.prompts import resolve_template
    from candor.annotation.records import read_records
    from candor.backends import load_backend
    from candor.data import load_items
    from candor.demo import DEMO_ESTIMATORS
    from candor.estimators import get_estimator

    torch.set_num_threads(args.threads)
    items = load_items("starter", limit=args.questions)
    backend = load_backend(MODEL, batch_size=16)
    template = resolve_template("auto", MODEL, backend)
    stages: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        annotate(items[:1], backend, Path(tmp) / "warm.jsonl", template, AnnotateConfig(k=5), progress=False)
        start, cpu = time.perf_counter(), time.process_time()
        annotate(items, backend, Path(tmp) / "records.jsonl", template, AnnotateConfig(k=5), progress=False)
        stages["annotate"] = {"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu}
        records = list(read_records(Path(tmp) / "records.jsonl"))
    for name in dict.fromkeys(FORMER_DEFAULT + tuple(DEMO_ESTIMATORS)):
        estimator = get_estimator(name)
        start, cpu = time.perf_counter(), time.process_time()
        estimator.estimate(records, backend)
        stages[name] = {"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu}
        print(f"{name}: {stages[name]['cpu_seconds']:.2f} CPU s", flush=True)

    def total(names: tuple[str, ...]) -> float:
        return sum(stages[n]["cpu_seconds"] for n in ("annotate", *names))

    before, after = total(FORMER_DEFAULT), total(tuple(DEMO_ESTIMATORS))
    scale = STARTER_SIZE / len(records)
    result = {
        "model": MODEL,
        "questions": len(records),
        "k": 5,
        "former_default": list(FORMER_DEFAULT),
        "current_default": list(DEMO_ESTIMATORS),
        "cpu_seconds": {"former_default": round(before, 2), "current_default": round(after, 2)},
        "ratio_current_to_former_cpu": round(after / before, 3),
        "projected_starter_minutes_on_2_cores": {
            "former_default": round(before * scale / 2 / 60, 2),
            "current_default": round(after * scale / 2 / 60, 2),
        },
        "stages": {k: {m: round(v, 3) for m, v in s.items()} for k, s in stages.items()},
        "note": "measured under heavy load from other jobs on the same 2 cores; the projection assumes both cores "
        "busy and excludes model loading and the report",
    }
    write_json(args.out, result)
    print(
        f"current/former default set: {result['ratio_current_to_former_cpu']}x CPU; projected "
        f"{result['projected_starter_minutes_on_2_cores']} minutes for the starter set"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
