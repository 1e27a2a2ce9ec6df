"""Annotation throughput: candor's decode loop against per-question ``generate`` calls.

Both paths answer the same NQ questions with the embedded default model and
the ``fewshot`` template: one greedy answer and k samples per question
(temperature 1, top-p 0.95, top-k 50, at most 32 new tokens, cut at the first
newline), keeping every token's log-prob.

- candor: ``HFBackend.generate`` on all questions (chunks of ``batch_size``),
  its linear layers on prepacked oneDNN weights and each decode step's small
  ops on one thread (the default, :mod:`candor.backends.engine.packed_linear`,
  :mod:`candor.backends.engine.op_threads`).
- candor-stock: the same loop with ``pack_linears=False`` (``nn.Linear``'s own
  MKL kernels, every op on torch's threads): the gain of both, greedy answers
  and log-prob drift, measured in the same run.
- naive: what per-question toolkits do: for each question one greedy
  ``model.generate`` call and k sampled calls, with the same stop string.
- annotate: the full ``candor.annotation.builder.annotate`` (generation and judges,
  records written to a temporary file), when that module is present.

Each path (:mod:`benchmarks.annotation_paths`) runs in its own subprocess, so its peak RSS
(``ru_maxrss``) is its own; model loading is outside the timed region. The two candor paths run
``--repeats`` times each, alternating, and report the median run (the machine
is shared; alternation spreads its load over both). Results go to
``benchmarks/results/annotate_throughput.json``.

The children run with ``OMP_WAIT_POLICY=PASSIVE`` unless the environment sets
it: on a 2-core machine shared with other processes, spinning OpenMP threads
made every path five to six times slower (measured), and far more so for the
naive path's small batch-1 steps, which would inflate the speedup.

    python -m benchmarks.annotate_throughput [--questions 64] [--threads 2] [--dtype float32] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from typing import Any

from benchmarks.annotation_job import DATA, MODEL, SETTINGS, job_parser, omp_wait_policy
from benchmarks.annotation_paths import PATHS, child, has_annotate, median_run, run_child


def main() -> None:
    parser = job_parser(__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated subset to run")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each candor path (alternating); the median")
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.path:
        child(args)
        return
    if not DATA.exists():
        print(f"skipped: NQ test data not found at {DATA} (benchmarks need ../shared/data)")
        return

    paths = [p for p in args.paths.split(",") if p != "annotate" or has_annotate()]
    args.load_before = os.getloadavg()
    repeated = [p for p in paths if p.startswith("candor")]
    order = [p for _ in range(max(1, args.repeats)) for p in repeated] + [p for p in paths if p not in repeated]
    attempts: dict[str, list[dict[str, Any]]] = {}
    for path in order:
        print(f"running {path} ...", flush=True)
        run = run_child(path, args)
        attempts.setdefault(path, []).append(run)
        print(f"  {run['seconds']:.1f} s wall, {run['cpu_seconds']:.1f} s CPU, peak RSS {run['peak_rss_mib']:.0f} MiB")
    runs = {path: median_run(tries) for path, tries in attempts.items()}
    args.repeat_seconds = {
        path: {"wall": [round(t["seconds"], 2) for t in tries], "cpu": [round(t["cpu_seconds"], 2) for t in tries]}
        for path, tries in attempts.items()
        if len(tries) > 1
    }
    report(runs, args)


def logprob_drift(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Largest |Δ log-prob| between two runs' greedy answers, over the answers whose tokens are identical."""
    drift = 0.0
    for ids_a, ids_b, lp_a, lp_b in zip(
        a["greedy_token_ids"], b["greedy_token_ids"], a["greedy_logprobs"], b["greedy_logprobs"], strict=True
    ):
        if ids_a == ids_b:
            drift = max([drift, *(abs(x - y) for x, y in zip(lp_a, lp_b, strict=True))])
    return drift


def report(runs: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    from candor.util.cpu import describe  # here, not at the top: the parent loads no torch before its children

    candor, naive = runs.get("candor"), runs.get("naive")
    result: dict[str, Any] = {
        "model": MODEL,
        "questions": args.questions,
        "samples_per_question": args.k,
        "settings": {
            **SETTINGS,
            "template": "fewshot",
            "batch_size": args.batch_size,
            "dtype": args.dtype,
            "torch_threads": args.threads,
            "omp_wait_policy": omp_wait_policy(),
            "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "machine": describe(),
        },
        # 1/5/15-minute load averages before and after the run: the machine is shared, so wall-clock
        # figures carry the other jobs' load; CPU seconds and same-run ratios are steadier.
        "load_average": {
            "before": [round(x, 2) for x in args.load_before],
            "after": [round(x, 2) for x in os.getloadavg()],
        },
    }
    if candor:
        result["candor_seconds"] = round(candor["seconds"], 2)
        result["candor_cpu_seconds"] = round(candor["cpu_seconds"], 2)
        result["candor_tokens_per_second"] = round(candor["tokens"] / candor["seconds"], 1)
        result["candor_tokens_per_cpu_second"] = round(candor["tokens"] / candor["cpu_seconds"], 1)
    if naive:
        result["naive_seconds"] = round(naive["seconds"], 2)
        result["naive_cpu_seconds"] = round(naive["cpu_seconds"], 2)
        result["naive_tokens_per_second"] = round(naive["tokens"] / naive["seconds"], 1)
    if candor and naive:
        same = sum(a == b for a, b in zip(candor["greedy"], naive["greedy"], strict=True))
        result["speedup"] = round(naive["seconds"] / candor["seconds"], 2)
        result["cpu_time_speedup"] = round(naive["cpu_seconds"] / candor["cpu_seconds"], 2)
        result["greedy_identical"] = same == len(candor["greedy"])
        result["greedy_identical_count"] = same
    stock = runs.get("candor-stock")
    if candor and stock:
        result["stock_seconds"] = round(stock["seconds"], 2)
        result["stock_cpu_seconds"] = round(stock["cpu_seconds"], 2)
        result["stock_tokens_per_second"] = round(stock["tokens"] / stock["seconds"], 1)
        result["packed_speedup"] = round(stock["seconds"] / candor["seconds"], 2)
        result["packed_cpu_time_speedup"] = round(stock["cpu_seconds"] / candor["cpu_seconds"], 2)
        result["packed_greedy_identical_count"] = sum(
            a == b for a, b in zip(candor["greedy"], stock["greedy"], strict=True)
        )
        result["packed_greedy_logprob_max_abs_diff"] = float(f"{logprob_drift(candor, stock):.2e}")
    if getattr(args, "repeat_seconds", None):
        result["repeats"] = args.repeat_seconds
    result["peak_rss_mib"] = {name: round(run["peak_rss_mib"]) for name, run in runs.items()}
    if "annotate" in runs:
        result["annotate_seconds"] = round(runs["annotate"]["seconds"], 2)
        result["annotate_cpu_seconds"] = round(runs["annotate"]["cpu_seconds"], 2)
    if args.out.exists():  # the profile and steps blocks come from annotate_profile.py / annotate_steps.py: keep them
        previous = json.loads(args.out.read_text())
        for block in ("profile", "steps"):
            if block in previous:
                result[block] = previous[block]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")

    if naive:
        wall, cpu = naive["seconds"], naive["cpu_seconds"]
        for name, run in runs.items():
            print(
                f"{name:>12}: {run['seconds']:7.1f} s wall = {wall / run['seconds']:5.2f}x naive; "
                f"{run['cpu_seconds']:7.1f} s CPU = {cpu / run['cpu_seconds']:5.2f}x naive"
            )
    if "packed_speedup" in result:
        print(
            f"packed / stock kernels: {result['packed_speedup']:.2f}x wall, {result['packed_cpu_time_speedup']:.2f}x "
            f"CPU; greedy identical {result['packed_greedy_identical_count']}/{args.questions}, "
            f"max |d logprob| {result['packed_greedy_logprob_max_abs_diff']:.1e}"
        )
    if "greedy_identical_count" in result:
        print(f"greedy answers identical: {result['greedy_identical_count']}/{args.questions}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
