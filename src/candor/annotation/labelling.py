"""``candor label``: mark served answers right or wrong, on a local page or with an LLM judge.

The page is served on 127.0.0.1 and is self-contained like ``report.html``
(style and script inline, no request leaves the machine). It shows one served
answer at a time (question, answer, confidence, the reference answers when the
record has any); keys **1** = correct, **2** = wrong, **0** = skip, arrows move.
Each label is appended to the records file as it is made
(:func:`candor.annotation.served_labels.append_label`, ``label_source:
"human"``), so closing the page loses nothing and reopening it starts at the
first unlabelled answer. The page reads the file afresh on each load.

``--judge-model`` labels the unlabelled answers with
:class:`~candor.annotation.judges.LLMAnswerJudge` (``label_source:
"judge:NAME"``), never overwriting a human label, and reports the judge's
agreement with the human labels it was also run on.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from candor.annotation.judges import LLMAnswerJudge
from candor.annotation.served_labels import LABEL_SOURCE_HUMAN, ServedAnswer, append_label, read_served
from candor.backends.base import Backend
from candor.util.errors import CandorError
from candor.util.pages import asset, esc, script_json

logger = logging.getLogger(__name__)

ASSETS = "candor.annotation.page_assets"
MAX_BODY = 4096  # a label request is a few dozen bytes


def queue(path: str | Path) -> list[ServedAnswer]:
    """One entry per served question: its latest-labelled choice index, else its first (all carry one answer)."""
    chosen: dict[int, ServedAnswer] = {}
    for answer in read_served(path).answers:
        mine = chosen.get(id(answer.record))
        if mine is None or (answer.label is not None and (answer.label_line or 0) >= (mine.label_line or 0)):
            chosen[id(answer.record)] = answer
    return list(chosen.values())


def served_confidence(answer: ServedAnswer) -> float | None:
    """The confidence the answer was served with, when the log has it."""
    served = answer.record.provenance.get("served")
    if not isinstance(served, dict):
        return None
    described = served.get("confidence") or []
    indexes = served.get("indexes") or [0]
    position = indexes.index(answer.index) if answer.index in indexes else 0
    if position < len(described) and isinstance(described[position], dict):
        value = described[position].get("value")
        return float(value) if isinstance(value, (int, float)) else None
    return None


def item_json(answer: ServedAnswer) -> dict[str, Any]:
    return {
        "id": answer.id,
        "index": answer.index,
        "question": answer.record.item.question,
        "answer": answer.record.greedy.text,
        "confidence": served_confidence(answer),
        "reference": list(answer.record.item.answers),
        "label": answer.label,
        "label_source": answer.label_source,
    }


def page_html(title: str) -> str:
    """The labelling page: the shared style and this page's script inline."""
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{esc(title)}</title><link rel='icon' href='data:,'>"
        f"<style>{asset('page.css')}{asset('label.css', ASSETS)}</style></head>"
        f"<body><main><h1>{esc(title)}</h1>"
        "<p class='help'>1 = correct · 2 = wrong · 0 = skip · ← → move. Labels are saved as you make them.</p>"
        "<p id='progress'></p><section id='card'></section><p id='status' role='status'></p></main>"
        f"<script id='page-config' type='application/json'>{script_json({'title': title})}</script>"
        f"<script>{asset('label.js', ASSETS)}</script></body></html>"
    )


class LabelServer:
    """The page and its two calls (``GET /api/items``, ``POST /api/label``) on a local port, in a thread."""

    def __init__(self, records: str | Path, host: str = "127.0.0.1", port: int = 0) -> None:
        self.records = Path(records)
        queue(self.records)  # a missing or unreadable file fails here, before the port opens
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/"

    def items(self) -> dict[str, Any]:
        entries = [item_json(a) for a in queue(self.records)]
        return {"items": entries, "left": sum(e["label"] is None for e in entries)}

    def label(self, body: dict[str, Any]) -> tuple[HTTPStatus, dict[str, Any]]:
        with self.lock:
            known = {a.key for a in read_served(self.records).answers}
            key = (body.get("id"), body.get("index"))
            if key not in known:
                return HTTPStatus.NOT_FOUND, {"error": f"no served answer {key[0]!r} at index {key[1]!r}"}
            try:
                append_label(self.records, key[0], key[1], body.get("correct"), LABEL_SOURCE_HUMAN)  # type: ignore[arg-type]
            except CandorError as exc:
                return HTTPStatus.BAD_REQUEST, {"error": str(exc)}
        return HTTPStatus.OK, {"left": self.items()["left"]}

    def start(self) -> LabelServer:
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="candor-label", daemon=True)
        self.thread.start()
        return self

    def wait(self) -> None:
        """Serve until Ctrl-C, then close."""
        try:
            while self.thread is not None and self.thread.is_alive():
                self.thread.join(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            self.close()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _handler(server: LabelServer) -> type[BaseHTTPRequestHandler]:
    title = f"candor label: {server.records.name}"

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path in ("/", "/index.html"):
                self._send(HTTPStatus.OK, page_html(title).encode(), "text/html; charset=utf-8")
            elif self.path == "/api/items":
                self._json(HTTPStatus.OK, server.items())
            else:
                self._json(HTTPStatus.NOT_FOUND, {"error": "not found"})

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/api/label":
                return self._json(HTTPStatus.NOT_FOUND, {"error": "not found"})
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                return self._json(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": "body too large"})
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
            except json.JSONDecodeError:
                return self._json(HTTPStatus.BAD_REQUEST, {"error": "the body must be JSON"})
            self._json(*server.label(body if isinstance(body, dict) else {}))

        def _json(self, status: HTTPStatus, payload: dict[str, Any]) -> None:
            self._send(status, json.dumps(payload).encode(), "application/json")

        def _send(self, status: HTTPStatus, data: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            logger.debug("label page: " + format, *args)

    return Handler


@dataclass
class JudgeReport:
    """What a judge run did: answers it labelled, and its agreement with the human labels."""

    labelled: int
    compared: int
    agreed: int

    @property
    def agreement(self) -> float | None:
        return self.agreed / self.compared if self.compared else None


def judge_labels(records: str | Path, backend: Backend, name: str) -> JudgeReport:
    """Label every answer no one labelled with the judge (``judge:NAME``); compare it with the human labels.

    Answers a judge of the same name labelled before are left alone, so a rerun resumes.
    """
    answers = queue(records)
    source = f"judge:{name}"
    todo = [a for a in answers if a.label is None]
    human = [a for a in answers if a.label_source == LABEL_SOURCE_HUMAN]
    asked = todo + human
    judge = LLMAnswerJudge(backend)
    verdicts = judge.judge_answers([a.record.item.question for a in asked], [a.record.greedy.text for a in asked])
    for answer, verdict in zip(todo, verdicts[: len(todo)], strict=True):
        append_label(records, answer.id, answer.index, bool(verdict), source)
    agreed = sum(bool(v) == a.label for a, v in zip(human, verdicts[len(todo) :], strict=True))
    return JudgeReport(len(todo), len(human), agreed)
