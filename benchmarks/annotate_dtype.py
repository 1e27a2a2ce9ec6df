"""Annotation in bfloat16 against float32: tokens per second, changed greedy answers, log-prob drift, one run.

Runs candor's decode loop (the ``candor`` path of ``annotate_throughput.py``, from
:mod:`benchmarks.annotation_paths`; same questions and settings: NQ, the
``fewshot`` template, greedy + k=5 samples, top-p 0.95, top-k 50, at most 32
new tokens) ``--repeats`` times per dtype, alternating, each run in its own
subprocess, and compares the median runs:

- generated tokens per second (wall) and per CPU second, and the bf16/fp32 ratios;
- how many greedy answers differ in text;
- the drift of the greedy log-probs: over the answers whose greedy tokens are
  identical, the mean and largest |log p_bf16 - log p_fp32| per token.

    PYTHONPATH=src python -m benchmarks.annotate_dtype [--questions 64] [--threads 2] [--repeats 3]

Writes benchmarks/results/annotate_dtype.json. Timings on a shared CPU are noisy; read the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.annotation_job import DATA, MODEL, SETTINGS, job_parser, omp_wait_policy
from benchmarks.annotation_paths import median_run, run_child
from candor.util.cpu import describe

RESULTS = Path(__file__).resolve().parent / "results" / "annotate_dtype.json"
DTYPES = ("float32", "bfloat16")


def drift(base: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Changed greedy answers, and per-token |Δ log-prob| over the answers with identical tokens."""
    changed = sum(a != b for a, b in zip(base["greedy"], other["greedy"], strict=True))
    deltas = [
        np.abs(np.asarray(lb) - np.asarray(lo))
        for ib, io, lb, lo in zip(
            base["greedy_token_ids"],
            other["greedy_token_ids"],
            base["greedy_logprobs"],
            other["greedy_logprobs"],
            strict=True,
        )
        if ib == io and ib
    ]
    flat = np.concatenate(deltas) if deltas else np.zeros(0)
    return {
        "greedy_answers_changed": changed,
        "greedy_token_sequences_identical": len(deltas),
        "logprob_abs_diff_mean": float(flat.mean()) if len(flat) else None,
        "logprob_abs_diff_max": float(flat.max()) if len(flat) else None,
    }


def main() -> None:
    parser = job_parser(__doc__.split("\n")[0], out=RESULTS)
    parser.add_argument("--repeats", type=int, default=3, help="runs per dtype, alternating; the median is kept")
    args = parser.parse_args()
    if not DATA.exists():
        print(f"skipped: NQ test data not found at {DATA}")
        return
    attempts: dict[str, list[dict[str, Any]]] = {dtype: [] for dtype in DTYPES}
    for _ in range(max(1, args.repeats)):
        for dtype in DTYPES:  # alternating, so a change in the machine's load falls on both
            print(f"running candor in {dtype} ...", flush=True)
            attempts[dtype].append(run_child("candor", argparse.Namespace(**{**vars(args), "dtype": dtype})))
    runs = {dtype: median_run(tries) for dtype, tries in attempts.items()}
    rows = {
        dtype: {
            "seconds": round(run["seconds"], 2),
            "cpu_seconds": round(run["cpu_seconds"], 2),
            "generated_tokens": run["tokens"],
            "tokens_per_second": round(run["tokens"] / run["seconds"], 1),
            "tokens_per_cpu_second": round(run["tokens"] / run["cpu_seconds"], 1),
            "peak_rss_mib": round(run["peak_rss_mib"]),
        }
        for dtype, run in runs.items()
    }
    fp32, bf16 = rows["float32"], rows["bfloat16"]
    result = {
        "model": MODEL,
        "questions": args.questions,
        "samples_per_question": args.k,
        "settings": {
            **SETTINGS,
            "template": "fewshot",
            "batch_size": args.batch_size,
            "torch_threads": args.threads,
            "omp_wait_policy": omp_wait_policy(),
            "machine": describe(),
        },
        "load_average_1min": os.getloadavg()[0],
        "dtypes": rows,
        "repeats": {dtype: [round(t["seconds"], 2) for t in tries] for dtype, tries in attempts.items()},
        "bf16_speedup_wall": round(bf16["tokens_per_second"] / fp32["tokens_per_second"], 2),
        "bf16_speedup_cpu": round(bf16["tokens_per_cpu_second"] / fp32["tokens_per_cpu_second"], 2),
        "bf16_vs_fp32": drift(runs["float32"], runs["bfloat16"]),
        "command": "PYTHONPATH=src python -m benchmarks.annotate_dtype " + " ".join(sys.argv[1:]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for dtype, row in rows.items():
        print(f"{dtype:>9}: {row['tokens_per_second']} tokens/s wall, {row['tokens_per_cpu_second']} per CPU s")
    print(f"bf16/fp32: {result['bf16_speedup_wall']}x wall, {result['bf16_speedup_cpu']}x CPU")
    print(result["bf16_vs_fp32"])


if __name__ == "__main__":
    main()
