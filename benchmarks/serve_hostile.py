"""The hostile phase of ``serve_load.py``: many official-client requests against one server, one in five hostile.

Each client thread loops until the deadline. Request number i (counted over
all clients) is hostile when i % 5 == 4, cycling through :data:`HOSTILE`; the
others are well-formed chat requests (greedy, the server's defaults),
streaming every other time.
Afterwards every question is asked again alone, and each well-formed answer
(and each ``temperature: 0.01`` confidence) is compared with the lone one.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import openai

from candor.data import load_items

TOLERANCE = 1e-6
OVER_CONTEXT = "\U0001f600" * 3000  # about 12k tokens for SmolLM2's tokenizer, beyond its 8,192 context


def _client(port: int) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=900)


def _messages(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}]


def ask_plain(client: openai.OpenAI, question: str, **extra: Any) -> dict[str, Any]:
    start = time.perf_counter()
    resp = client.chat.completions.create(model="candor", messages=_messages(question), **extra)
    choice = resp.choices[0]
    conf = choice.model_extra["confidence"]
    text = None if conf["abstained"] else choice.message.content
    return {
        "latency": time.perf_counter() - start,
        "ttft": None,
        "text": text,
        "confidence": conf["value"],
        "abstained": conf["abstained"],
        "finish": choice.finish_reason,
    }


def ask_streaming(client: openai.OpenAI, question: str) -> dict[str, Any]:
    start = time.perf_counter()
    first, text, final = None, "", None
    for chunk in client.chat.completions.create(model="candor", messages=_messages(question), stream=True):
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        if choice.delta.content and first is None:
            first = time.perf_counter() - start
        text += choice.delta.content or ""
        if choice.finish_reason:
            final = choice
    latency = time.perf_counter() - start
    assert final is not None, "the stream ended without a finish_reason"
    conf = final.model_extra["confidence"]
    return {
        "latency": latency,
        "ttft": latency if first is None else first,
        "text": None if conf["abstained"] else text,
        "confidence": conf["value"],
        "abstained": conf["abstained"],
        "finish": final.finish_reason,
    }


def _raw_post(port: int, body: bytes) -> tuple[int, dict[str, Any]]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=900) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _outcome(status: int, body: dict[str, Any]) -> str:
    if status != 200:
        return f"{status} {body['error'].get('code')}"
    choice = body["choices"][0]
    text = choice["message"]["content"]
    return f"200 {choice['finish_reason']}" + (" (empty text)" if text == "" else "")


def hostile_bad_stop(port: int, question: str) -> str:
    # SmolLM2's answers begin with a space token: the stop string cuts the answer to "".
    body = {"model": "candor", "messages": _messages(question), "stop": [" "]}
    return _outcome(*_raw_post(port, json.dumps(body).encode()))


def hostile_surrogate(port: int, question: str) -> str:
    body = json.dumps({"model": "candor", "messages": _messages("Who wrote \ud800 Hamlet?")}).encode()
    return _outcome(*_raw_post(port, body))


def hostile_over_context(port: int, question: str) -> str:
    return _outcome(*_raw_post(port, json.dumps({"model": "candor", "messages": _messages(OVER_CONTEXT)}).encode()))


def hostile_huge_n(port: int, question: str) -> str:
    return _outcome(
        *_raw_post(port, json.dumps({"model": "candor", "messages": _messages(question), "n": 1000}).encode())
    )


def hostile_drop(port: int, question: str) -> str:
    """Stream, read up to the first chunk, hang up."""
    body = json.dumps({"model": "candor", "messages": _messages(question), "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=900) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        head = sock.recv(4096)
    return f"{head.split(b' ')[1].decode()} stream, dropped after the first bytes"


HOSTILE: dict[str, Callable[[int, str], str]] = {
    "stop that empties the answer": hostile_bad_stop,
    "lone surrogate": hostile_surrogate,
    "prompt over the context": hostile_over_context,
    "n = 1000": hostile_huge_n,
    "client drops mid-stream": hostile_drop,
    "temperature 0.01": lambda port, q: "",  # sent through the client in the loop (its confidence is compared)
}


def run_hostile(port: int, clients: int, seconds: float) -> dict[str, Any]:
    questions = [item.question for item in load_items("starter")]
    client = _client(port)
    ask_plain(client, "warm-up question?")
    deadline = time.monotonic() + seconds
    well: list[dict[str, Any]] = []
    cold: list[dict[str, Any]] = []  # temperature 0.01
    hostile: dict[str, Counter[str]] = {name: Counter() for name in HOSTILE}
    failures: list[str] = []
    lock = threading.Lock()
    kinds = list(HOSTILE)

    numbers = itertools.count()

    def loop(c: int) -> None:
        mine = _client(port)
        while time.monotonic() < deadline:
            with lock:
                n = next(numbers)
            q = questions[n * 7 % len(questions)]
            try:
                if n % 5 == 4:
                    kind = kinds[n // 5 % len(kinds)]
                    if kind == "temperature 0.01":
                        r = ask_plain(mine, q, temperature=0.01)
                        with lock:
                            cold.append({**r, "question": q})
                            hostile[kind]["200 " + r["finish"]] += 1
                    else:
                        got = HOSTILE[kind](port, q)
                        with lock:
                            hostile[kind][got] += 1
                else:
                    r = ask_streaming(mine, q) if n % 2 else ask_plain(mine, q)
                    with lock:
                        well.append({**r, "question": q, "stream": bool(n % 2)})
            except Exception as exc:  # a well-formed request must never fail; a hostile one is counted as it went
                with lock:
                    failures.append(f"{'hostile' if n % 5 == 4 else 'well-formed'}: {type(exc).__name__}: {exc}")

    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=clients) as pool:
        list(pool.map(loop, range(clients)))
    wall = time.monotonic() - start
    alone = {q: ask_plain(client, q) for q in sorted({r["question"] for r in well + cold})}
    up = _health(port) and ask_plain(client, questions[0])["finish"] is not None
    return {
        "clients": clients,
        "seconds": seconds,
        "wall_seconds": round(wall, 1),
        "well_formed": _compare(well, alone, failures),
        "temperature_0.01": _compare(cold, alone, [], text=False),
        "hostile": {k: dict(v) for k, v in hostile.items()},
        "failures": failures[:20],
        "server_up_afterwards": bool(up),
    }


def _compare(
    rows: list[dict[str, Any]], alone: dict[str, dict[str, Any]], failures: list[str], text: bool = True
) -> dict[str, Any]:
    answer_mismatch = sum(
        r["abstained"] != alone[r["question"]]["abstained"] or (text and r["text"] != alone[r["question"]]["text"])
        for r in rows
    )
    diffs = [abs(r["confidence"] - alone[r["question"]]["confidence"]) for r in rows]
    latency = np.array([r["latency"] for r in rows]) if rows else np.zeros(1)
    ttft = np.array([r["ttft"] for r in rows if r["ttft"] is not None])
    out = {
        "requests": len(rows),
        "streaming": sum(bool(r.get("stream")) for r in rows),
        "failures": sum(f.startswith("well-formed") for f in failures),
        "answer_mismatches": int(answer_mismatch),
        "confidence_mismatches": int(sum(d > TOLERANCE for d in diffs)),
        "max_confidence_difference": float(max(diffs, default=0.0)),
        "confidences_bit_equal": int(sum(d == 0.0 for d in diffs)),
        "abstained": sum(r["abstained"] for r in rows),
        "p50_latency_ms": round(float(np.percentile(latency, 50)) * 1000, 1),
        "p99_latency_ms": round(float(np.percentile(latency, 99)) * 1000, 1),
    }
    if len(ttft):
        out["p50_ttft_ms"] = round(float(np.percentile(ttft, 50)) * 1000, 1)
        out["p99_ttft_ms"] = round(float(np.percentile(ttft, 99)) * 1000, 1)
    return out


def _health(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=30) as resp:
            return resp.status == 200
    except OSError:
        return False
