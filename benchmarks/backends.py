"""Annotation throughput of the three engines on the same NQ questions: hf, vllm and openai (a local server).

Every path runs the full ``candor.annotation.builder.annotate`` (generation, judges,
records written) on the same first ``--questions`` NQ test questions with the
``fewshot`` template, k samples (temperature 1, top-p 0.95, top-k 50, at most
32 new tokens, cut at the first newline):

- hf: transformers in process;
- vllm: vLLM's offline engine, run by ``--vllm-python`` (vLLM lives in its own
  venv on CPU machines; see README), float32 on CPU;
- openai: the openai backend against a vLLM OpenAI-compatible server started
  here on 127.0.0.1 (``--server vllm``, the grey-box case with ``n`` and
  log-probs), or ``transformers serve`` (``--server transformers``, the
  black-box case: one request per sample).

Each path runs in its own subprocess; engine start-up and model loading are
outside the timed region. Ratios are questions per second against hf measured
in the same run. Results: ``benchmarks/results/backends.json``.

    python -m benchmarks.backends [--questions 64] [--k 5] [--vllm-python /work/vllm-venv/bin/python]
        [--server vllm|transformers] [--paths hf,vllm,openai]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.annotation_job import DATA, MODEL, load_items
from benchmarks.children import script_command, script_env
from benchmarks.servers import free_port

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "backends.json"
SETTINGS = {"max_new_tokens": 32, "temperature": 1.0, "top_p": 0.95, "top_k": 50}


def timed_annotate(backend: Any, items: list[Any], k: int, batch_size: int, keep: Path | None = None) -> dict[str, Any]:
    from candor.annotation.builder import AnnotateConfig, annotate
    from candor.annotation.prompts import TEMPLATES
    from candor.annotation.records import read_records
    from candor.backends.base import SamplingParams

    template = TEMPLATES.get("fewshot")
    config = AnnotateConfig(k=k, params=SamplingParams(**SETTINGS), batch_size=batch_size)
    with tempfile.TemporaryDirectory() as tmp:
        # Warm-up on one question (first-call allocations), outside the timed region.
        annotate(items[:1], backend, Path(tmp) / "warm.jsonl", template, config, progress=False)
        start = time.perf_counter()
        annotate(items, backend, Path(tmp) / "r.jsonl", template, config, progress=False)
        seconds = time.perf_counter() - start
        records = read_records(Path(tmp) / "r.jsonl")
        if keep is not None:  # the records, for a later stage (gpu_check.sh trains on them)
            keep.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(Path(tmp) / "r.jsonl", keep)
    return {
        "seconds": seconds,
        "questions": len(records),
        "questions_per_second": len(records) / seconds,
        "greedy_accuracy": sum(r.greedy_correct or 0 for r in records) / len(records),
        "greedy": [r.greedy.text for r in records],
        "has_logprobs": all(bool(r.greedy.logprobs) or not r.greedy.text for r in records),
    }


# ------------------------------------------------------------------- children


def child(args: argparse.Namespace) -> None:
    from candor.backends import load_backend

    items = load_items(args.questions, args.data)
    if args.path == "openai":
        backend = load_backend(
            args.served_model, "openai", base_url=args.base_url, tokenizer=MODEL, max_concurrency=args.concurrency
        )
    elif args.path == "vllm":
        backend = load_backend(MODEL, "vllm", max_model_len=1024)
    else:
        backend = load_backend(MODEL, "hf", batch_size=args.batch_size)
    keep = Path(args.keep) / f"{args.path}.jsonl" if args.keep else None
    out = timed_annotate(backend, items, args.k, args.batch_size, keep)
    print("RESULT " + json.dumps(out), flush=True)


def run_child(python: str, path: str, args: argparse.Namespace, extra: list[str] | None = None) -> dict[str, Any]:
    cmd = script_command(
        __spec__.name,
        "--child",
        path,
        "--questions",
        str(args.questions),
        "--k",
        str(args.k),
        "--batch-size",
        str(args.batch_size),
        "--concurrency",
        str(args.concurrency),
        "--data",
        str(args.data),
        *(extra or []),
        python=python,
    )
    if args.keep:
        cmd += ["--keep", args.keep]
    # Passive OpenMP waiting: spinning threads were 5-6x slower on a shared CPU (see annotate_throughput.py).
    env = {
        "OMP_WAIT_POLICY": "PASSIVE",
        **os.environ,
        "PYTHONPATH": "",
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),
    }
    env = script_env(env, ROOT / "src")  # this checkout's src and benchmarks only, whatever the parent's path
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{path} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT ") :])


def start_server(kind: str, vllm_python: str) -> tuple[subprocess.Popen, str, str]:
    """A local OpenAI-compatible server on the embedded model; (process, base url, served model id)."""
    from candor.backends.default_model import resolve_embedded

    folder = str(resolve_embedded(MODEL))
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2")}
    if kind == "vllm":
        cmd = [
            vllm_python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            folder,
            "--port",
            str(port),
            "--max-model-len",
            "1024",
            "--enforce-eager",
            "--dtype",
            "float32",
        ]
    else:
        cmd = [
            sys.executable,
            "-m",
            "transformers.cli.transformers",
            "serve",
            folder,
            "--port",
            str(port),
            "--device",
            "cpu",
        ]
    log = open(Path(tempfile.gettempdir()) / f"candor_backends_{kind}_server.log", "w")  # noqa: SIM115 (server's lifetime)
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{kind} server exited with {proc.returncode}; see {log.name}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                return proc, f"http://127.0.0.1:{port}/v1", folder
        except OSError:
            time.sleep(2)
    raise RuntimeError(f"{kind} server not healthy in 600 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=64)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--paths", default="hf,vllm,openai")
    parser.add_argument("--server", choices=["vllm", "transformers"], default="vllm")
    parser.add_argument("--vllm-python", default="/work/vllm-venv/bin/python")
    parser.add_argument("--data", type=Path, default=DATA, help="NQ test JSONL (HonestyBench format)")
    parser.add_argument("--keep", default=None, help="folder to keep each path's records in (<path>.jsonl)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--child", default=None)
    parser.add_argument("--base-url", default=None)
    parser.add_argument("--served-model", default=None)
    args = parser.parse_args()
    if args.child:
        args.path = args.child
        child(args)
        return
    if not args.data.exists():
        print(f"skipped: NQ test data not found at {args.data}")
        return
    results: dict[str, Any] = {}
    for path in args.paths.split(","):
        if path == "hf":
            results["hf"] = run_child(sys.executable, "hf", args)
        elif path == "vllm":
            results["vllm"] = run_child(args.vllm_python, "vllm", args)
        elif path == "openai":
            proc, url, served = start_server(args.server, args.vllm_python)
            try:
                results["openai"] = run_child(
                    sys.executable, "openai", args, ["--base-url", url, "--served-model", served]
                )
                results["openai"]["server"] = args.server
            finally:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=60)
        print(f"{path}: {results[path]['questions_per_second']:.3f} q/s", flush=True)
    base = results.get("hf", {}).get("questions_per_second")
    ratios = {p: r["questions_per_second"] / base for p, r in results.items()} if base else {}
    same = {p: r["greedy"] == results["hf"]["greedy"] for p, r in results.items() if "hf" in results}
    payload = {
        "command": " ".join([Path(sys.executable).name, "-m", __spec__.name, *sys.argv[1:]]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "settings": {
            "questions": args.questions,
            "k": args.k,
            "batch_size": args.batch_size,
            "concurrency": args.concurrency,
            "server": args.server,
            **SETTINGS,
        },
        "results": {p: {k: v for k, v in r.items() if k != "greedy"} for p, r in results.items()},
        "speed_vs_hf": ratios,
        "greedy_equal_to_hf": same,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    for path, ratio in ratios.items():
        print(f"{path}: {ratio:.2f}x hf, greedy answers equal to hf: {same.get(path)}")


if __name__ == "__main__":
    main()
