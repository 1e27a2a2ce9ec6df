"""`candor annotate --engine ray` against the single-process `--backend openai` path, on the same servers.

Two ``transformers serve`` replicas of the embedded model on 127.0.0.1 (one
thread each), one local Ray cluster, the first NQ test questions, the
``fewshot`` template, 1 greedy + k samples. Three arms, each a fresh output
file, in one run so their ratios share the machine's state:

- ``openai``: :func:`candor.annotation.builder.annotate` in this process, on replica 1;
- ``ray_1``: the Ray Data pipeline, the fleet being replica 1;
- ``ray_2``: the pipeline with both replicas.

Records per second are the items over the arm's wall time (Ray's startup is
timed apart, once). The per-item overhead of the pipeline is
``(ray_1 − openai) / items``. The records of every Ray arm are compared with
the ``openai`` arm's (greedy texts, sample texts by seed).

    python -m benchmarks.annotate_ray [--questions 40] [--k 2]

Writes ``benchmarks/results/annotate_ray.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.annotation_job import DATA, MODEL, SETTINGS, load_items
from benchmarks.common import write_json

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "annotate_ray.json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def replica(model_dir: Path, log: Path) -> Iterator[str]:
    """One ``transformers serve`` on one thread, on a free port: yields its /v1 URL."""
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "transformers.cli.transformers", "serve", str(model_dir), "--port", str(port)]
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [*cmd, "--device", "cpu"], env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"transformers serve did not start: {log.read_text()[-2000:]}")
            url = f"http://127.0.0.1:{port}/health"
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    break
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def config(k: int) -> Any:
    from candor.annotation.builder import AnnotateConfig
    from candor.backends.base import SamplingParams

    params = SamplingParams(
        max_new_tokens=SETTINGS["max_new_tokens"],
        temperature=SETTINGS["temperature"],
        top_p=SETTINGS["top_p"],
        top_k=SETTINGS["top_k"],
    )
    return AnnotateConfig(k=k, params=params, batch_size=8, seed=0)


def recipe(model_dir: Path, url: str) -> Any:
    from candor.annotation.workers import BackendRecipe

    options = {"base_url": url, "batch_size": 8, "seed": 0}
    return BackendRecipe(model=str(model_dir), backend="openai", options=options, template="fewshot")


def agreement(got: Path, expected: Path) -> dict[str, int]:
    from candor.annotation.records import read_records

    mine = {r.id: r for r in read_records(got)}
    theirs = {r.id: r for r in read_records(expected)}
    same_greedy = sum(mine[i].greedy.text == theirs[i].greedy.text for i in theirs)
    samples = [(a.text, b.text) for i in theirs for a, b in zip(mine[i].samples, theirs[i].samples, strict=True)]
    return {
        "records": len(mine),
        "greedy_identical": same_greedy,
        "samples": len(samples),
        "samples_identical": sum(a == b for a, b in samples),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=40)
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--data", type=Path, default=DATA, help="NQ test JSONL (default: the shared data)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if not args.data.exists():
        print(f"skipped: NQ test data not found at {args.data} (benchmarks need ../shared/data)")
        return
    import ray

    from candor.annotation.builder import annotate
    from candor.annotation.ray_pipeline import RayOptions, annotate_with_ray
    from candor.backends.default_model import resolve_embedded
    from candor.util.cpu import describe

    items = load_items(args.questions, args.data)
    model_dir = resolve_embedded(MODEL)
    load_before = os.getloadavg()
    seconds: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        folder = Path(tmp)
        urls = [stack.enter_context(replica(model_dir, folder / f"serve{i}.log")) for i in range(2)]
        start = time.perf_counter()
        ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR")
        ray_startup = time.perf_counter() - start
        outs = {name: folder / f"{name}.jsonl" for name in ("openai", "ray_1", "ray_2")}

        start = time.perf_counter()
        answering, judging, template = recipe(model_dir, urls[0]).load()
        annotate(items, answering, outs["openai"], template, config(args.k), judge_backend=judging, progress=False)
        seconds["openai"] = time.perf_counter() - start
        for name, fleet in (("ray_1", urls[:1]), ("ray_2", urls)):
            start = time.perf_counter()
            options = RayOptions(urls=tuple(fleet), batch_size=8, progress=False)
            annotate_with_ray(items, recipe(model_dir, urls[0]), outs[name], config(args.k), options)
            seconds[name] = time.perf_counter() - start
            print(f"{name}: {seconds[name]:.1f} s", flush=True)
        agree = {name: agreement(outs[name], outs["openai"]) for name in ("ray_1", "ray_2")}
        ray.shutdown()
    n = len(items)
    rate = {name: round(n / s, 3) for name, s in seconds.items()}
    result = {
        "command": f"nice python -m benchmarks.annotate_ray --questions {args.questions} --k {args.k}",
        "settings": {
            "model": MODEL,
            "questions": n,
            "samples": args.k,
            "batch_size": 8,
            "server": "transformers serve, one thread per replica, 127.0.0.1",
            "ray": {"version": ray.__version__, "num_cpus": 2, "generation_actors": 1},
            **{k: v for k, v in SETTINGS.items() if k != "stop"},
            "machine": describe(),
        },
        "seconds": {name: round(s, 2) for name, s in seconds.items()},
        "records_per_second": rate,
        "ray_startup_seconds": round(ray_startup, 2),
        "ratios": {
            "ray_1_vs_openai": round(rate["ray_1"] / rate["openai"], 3),
            "ray_2_vs_ray_1": round(rate["ray_2"] / rate["ray_1"], 3),
            "ray_2_vs_openai": round(rate["ray_2"] / rate["openai"], 3),
        },
        "overhead_seconds_per_item": round((seconds["ray_1"] - seconds["openai"]) / n, 4),
        "agreement": agree,
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in os.getloadavg()]},
        "note": "one run, arms in sequence; the machine is shared with other jobs (see load_average), "
        "so the ratios, not the seconds, are the figures to read",
    }
    write_json(args.out, result)
    print(f"{result['ratios']}; overhead {result['overhead_seconds_per_item']} s/item; wrote {args.out}")


if __name__ == "__main__":
    main()
