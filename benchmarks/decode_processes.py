"""Threads or processes on the CPU: one decode loop on 2 threads, or two loops on 1 thread each.

The job is ``annotate_throughput.py``'s (the embedded default, ``fewshot``
template, a greedy answer and 5 samples per NQ question, cut at the first
newline). Two arms, alternating, each in fresh subprocesses:

- **one process, 2 threads**: ``HFBackend.generate`` on all the questions,
  as candor runs today (products on both threads, small ops on one);
- **two processes, 1 thread each**: each runs the same call on its half of
  the questions (same seeds) with half the batch size, so that as many rows
  decode at once in all (96) as in the first arm; both start together after
  loading (they wait for one signal), the pair's time being the slower one's.

The second arm never wakes a sleeping OpenMP thread (``OMP_WAIT_POLICY=PASSIVE``)
and overlaps one loop's Python work with the other's products. It is not how
candor runs; this measures whether a data-parallel annotate would pay, and
what it would cost in memory (each process holds its own model).
Greedy answers must be identical between the arms.

    python -m benchmarks.decode_processes [--questions 64] [--repeats 3] [--batch-size 16]

Writes ``benchmarks/results/decode_processes.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.annotation_job import MODEL, generated_tokens, load_items, prompts_for, sampling_params
from benchmarks.children import script_command, script_env
from benchmarks.common import write_json
from benchmarks.measure import Timer, peak_rss_mib

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "decode_processes.json"


def child(job: dict[str, Any], out: Path, ready: Path, go: Path) -> None:
    """Load, warm up, say ready, wait for the signal, time one ``generate`` on the job's slice."""
    import torch

    from candor.backends.hf import HFBackend

    torch.set_num_threads(job["threads"])
    backend = HFBackend.from_pretrained(MODEL, batch_size=job["batch_size"])
    items = load_items(job["questions"])[job["start"] : job["stop"]]
    prompts, params = prompts_for(items, backend), sampling_params()
    backend.generate(prompts[:1], 1, params)  # warm-up: first-call allocations, decoded vocabulary
    ready.touch()
    while not go.exists():
        time.sleep(0.005)
    seeds = list(range(job["start"], job["stop"]))
    with Timer() as timer:
        gens = backend.generate(prompts, job["k"], params, seeds=seeds)
    tokens = generated_tokens(gens, params.max_new_tokens)
    out.write_text(
        json.dumps(
            {
                "seconds": timer.wall,
                "cpu_seconds": timer.cpu,
                "tokens": tokens,
                "greedy": [g.greedy.text for g in gens],
                "peak_rss_mib": peak_rss_mib(),
            }
        )
    )


def run_arm(slices: list[tuple[int, int, int, int]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Start one child per ``(start, stop, threads, batch size)``, release them together, return their results."""
    env = script_env({**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}, ROOT / "src")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        go = folder / "go"
        procs, outs, readies = [], [], []
        for i, (start, stop, threads, batch_size) in enumerate(slices):
            job = {
                "questions": args.questions,
                "k": args.k,
                "start": start,
                "stop": stop,
                "threads": threads,
                "batch_size": batch_size,
            }
            (folder / f"job{i}.json").write_text(json.dumps(job))
            outs.append(folder / f"out{i}.json")
            readies.append(folder / f"ready{i}")
            command = script_command(
                __spec__.name, "--child", str(folder / f"job{i}.json"), str(outs[-1]), str(readies[-1]), str(go)
            )
            procs.append(subprocess.Popen(command, env=env))
        while not all(r.exists() for r in readies):
            if any(p.poll() not in (None, 0) for p in procs):
                raise SystemExit("a child failed before it was ready")
            time.sleep(0.01)
        go.touch()
        for p in procs:
            if p.wait() != 0:
                raise SystemExit("a child failed")
        return [json.loads(o.read_text()) for o in outs]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        job = json.loads(Path(sys.argv[2]).read_text())
        child(job, Path(sys.argv[3]), Path(sys.argv[4]), Path(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=64)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16, help="the one process's; each of two gets half")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    half = args.questions // 2
    arms = {
        "one_process_2_threads": [(0, args.questions, 2, args.batch_size)],
        "two_processes_1_thread": [(0, half, 1, args.batch_size // 2), (half, args.questions, 1, args.batch_size // 2)],
    }
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in arms}
    load_before = os.getloadavg()[0]
    for i in range(args.repeats):
        for name in arms if i % 2 == 0 else reversed(list(arms)):
            children = run_arm(arms[name], args)
            runs[name].append(
                {
                    "seconds": max(c["seconds"] for c in children),
                    "cpu_seconds": sum(c["cpu_seconds"] for c in children),
                    "tokens": sum(c["tokens"] for c in children),
                    "greedy": [text for c in children for text in c["greedy"]],
                    "peak_rss_mib": sum(c["peak_rss_mib"] for c in children),
                }
            )
            print(f"{name}: {runs[name][-1]['seconds']:.2f} s, {runs[name][-1]['cpu_seconds']:.2f} CPU s", flush=True)
    summary: dict[str, Any] = {}
    for name, results in runs.items():
        summary[name] = {
            "seconds": [round(r["seconds"], 2) for r in results],
            "cpu_seconds": [round(r["cpu_seconds"], 2) for r in results],
            "median_seconds": round(statistics.median(r["seconds"] for r in results), 2),
            "median_cpu_seconds": round(statistics.median(r["cpu_seconds"] for r in results), 2),
            "tokens": results[0]["tokens"],
            "peak_rss_mib_all_processes": round(max(r["peak_rss_mib"] for r in results)),
        }
        summary[name]["tokens_per_second"] = round(summary[name]["tokens"] / summary[name]["median_seconds"], 1)
    one, two = summary["one_process_2_threads"], summary["two_processes_1_thread"]
    greedy_one, greedy_two = runs["one_process_2_threads"][0]["greedy"], runs["two_processes_1_thread"][0]["greedy"]
    result = {
        "command": f"python -m benchmarks.decode_processes --questions {args.questions} --repeats {args.repeats} "
        f"--batch-size {args.batch_size}",
        "questions": args.questions,
        "samples_per_question": args.k,
        "batch_size": {"one_process": args.batch_size, "each_of_two": args.batch_size // 2},
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
        **summary,
        "wall_ratio": round(one["median_seconds"] / two["median_seconds"], 2),
        "cpu_ratio": round(one["median_cpu_seconds"] / two["median_cpu_seconds"], 2),
        "greedy_identical_count": sum(a == b for a, b in zip(greedy_one, greedy_two, strict=True)),
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }
    write_json(args.out, result)
    print(
        f"two processes / one: {result['wall_ratio']}x wall, {result['cpu_ratio']}x CPU; "
        f"greedy identical {result['greedy_identical_count']}/{args.questions}; wrote {args.out}"
    )


if __name__ == "__main__":
    main()
