"""The ``traffic`` phase of ``serve_load.py``: real chat traffic against one ``candor serve`` (issue 42's acceptance).

``--clients`` threads send requests for ``--seconds`` through the official client:
request number i (over all clients) is hostile when i % 5 == 4, alternating a
~4,000-token prompt and a request with a unique ``stop`` list; the others cycle
through a 3-turn chat with a system prompt (plain, then streamed), a long answer
(``max_tokens`` 512), a LangChain user (``ChatCandor.invoke`` / ``.stream``) and a
short single question, the one whose latency is compared with the idle server.

Measured in the same run:

- ``idle_p50_s``: short single questions asked one at a time on the idle server;
- under load: failures of well-formed requests, p50/p99 of the short singles and
  their ratio to the idle p50 (goal ≤ 3), what each hostile kind got;
- every well-formed conversation asked again alone afterwards: confidences that
  differ beyond 1e-6 (goal 0);
- resident memory of the server before and after the load (goal ≤ 1.2×), read
  again after 5 s idle, and before and after 1,000 requests with unique stop
  lists (goal ≤ +50 MiB);
- the throughput, and the mean latency it implies for this many clients that
  each wait for their answer (Little's law): the part of every latency that
  is queueing when the load exceeds what the machine serves.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import openai

from benchmarks.servers import resident_mib
from candor.data import load_items

TOLERANCE = 1e-6
SYSTEM = "You are a helpful assistant. Answer in a few words."
# About 4,000 tokens with SmolLM2's tokenizer ("word1234" is about 4 tokens). The first full run used 3,000
# words, about 12,000 tokens: beyond the 8,192 context, so those prompts were refused 400 before any work.
LONG_PROMPT_WORDS = 1000
UNIQUE_STOPS = 1000
IDLE_S = 5.0  # seconds the server idles after the load before its memory is read again


def client_for(port: int) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=900)


def conversation(questions: list[str], i: int) -> list[dict[str, str]]:
    """A 3-turn chat: two earlier questions with short answers, then the question."""
    a, b, q = (questions[(i + k) % len(questions)] for k in (1, 2, 0))
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": a},
        {"role": "assistant", "content": "I think so."},
        {"role": "user", "content": b},
        {"role": "assistant", "content": "Not sure."},
        {"role": "user", "content": q},
    ]


def long_prompt(i: int) -> str:
    words = " ".join(f"word{(i * 7919 + k) % 10007}" for k in range(LONG_PROMPT_WORDS))
    return f"Read this list and say which word comes first: {words}"


def plain(client: openai.OpenAI, messages: list[dict[str, str]], **extra: Any) -> dict[str, Any]:
    start = time.perf_counter()
    resp = client.chat.completions.create(model="candor", messages=messages, **extra)
    conf = resp.choices[0].model_extra["confidence"]
    return {"latency": time.perf_counter() - start, "confidence": conf["value"], "abstained": conf["abstained"]}


def streamed(client: openai.OpenAI, messages: list[dict[str, str]], **extra: Any) -> dict[str, Any]:
    start = time.perf_counter()
    conf = None
    for chunk in client.chat.completions.create(model="candor", messages=messages, stream=True, **extra):
        if chunk.choices and chunk.choices[0].finish_reason:
            conf = chunk.choices[0].model_extra["confidence"]
    if conf is None:
        raise RuntimeError("the stream ended without a final chunk")
    return {"latency": time.perf_counter() - start, "confidence": conf["value"], "abstained": conf["abstained"]}


def langchain_user(port: int, messages: list[dict[str, str]], stream: bool) -> dict[str, Any]:
    from candor.integrations.langchain import ChatCandor

    llm = ChatCandor(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", model="candor", max_retries=0, timeout=900)
    turns = [(m["role"] if m["role"] != "assistant" else "ai", m["content"]) for m in messages]
    start = time.perf_counter()
    if stream:
        total = None
        for chunk in llm.stream(turns):
            total = chunk if total is None else total + chunk
        message = total
    else:
        message = llm.invoke(turns)
    conf = message.response_metadata["confidence"]
    return {"latency": time.perf_counter() - start, "confidence": conf["value"], "abstained": conf["abstained"]}


def hostile(client: openai.OpenAI, kind: str, i: int, question: str) -> str:
    try:
        if kind == "long_prompt":
            client.chat.completions.create(
                model="candor", messages=[{"role": "user", "content": long_prompt(i)}], max_tokens=8
            )
        else:  # unique stop lists: the server must not keep a matcher per list
            client.chat.completions.create(
                model="candor",
                messages=[{"role": "user", "content": question}],
                stop=[f"zz{i}", f"qq{i}x"],
                max_tokens=8,
            )
        return "200"
    except openai.APIStatusError as exc:
        return str(exc.status_code)


def run_traffic(port: int, pid: int, clients: int, seconds: float, stops: int = UNIQUE_STOPS) -> dict[str, Any]:
    questions = [it.question for it in load_items("starter")]
    client = client_for(port)
    idle = [plain(client, [{"role": "user", "content": q}])["latency"] for q in questions[:12]]
    memory_before = resident_mib(pid)
    counter = itertools.count()
    lock = threading.Lock()
    rows: list[dict[str, Any]] = []
    failures: list[str] = []
    hostile_outcomes: Counter[str] = Counter()
    deadline = time.monotonic() + seconds
    kinds: list[tuple[str, Callable[[int], dict[str, Any]]]] = [
        ("chat_plain", lambda i: plain(client, conversation(questions, i))),
        ("chat_streamed", lambda i: streamed(client, conversation(questions, i))),
        ("long_answer", lambda i: plain(client, conversation(questions, i), max_tokens=512)),
        ("langchain", lambda i: langchain_user(port, conversation(questions, i), stream=i % 2 == 0)),
        ("short_single", lambda i: plain(client, [{"role": "user", "content": questions[i % len(questions)]}])),
    ]

    def user() -> None:
        while time.monotonic() < deadline:
            i = next(counter)
            if i % 5 == 4:
                kind = ("long_prompt", "unique_stop")[(i // 5) % 2]
                outcome = hostile(client, kind, i, questions[i % len(questions)])
                with lock:
                    hostile_outcomes[f"{kind}:{outcome}"] += 1
                continue
            name, fn = kinds[(i - i // 5) % len(kinds)]
            try:
                row = {"kind": name, "i": i, **fn(i)}
            except Exception as exc:  # noqa: BLE001 - every failure of a well-formed request is counted
                with lock:
                    failures.append(f"{name}: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            with lock:
                rows.append(row)

    started = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        for f in [pool.submit(user) for _ in range(clients)]:
            f.result()
    wall = time.monotonic() - started
    memory_after = resident_mib(pid)
    time.sleep(IDLE_S)  # the engine gives back what long requests freed once it is idle
    memory_after_idle = resident_mib(pid)
    mismatches = compare_alone(client, questions, rows)
    stop_memory = unique_stops(client, pid, questions, stops) if stops else None  # 0: not measured in this run
    short = [r["latency"] for r in rows if r["kind"] == "short_single"]
    idle_p50 = float(np.median(idle))
    completed = len(rows) + sum(hostile_outcomes.values())
    p99 = float(np.percentile(short, 99)) if short else None
    return {
        "clients": clients,
        "seconds": seconds,
        "long_prompt_words": LONG_PROMPT_WORDS,
        "idle_p50_s": round(idle_p50, 4),
        "wall_seconds": round(wall, 1),
        # Each client waits for its answer before sending the next request, so the mean latency is
        # clients / throughput (Little's law): what queueing alone costs at this load.
        "completed_per_s": round(completed / wall, 3),
        "littles_law_mean_latency_s": round(clients * wall / completed, 2) if completed else None,
        "well_formed": {
            "requests": len(rows) + len(failures),
            "failures": len(failures),
            "failure_examples": failures[:5],
            "confidence_mismatches": mismatches,
            "by_kind": dict(Counter(r["kind"] for r in rows)),
        },
        "short_single_under_load": {
            "n": len(short),
            "p50_s": round(float(np.median(short)), 4) if short else None,
            "p99_s": None if p99 is None else round(p99, 4),
            "p99_over_idle_p50": None if p99 is None else round(p99 / idle_p50, 2),
        },
        "hostile": dict(hostile_outcomes),
        "resident_mib": {
            "before": round(memory_before, 1),
            "after": round(memory_after, 1),
            "ratio": round(memory_after / memory_before, 3),
            f"after_{IDLE_S:g}s_idle": round(memory_after_idle, 1),
            "ratio_after_idle": round(memory_after_idle / memory_before, 3),
        },
        "unique_stops": stop_memory,
    }


def compare_alone(client: openai.OpenAI, questions: list[str], rows: list[dict[str, Any]]) -> int:
    """Each served conversation asked again on the quiet server: its confidence must not have moved."""
    alone: dict[int, float] = {}
    bad = 0
    for row in rows:
        if row["kind"] == "short_single":
            messages = [{"role": "user", "content": questions[row["i"] % len(questions)]}]
            key = -1 - row["i"] % len(questions)
        else:
            messages, key = conversation(questions, row["i"]), row["i"] % len(questions)
        if key not in alone:
            alone[key] = plain(client, messages)["confidence"]
        bad += abs(alone[key] - row["confidence"]) > TOLERANCE
    return bad


def unique_stops(client: openai.OpenAI, pid: int, questions: list[str], count: int) -> dict[str, float]:
    before = resident_mib(pid)

    def one(i: int) -> None:
        client.chat.completions.create(
            model="candor",
            messages=[{"role": "user", "content": questions[i % 20]}],
            stop=[f"u{i}-a", f"u{i}-b"],
            max_tokens=4,
        )

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(count)))
    after = resident_mib(pid)
    return {
        "requests": count,
        "before_mib": round(before, 1),
        "after_mib": round(after, 1),
        "growth_mib": round(after - before, 1),
    }
