"""What one question's answering passes around: what was asked and how to reply, who listens, what comes back.

:class:`HonestModel` (:mod:`candor.serve.model`) takes :class:`Ask` values (a question rendered and
checked, :class:`Prompted`, with its :class:`Reply` settings and an optional :class:`Listener`) and
returns :class:`HonestAnswer` values; :class:`Decoding` is the answer the confidence is computed for.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from candor.annotation.records import Record
from candor.backends.base import Completion, RequestTokenHook, SamplingParams
from candor.data.items import QAItem
from candor.serve.shapes import shape_of
from candor.serve.thresholds import Threshold
from candor.util.errors import CandorError


@dataclass(frozen=True)
class Decoding:
    """The answer the confidence is computed for: greedy, up to ``max_new_tokens``.

    See docs/methods.md "Generation and judging".

    ``temperature``, ``top_p`` and ``top_k`` are kept for folders saved before
    :class:`Reply` existed; the confidence is always that of the greedy answer
    plus the source's samples at :data:`PROTOCOL_SAMPLES`.
    """

    max_new_tokens: int = 32
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def params(self, stop: Sequence[str] = ()) -> SamplingParams:
        return SamplingParams(
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            stop=tuple(stop),
        )


# The method's own samples: temperature 1, top-p 0.95, top-k 50, seeded per question.
# (see docs/methods.md "Generation and judging")
PROTOCOL_SAMPLES = SamplingParams()


class ContextLengthExceeded(CandorError):
    """The templated prompt plus the answer would not fit in the model's context."""


@dataclass(frozen=True)
class Prompted:
    """A question rendered with the model's QA template, checked (and counted) before any work.

    ``history`` holds the conversation's earlier turns (``(role, text)``, oldest first); empty
    for a question asked alone.
    """

    question: str
    prompt: str
    prompt_tokens: int | None = None  # the template's tokens; None when the backend has no tokenizer
    history: tuple[tuple[str, str], ...] = ()
    agent: Any = None  # an AgentTurn (candor.serve.agent_turns): tools or a structured output; None: a question

    @property
    def shape(self) -> str:
        """Alone, after one system message (named by its text), or in a conversation (:mod:`candor.serve.shapes`);
        an agent turn's own shape (a tool call, a structured output)."""
        return self.agent.shape if self.agent is not None else shape_of(self.history)

    def item(self) -> QAItem:
        return served_item(self.question, self.history)


def served_item(question: str, history: Sequence[tuple[str, str]] = ()) -> QAItem:
    """A served question as a QA item whose id comes from its text and conversation, never from a batch."""
    return QAItem(
        id="q-" + hashlib.sha256(_conversation_key(question, history)).hexdigest()[:16],
        dataset="served",
        split="",
        question=question,
        answers=(),
        history=tuple(history),
    )


def _conversation_key(question: str, history: Sequence[tuple[str, str]]) -> bytes:
    """The question's own text when asked alone (so ids and seeds are those of earlier versions)."""
    if not history:
        return question.encode("utf-8")
    return json.dumps([question, [list(t) for t in history]], ensure_ascii=False).encode("utf-8")


@dataclass(frozen=True)
class Reply:
    """How the returned text is decoded (a request's parameters); the confidence never depends on it.

    The default (greedy, the model's token cap, no extra stop strings) returns
    the very answer the confidence was computed for. ``seed`` seeds sampled
    replies; None draws fresh ones.
    """

    n: int = 1
    max_new_tokens: int | None = None  # None: the model's own cap
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None


class Listener(Protocol):
    """What a caller hears while its question is answered (in the engine thread): streaming and cancellation."""

    def alive(self) -> bool:
        """False once nobody waits for the answer: its generation stops."""
        ...

    def decided(self, answer: HonestAnswer) -> None:
        """A question-level source decided before generating (the first streamed chunk)."""
        ...

    def token(self, choice: int, token_id: int) -> None:
        """Choice ``choice`` of the reply kept one more token."""
        ...


@dataclass
class Ask:
    """One question with its reply settings: the unit a serving flow answers."""

    prompted: Prompted
    reply: Reply = field(default_factory=Reply)
    listener: Listener | None = None

    def alive(self) -> bool:
        return self.listener is None or self.listener.alive()

    def check_alive(self) -> None:
        """Raise :class:`Cancelled` once nobody waits for the answer."""
        if not self.alive():
            raise Cancelled()

    def decided(self, answer: HonestAnswer) -> None:
        if self.listener is not None:
            self.listener.decided(answer)

    def token_hook(self, choices: Callable[[int], Sequence[int]]) -> RequestTokenHook | None:
        """An engine token hook streaming a row to the ``choices(sample)`` it feeds; it ends rows nobody waits for."""
        listener = self.listener
        if listener is None:
            return None

        def on_token(sample: int, token: int) -> bool:
            for choice in choices(sample):
                listener.token(choice, token)
            return listener.alive()

        return on_token


class Cancelled(Exception):
    """Nobody waits for the answer any more (a client left); its work was stopped."""


@dataclass
class Scored:
    """A question's confidence, the record scored (answer-level sources), or its whole abstention."""

    confidence: float
    record: Record | None = None
    abstained: list[HonestAnswer] | None = None
    prompt_tokens: int | None = None  # the protocol prompt's tokens, when it was generated


@dataclass(frozen=True)
class ServedBy:
    """What the model that answered stood for at that moment: its version, threshold and calibration.

    An answer carries it so that what is said about the answer (the response's ``confidence``
    object, the served log) never asks the model again, which a reload may have replaced since.
    """

    version: str
    threshold: Threshold | None
    fitted_where: str | None  # the labels the value was fitted on, in words; None: not fitted on labels
    tuned_on: tuple[str, ...]  # the request shapes the calibrator, head and threshold were fitted on

    def calibration(self, shape: str) -> dict[str, Any]:
        """``calibrated``: the value is a probability fitted on labels for requests of ``shape``; and where.

        A value fitted on questions asked alone is not calibrated for a conversation, nor after a system
        prompt it was not tuned with: nothing measured how the earlier turns move it (docs/serving.md
        "Calibrated for your system prompt").
        """
        where = self.fitted_where
        calibrated = where is not None and shape in self.tuned_on
        # Where the value is calibrated, only when it is: a shape it was not fitted for names nothing.
        return {"calibrated": calibrated, "calibrated_on": where if calibrated else None}


@dataclass
class HonestAnswer:
    """One answer with its confidence; ``answer`` is None when the model abstained.

    ``scores_returned_text`` is False when the returned text is not the answer
    the confidence was computed for (a reply decoded with other parameters).
    """

    answer: str | None
    confidence: float
    abstained: bool
    reason: str
    method: str
    calibrated: bool = False
    threshold: float | None = None
    finish_reason: str = "stop"  # "stop", "length" or "abstained"
    completion_tokens: int = 0
    scores_returned_text: bool = True
    withheld: str | None = field(default=None, repr=False)  # an answer-level source's answer it declined
    completion: Completion | None = field(default=None, repr=False, compare=False)  # the returned text's tokens
    prompt_tokens: int = field(default=0, repr=False, compare=False)
    record: Record | None = field(default=None, repr=False, compare=False)  # what was scored, with provenance
    claims: Any = field(default=None, repr=False, compare=False)  # a ClaimVerdict, when claims are served
    agent: Any = field(default=None, repr=False, compare=False)  # an AgentReply: an agent turn's calls or fields
    served_by: ServedBy | None = field(default=None, repr=False, compare=False)  # None: built outside a model

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.repr}
        return out


Outcome = list[HonestAnswer] | Exception


def question_seed(question: str, history: Sequence[tuple[str, str]] = ()) -> int:
    """A seed from the question's text (and conversation), so its samples never depend on the batch it shares."""
    return int.from_bytes(hashlib.sha256(_conversation_key(question, history)).digest()[:8], "little") >> 1


def reply_seed(ask: Ask) -> int:
    """A sampled reply's seed: the request's (mixed with the question), else a fresh one."""
    if ask.reply.seed is None:
        return secrets.randbits(31)
    digest = hashlib.sha256(f"{ask.reply.seed}\0{ask.prompted.question}".encode()).digest()
    return int.from_bytes(digest[:4], "little") >> 1


def check_text(text: str, what: str) -> None:
    """Refuse text that is not valid Unicode (a lone surrogate from JSON ``\\ud800``), or that holds a NUL (no
    question needs one, and a PostgreSQL store cannot keep it), before a tokenizer sees it."""
    if "\x00" in text:
        raise CandorError(f"{what} holds a NUL character (at character {text.index(chr(0))})")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CandorError(f"{what} is not valid Unicode (a lone surrogate at character {exc.start})") from None
