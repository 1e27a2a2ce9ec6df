"""Load tests of ``candor serve`` on loopback, against a real ``candor serve`` subprocess (embedded model).

Two phases, each stored under its own key of the results file (a phase not run keeps its old entry):

- ``batching``: a fixed number of chat requests (built-in starter questions) at
  concurrency 1, 8 and 32, micro-batching on and off; requests per second,
  p50/p99 latency, and the throughput ratio on/off measured in the same run.
- ``head_memory``: resident memory of ``candor serve`` answering the same
  questions with n-prob (no head), with an EliCal head read from the
  generator's own prefill (issue 24: one prefill, no second backbone), and with
  a head whose template differs from the generator's (the separate pass, its
  own backbone). The head is an untrained one on the served model (its values
  do not matter here, only what the process holds); ratios against n-prob.
- ``hostile``: the acceptance test of issue 23. ``--clients`` threads with the
  official ``openai`` client send chat requests for ``--seconds``, half of them
  streaming; every fifth request is hostile (a stop string that empties the
  answer, a lone surrogate, a prompt over the context, a huge ``n``, a client
  that drops mid-stream, ``temperature: 0.01``). Afterwards every question is
  asked again alone; the phase counts failures of well-formed requests,
  answers and confidences (beyond 1e-6) that differ from the lone answer, what
  each hostile kind got, p50/p99 latency and time to first token, and checks
  the server is still up.
- ``traffic``: real chat traffic (issue 42): 3-turn chats with a system prompt, long
  answers, LangChain users, one hostile request in five (4,000-token prompts, unique
  stop lists); the short single questions' p99 against their idle p50, confidences
  against the same conversations asked alone, resident memory (``serve_traffic.py``).
- ``production``: issue 53's acceptance (``serve_production.py``): PostgreSQL, two replicas,
  ``--clients`` for ``--seconds`` (chats with a system prompt, streams, long answers, slow bodies,
  labels posted to a random replica, one hostile request in five), two reloads per replica
  during the load; failed well-formed requests, responses with other options than the
  deployment's, labels lost or misplaced in the store, memory, the replicas' audit gauges.

    PYTHONPATH=src python -m benchmarks.serve_load --phases hostile [--clients 50] [--seconds 60]
    PYTHONPATH=src python -m benchmarks.serve_load --phases traffic [--clients 50] [--seconds 60]
    PYTHONPATH=src python -m benchmarks.serve_load --phases production --clients 30 --seconds 120

Results: ``benchmarks/results/serve_load.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import RESULTS, logger, setup_logging, write_json
from benchmarks.heads import untrained_head
from benchmarks.serve_hostile import run_hostile
from benchmarks.serve_production import run_production
from benchmarks.serve_traffic import run_traffic
from benchmarks.servers import free_port, start_candor_serve
from candor.data import load_items

ROOT = Path(__file__).resolve().parents[1]
CONCURRENCY = (1, 8, 32)
SETTINGS = {
    "batching_on": {"max_batch": 32, "batch_wait_ms": 10.0},
    "batching_off": {"max_batch": 1, "batch_wait_ms": 0.0},
}


def start_server(
    model: str,
    port: int,
    max_batch: int,
    batch_wait_ms: float,
    threads: int,
    max_new_tokens: int,
    extra: tuple[str, ...] = (),
) -> subprocess.Popen:
    serve = [
        "--model",
        model,
        "--max-batch",
        str(max_batch),
        "--batch-wait-ms",
        str(batch_wait_ms),
        "--queue-size",
        "256",
        "--max-new-tokens",
        str(max_new_tokens),
        *extra,
    ]
    return start_candor_serve(serve, port, threads=threads, limit_s=300)


def ask(port: int, question: str) -> tuple[float, str, float]:
    body = json.dumps({"model": "candor", "messages": [{"role": "user", "content": question}]}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as resp:
        out = json.loads(resp.read())
    choice = out["choices"][0]
    return time.perf_counter() - start, choice["message"]["content"], choice["confidence"]["value"]


def health(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as resp:
        return json.loads(resp.read())


def run_level(port: int, questions: list[str], concurrency: int) -> dict[str, Any]:
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(lambda q: ask(port, q), questions))
    wall = time.perf_counter() - start
    latencies = np.array([r[0] for r in results])
    return {
        "concurrency": concurrency,
        "requests": len(questions),
        "seconds": round(wall, 3),
        "requests_per_s": round(len(questions) / wall, 3),
        "p50_ms": round(float(np.percentile(latencies, 50)) * 1000, 1),
        "p99_ms": round(float(np.percentile(latencies, 99)) * 1000, 1),
        "in_flight_after": health(port)["in_flight"],
        "answers": [[r[1], r[2]] for r in results],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument(
        "--phases",
        default="batching,hostile",
        help="comma-separated: batching, hostile, head_memory, traffic, production",
    )
    parser.add_argument("--requests", type=int, default=32, help="batching: requests per concurrency level")
    parser.add_argument("--threads", type=int, default=1, help="OMP threads of the server (a shared CPU)")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--clients", type=int, default=50, help="hostile: concurrent clients")
    parser.add_argument("--seconds", type=float, default=60.0, help="hostile: how long the clients send")
    parser.add_argument("--threshold", type=float, default=0.5, help="hostile: the server's abstention threshold")
    parser.add_argument(
        "--max-batch",
        type=int,
        default=16,
        help="hostile: the server's batch size (1 turns batching off; stored as hostile_max_batch_1)",
    )
    parser.add_argument("--unique-stops", type=int, default=1000, help="traffic: requests with unique stop lists")
    parser.add_argument("--out", default=str(RESULTS / "serve_load.json"))
    args = parser.parse_args()
    setup_logging()
    out = Path(args.out)
    payload = json.loads(out.read_text()) if out.exists() else {}
    if payload and "batching" not in payload and "hostile" not in payload:
        payload = {"batching": payload}  # the file before the hostile phase existed
    command = "PYTHONPATH=src python -m benchmarks.serve_load " + " ".join(sys.argv[1:])
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    if "batching" in phases:
        payload["batching"] = run_batching(args)
        payload["batching"]["command"] = command
    if "head_memory" in phases:
        payload["head_memory"] = {"command": command, **run_head_memory(args)}
    if "hostile" in phases:
        port = free_port()
        key = "hostile" if args.max_batch == 16 else f"hostile_max_batch_{args.max_batch}"
        proc = start_server(
            args.model,
            port,
            args.max_batch,
            10.0,
            args.threads,
            args.max_new_tokens,
            ("--threshold", str(args.threshold)),
        )
        try:
            payload[key] = {
                "command": command,
                "model": args.model,
                "confidence": "n-prob",
                "threshold": args.threshold,
                "max_new_tokens": args.max_new_tokens,
                "max_batch": args.max_batch,
                "server_omp_threads": args.threads,
                "cpu_count": os.cpu_count(),
                **run_hostile(port, args.clients, args.seconds),
            }
            payload[key]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        w = payload[key]["well_formed"]
        print(
            f"hostile: {w['requests']} well-formed requests, {w['failures']} failures, {w['answer_mismatches']} "
            f"answer and {w['confidence_mismatches']} confidence mismatches, server up afterwards: "
            f"{payload[key]['server_up_afterwards']}"
        )
    if "traffic" in phases:
        key = "traffic" if args.clients == 50 else f"traffic_{args.clients}_clients"  # 50: the issue's acceptance
        payload[key] = {"command": command, **run_traffic_phase(args)}
        t = payload[key]
        print(
            f"traffic: {t['well_formed']['failures']} failures of {t['well_formed']['requests']}, "
            f"{t['well_formed']['confidence_mismatches']} confidence mismatches, short p99/idle p50 "
            f"{t['short_single_under_load']['p99_over_idle_p50']}, memory x{t['resident_mib']['ratio']}, "
            f"unique stops {t['unique_stops']}"
        )
    if "production" in phases:
        key = "production" if (args.clients, args.seconds) == (30, 120) else f"production_{args.clients}_clients"
        payload[key] = {
            "command": command,
            "model": args.model,
            "confidence": "n-prob",
            "cpu_count": os.cpu_count(),
            **run_production(args.model, args.clients, args.seconds, args.threads, log=logger.info),
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        }
        print(production_summary(payload[key]))
    write_json(out, payload)
    print(f"wrote {args.out}")


def production_summary(p: dict[str, Any]) -> str:
    w, labels = p["well_formed"], p["labels"]
    return (
        f"production: {w['failures']} failures of {w['requests']} well-formed requests, {w['feedback_failures']} of "
        f"{w['feedback_posts']} labels, {p['hostile_not_4xx']} hostile not 4xx; {p['options']['violations']} of "
        f"{p['options']['checked']} choices with other options; labels lost {labels['lost']}, foreign "
        f"{labels['foreign']}, on another version {labels['version_mismatches']}; "
        f"memory x{p['resident_mib']['ratio']}; "
        f"audit gauges equal: {p['audit']['equal']}; reloads {[r['ok'] for r in p['reloads']]}"
    )


def run_traffic_phase(args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    proc = start_server(
        args.model, port, args.max_batch, 10.0, args.threads, args.max_new_tokens, ("--threshold", str(args.threshold))
    )
    try:
        result = {
            "model": args.model,
            "confidence": "n-prob",
            "threshold": args.threshold,
            "max_new_tokens": args.max_new_tokens,
            "max_batch": args.max_batch,
            "server_omp_threads": args.threads,
            "cpu_count": os.cpu_count(),
            **run_traffic(port, proc.pid, args.clients, args.seconds, args.unique_stops),
        }
        result["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
        return result
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def run_batching(args: argparse.Namespace) -> dict[str, Any]:
    items = load_items("starter")
    questions = [items[i % len(items)].question for i in range(args.requests)]
    runs: dict[str, list[dict[str, Any]]] = {}
    for name, setting in SETTINGS.items():
        port = free_port()
        proc = start_server(
            args.model, port, setting["max_batch"], setting["batch_wait_ms"], args.threads, args.max_new_tokens
        )
        try:
            ask(port, "warm-up question?")
            runs[name] = []
            for c in CONCURRENCY:
                level = run_level(port, questions, c)
                logger.info(
                    "%s c=%d: %.2f req/s, p50 %.0f ms, p99 %.0f ms",
                    name,
                    c,
                    level["requests_per_s"],
                    level["p50_ms"],
                    level["p99_ms"],
                )
                runs[name].append(level)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    result = summarize(runs, args)
    for row in result["ratio_on_over_off"]:
        print(
            f"c={row['concurrency']:>2}: throughput on/off = {row['throughput']:.2f}x, "
            f"p50 on/off = {row['p50']:.2f}x, answer mismatches = {row['answer_mismatches']}"
        )
    return result


def resident_mb(pid: int) -> dict[str, float]:
    """Resident memory now and at its peak (Linux ``/proc``), in MB."""
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return {
        "rss_mb": round(int(status["VmRSS"].split()[0]) / 1024, 1),
        "peak_rss_mb": round(int(status["VmHWM"].split()[0]) / 1024, 1),
    }


def run_head_memory(args: argparse.Namespace) -> dict[str, Any]:
    import tempfile

    items = load_items("starter")
    questions = [items[i].question for i in range(args.requests)]
    out: dict[str, Any] = {"model": args.model, "questions": len(questions), "max_new_tokens": args.max_new_tokens}
    with tempfile.TemporaryDirectory() as tmp:
        setups = {
            "no_head": (),
            "head_from_prefill": ("--head", str(untrained_head(args.model, Path(tmp) / "fewshot", "fewshot"))),
            "head_own_pass": ("--head", str(untrained_head(args.model, Path(tmp) / "chat", "chat"))),
        }
        for name, extra in setups.items():
            port = free_port()
            proc = start_server(args.model, port, 16, 5.0, args.threads, args.max_new_tokens, extra)
            try:
                with ThreadPoolExecutor(max_workers=8) as pool:
                    answers = list(pool.map(lambda q, port=port: ask(port, q), questions))
                out[name] = {**resident_mb(proc.pid), "requests": len(answers)}
            finally:
                proc.terminate()
                proc.wait(timeout=60)
            logger.info("%s: %s", name, out[name])
    base = out["no_head"]["rss_mb"]
    out["rss_ratio_over_no_head"] = {
        k: round(out[k]["rss_mb"] / base, 3) for k in ("head_from_prefill", "head_own_pass")
    }
    print("resident memory over no head:", out["rss_ratio_over_no_head"])
    return out


def summarize(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> dict[str, Any]:
    ratios = []
    for on, off in zip(runs["batching_on"], runs["batching_off"], strict=True):
        mismatches = sum(
            a[0] != b[0] or abs(a[1] - b[1]) > 1e-3 * max(abs(b[1]), 1e-12)
            for a, b in zip(on["answers"], off["answers"], strict=True)
        )
        ratios.append(
            {
                "concurrency": on["concurrency"],
                "throughput": round(on["requests_per_s"] / off["requests_per_s"], 3),
                "p50": round(on["p50_ms"] / off["p50_ms"], 3),
                "answer_mismatches": int(mismatches),
            }
        )
    for levels in runs.values():
        for level in levels:
            level.pop("answers")
    return {
        "model": args.model,
        "confidence": "n-prob",
        "max_new_tokens": args.max_new_tokens,
        "server_omp_threads": args.threads,
        "cpu_count": os.cpu_count(),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],  # other processes share the CPU
        "settings": SETTINGS,
        "runs": runs,
        "ratio_on_over_off": ratios,
    }


if __name__ == "__main__":
    main()
