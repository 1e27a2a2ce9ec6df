"""``candor label``: mark served answers right or wrong, on a local page or with an LLM judge.

The page is served on 127.0.0.1 and is self-contained like ``report.html``
(style and script inline, no request leaves the machine). It shows one served
answer at a time (question, answer, confidence, the reference answers when the
record has any); keys **1** = correct, **2** = wrong, **0** = skip, arrows move.
Each label is written to the store as it is made (``label_source: "human"``;
a served log file given instead of a store URL is read once into memory and
each label appended to it), so closing the page loses nothing and reopening it
starts at the first unlabelled answer. Each view asks the store for one
question (indexed queries), never re-reading the whole log. ``--audit N``
shows a seeded, uniformly drawn sample of N answered choices instead, whose
labels are ``audit`` ones (the random audit the guarantee and the drift
statistic rest on).

``--judge-model`` labels the unlabelled answers with
:class:`~candor.annotation.judges.LLMAnswerJudge` (``label_source:
"judge:NAME"``), never overwriting a human label, and reports the judge's
agreement with the human labels it was also run on.

The page is safe from other sites (another tab's page must not write labels, which feed the drift
alarm and ``candor adapt``). ``POST /api/label`` is taken only when all of these hold, else 403 (415
for the body's type), naming what failed:

=================  ============================================================================
the token          ``X-Candor-Page-Token`` equals the random token this server put in its page
                   (a new one per server; another site cannot read the page to learn it)
the origin         an ``Origin`` header, when sent, is this page's own; ``Sec-Fetch-Site`` is not
                   ``cross-site``
JSON only          ``Content-Type: application/json`` (a form or ``text/plain`` post, which a
                   browser sends across sites without asking, is refused)
the host           ``Host`` names this server (127.0.0.1, localhost or its bound address, with its
                   port), so a DNS-rebound name cannot reach it; this holds for every request
=================  ============================================================================
"""

from __future__ import annotations

import getpass
import hmac
import json
import logging
import secrets
import threading
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from candor.annotation.judges import LLMAnswerJudge
from candor.annotation.served_labels import LABEL_SOURCE_AUDIT, LABEL_SOURCE_HUMAN, ServedAnswer, check_label
from candor.annotation.served_store import RecordGone, ServedStore, open_store, pick_answer
from candor.backends.base import Backend
from candor.util.pages import asset, esc, script_json

logger = logging.getLogger(__name__)

ASSETS = "candor.annotation.page_assets"
MAX_BODY = 4096  # a label request is a few dozen bytes
TOKEN_HEADER = "X-Candor-Page-Token"  # the page's token, sent with each label (see the module docstring)
LOCAL_NAMES = ("127.0.0.1", "localhost", "[::1]")


def queue(store: ServedStore) -> list[ServedAnswer]:
    """One entry per served question: its latest-labelled choice, else its first scored one, else its first."""
    chosen: dict[int, list[ServedAnswer]] = {}
    for answer in store.served_log().answers:
        chosen.setdefault(id(answer.record), []).append(answer)
    return [a for a in (pick_answer(group) for group in chosen.values()) if a is not None]


class QuestionQueue:
    """The label page over every served question, in serving order; each view reads one record from the store."""

    label_source = LABEL_SOURCE_HUMAN

    def __init__(self, store: ServedStore) -> None:
        self.store = store

    def total(self) -> int:
        return self.store.count()

    def left(self) -> int:
        return self.store.count(unlabelled=True)

    def first_open(self) -> int:
        return self.store.first_unlabelled()

    def at(self, position: int) -> ServedAnswer | None:
        return self.store.question_at(position)

    def holds(self, response_id: str, index: int) -> bool:
        return self.store.has_choice(response_id, index)


class AuditQueue:
    """The label page over a uniformly drawn, seeded sample of answered choices; labels are ``audit`` ones."""

    label_source = LABEL_SOURCE_AUDIT

    def __init__(self, store: ServedStore, n: int, seed: int) -> None:
        self.store = store
        self.keys = store.audit_sample(n, seed)
        self._members = set(self.keys)

    def total(self) -> int:
        return len(self.keys)

    def left(self) -> int:
        return len(self.keys) - len(self.store.labelled_keys(self.keys, LABEL_SOURCE_AUDIT))

    def first_open(self) -> int:
        done = self.store.labelled_keys(self.keys, LABEL_SOURCE_AUDIT)
        return next((i for i, key in enumerate(self.keys) if key not in done), 0)

    def at(self, position: int) -> ServedAnswer | None:
        if not 0 <= position < len(self.keys):
            return None
        return self.store.answer(*self.keys[position], label_source=LABEL_SOURCE_AUDIT)

    def holds(self, response_id: str, index: int) -> bool:
        return (response_id, index) in self._members


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
        "answer": shown(answer),
        "confidence": served_confidence(answer),
        "reference": list(answer.record.item.answers),
        "label": answer.label,
        "label_source": answer.label_source,
    }


def page_html(title: str, token: str) -> str:
    """The labelling page: the shared style and this page's script inline, with the token its labels carry."""
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{esc(title)}</title><link rel='icon' href='data:,'>"
        f"<style>{asset('page.css')}{asset('label.css', ASSETS)}</style></head>"
        f"<body><main><h1>{esc(title)}</h1>"
        "<p class='help'>1 = correct · 2 = wrong · 0 = skip · ← → move. Labels are saved as you make them.</p>"
        "<p id='progress'></p><section id='card'></section><p id='status' role='status'></p></main>"
        f"<script id='page-config' type='application/json'>{script_json({'title': title, 'token': token})}</script>"
        f"<script>{asset('label.js', ASSETS)}</script></body></html>"
    )


class LabelServer:
    """The page and its two calls (``GET /api/item?pos=N``, ``POST /api/label``) on a local port, in a thread.

    ``source`` is a store URL or a served log file (read once into memory; labels are appended to it).
    With ``audit=N`` the page holds a seeded uniform sample of N answered choices instead of every question.
    """

    def __init__(
        self,
        source: str | Path | ServedStore,
        host: str = "127.0.0.1",
        port: int = 0,
        audit: int | None = None,
        seed: int = 0,
    ) -> None:
        # A missing or unreadable source fails here, before the port opens.
        self.store = source if isinstance(source, ServedStore) else open_store(source)
        self.name = Path(str(source)).name if not isinstance(source, ServedStore) else source.url
        self.queue: QuestionQueue | AuditQueue = (
            QuestionQueue(self.store) if audit is None else AuditQueue(self.store, audit, seed)
        )
        self.token = secrets.token_urlsafe(32)  # bound to this server's page: labels must carry it
        self.httpd = ThreadingHTTPServer((host, port), _handler(self))
        self.thread: threading.Thread | None = None

    def hosts(self) -> set[str]:
        """The ``Host`` headers that name this server: its bound address or a local name, with its port."""
        host, port = self.httpd.server_address[:2]
        names = {*LOCAL_NAMES, f"[{host}]" if ":" in host else host}
        return {f"{name}:{port}" for name in names}

    def origins(self) -> set[str]:
        return {f"http://{host}" for host in self.hosts()}

    def foreign(self, headers: Any) -> str | None:
        """Why a request does not come from this server's own page (its Host, and its Origin when sent), or None."""
        bound = self.httpd.server_address[0]
        if bound not in ("0.0.0.0", "::") and headers.get("Host") not in self.hosts():  # a wildcard: any name
            return "the Host header does not name this server"
        origin = headers.get("Origin")
        if origin is not None and origin not in self.origins():
            return "the request comes from another site (its Origin is not this page's)"
        if headers.get("Sec-Fetch-Site") == "cross-site":
            return "the request comes from another site (Sec-Fetch-Site: cross-site)"
        return None

    def refused_label(self, headers: Any) -> tuple[HTTPStatus, str] | None:
        """Why ``POST /api/label`` with ``headers`` is refused (the module docstring's table), or None."""
        why = self.foreign(headers)
        if why is not None:
            return HTTPStatus.FORBIDDEN, why
        kind = (headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        if kind != "application/json":
            return HTTPStatus.UNSUPPORTED_MEDIA_TYPE, "a label is a JSON body (Content-Type: application/json)"
        if not hmac.compare_digest((headers.get(TOKEN_HEADER) or "").encode(), self.token.encode()):
            return HTTPStatus.FORBIDDEN, f"a label carries this page's token ({TOKEN_HEADER}); reload the page"
        return None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/"

    def item(self, position: int | None) -> dict[str, Any]:
        """The entry at ``position`` (default: the first unlabelled), and the counts the page shows."""
        total = self.queue.total()
        pos = self.queue.first_open() if position is None else min(max(position, 0), max(total - 1, 0))
        answer = self.queue.at(pos)
        return {
            "item": None if answer is None else item_json(answer),
            "pos": pos,
            "total": total,
            "left": self.queue.left(),
        }

    def label(self, body: dict[str, Any]) -> tuple[HTTPStatus, dict[str, Any]]:
        response_id, index, correct = body.get("id"), body.get("index"), body.get("correct")
        try:
            check_label(response_id, index, correct, self.queue.label_source)
        except ValueError as exc:
            return HTTPStatus.BAD_REQUEST, {"error": str(exc)}
        if not self.queue.holds(response_id, index):  # type: ignore[arg-type]
            return HTTPStatus.NOT_FOUND, {"error": f"no served answer {response_id!r} at index {index!r}"}
        try:
            self.store.add_label(response_id, index, correct, self.queue.label_source, who=labeller())  # type: ignore[arg-type]
        except RecordGone as exc:  # retention deleted it since the page showed it
            return HTTPStatus.NOT_FOUND, {"error": str(exc)}
        return HTTPStatus.OK, {"left": self.queue.left()}

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
        self.store.close()


def _handler(server: LabelServer) -> type[BaseHTTPRequestHandler]:
    title = f"candor label: {server.name}" + (" (audit)" if isinstance(server.queue, AuditQueue) else "")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            url = urlsplit(self.path)
            why = server.foreign(self.headers)
            if why is not None:
                return self._json(HTTPStatus.FORBIDDEN, {"error": why})
            if url.path in ("/", "/index.html"):
                self._send(HTTPStatus.OK, page_html(title, server.token).encode(), "text/html; charset=utf-8")
            elif url.path == "/api/item":
                raw = parse_qs(url.query).get("pos", [None])[0]
                if raw is not None and not raw.lstrip("-").isdigit():
                    return self._json(HTTPStatus.BAD_REQUEST, {"error": f"'pos' must be an integer, got {raw!r}"})
                self._json(HTTPStatus.OK, server.item(None if raw is None else int(raw)))
            else:
                self._json(HTTPStatus.NOT_FOUND, {"error": "not found"})

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/api/label":
                return self._json(HTTPStatus.NOT_FOUND, {"error": "not found"})
            refused = server.refused_label(self.headers)
            if refused is not None:
                self.close_connection = True  # its body is left unread
                return self._json(refused[0], {"error": refused[1]})
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
            self.send_header("X-Frame-Options", "DENY")  # no other site frames the page to press its keys
            self.send_header("Content-Security-Policy", "frame-ancestors 'none'")
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


def judge_labels(source: str | Path | ServedStore, backend: Backend, name: str) -> JudgeReport:
    """Label every answer no one labelled with the judge (``judge:NAME``); compare it with the human labels.

    ``source`` is a store URL, a store, or a served log file (labels appended to it).
    Answers a judge of the same name labelled before are left alone, so a rerun resumes.
    """
    store = source if isinstance(source, ServedStore) else open_store(source)
    answers = queue(store)
    source = f"judge:{name}"
    todo = [a for a in answers if a.label is None]
    human = [a for a in answers if a.label_source == LABEL_SOURCE_HUMAN]
    asked = todo + human
    judge = LLMAnswerJudge(backend)
    verdicts = judge.judge_answers([a.record.item.question for a in asked], [shown(a) for a in asked])
    for answer, verdict in zip(todo, verdicts[: len(todo)], strict=True):
        store.add_label(answer.id, answer.index, bool(verdict), source, who=source)
    agreed = sum(bool(v) == a.label for a, v in zip(human, verdicts[len(todo) :], strict=True))
    if not isinstance(source, ServedStore):
        store.close()
    return JudgeReport(len(todo), len(human), agreed)


def shown(answer: ServedAnswer) -> str:
    """The text the choice returned (the record's greedy answer when the log does not say)."""
    return answer.returned if answer.returned is not None else answer.record.greedy.text


def labeller() -> str:
    """Who labels on this machine's page: the operating-system user."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"
