"""`candor annotate --workers 2` against one process, end to end, as a user runs it.

Each arm is the whole command in a fresh process (imports, model load,
generation, judges, records, and for workers the merge): the embedded
default, ``fewshot`` template, NQ test questions, 1 greedy + 5 samples, at
most 32 new tokens, batch size 16 (``annotate_throughput.py``'s job). The
arms alternate; wall and CPU seconds (the command and every process it
waited for) are kept per run, and medians compared. The records of the two
arms are compared answer by answer: tokens, and log-probs where the tokens
agree (the workers decode in other batches and on one thread each, which may
round the last bits differently).

    python -m benchmarks.annotate_workers [--questions 256] [--repeats 3] [--workers 2]

Writes ``benchmarks/results/annotate_workers.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.annotation_job import DATA, MODEL, SETTINGS
from benchmarks.common import write_json

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "annotate_workers.json"


def command(data: Path, out: Path, workers: int, k: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "candor.cli",
        "annotate",
        "--data",
        str(data),
        "--out",
        str(out),
        "--model",
        MODEL,
        "--template",
        "fewshot",
        "--k",
        str(k),
        "--max-new-tokens",
        str(SETTINGS["max_new_tokens"]),
        "--temperature",
        str(SETTINGS["temperature"]),
        "--top-p",
        str(SETTINGS["top_p"]),
        "--top-k",
        str(SETTINGS["top_k"]),
        "--batch-size",
        "16",
        "--workers",
        str(workers),
    ]


def run_once(data: Path, workers: int, k: int, folder: Path) -> tuple[float, float, Path]:
    """One command in a fresh process: its wall seconds, the CPU seconds of it and its workers, the records."""
    out = folder / f"records-{workers}-{time.monotonic_ns()}.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command(data, out, workers, k), check=True, env=env, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, out


def answers(path: Path) -> list[dict[str, Any]]:
    """Every completion of a records file, greedy then samples, record by record."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [c for r in rows for c in [r["greedy"], *r["samples"]]]


def compare(first: Path, second: Path) -> dict[str, Any]:
    a, b = answers(first), answers(second)
    same = [(x, y) for x, y in zip(a, b, strict=True) if x["tokens"] == y["tokens"]]
    gaps = [abs(p - q) for x, y in same for p, q in zip(x["logprobs"], y["logprobs"], strict=True)]
    greedy_a = [json.loads(line)["greedy"]["text"] for line in first.read_text().splitlines()]
    greedy_b = [json.loads(line)["greedy"]["text"] for line in second.read_text().splitlines()]
    return {
        "answers": len(a),
        "answers_same_tokens": len(same),
        "greedy_identical": sum(x == y for x, y in zip(greedy_a, greedy_b, strict=True)),
        "max_logprob_gap_same_tokens": float(f"{max(gaps, default=0.0):.3g}"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if not DATA.exists():
        print(f"skipped: NQ test data not found at {DATA} (benchmarks need ../shared/data)")
        return
    from candor.util.cpu import describe

    arms = {"one_process": 1, "workers": args.workers}
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in arms}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        data = folder / "nq.jsonl"
        data.write_text("".join(DATA.read_text().splitlines(keepends=True)[: args.questions]))
        first_records: dict[str, Path] = {}
        for i in range(args.repeats):
            for name in arms if i % 2 == 0 else reversed(list(arms)):
                wall, cpu, records = run_once(data, arms[name], args.k, folder)
                runs[name].append((wall, cpu))
                first_records.setdefault(name, records)
                print(f"{name}: {wall:.1f} s, {cpu:.1f} CPU s", flush=True)
        agreement = compare(first_records["one_process"], first_records["workers"])
    summary = {
        name: {
            "seconds": [round(w, 2) for w, _ in r],
            "cpu_seconds": [round(c, 2) for _, c in r],
            "median_seconds": round(statistics.median(w for w, _ in r), 2),
            "median_cpu_seconds": round(statistics.median(c for _, c in r), 2),
        }
        for name, r in runs.items()
    }
    one, many = summary["one_process"], summary["workers"]
    result = {
        "command": f"python -m benchmarks.annotate_workers --questions {args.questions} --repeats {args.repeats} "
        f"--workers {args.workers}",
        "settings": {
            "model": MODEL,
            "questions": args.questions,
            "samples": args.k,
            "batch_size": 16,
            "workers": args.workers,
            **{k: v for k, v in SETTINGS.items() if k != "stop"},
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "PASSIVE (candor's CLI default)"),
            "machine": describe(),
        },
        **summary,
        "wall_speedup": round(one["median_seconds"] / many["median_seconds"], 2),
        "cpu_ratio": round(one["median_cpu_seconds"] / many["median_cpu_seconds"], 2),
        "agreement": agreement,
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]},
        "note": "wall and CPU seconds are the whole command's, model loading included (each worker loads its own "
        "model); a 2-core machine shared with other jobs: the ratio is the figure to read",
    }
    write_json(args.out, result)
    print(
        f"--workers {args.workers} / one process: {result['wall_speedup']}x wall, {result['cpu_ratio']}x CPU; "
        f"{agreement['greedy_identical']}/{args.questions} greedy identical; wrote {args.out}"
    )


if __name__ == "__main__":
    main()
