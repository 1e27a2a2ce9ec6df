"""Confidence at the speed of the engine (issue 24): ``candor serve`` against the engines it is deployed on.

Every arm is a real server on 127.0.0.1, asked the same requests (questions of
the HonestyBench-mini in-domain test parts, interleaved over the datasets)
with the official ``openai`` client at concurrency 1, 8, 32 and 64; greedy
answers of at most ``--max-new-tokens`` tokens from the embedded model.

Arms (``--arms`` runs a subset; each arm × concurrency cell is written to the
results file as it finishes, and a rerun skips the cells already there when
the setup is the same):

- ``generation``: ``transformers serve --continuous-batching``, asked on its
  completions endpoint with the prompt candor sends (the ``fewshot`` template,
  its stop strings): the engine alone.
- ``candor``: ``candor serve`` in process, ``n-prob``, threshold 0 (every
  question answered).
- ``head``: ``candor serve --head DIR`` (an EliCal head), threshold 0.
- ``head-abstain``: the same head, with the threshold at the median of the
  confidences the ``head`` arm returned, so about half the questions abstain.
- ``chain``: ``candor serve --backend openai --base-url GEN --confidence-url
  CLS --head OUT`` in front of the ``generation`` server and ``candor
  serve-head OUT`` (the head exported with ``candor export --to seq-cls``),
  threshold 0: the deployment without weights in candor's process.

Ratios, computed from cells of the same setup in the file:

- (a) ``candor`` / ``generation``: throughput at 32, p50 latency at 1;
- (b) ``head`` / ``candor``: p50 latency of answered questions at 1, peak
  resident memory of the server; mean latency against the abstention share
  (``head``, ``head-abstain``);
- (c) ``chain`` / ``generation``: p50 latency (the added cost of candor and
  the classify request).

``--redo`` measures the named arms again (e.g. ``--arms candor,head,head-abstain
--redo`` after the in-process engine changes); each arm records the commit it
measured.

    CANDOR_DATA_DIR=... PYTHONPATH=src python -m benchmarks.serve_engine --head HEAD [--arms chain,generation] [--quick]

Results: ``benchmarks/results/serve_engine.json`` (``--quick``: ``serve_engine_quick.json``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import CACHE, RESULTS, logger, setup_logging, write_json
from benchmarks.mini import load_mini_or_exit
from benchmarks.servers import free_port

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("generation", "candor", "head", "head-abstain", "chain")
CONCURRENCY = (1, 8, 32, 64)
MODEL = "smollm2-135m"


class Server:
    """A server process on a free port, stopped (its whole process group) on exit."""

    def __init__(self, name: str, cmd: list[str], port: int, log: Path, threads: int) -> None:
        self.name, self.port, self.log = name, port, log
        env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}
        env.pop("CANDOR_API_KEY", None)
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as sink:
            self.proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait(self, limit: float = 600.0) -> Server:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2):
                    return self
            except OSError:
                time.sleep(0.5)
        raise RuntimeError(f"{self.name} did not start within {limit:.0f} s (log: {self.log})")

    def peak_rss_mib(self) -> float:
        """The peak resident memory of the server process (VmHWM)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
        return float("nan")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def candor_cmd(port: int, max_new_tokens: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "candor.cli",
        "serve",
        "--port",
        str(port),
        "--max-new-tokens",
        str(max_new_tokens),
        "--queue-size",
        "512",
        *extra,
    ]


def generation_cmd(model_dir: str, port: int) -> list[str]:
    """transformers serve with continuous batching; its KV cache is sized to the load (32k tokens, about 1.5 GB
    here) since on a CPU it would otherwise take most of the machine's memory (12 GB seen)."""
    return [
        sys.executable,
        "-m",
        "transformers.cli.transformers",
        "serve",
        model_dir,
        "--port",
        str(port),
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--continuous-batching",
        "--cb-block-size",
        "32",
        "--cb-num-blocks",
        "1024",
    ]


class Asker:
    """One request the way an arm is asked: candor's chat endpoint, or the engine's completions endpoint."""

    def __init__(
        self, url: str, engine_model: str | None, prompts: dict[str, str], stop: list[str], max_new_tokens: int
    ) -> None:
        import openai

        self.client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", timeout=900, max_retries=0)
        self.engine_model, self.prompts, self.stop, self.max_new_tokens = engine_model, prompts, stop, max_new_tokens

    def __call__(self, question: str) -> dict[str, Any]:
        start = time.perf_counter()
        if self.engine_model is None:
            reply = self.client.chat.completions.create(
                model="candor", messages=[{"role": "user", "content": question}]
            )
            choice = reply.choices[0]
            confidence = choice.model_extra["confidence"]
            text, abstained, value = choice.message.content, confidence["abstained"], confidence["value"]
        else:
            reply = self.client.completions.create(
                model=self.engine_model,
                prompt=self.prompts[question],
                max_tokens=self.max_new_tokens,
                temperature=0.0,
                stop=self.stop,
            )
            text, abstained, value = reply.choices[0].text, False, None
        seconds = time.perf_counter() - start
        tokens = reply.usage.completion_tokens if reply.usage is not None else None
        return {"s": seconds, "text": text, "abstained": abstained, "confidence": value, "tokens": tokens}


def run_cell(ask: Asker, questions: list[str], concurrency: int, stop: list[str]) -> dict[str, Any]:
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        replies = list(pool.map(ask, questions))
    wall = time.perf_counter() - start
    lat = np.array([r["s"] for r in replies])
    answered = np.array([r["s"] for r in replies if not r["abstained"]])
    tokens = [r["tokens"] for r in replies if r["tokens"] is not None]
    ms = lambda x: round(float(x) * 1000, 1)  # noqa: E731
    return {
        "requests": len(questions),
        "seconds": round(wall, 3),
        "requests_per_s": round(len(questions) / wall, 3),
        "p50_ms": ms(np.percentile(lat, 50)),
        "p90_ms": ms(np.percentile(lat, 90)),
        "mean_ms": ms(lat.mean()),
        "answered": int(len(answered)),
        "abstention_share": round(1 - len(answered) / len(replies), 3),
        "answered_p50_ms": ms(np.percentile(answered, 50)) if len(answered) else None,
        "completion_tokens": int(sum(tokens)) if tokens else None,
        "completion_tokens_per_s": round(sum(tokens) / wall, 2) if tokens else None,
        "answers": [[r["text"], r["confidence"], r["abstained"]] for r in replies],
        # answers that ran on past a stop string: an engine that ignores ``stop`` (transformers serve) keeps
        # generating to the token cap, so its requests do more work than candor's
        "past_stop": sum(any(s in (r["text"] or "").strip() for s in stop) for r in replies),
        "load_average": round(os.getloadavg()[0], 2),  # other jobs on the machine, at the cell's end
    }


def questions_of(n: int, data_dir: str | None) -> list[str]:
    """``n`` test questions, interleaved over the in-domain datasets (the same ones in every arm)."""
    bench = load_mini_or_exit(data_dir, test_size=max(8, -(-n // 4)))
    parts = [[item.question for item in items] for _, items in sorted(bench.test_id.items())]
    out = [q for row in zip(*parts, strict=False) for q in row]
    return out[:n]


def engine_prompts(questions: list[str], model_dir: str) -> tuple[dict[str, str], list[str]]:
    """The prompt candor sends an engine for each question (the embedded model's ``fewshot``) and its stops."""
    from transformers import AutoTokenizer

    from candor.annotation.prompts import resolve_template
    from candor.backends.chat import TokenizerChat
    from candor.serve.confidence_sources import question_item

    template = resolve_template("auto", MODEL)
    chat = TokenizerChat(AutoTokenizer.from_pretrained(model_dir), MODEL)
    return {q: template(question_item(q), chat) for q in questions}, list(template.stop)  # type: ignore[arg-type]


def embedded_dir() -> Path:
    from candor.backends.default_model import resolve_embedded

    return Path(resolve_embedded(MODEL))


def exported_head(head: Path, out: Path) -> Path:
    """The head exported as a sequence classifier (reused when already there)."""
    from candor.train.elical.export import EXPORT_FILE, export_seq_cls

    if not (out / EXPORT_FILE).exists():
        export_seq_cls(head, out)
    return out


def setup_key(args: argparse.Namespace, questions: list[str]) -> str:
    what = {
        "questions": questions,
        "max_new_tokens": args.max_new_tokens,
        "threads": args.threads,
        "head": str(args.head),
        "concurrency": args.concurrency,
        "requests": args.requests,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head", type=Path, required=True, help="an EliCal head folder on the embedded model")
    parser.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated subset of {', '.join(ARMS)}")
    parser.add_argument("--concurrency", default=",".join(map(str, CONCURRENCY)))
    parser.add_argument("--requests", type=int, default=32, help="requests per cell (at least 2x the concurrency)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="OMP threads of each server (a shared CPU)")
    parser.add_argument("--fresh", action="store_true", help="start the results file over (a new setup)")
    parser.add_argument("--redo", action="store_true", help="measure the --arms again (drop their cells first)")
    parser.add_argument("--quick", action="store_true", help="a short smoke run: concurrency 1 and 8, 8 requests")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    setup_logging()
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # the openai client's transport logs every request
    if args.quick:
        args.concurrency, args.requests = "1,8", 8
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        parser.error(f"unknown arms {unknown}; known: {', '.join(ARMS)}")
    if not (args.head / "elical_config.json").exists():
        parser.error(f"--head {args.head}: not an EliCal head folder")
    out = args.out or RESULTS / ("serve_engine_quick.json" if args.quick else "serve_engine.json")
    questions = questions_of(max(args.requests, 2 * max(args.concurrency)), args.data_dir)
    key = setup_key(args, questions)
    payload = json.loads(out.read_text()) if out.exists() else {}
    if payload.get("cells") and payload.get("setup_key") != key and not args.fresh:
        parser.error(
            f"{out} holds cells measured with another setup (questions, requests, tokens, threads, head or "
            "concurrency levels); give the same options, another --out, or --fresh to start over"
        )
    if payload.get("setup_key") != key:
        payload = {"setup_key": key, "cells": {}, "servers": {}}
    payload.update(
        {
            "command": "PYTHONPATH=src python -m benchmarks.serve_engine " + " ".join(sys.argv[1:]),
            "model": MODEL,
            "head": str(args.head),
            "max_new_tokens": args.max_new_tokens,
            "server_omp_threads": args.threads,
            "cpu_count": os.cpu_count(),
            "concurrency": args.concurrency,
            "requests_per_cell": {str(c): max(args.requests, 2 * c) for c in args.concurrency},
            "questions": "HonestyBench-mini in-domain test parts, interleaved",
            "stop": engine_prompts(questions[:1], str(embedded_dir()))[1],
        }
    )
    for arm in arms:
        if args.redo:
            payload["cells"].pop(arm, None)
        run_arm(arm, args, questions, payload, out)
    save(out, payload)
    print(json.dumps(payload["ratios"], indent=2))
    print(f"wrote {out}")


def save(out: Path, payload: dict[str, Any]) -> None:
    """Write the file with the ratios of the cells measured so far (a stopped run leaves a complete file)."""
    payload["ratios"] = ratios(payload)
    payload["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    write_json(out, payload)


def run_arm(arm: str, args: argparse.Namespace, questions: list[str], payload: dict[str, Any], out: Path) -> None:
    cells = payload["cells"].setdefault(arm, {})
    todo = [c for c in args.concurrency if str(c) not in cells]
    if not todo:
        logger.info("%s: every cell already measured", arm)
        return
    model_dir = str(embedded_dir())
    prompts, stop = engine_prompts(questions, model_dir)
    logs = CACHE / "serve_engine" / "logs"
    servers: list[Server] = []
    try:
        front, engine_model, extra = start_arm(arm, args, payload, model_dir, logs, servers)
        ask = Asker(front.url, engine_model, prompts, stop, args.max_new_tokens)
        for q in questions[:2]:  # warm-up (first-request allocations), not timed
            ask(q)
        for c in todo:
            n = max(args.requests, 2 * c)
            cell = run_cell(ask, questions[:n], c, stop)
            logger.info(
                "%s c=%d: %.2f req/s, p50 %.0f ms, mean %.0f ms, abstained %.0f%%",
                arm,
                c,
                cell["requests_per_s"],
                cell["p50_ms"],
                cell["mean_ms"],
                100 * cell["abstention_share"],
            )
            cells[str(c)] = cell
            payload["servers"][arm] = {
                "peak_rss_mib": {s.name: s.peak_rss_mib() for s in servers},
                "commit": commit(),
                **extra,
            }
            save(out, payload)
    finally:
        for server in reversed(servers):
            server.stop()


def start_arm(
    arm: str, args: argparse.Namespace, payload: dict[str, Any], model_dir: str, logs: Path, servers: list[Server]
) -> tuple[Server, str | None, dict[str, Any]]:
    """Start the arm's servers; return the one asked, the engine model name (None: candor's chat) and notes."""
    port = free_port()
    if arm == "generation":
        servers.append(
            Server("generation", generation_cmd(model_dir, port), port, logs / "generation.log", args.threads).wait()
        )
        return servers[0], model_dir, {}
    if arm == "candor":
        cmd = candor_cmd(port, args.max_new_tokens, "--model", MODEL, "--threshold", "0")
        servers.append(Server("candor", cmd, port, logs / "candor.log", args.threads).wait())
        return servers[0], None, {}
    if arm in ("head", "head-abstain"):
        threshold = 0.0 if arm == "head" else abstaining_threshold(payload)
        cmd = candor_cmd(
            port, args.max_new_tokens, "--model", MODEL, "--head", str(args.head), "--threshold", repr(threshold)
        )
        servers.append(Server("candor", cmd, port, logs / f"{arm}.log", args.threads).wait())
        return servers[0], None, {"threshold": threshold}
    # chain: the engine, the exported head on candor serve-head, candor serve in front
    export = exported_head(args.head, CACHE / "serve_engine" / "head-seq-cls")
    gen_port, cls_port = free_port(), free_port()
    servers.append(
        Server("generation", generation_cmd(model_dir, gen_port), gen_port, logs / "chain-gen.log", args.threads)
    )
    servers.append(
        Server(
            "classify",
            [sys.executable, "-m", "candor.cli", "serve-head", str(export), "--port", str(cls_port)],
            cls_port,
            logs / "chain-cls.log",
            args.threads,
        )
    )
    servers[0].wait()
    servers[1].wait()
    cmd = candor_cmd(
        port,
        args.max_new_tokens,
        "--backend",
        "openai",
        "--model",
        model_dir,
        "--base-url",
        f"{servers[0].url}/v1",
        "--confidence-url",
        servers[1].url,
        "--head",
        str(export),
        "--threshold",
        "0",
    )
    servers.append(Server("candor", cmd, port, logs / "chain-candor.log", args.threads).wait())
    return servers[-1], None, {"export": str(export.relative_to(ROOT))}


def commit() -> str:
    """The checkout's commit (with ``+dirty`` when files differ): which engine an arm measured."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
    )
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def abstaining_threshold(payload: dict[str, Any]) -> float:
    """The median confidence the ``head`` arm returned at concurrency 1 (about half the questions abstain)."""
    cells = payload["cells"].get("head") or {}
    cell = cells.get("1") or next(iter(cells.values()), None)
    if cell is None:
        raise SystemExit("head-abstain needs the head arm first (its confidences set the threshold): --arms head,...")
    return float(np.median([a[1] for a in cell["answers"]]))


def ratio(a: float | None, b: float | None) -> float | None:
    return None if not a or not b else round(a / b, 3)


def ratios(payload: dict[str, Any]) -> dict[str, Any]:
    """The issue's ratios from the cells in the file (all measured with the same setup)."""
    cells = payload["cells"]

    def get(arm: str, c: int, field: str) -> float | None:
        return (cells.get(arm) or {}).get(str(c), {}).get(field)

    rss = {arm: (payload["servers"].get(arm) or {}).get("peak_rss_mib", {}) for arm in cells}
    out: dict[str, Any] = {
        "a_throughput_candor_over_engine_at_32": ratio(
            get("candor", 32, "requests_per_s"), get("generation", 32, "requests_per_s")
        ),
        "a_p50_candor_over_engine_at_1": ratio(get("candor", 1, "p50_ms"), get("generation", 1, "p50_ms")),
        "a_tokens_per_s_candor_over_engine_at_32": ratio(
            get("candor", 32, "completion_tokens_per_s"), get("generation", 32, "completion_tokens_per_s")
        ),
        "a_answers_equal_engine": answers_equal(cells, "candor", "generation", payload["stop"]),
        "b_answered_p50_head_over_candor_at_1": ratio(get("head", 1, "answered_p50_ms"), get("candor", 1, "p50_ms")),
        "b_peak_rss_head_over_candor": ratio(rss.get("head", {}).get("candor"), rss.get("candor", {}).get("candor")),
        "b_mean_latency_by_abstention_at_1": [
            {"arm": arm, "abstention_share": get(arm, 1, "abstention_share"), "mean_ms": get(arm, 1, "mean_ms")}
            for arm in ("head", "head-abstain")
            if get(arm, 1, "mean_ms") is not None
        ],
        "c_p50_chain_over_engine": {
            str(c): ratio(get("chain", c, "p50_ms"), get("generation", c, "p50_ms")) for c in payload["concurrency"]
        },
        "c_answers_equal_engine": answers_equal(cells, "chain", "generation", payload["stop"]),
        "chain_candor_peak_rss_mib": rss.get("chain", {}).get("candor"),
    }
    return out


def answer_text(text: str | None, stop: list[str]) -> str:
    """The answer as candor returns it: cut at the template's first stop string (an engine may ignore
    ``stop``: transformers serve does), stripped."""
    text = text or ""
    for s in stop:
        text = text.split(s, 1)[0]
    return text.strip()


def answers_equal(cells: dict[str, Any], arm: str, base: str, stop: list[str]) -> dict[str, Any] | None:
    """How many of ``arm``'s answers equal ``base``'s to the same question (both cut at the stops), per concurrency."""
    out = {}
    for c, cell in (cells.get(arm) or {}).items():
        other = (cells.get(base) or {}).get(c)
        if other is None:
            continue
        same = sum(
            answer_text(a[0], stop) == answer_text(b[0], stop)
            for a, b in zip(cell["answers"], other["answers"], strict=True)
        )
        out[c] = {"equal": same, "of": len(cell["answers"])}
    return out or None


if __name__ == "__main__":
    main()
