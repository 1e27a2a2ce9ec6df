"""What clients can make ``candor serve`` hold (issue 42, items 5 and 6), through a real server and the official client.

Two phases, each stored under its own key of the results file (a phase not run keeps its old entry):

- ``stops``: ``--stops`` requests, each with a stop list no other request has
  (sixteen at a time); the server's resident memory before and after.
- ``long_prompts``: short questions asked one at a time on an idle server
  (their p50 is the reference), then asked one at a time again while another
  client sends ``--long-prompts`` prompts of about ``--long-tokens`` tokens,
  one after another; p50/p99 of the short questions under that load over the
  idle p50, whether each short question's confidence equals its idle one bit
  for bit, and the server's resident memory before and after the long prompts.

``--src`` picks the source tree the server runs (default: this checkout), so
the same measurement can be taken of another version (the phase's key gets
``--tag`` appended).

    PYTHONPATH=src python -m benchmarks.serve_resources [--phases stops,long_prompts] [--src ../main/src --tag main]

Results: ``benchmarks/results/serve_resources.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import openai

from benchmarks.common import RESULTS, setup_logging, write_json
from benchmarks.heads import untrained_head
from benchmarks.servers import free_port, resident_mib, start_candor_serve
from candor.data import load_items

ROOT = Path(__file__).resolve().parents[1]
EMOJI = "\U0001f600"


def start_server(args: argparse.Namespace, port: int, head: tuple[str, ...] = ()) -> subprocess.Popen:
    serve = ["--model", args.model, "--max-new-tokens", str(args.max_new_tokens), "--queue-size", "256", *head]
    return start_candor_serve(serve, port, threads=args.threads, src=Path(args.src))


def client(port: int) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=1800)


def ask(api: openai.OpenAI, text: str, **extra: Any) -> dict[str, Any]:
    start = time.perf_counter()
    resp = api.chat.completions.create(model="candor", messages=[{"role": "user", "content": text}], **extra)
    conf = resp.choices[0].model_extra["confidence"]
    return {
        "latency": time.perf_counter() - start,
        "confidence": conf["value"],
        "prompt_tokens": resp.usage.prompt_tokens if resp.usage else None,
    }


def percentiles(latencies: list[float]) -> dict[str, float]:
    a = np.array(latencies)
    return {
        "n": len(a),
        "p50_s": round(float(np.percentile(a, 50)), 3),
        "p99_s": round(float(np.percentile(a, 99)), 3),
        "max_s": round(float(a.max()), 3),
    }


def run_stops(api: openai.OpenAI, pid: int, count: int, question: str) -> dict[str, Any]:
    ask(api, question, max_tokens=2)  # the vocabulary decoded once, before the first measure
    before = resident_mib(pid)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda i: ask(api, question, max_tokens=2, stop=[f"~{i}~", "e"]), range(count)))
    wall = time.perf_counter() - start
    time.sleep(1.0)
    after = resident_mib(pid)
    return {
        "unique_stop_lists": count,
        "seconds": round(wall, 1),
        "rss_before_mib": before,
        "rss_after_mib": after,
        "rss_growth_mib": round(after - before, 1),
        "acceptance_mib": 50,
        "passes": after - before <= 50,
    }


def long_prompt(tokens: int) -> str:
    """About ``tokens`` tokens within the server's 4,000-character question cap: an emoji is 3 of SmolLM2's tokens."""
    return EMOJI * max(1, tokens // 3) + "\nWhich face is this?"


def run_long_prompts(api: openai.OpenAI, pid: int, questions: list[str], args: argparse.Namespace) -> dict[str, Any]:
    for q in questions[:3]:
        ask(api, q)  # warm-up
    idle = [ask(api, q) for q in questions]
    idle_p50 = float(np.percentile([r["latency"] for r in idle], 50))
    before = resident_mib(pid)
    long_results: list[dict[str, Any]] = []
    long_failures: list[str] = []
    done = threading.Event()

    def send_long() -> None:
        try:
            for _ in range(args.long_prompts):
                try:
                    long_results.append(ask(api, long_prompt(args.long_tokens), max_tokens=8))
                except openai.APIError as exc:  # recorded: a failed long prompt must not pass for a fast one
                    long_failures.append(f"{type(exc).__name__}: {str(exc)[:200]}")
        finally:
            done.set()

    sender = threading.Thread(target=send_long)
    sender.start()
    loaded: list[dict[str, Any]] = []
    confidences_equal = 0
    i = 0
    while not done.is_set():
        q = questions[i % len(questions)]
        r = ask(api, q)
        loaded.append(r)
        confidences_equal += r["confidence"] == idle[i % len(questions)]["confidence"]
        i += 1
    sender.join()
    time.sleep(2.0)
    after = resident_mib(pid)
    stats = percentiles([r["latency"] for r in loaded])
    return {
        "idle": {**percentiles([r["latency"] for r in idle])},
        "under_long_prompts": stats,
        "p99_over_idle_p50": round(stats["p99_s"] / idle_p50, 2),
        "p50_over_idle_p50": round(stats["p50_s"] / idle_p50, 2),
        "acceptance_p99_over_idle_p50": 3.0,
        "short_confidences_bit_equal_to_idle": f"{confidences_equal}/{len(loaded)}",
        "long_prompts": [
            {"prompt_tokens": r["prompt_tokens"], "latency_s": round(r["latency"], 2)} for r in long_results
        ],
        "long_prompt_failures": long_failures,
        "rss_before_mib": before,
        "rss_after_mib": after,
        "rss_after_over_before": round(after / before, 3),
        "acceptance_rss_ratio": 1.2,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--phases", default="stops,long_prompts", help="comma-separated: stops, long_prompts")
    parser.add_argument("--stops", type=int, default=1000, help="stops: requests with unique stop lists")
    parser.add_argument("--long-tokens", type=int, default=4000, help="long_prompts: tokens per long prompt")
    parser.add_argument("--long-prompts", type=int, default=3, help="long_prompts: long prompts sent in turn")
    parser.add_argument("--questions", type=int, default=12, help="long_prompts: short questions (starter set)")
    parser.add_argument("--threads", type=int, default=2, help="OMP threads of the server")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--src", default=str(ROOT / "src"), help="the source tree the server runs")
    parser.add_argument("--tag", default="", help="appended to each phase's key (e.g. the version measured)")
    parser.add_argument(
        "--head-template",
        default="",
        help="serve an untrained EliCal head with this template (fewshot: read from the reply's "
        "prefill) instead of n-prob, whose answer re-read runs the whole prompt again",
    )
    parser.add_argument("--out", default=str(RESULTS / "serve_resources.json"))
    args = parser.parse_args()
    setup_logging()
    out = Path(args.out)
    payload = json.loads(out.read_text()) if out.exists() else {}
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = set(phases) - {"stops", "long_prompts"}
    if unknown:
        parser.error(f"unknown phases: {sorted(unknown)}")
    questions = [item.question for item in load_items("starter")][: args.questions]
    common = {
        "command": "PYTHONPATH=src python -m benchmarks.serve_resources " + " ".join(sys.argv[1:]),
        "model": args.model,
        "server_omp_threads": args.threads,
        "cpu_count": os.cpu_count(),
        "src": os.path.relpath(Path(args.src).resolve(), ROOT),
    }
    common["confidence"] = f"untrained EliCal head ({args.head_template} template)" if args.head_template else "n-prob"
    head: tuple[str, ...] = ()
    if args.head_template:  # read from the reply's own prefill: no second pass over the prompt
        head = ("--head", str(untrained_head(args.model, Path(tempfile.mkdtemp()) / "head", args.head_template)))
    for phase in phases:
        port = free_port()
        proc = start_server(args, port, head)
        try:
            api = client(port)
            if phase == "stops":
                result = run_stops(api, proc.pid, args.stops, questions[0])
            else:
                result = run_long_prompts(api, proc.pid, questions, args)
            result["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        key = phase + (f"_{args.tag}" if args.tag else "")
        payload[key] = {**common, **result}
        print(key, json.dumps(result))
        write_json(out, payload)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
