"""The ``production`` phase of ``serve_load.py``: two replicas on one PostgreSQL under load, reloaded (issue 53).

A deployment as an operator runs it: PostgreSQL (:class:`benchmarks.servers.PostgresServer`), two
``candor serve`` processes of the embedded model on it (``--honest`` a saved folder with a threshold,
the deployment's own ``--threshold`` and ``--max-new-tokens``, ``--store postgresql://…``, an
inference key and an operator key, one OpenMP thread each), and ``--clients`` threads for
``--seconds`` sending to a random replica each time:

- well-formed: 3-turn chats with a system prompt (``n`` 2, sampled), the same chats streamed, long
  answers (``max_tokens`` :data:`LONG_MAX_TOKENS`), and chats whose body is sent slowly over a raw
  socket (in pieces, within the server's body timeout: slow but well-formed, so it must succeed);
- after each answered request one label posted to a random replica (either may have served it):
  end-user feedback with the inference key on an answered choice, else an audit label with the
  operator key; each must be 200;
- every fifth request hostile (:data:`HOSTILE_KINDS`): malformed JSON, wrong types, a huge stop
  list, a body over the size limit, a body that stalls past the body timeout, a label that claims
  the ``audit`` source with the inference key; each must be a 4xx, never a 5xx;
- meanwhile two reloads per replica, alternating ``POST /admin/reload`` and ``SIGHUP``, of the
  ``--honest`` folder re-saved under a new version: the version's folder part changes, its
  ``+opts.<digest>`` part must not.

Checked afterwards: failed well-formed requests; responses whose version, threshold or answer
length is not the deployment's (:func:`option_violations`); every 200 label read back from the
store with the same (id, index, correct, label_source) on the choice of the version that served it
(:func:`reconcile_labels`); each replica's resident memory after the load against before; both
replicas' ``/metrics`` audit gauges equal (:func:`audit_gauges`), and what the posted audit labels
say they should count; throughput and p50/p99 latency.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import openai

from benchmarks.serve_traffic import conversation
from benchmarks.servers import PostgresServer, free_port, resident_parts_mib, start_candor_serve
from candor.annotation.served_labels import LABEL_SOURCE_USER
from candor.data import load_items
from candor.serve.deployment import Deployment

INFERENCE_KEY = "production-inference-key"
OPERATOR_KEY = "production-operator-key"
FOLDER_THRESHOLD = 0.5  # the saved folder's threshold (set by hand, not tuned: the deployment overrides it)
FOLDER_MAX_NEW_TOKENS = 32  # the saved folder's answer cap (the deployment overrides it)
DEPLOYMENT = Deployment(threshold=0.3, max_new_tokens=16)  # the operator's options: every response must carry them
LONG_MAX_TOKENS = 256
SAMPLED_N = 2  # choices of a plain chat (sampled, temperature SAMPLED_TEMPERATURE): labels name one of them
SAMPLED_TEMPERATURE = 0.7
SLOW_PIECES = 6  # a slow body arrives in this many pieces ...
SLOW_GAP_S = 0.5  # ... this far apart (3 s in all, within the server's 10 s body timeout)
STALL_S = 15.0  # a stalled body stops sending for this long: past the body timeout (408)
HUGE_STOPS = 5000
OVERSIZED_BYTES = 300 * 1024  # over the server's 256 KiB body limit (413)
QUEUE_SIZE = 256  # questions in flight per replica before 503: above what the clients can have in flight
MAX_BATCH = 16
WELL_FORMED_KINDS = ("chat_plain", "chat_streamed", "long_answer", "slow_body")
HOSTILE_KINDS = (
    "malformed_json",
    "wrong_types",
    "huge_stop_list",
    "oversized_body",
    "stalled_body",
    "forged_label_source",
)
# The reloads, in order, at 1/5 .. 4/5 of the load: (replica, how, re-save the folder first). Each replica
# reloads twice, once each way; both end on the last folder version.
RELOADS = ((0, "post", True), (1, "sighup", False), (0, "sighup", True), (1, "post", False))
AUDIT_GAUGES = (
    "candor_feedback_accuracy",
    "candor_feedback_accuracy_lower",
    "candor_feedback_accuracy_upper",
    "candor_feedback_audited",
    "candor_promised_accuracy",
    "candor_calibration_unconfirmed",
    "candor_calibration_drift",
)
RELOAD_WAIT_S = 300.0


# ---------------------------------------------------------------- the checks (pure: tests/test_serve_production.py)


@dataclass(frozen=True)
class ServedChoice:
    """One choice of a 200 response as the client received it."""

    response_id: str
    index: int
    model_version: str
    threshold: float | None
    abstained: bool
    completion_tokens: int | None = None  # this choice's share of usage, when the request left max_tokens unset


@dataclass(frozen=True)
class PostedLabel:
    """A label the service accepted (200), and the version of the choice as the client saw it."""

    response_id: str
    index: int
    correct: bool
    label_source: str
    model_version: str


@dataclass(frozen=True)
class StoredLabel:
    """A label read back from the store, and the version of the served choice it is attached to."""

    response_id: str
    index: int
    correct: bool
    label_source: str
    model_version: str


def options_digest(version: str) -> str | None:
    """The ``+opts.<digest>`` part of a model version (None when it has none)."""
    head, sep, digest = version.rpartition("+opts.")
    return digest if sep and head else None


def folder_version(version: str) -> str:
    """The folder's part of a model version (the whole of it when the deployment sets no options)."""
    head, sep, _ = version.rpartition("+opts.")
    return head if sep else version


def option_violations(
    choices: Iterable[ServedChoice], deployment: Deployment, folder_versions: Sequence[str]
) -> dict[str, Any]:
    """Choices served by a generation with other options than ``deployment``'s.

    A choice counts once if any of these hold: its version's options digest is not the deployment's; its
    folder part is none of ``folder_versions`` (the versions the folder was saved under); its threshold
    is not the deployment's; or, where the request named no ``max_tokens``, it is longer than the
    deployment's ``max_new_tokens``.
    """
    checked = bad = 0
    reasons: Counter[str] = Counter()
    examples: list[str] = []
    for c in choices:
        checked += 1
        why = []
        if options_digest(c.model_version) != (deployment.digest or None):
            why.append("digest")
        if folder_version(c.model_version) not in folder_versions:
            why.append("folder_version")
        if deployment.threshold is not None and c.threshold != deployment.threshold:
            why.append("threshold")
        cap = deployment.max_new_tokens
        if cap is not None and c.completion_tokens is not None and c.completion_tokens > cap:
            why.append("max_new_tokens")
        if why:
            bad += 1
            reasons.update(why)
            if len(examples) < 5:
                examples.append(f"{c.response_id}[{c.index}] {c.model_version} threshold={c.threshold}: {why}")
    return {"checked": checked, "violations": bad, "by_reason": dict(reasons), "examples": examples}


def reconcile_labels(posted: Sequence[PostedLabel], stored: Sequence[StoredLabel]) -> dict[str, Any]:
    """Every accepted label against the store: ``lost`` ones are not there as posted (id, index, correct,
    label_source), ``foreign`` ones are there but nobody's 200 posted them (a label attached to another
    choice counts in both), and ``version_mismatches`` sit on a choice another version served than the one
    the client saw.

    End-user labels are one per choice and key (the store replaces a key's earlier label of a choice, and the
    benchmark sends them all with one key): the user labels posted on one choice are one label, kept as any of
    the values posted (which commits last decides), so the store must hold exactly one of them."""
    key = lambda x: (x.response_id, x.index, x.correct, x.label_source)  # noqa: E731
    user = lambda x: x.label_source == LABEL_SOURCE_USER  # noqa: E731
    want = Counter(key(p) for p in posted if not user(p))
    have = Counter(key(s) for s in stored if not user(s))
    lost, foreign = want - have, have - want
    user_posted: dict[tuple[str, int], set[bool]] = {}
    user_stored: dict[tuple[str, int], list[bool]] = {}
    for p in filter(user, posted):
        user_posted.setdefault((p.response_id, p.index), set()).add(p.correct)
    for s in filter(user, stored):
        user_stored.setdefault((s.response_id, s.index), []).append(s.correct)
    for choice in user_posted.keys() | user_stored.keys():
        values, kept = user_posted.get(choice, set()), user_stored.get(choice, [])
        found = next((v for v in kept if v in values), None)
        if values and found is None:
            lost[(*choice, max(values), LABEL_SOURCE_USER)] += 1
        extra = list(kept)
        if found is not None:
            extra.remove(found)
        for v in extra:
            foreign[(*choice, v, LABEL_SOURCE_USER)] += 1
    seen = {(p.response_id, p.index): p.model_version for p in posted}
    versions = {(s.response_id, s.index): s.model_version for s in stored}
    mismatched = sorted(k for k, v in seen.items() if k in versions and versions[k] != v)
    return {
        "posted": len(posted),
        "posted_by_source": dict(sorted(Counter(p.label_source for p in posted).items())),
        "stored": len(stored),
        "lost": sum(lost.values()),
        "foreign": sum(foreign.values()),
        "version_mismatches": len(mismatched),
        "examples": [f"lost {k}" for k in list(lost)[:3]]
        + [f"foreign {k}" for k in list(foreign)[:3]]
        + [f"version {k}: saw {seen[k]}, stored {versions[k]}" for k in mismatched[:3]],
    }


def metric_values(text: str) -> dict[str, float]:
    """``/metrics`` (Prometheus text) as ``{"name{labels}": value}``, comments left out."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def audit_gauges(text: str) -> dict[str, float | None]:
    """The audit gauges (:data:`AUDIT_GAUGES`) of one ``/metrics`` text; NaN as None."""
    values = metric_values(text)
    return {name: None if name not in values or math.isnan(values[name]) else values[name] for name in AUDIT_GAUGES}


def expected_audited(posted: Sequence[PostedLabel], answered: set[tuple[str, int]], version: str) -> int:
    """Responses the audit of ``version`` counts: those of ``version`` with an audit label on an answered choice."""
    return len(
        {
            p.response_id
            for p in posted
            if p.label_source == "audit" and p.model_version == version and (p.response_id, p.index) in answered
        }
    )


# ---------------------------------------------------------------- requests


def post_json(port: int, path: str, body: bytes | dict[str, Any], key: str, timeout: float = 900) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=data,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, raw.decode(errors="replace")[:200]


def raw_post(
    port: int, path: str, body: bytes, key: str, pieces: int = 1, gap_s: float = 0.0, stall_s: float = 0.0
) -> tuple[int, str]:
    """POST ``body`` over a raw socket in ``pieces`` sent ``gap_s`` apart (``stall_s`` > 0: send half, then stop
    for that long); the status and the response's body (the connection is closed after it)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=900)
    try:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        sock.sendall(head)
        if stall_s:
            sock.sendall(body[: len(body) // 2])
            sock.settimeout(stall_s)  # the server answers (408) before this, or the body never completes
        else:
            size = -(-len(body) // pieces)
            for k in range(pieces):
                if k:
                    time.sleep(gap_s)
                sock.sendall(body[k * size : (k + 1) * size])
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    finally:
        sock.close()
    text = b"".join(chunks).decode(errors="replace")
    return int(text.split(" ", 2)[1]), text.split("\r\n\r\n", 1)[1] if "\r\n\r\n" in text else ""


def choices_of(data: dict[str, Any], capped: bool) -> list[ServedChoice]:
    """A non-streamed chat response's choices (``capped``: the request left ``max_tokens`` to the deployment)."""
    n = len(data["choices"])
    tokens = data.get("usage", {}).get("completion_tokens") if capped else None
    out = []
    for choice in data["choices"]:
        conf = choice["confidence"]
        out.append(
            ServedChoice(
                response_id=data["id"],
                index=choice["index"],
                model_version=conf["model_version"],
                threshold=conf["threshold"],
                abstained=conf["abstained"],
                # the usage sums the choices: each within the cap when the sum is within n caps; the mean is checked
                completion_tokens=None if tokens is None else -(-tokens // n),
            )
        )
    return out


class Client:
    """One user: requests to a random replica, a label on each answer to a random replica."""

    def __init__(self, ports: Sequence[int], questions: Sequence[str], seed: int) -> None:
        self.ports = list(ports)
        self.questions = list(questions)
        self.rng = random.Random(seed)
        self.openai = {
            p: openai.OpenAI(base_url=f"http://127.0.0.1:{p}/v1", api_key=INFERENCE_KEY, max_retries=0, timeout=900)
            for p in self.ports
        }

    def port(self) -> int:
        return self.rng.choice(self.ports)

    def well_formed(self, kind: str, i: int) -> list[ServedChoice]:
        messages = conversation(self.questions, i)
        port = self.port()
        if kind == "chat_plain":
            resp = self.openai[port].chat.completions.create(
                model="candor", messages=messages, n=SAMPLED_N, temperature=SAMPLED_TEMPERATURE
            )
            return choices_of(resp.model_dump(), capped=True)
        if kind == "long_answer":
            resp = self.openai[port].chat.completions.create(
                model="candor", messages=messages, max_tokens=LONG_MAX_TOKENS
            )
            return choices_of(resp.model_dump(), capped=False)
        if kind == "chat_streamed":
            final: list[ServedChoice] = []
            for chunk in self.openai[port].chat.completions.create(model="candor", messages=messages, stream=True):
                if chunk.choices and chunk.choices[0].finish_reason:
                    conf = chunk.choices[0].model_extra["confidence"]
                    final.append(
                        ServedChoice(
                            response_id=chunk.id,
                            index=chunk.choices[0].index,
                            model_version=conf["model_version"],
                            threshold=conf["threshold"],
                            abstained=conf["abstained"],
                        )
                    )
            if not final:
                raise RuntimeError("the stream ended without a final chunk")
            return final
        body = json.dumps({"model": "candor", "messages": messages}).encode()  # slow_body
        status, text = raw_post(port, "/v1/chat/completions", body, INFERENCE_KEY, SLOW_PIECES, SLOW_GAP_S)
        if status != 200:
            raise RuntimeError(f"a slow well-formed body got {status}: {text[:200]}")
        return choices_of(json.loads(text), capped=True)

    def label(self, served: Sequence[ServedChoice]) -> tuple[PostedLabel | None, str]:
        """One label on one of ``served``'s choices, to a random replica; the label if accepted, and the outcome."""
        choice = self.rng.choice(list(served))
        correct = self.rng.random() < 0.5
        user = not choice.abstained and self.rng.random() < 0.5  # a client labels only what it saw answered
        body: dict[str, Any] = {"id": choice.response_id, "index": choice.index, "correct": correct}
        if not user:
            body["label_source"] = "audit"
        try:
            status, data = post_json(self.port(), "/v1/feedback", body, INFERENCE_KEY if user else OPERATOR_KEY)
        except OSError as exc:
            return None, f"{type(exc).__name__}: {str(exc)[:200]}"
        if status != 200:
            return None, f"{status}: {str(data)[:200]}"
        if data.get("model_version") != choice.model_version:
            return None, f"the label landed on {data.get('model_version')}, the answer came from {choice.model_version}"
        return PostedLabel(
            response_id=choice.response_id,
            index=choice.index,
            correct=correct,
            label_source=data["label_source"],
            model_version=choice.model_version,
        ), "200"

    def hostile(self, kind: str, i: int, known_id: str | None) -> int:
        """A hostile request of ``kind``; its status."""
        port, key, path = self.port(), INFERENCE_KEY, "/v1/chat/completions"
        question = self.questions[i % len(self.questions)]
        one = [{"role": "user", "content": question}]
        if kind == "malformed_json":
            return post_json(port, path, b'{"model": "candor", "messages": [{"role": "user", "content": ', key)[0]
        if kind == "wrong_types":
            variants = [{"messages": "hello"}, {"messages": one, "max_tokens": "many"}, {"messages": one, "n": 1.5}]
            return post_json(port, path, {"model": "candor", **variants[i % len(variants)]}, key)[0]
        if kind == "huge_stop_list":
            stops = [f"stop{k}" for k in range(HUGE_STOPS)]
            return post_json(port, path, {"model": "candor", "messages": one, "stop": stops}, key)[0]
        if kind == "oversized_body":
            big = [{"role": "user", "content": "x" * OVERSIZED_BYTES}]
            return post_json(port, path, {"model": "candor", "messages": big}, key)[0]
        if kind == "stalled_body":
            body = json.dumps({"model": "candor", "messages": one}).encode()
            return raw_post(port, path, body, key, stall_s=STALL_S)[0]
        # forged_label_source: an end user claiming to be the audit; the store must not get it
        body = {"id": known_id or "chatcmpl-unknown", "index": 0, "correct": True, "label_source": "audit"}
        return post_json(port, "/v1/feedback", body, key)[0]


# ---------------------------------------------------------------- the deployment


def save_folder(model: Any, folder: Path, version: str) -> None:
    """The operator's re-save: the same model under a new version, swapped in whole."""
    model.version = version
    model.save_pretrained(folder)


def honest_model(model_name: str) -> Any:
    """The embedded model answering with n-prob, a hand-set threshold and answer cap (the deployment overrides
    both)."""
    from candor.backends import load_backend
    from candor.serve import HonestModel
    from candor.serve.answering import Decoding
    from candor.serve.thresholds import Threshold

    return HonestModel(
        load_backend(model_name),
        confidence="n-prob",
        threshold=Threshold(FOLDER_THRESHOLD),
        decoding=Decoding(max_new_tokens=FOLDER_MAX_NEW_TOKENS),
    )


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as resp:
        return resp.read().decode()


def serving_version(port: int) -> str | None:
    """The version ``candor_model_info`` says answers now."""
    for name, value in metric_values(scrape(port)).items():
        if name.startswith('candor_model_info{version="') and value == 1.0:
            return name[len('candor_model_info{version="') : -2]
    return None


def reload_replica(proc: subprocess.Popen, port: int, how: str, expected: str) -> dict[str, Any]:
    """Reload one replica by ``POST /admin/reload`` or ``SIGHUP``; wait until ``expected`` answers."""
    start = time.monotonic()
    if how == "post":
        status, data = post_json(port, "/admin/reload", b"", OPERATOR_KEY)
        got = data.get("model_version") if isinstance(data, dict) else None
        if status != 200:
            return {"how": how, "ok": False, "status": status, "detail": str(data)[:300]}
    else:
        proc.send_signal(signal.SIGHUP)
        got = None
        while time.monotonic() - start < RELOAD_WAIT_S:
            got = serving_version(port)
            if got == expected:
                break
            time.sleep(0.5)
    return {"how": how, "ok": got == expected, "version": got, "seconds": round(time.monotonic() - start, 2)}


def run_production(
    model_name: str, clients: int, seconds: float, threads: int = 1, seed: int = 0, log: Callable[[str], None] = print
) -> dict[str, Any]:
    """The whole phase: PostgreSQL, two replicas, the load with reloads, the checks."""
    import tempfile

    from candor.annotation.served_store import ServedStore

    questions = [it.question for it in load_items("starter")]
    pg = PostgresServer()
    procs: list[subprocess.Popen] = []
    try:
        url = pg.create_database()
        with tempfile.TemporaryDirectory(prefix="candor-production-") as tmp:
            folder = Path(tmp) / "honest"
            model = honest_model(model_name)
            versions = ["production-1"]
            save_folder(model, folder, versions[-1])
            options = ["--threshold", str(DEPLOYMENT.threshold), "--max-new-tokens", str(DEPLOYMENT.max_new_tokens)]
            serve = [
                "--honest",
                str(folder),
                *options,
                "--store",
                url,
                "--queue-size",
                str(QUEUE_SIZE),
                "--max-batch",
                str(MAX_BATCH),
            ]
            keys = {"CANDOR_API_KEY": INFERENCE_KEY, "CANDOR_ADMIN_KEY": OPERATOR_KEY}
            ports = [free_port(), free_port()]
            while ports[1] == ports[0]:
                ports[1] = free_port()
            for port in ports:
                procs.append(start_candor_serve(serve, port, threads=threads, env=keys, limit_s=600))
            log(f"production: replicas on {ports}, store {url}")
            result = load_with_reloads(procs, ports, questions, clients, seconds, seed, model, folder, versions, log)
            store = ServedStore(url)
            try:
                stored = stored_labels(store)
                served_rows = store.count()
            finally:
                store.close()
        result["labels"] = reconcile_labels(result.pop("posted"), stored)
        result["store_served_questions"] = served_rows
        result["serve_flags"] = [*options, "--queue-size", str(QUEUE_SIZE), "--max-batch", str(MAX_BATCH)]
        result["server_omp_threads"] = threads
        return result
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        pg.stop()


def stored_labels(store: Any) -> list[StoredLabel]:
    """Every label in the store, with the version of the served choice it is attached to (as the client saw it)."""
    out = []
    log = store.served_log()
    for answer in log.answers:
        served = answer.record.provenance.get("served", {})
        indexes = list(served.get("indexes", []))
        confidences = served.get("confidence", [])
        version = (
            confidences[indexes.index(answer.index)].get("model_version", "")
            if answer.index in indexes and indexes.index(answer.index) < len(confidences)
            else ""
        )
        for _, label in answer.labels:
            out.append(
                StoredLabel(
                    response_id=label.id,
                    index=label.index,
                    correct=label.correct,
                    label_source=label.label_source,
                    model_version=version,
                )
            )
    out += [StoredLabel(response_id="(orphan)", index=-1, correct=False, label_source="?", model_version="")] * (
        log.orphan_labels
    )
    return out


def memory_report(before: Sequence[dict[str, float]], after: Sequence[dict[str, float]]) -> dict[str, Any]:
    """Each replica's resident memory before and after (all of it, and its anonymous and file-backed parts) and
    the ratios after / before of all of it (the acceptance's) and of the anonymous part (what a leak grows)."""
    return {
        "measured": "before: after each replica answered one request of each well-formed kind; after: the load",
        "before": [m["rss"] for m in before],
        "after": [m["rss"] for m in after],
        "ratio": [round(a["rss"] / b["rss"], 3) for a, b in zip(after, before, strict=True)],
        "anon_before": [m.get("anon") for m in before],
        "anon_after": [m.get("anon") for m in after],
        "anon_ratio": [
            round(a["anon"] / b["anon"], 3) if a.get("anon") and b.get("anon") else None
            for a, b in zip(after, before, strict=True)
        ],
        "file_before": [m.get("file") for m in before],
        "file_after": [m.get("file") for m in after],
    }


def load_with_reloads(
    procs: Sequence[subprocess.Popen],
    ports: Sequence[int],
    questions: Sequence[str],
    clients: int,
    seconds: float,
    seed: int,
    model: Any,
    folder: Path,
    versions: list[str],
    log: Callable[[str], None],
) -> dict[str, Any]:
    warm = Client(ports, questions, seed=-1)
    for port in ports:  # each replica answers each well-formed kind once before its memory is read
        warm.ports = [port]
        for k, kind in enumerate(WELL_FORMED_KINDS):
            warm.well_formed(kind, k)
    memory_before = [resident_parts_mib(p.pid) for p in procs]
    counter = itertools.count()
    lock = threading.Lock()
    served: list[ServedChoice] = []
    posted: list[PostedLabel] = []
    latencies: dict[str, list[float]] = {k: [] for k in (*WELL_FORMED_KINDS, "feedback")}
    failures: list[str] = []
    feedback_failures: list[str] = []
    hostile: Counter[str] = Counter()
    reloads: list[dict[str, Any]] = []
    known_ids: list[str] = []
    start = time.monotonic()
    deadline = start + seconds

    def user(number: int) -> None:
        client = Client(ports, questions, seed=seed * 1000 + number)
        while time.monotonic() < deadline:
            i = next(counter)
            if i % 5 == 4:
                kind = HOSTILE_KINDS[(i // 5) % len(HOSTILE_KINDS)]
                try:
                    outcome = str(client.hostile(kind, i, known_ids[-1] if known_ids else None))
                except Exception as exc:  # noqa: BLE001 - a dropped connection is an outcome too
                    outcome = type(exc).__name__
                with lock:
                    hostile[f"{kind}:{outcome}"] += 1
                continue
            kind = WELL_FORMED_KINDS[(i - i // 5) % len(WELL_FORMED_KINDS)]
            t0 = time.perf_counter()
            try:
                choices = client.well_formed(kind, i)
            except Exception as exc:  # noqa: BLE001 - every failure of a well-formed request is counted
                with lock:
                    failures.append(f"{kind}: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            t1 = time.perf_counter()
            label, outcome = client.label(choices)
            t2 = time.perf_counter()
            with lock:
                served.extend(choices)
                latencies[kind].append(t1 - t0)
                known_ids.append(choices[0].response_id)
                if label is None:
                    feedback_failures.append(outcome)
                else:
                    posted.append(label)
                    latencies["feedback"].append(t2 - t1)

    def reloader() -> None:
        for k, (replica, how, resave) in enumerate(RELOADS):
            time.sleep(max(0.0, start + seconds * (k + 1) / (len(RELOADS) + 1) - time.monotonic()))
            if resave:
                versions.append(f"production-{len(versions) + 1}")
                save_folder(model, folder, versions[-1])
            outcome = reload_replica(procs[replica], ports[replica], how, DEPLOYMENT.version(versions[-1]))
            outcome.update(replica=replica, at_s=round(time.monotonic() - start, 1))
            log(f"production: reload {outcome}")
            reloads.append(outcome)

    reloading = threading.Thread(target=reloader, daemon=True)
    reloading.start()
    with ThreadPoolExecutor(clients) as pool:
        for f in [pool.submit(user, n) for n in range(clients)]:
            f.result()
    wall = time.monotonic() - start
    reloading.join()
    memory_after = [resident_parts_mib(p.pid) for p in procs]
    time.sleep(3.0)  # past the audit's once-a-second read of the store
    scraped = [scrape(port) for port in ports]
    gauges = [audit_gauges(text) for text in scraped]
    final = DEPLOYMENT.version(versions[-1])
    answered = {(c.response_id, c.index) for c in served if not c.abstained}
    by_kind = {k: len(v) for k, v in latencies.items() if k != "feedback"}
    requests = [x for k, v in latencies.items() if k != "feedback" for x in v]
    reload_counts = [
        {
            outcome: metric_values(text).get(f'candor_reloads_total{{outcome="{outcome}"}}', 0.0)
            for outcome in ("ok", "failed")
        }
        for text in scraped
    ]
    return {
        "clients": clients,
        "seconds": seconds,
        "wall_seconds": round(wall, 1),
        "deployment": DEPLOYMENT.options(),
        "deployment_digest": DEPLOYMENT.digest,
        "folder": {"threshold": FOLDER_THRESHOLD, "max_new_tokens": FOLDER_MAX_NEW_TOKENS, "versions": versions},
        "well_formed": {
            "requests": sum(by_kind.values()) + len(failures),
            "failures": len(failures),
            "failure_examples": failures[:5],
            "by_kind": by_kind,
            "feedback_posts": len(posted) + len(feedback_failures),
            "feedback_failures": len(feedback_failures),
            "feedback_failure_examples": feedback_failures[:5],
            "per_s": round(len(requests) / wall, 3),
            "p50_s": round(float(np.percentile(requests, 50)), 2) if requests else None,
            "p99_s": round(float(np.percentile(requests, 99)), 2) if requests else None,
            "feedback_p50_s": round(float(np.percentile(latencies["feedback"], 50)), 3) if posted else None,
            "feedback_p99_s": round(float(np.percentile(latencies["feedback"], 99)), 3) if posted else None,
        },
        "hostile": dict(sorted(hostile.items())),
        "hostile_5xx": sum(n for k, n in hostile.items() if k.rsplit(":", 1)[1].startswith("5")),
        "hostile_not_4xx": sum(n for k, n in hostile.items() if not k.rsplit(":", 1)[1].startswith("4")),
        "options": option_violations(served, DEPLOYMENT, versions),
        "reloads": reloads,
        "reloads_counted": reload_counts,
        "final_versions": [serving_version(port) for port in ports],
        "audit": {
            "replicas": gauges,
            "equal": gauges[0] == gauges[1],
            "expected_audited": expected_audited(posted, answered, final),
        },
        "resident_mib": memory_report(memory_before, memory_after),
        "posted": posted,
    }
