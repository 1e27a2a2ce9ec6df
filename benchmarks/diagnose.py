"""Is the embedded default's confidence grounded in its answer? (docs/methods.md "ADVICE and ConfTuner" Diagnostics)

Takes 100 in-domain questions from the cached HonestyBench-mini test records
(benchmarks/cache/mini/test, written by baselines.py): 25 per dataset, drawn
with a seed, interleaved so that every subset the stages pick spans the four
datasets. Each question gets up to 30 candidate answers (greedy, samples, gold
aliases, answers borrowed from the other test questions) and the four
diagnostics run on the base model and, with --adapter, on the model with that
adapter (the "advice" column):

    .venv/bin/python -m benchmarks.diagnose
    .venv/bin/python -m benchmarks.diagnose --adapter benchmarks/cache/advice/<run>/adapter

Every finished stage is cached under benchmarks/cache/diagnose, so a killed
run resumes; a run with an adapter reuses the base model's cached stages.
--quick runs 12 questions with 10 candidates and 2 short IG examples and
writes under benchmarks/cache/diagnose_quick instead of results/.

Writes benchmarks/results/diagnose.json (summaries, settings, wall time and
peak memory) and the report in benchmarks/results/diagnose/.
"""

from __future__ import annotations

import argparse
import random
from itertools import zip_longest
from pathlib import Path

from benchmarks.common import CACHE, RESULTS, logger, setup_logging, write_json
from candor.annotation.records import Record, read_records
from candor.data.mini import IN_DOMAIN
from candor.diagnose import DiagnoseConfig, build_candidates, run_diagnosis
from candor.util.resource_meter import ResourceMeter


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--adapter", default=None, help="a PEFT adapter directory (e.g. an ADVICE run's adapter)")
    p.add_argument("--adapter-name", default="advice")
    p.add_argument("--records", type=Path, default=CACHE / "mini" / "test", help="folder of <dataset>.jsonl records")
    p.add_argument("--questions", type=int, default=100)
    p.add_argument("--candidates", type=int, default=30)
    p.add_argument("--fmt", default="number")
    p.add_argument("--ig-examples", type=int, default=10)
    p.add_argument("--ig-steps", type=int, default=32)
    p.add_argument("--ig-batch", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stages", default="sensitivity,masking,rollout,attribution", help="comma-separated subset")
    p.add_argument("--quick", action="store_true", help="a small smoke run (12 questions) outside results/")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results JSON (default results/diagnose.json); the report goes to the folder of the same name",
    )
    return p.parse_args()


def load_pool(folder: Path) -> dict[str, list[Record]]:
    pool = {}
    for dataset in IN_DOMAIN:
        path = folder / f"{dataset}.jsonl"
        if not path.exists():
            raise SystemExit(
                f"SKIP: {path} not found; run `python -m benchmarks.baselines` first to annotate the test sets"
            )
        pool[dataset] = read_records(path)
    return pool


def pick_questions(pool: dict[str, list[Record]], n: int, seed: int) -> list[Record]:
    """``n`` records spread evenly over the datasets (seeded), interleaved dataset by dataset."""
    per, extra = divmod(n, len(pool))
    drawn = []
    for k, (dataset, records) in enumerate(pool.items()):
        ordered = sorted(records, key=lambda r: r.id)
        random.Random(f"{seed}:{dataset}").shuffle(ordered)
        drawn.append(ordered[: per + (1 if k < extra else 0)])
    return [r for group in zip_longest(*drawn) for r in group if r is not None]


def main() -> None:
    setup_logging()
    args = parse_args()
    if args.quick:
        args.questions, args.candidates, args.ig_examples, args.ig_steps = 12, 10, 2, 16
    out = (args.out or (CACHE / "diagnose_quick.json" if args.quick else RESULTS / "diagnose.json")).resolve()
    # The report folder is named after the results file, so a second run with --out keeps the first's plots.
    report_dir = out.with_suffix("")
    pool = load_pool(args.records)
    chosen = pick_questions(pool, args.questions, args.seed)
    everything = [r for records in pool.values() for r in records]
    config = DiagnoseConfig(
        fmt=args.fmt,
        max_candidates=args.candidates,
        seed=args.seed,
        ig_examples=args.ig_examples,
        ig_steps=args.ig_steps,
        ig_batch_size=args.ig_batch,
        stages=tuple(args.stages.split(",")),
    )
    candidates = build_candidates(
        chosen, max_candidates=config.max_candidates, seed=config.seed, judge=config.judge, pool=everything
    )
    logger.info("diagnose: %d questions, %d candidates", len(candidates), sum(len(c) for c in candidates))

    with ResourceMeter() as meter:
        report = run_diagnosis(
            candidates,
            report_dir,
            model=args.model,
            adapter=args.adapter,
            adapter_name=args.adapter_name,
            config=config,
            cache_dir=CACHE / ("diagnose_quick_stages" if args.quick else "diagnose"),
            title="Diagnose: the embedded default on HonestyBench-mini (in-domain)",
        )
    payload = dict(report.summary())
    payload["settings"] = {
        **config.to_dict(),
        "model": args.model,
        "adapter": args.adapter,
        "questions": len(candidates),
        "per_dataset": {d: sum(c.item.dataset == d for c in candidates) for d in IN_DOMAIN},
        "n_candidates": sum(len(c) for c in candidates),
        "report": report_dir.relative_to(RESULTS.parent).as_posix(),
    }
    import torch  # after common, which sets OMP_WAIT_POLICY before torch loads

    # Stage costs survive in the cache, so these are the cost of a run from scratch even when resumed.
    costs = [c for d in report.diagnoses.values() for c in d.costs.values()]
    payload["run"] = {
        "stages_wall_s": round(sum(c.get("wall_s", 0.0) for c in costs), 1),
        "stages_peak_rss_mib": max((c.get("peak_rss_mib", 0.0) for c in costs), default=0.0),
        "this_invocation": meter.cost.as_dict(),
        "device": "cpu",
        "threads": torch.get_num_threads(),
    }
    write_json(out, _json_safe(payload))
    logger.info("wrote %s and %s (%.0f s, peak %.0f MiB)", out, report_dir, meter.cost.wall_s, meter.cost.peak_rss_mib)


def _json_safe(value):  # NaN is not JSON
    import math

    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


if __name__ == "__main__":
    main()
