"""``HonestModel``: a generator, a confidence source, an optional calibrator and an abstention threshold.

    from candor.serve import HonestModel
    model = HonestModel(load_backend("smollm2-135m"), confidence="n-prob", threshold=0.3)
    model.answer("Who wrote Hamlet?").to_dict()
    # {"answer": ..., "confidence": 0.41, "abstained": False, "reason": "...", "method": "n-prob", ...}

A question-level source (an EliCal head) decides before generating, so a
declined question is never generated. An answer-level source generates first,
then scores the answer. The question is rendered with the QA prompt template
the confidence was made for (``fewshot`` for the embedded default).

The confidence always follows the method's own protocol (DESIGN.md §4.1): the
greedy answer up to the model's token cap, plus the source's samples at
temperature 1, top-p 0.95, top-k 50, seeded by the question's text, so it
never depends on a caller's sampling parameters nor on the batch a question
shares. A :class:`Reply` (a request's decoding) changes the returned text only.
Served records carry the model, template and decoding they were made with, so
an estimator that re-reads the prompt scores the sequence that was generated.

One folder holds a tuned model (:meth:`HonestModel.save_pretrained`)::

    honest.json   generator (model, backend, template, decoding), confidence source,
                  calibrator (name and the dev data it was fitted on), threshold
    head/         the EliCal head (head sources only)
    adapter/      the generator's PEFT adapter (when it has one; ADVICE)

The calibrator is stored in its own JSON form (``Calibrator.to_dict``), with
the number of dev questions it was fitted on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from candor.annotation.prompts import QATemplate, resolve_template
from candor.annotation.records import Record
from candor.backends.base import (
    TOKEN_HOOK,
    TOKENIZER,
    Backend,
    Completion,
    Generations,
    SamplingParams,
    TokenHook,
    backend_capabilities,
)
from candor.evaluation.calibration import Calibrator, calibrator_from_dict, get_calibrator
from candor.serve import thresholds as th
from candor.serve.confidence import ConfidenceSource, answer_records, as_source, load_source, question_item
from candor.util.errors import CandorError
from candor.util.files import atomic_folder
from candor.util.version import __version__

logger = logging.getLogger(__name__)

CONFIG_FILE = "honest.json"
ADAPTER_DIR = "adapter"
DEFAULT_REFUSAL = "I don't know."

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Decoding:
    """The answer the confidence is computed for: greedy, up to ``max_new_tokens`` (DESIGN.md §4.1).

    ``temperature``, ``top_p`` and ``top_k`` are kept for folders saved before
    :class:`Reply` existed; the confidence is always that of the greedy answer
    plus the source's samples at :data:`PROTOCOL_SAMPLES`.
    """

    max_new_tokens: int = 32
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    def params(self, stop: Sequence[str] = ()) -> SamplingParams:
        return SamplingParams(self.max_new_tokens, self.temperature, self.top_p, self.top_k, tuple(stop))


# The method's own samples (DESIGN.md §4.1): temperature 1, top-p 0.95, top-k 50, seeded per question.
PROTOCOL_SAMPLES = SamplingParams()


class ContextLengthExceeded(CandorError):
    """The templated prompt plus the answer would not fit in the model's context."""


@dataclass(frozen=True)
class Prompted:
    """A question rendered with the model's QA template, checked (and counted) before it is batched."""

    question: str
    prompt: str
    prompt_tokens: int | None = None  # the template's tokens; None when the backend has no tokenizer


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
    """What a caller hears while its question is answered (in the batch thread): streaming and cancellation."""

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
    """One question with its reply settings: the unit the micro-batcher gathers."""

    prompted: Prompted
    reply: Reply = field(default_factory=Reply)
    listener: Listener | None = None

    def alive(self) -> bool:
        return self.listener is None or self.listener.alive()


class Cancelled(Exception):
    """Nobody waits for the answer any more (a client left); its work was stopped."""


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

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.repr}
        return out


Outcome = list[HonestAnswer] | Exception


class HonestModel:
    """Answers questions with a confidence, abstaining below ``threshold`` (see the module docstring)."""

    def __init__(
        self,
        backend: Backend,
        confidence: str | ConfidenceSource = "n-prob",
        calibrator: Calibrator | None = None,
        threshold: th.Threshold | float | None = None,
        *,
        template: str = "auto",
        decoding: Decoding | None = None,
        backend_name: str = "hf",
    ) -> None:
        self.backend = backend
        self.backend_name = backend_name  # the registry name that reloads the generator
        self.source = as_source(confidence)
        check = getattr(self.source, "check", None)  # a source from a plugin may predate ``check``
        if check is not None:
            check(backend)  # a method the backend cannot run is refused here, at startup
        self.calibrator = calibrator
        self._calibrated_on = 0  # dev questions the calibrator was fitted on (0: unknown)
        self.threshold = th.Threshold(float(threshold)) if isinstance(threshold, (int, float)) else threshold
        self.template: QATemplate = resolve_template(template, backend.model_name, backend)
        self.decoding = decoding or Decoding()

    @property
    def method(self) -> str:
        return self.source.name

    @property
    def context_length(self) -> int | None:
        value = getattr(self.backend, "context_length", None)
        return int(value) if value else None

    # ------------------------------------------------------------ answering

    def prepare(self, question: str, max_new_tokens: int | None = None) -> Prompted:
        """The question checked, templated and counted; a bad one raises :class:`CandorError` before any work.

        Raises :class:`ContextLengthExceeded` when the templated prompt plus the
        longest answer asked for (the model's cap or ``max_new_tokens``) exceeds
        the model's context.
        """
        if not question.strip():
            raise CandorError("the question is empty")
        check_text(question, "the question")
        prompt = self.template(question_item(question), self.backend)
        count = len(self.backend.tokenize(prompt)) if TOKENIZER in backend_capabilities(self.backend) else None
        limit = self.context_length
        answer = max(self.decoding.max_new_tokens, max_new_tokens or 0)
        if count is not None and limit is not None and count + answer > limit:
            raise ContextLengthExceeded(
                f"the prompt is {count} tokens after the QA template; with {answer} answer tokens it exceeds "
                f"the model's context of {limit} tokens"
            )
        return Prompted(question, prompt, count)

    def answer(self, question: str) -> HonestAnswer:
        """The greedy answer to one question, or an abstention, with its confidence."""
        return self.answer_batch([question])[0][0]

    def answer_batch(
        self, questions: Sequence[str], n: int = 1, decoding: Decoding | None = None, stop: Sequence[str] = ()
    ) -> list[list[HonestAnswer]]:
        """``n`` answers per question; ``decoding`` and ``stop`` shape the returned text only.

        The first failing question raises (use :meth:`answer_asks` for per-question outcomes).
        """
        reply = Reply(n=n, stop=tuple(stop))
        if decoding is not None:
            reply = Reply(n, decoding.max_new_tokens, decoding.temperature, decoding.top_p, tuple(stop))
        asks = [Ask(self.prepare(q, reply.max_new_tokens), reply) for q in questions]
        out = []
        for outcome in self.answer_asks(asks):
            if isinstance(outcome, Exception):
                raise outcome
            out.append(outcome)
        return out

    def answer_asks(self, asks: Sequence[Ask]) -> list[Outcome]:
        """Per ask, its ``n`` answers or the exception that failed it alone (never its neighbours).

        The confidence follows the method's own protocol whatever the reply's
        parameters: a head scores the question; an estimator scores the greedy
        answer (the model's cap, the template's stops) with its samples at
        :data:`PROTOCOL_SAMPLES`, seeded by the question. The returned text is
        that greedy answer unless the reply asks for other decoding, which is
        then generated apart.
        """
        out: list[Outcome | None] = [None] * len(asks)
        live = [i for i, a in enumerate(asks) if a.alive()]
        for i in set(range(len(asks))) - set(live):
            out[i] = Cancelled()
        decided: dict[int, tuple[float, Record | None]] = {}
        protocol: dict[int, Generations] = {}
        if self.source.before_generation:
            for i, c in zip(live, isolated(self._score_questions, [asks[i] for i in live]), strict=True):
                if isinstance(c, Exception):
                    out[i] = c
                    continue
                if self._declines(c):
                    out[i] = [self._abstention(c, "declined before generating")] * asks[i].reply.n
                else:
                    decided[i] = (c, None)
                if asks[i].listener is not None:
                    first = out[i][0] if isinstance(out[i], list) else self._undecided(c)  # type: ignore[index]
                    asks[i].listener.decided(first)  # type: ignore[union-attr]
        else:
            for i, g in zip(live, self._protocol([asks[i] for i in live]), strict=True):
                if isinstance(g, Exception) or not asks[i].alive():
                    out[i] = g if isinstance(g, Exception) else Cancelled()
                else:
                    protocol[i] = g
            decided = self._score_answers(asks, list(protocol), protocol, out)
        live = list(decided)
        replies = self._replies(asks, live, protocol)  # only for questions answered: an abstention generates no reply
        for i in live:
            reply = replies[i]
            if isinstance(reply, Exception) or not asks[i].alive():
                out[i] = reply if isinstance(reply, Exception) else Cancelled()
                continue
            conf, rec = decided[i]
            scored = [rec is None or c is rec.greedy for c in reply]
            out[i] = [self._answered(c, conf, asks[i], sc, rec, protocol[i].prompt_tokens)
                      for c, sc in zip(reply, scored, strict=True)]  # fmt: skip
        return out  # type: ignore[return-value]

    def _score_questions(self, asks: Sequence[Ask]) -> list[float]:
        return [float(c) for c in self._calibrated(self.source.score_questions([a.prompted.question for a in asks]))]

    def _protocol(self, asks: Sequence[Ask]) -> list[Generations | Exception]:
        """The greedy answer and the source's samples of each question, in one backend call."""

        def run(group: Sequence[Ask]) -> list[Generations]:
            params = replace(PROTOCOL_SAMPLES, max_new_tokens=self.decoding.max_new_tokens, stop=self.template.stop)
            reuse = [self._returns_greedy(a.reply) for a in group]
            hook = self._hook(group, lambda k, sample: range(group[k].reply.n) if sample < 0 and reuse[k] else ())
            return self._generate(group, self.source.samples, params, True,
                                  [question_seed(a.prompted.question) for a in group], hook)  # fmt: skip

        return isolated(run, asks)

    def _replies(
        self, asks: Sequence[Ask], live: Sequence[int], protocol: dict[int, Generations]
    ) -> dict[int, list[Completion] | Exception]:
        """The returned texts: the protocol's greedy answer, or a generation with the reply's own decoding."""
        out: dict[int, list[Completion] | Exception] = {}
        groups: dict[tuple[SamplingParams, bool], list[int]] = {}
        for i in live:
            reply = asks[i].reply
            if i in protocol and self._returns_greedy(reply):
                out[i] = [protocol[i].greedy] * reply.n  # type: ignore[list-item]
                continue
            groups.setdefault((self._reply_params(reply), reply.temperature == 0), []).append(i)
        for (params, greedy), idx in groups.items():
            group = [asks[i] for i in idx]

            def run(part: Sequence[Ask], params: SamplingParams = params, greedy: bool = greedy) -> list[Generations]:
                seeds = [reply_seed(a) for a in part]
                hook = self._hook(part, lambda k, sample: range(part[k].reply.n) if sample < 0 else (sample,))
                return self._generate(part, 0 if greedy else max(a.reply.n for a in part), params, greedy, seeds, hook)

            for i, g in zip(idx, isolated(run, group), strict=True):
                if isinstance(g, Exception):
                    out[i] = g
                else:
                    n = asks[i].reply.n
                    out[i] = [g.greedy] * n if greedy else g.samples[:n]  # type: ignore[list-item]
                    if i not in protocol:
                        protocol[i] = Generations(None, [], g.prompt_tokens)  # usage: the prompt was read here
        return out

    def _generate(
        self,
        asks: Sequence[Ask],
        n: int,
        params: SamplingParams,
        greedy: bool,
        seeds: list[int],
        hook: TokenHook | None,
    ) -> list[Generations]:
        extra = {"on_token": hook} if hook is not None else {}
        return self.backend.generate([a.prompted.prompt for a in asks], n, params, greedy=greedy, seeds=seeds, **extra)

    def _hook(self, asks: Sequence[Ask], choices: Any) -> TokenHook | None:
        """A backend token hook that streams rows to their listeners and ends rows nobody waits for."""
        if all(a.listener is None for a in asks) or TOKEN_HOOK not in backend_capabilities(self.backend):
            return None

        def on_token(prompt: int, sample: int, token: int) -> bool:
            listener = asks[prompt].listener
            if listener is None:
                return True
            for choice in choices(prompt, sample):
                listener.token(choice, token)
            return listener.alive()

        return on_token

    def _returns_greedy(self, reply: Reply) -> bool:
        cap = reply.max_new_tokens
        return reply.temperature == 0 and not reply.stop and cap in (None, self.decoding.max_new_tokens)

    def _reply_params(self, reply: Reply) -> SamplingParams:
        cap = reply.max_new_tokens or self.decoding.max_new_tokens
        stop = tuple(dict.fromkeys((*self.template.stop, *reply.stop)))
        return SamplingParams(cap, reply.temperature, reply.top_p, 0, stop)

    def _score_answers(
        self, asks: Sequence[Ask], live: Sequence[int], protocol: dict[int, Generations], out: list[Outcome | None]
    ) -> dict[int, tuple[float, Record | None]]:
        """Score each protocol answer; abstentions and failures go to ``out``, the answered are returned."""
        records = answer_records(
            [asks[i].prompted.question for i in live],
            [protocol[i].greedy for i in live],
            [protocol[i].samples for i in live],
            self.provenance(),
        )  # type: ignore[misc]
        scores = isolated(lambda recs: list(self._calibrated(self.source.score_records(recs, self.backend))), records)
        answered: dict[int, tuple[float, Record | None]] = {}
        for i, rec, conf in zip(live, records, scores, strict=True):
            n = asks[i].reply.n
            if isinstance(conf, CandorError):  # an answer the method cannot score (an empty one) abstains
                reason = f"the answer could not be scored: {conf}"
                out[i] = [self._abstention(0.0, reason, rec=rec, below=False)] * n
            elif isinstance(conf, Exception):
                out[i] = conf
            elif self._declines(conf):
                out[i] = [self._abstention(conf, "answer scored below the threshold", rec.greedy.text, rec)] * n
            else:
                answered[i] = (float(conf), rec)
        return answered

    def provenance(self) -> dict[str, Any]:
        """What a served record was made with (as annotation writes it), so re-scoring uses the same prompt."""
        samples = replace(PROTOCOL_SAMPLES, max_new_tokens=self.decoding.max_new_tokens, stop=self.template.stop)
        return {
            "model": self.backend.model_name,
            "template": self.template.name,
            "k": self.source.samples,
            "seed": "question",  # samples are seeded by the question's text (question_seed)
            "decoding": {
                "greedy": {
                    "temperature": 0.0,
                    "max_new_tokens": self.decoding.max_new_tokens,
                    "stop": list(self.template.stop),
                },
                "samples": samples.to_dict(),
            },  # fmt: skip
            "candor_version": __version__,
            "served": True,
        }

    # ------------------------------------------------------------ deciding

    def _calibrated(self, raw: np.ndarray) -> np.ndarray:
        return self.calibrator.predict(raw) if self.calibrator is not None else np.asarray(raw, dtype=float)

    def _declines(self, confidence: float) -> bool:
        return self.threshold is not None and self.threshold.abstains(float(confidence))

    def _threshold_value(self) -> float | None:
        return None if self.threshold is None else self.threshold.value

    def _abstention(
        self, confidence: float, reason: str, withheld: str | None = None, rec: Record | None = None,
        below: bool = True,
    ) -> HonestAnswer:  # fmt: skip
        if below and self.threshold is not None:
            reason = f"{reason} ({confidence:.3f} < {self.threshold.value:.3f})"
        return HonestAnswer(
            None, float(confidence), True, reason, self.method, self.calibrator is not None,
            self._threshold_value(), "abstained", 0, True, withheld, None, 0, rec,
        )  # fmt: skip

    def _undecided(self, confidence: float) -> HonestAnswer:
        """The head's verdict for a question it answers, before the answer exists (the first streamed chunk)."""
        return HonestAnswer(None, float(confidence), False, self._answer_reason(), self.method,
                            self.calibrator is not None, self._threshold_value(), "stop")  # fmt: skip

    def _answer_reason(self) -> str:
        return "no threshold set" if self.threshold is None else f"confidence ≥ {self.threshold.value:.3f}"

    def _answered(
        self,
        completion: Completion,
        confidence: float,
        ask: Ask,
        scored: bool,
        rec: Record | None = None,
        prompt_tokens: int | None = None,
    ) -> HonestAnswer:
        cap = ask.reply.max_new_tokens or self.decoding.max_new_tokens
        finish = completion.finish_reason or ("length" if len(completion.token_ids) >= cap else "stop")
        used = completion.completion_tokens if completion.completion_tokens is not None else len(completion.token_ids)
        return HonestAnswer(
            completion.text, float(confidence), False, self._answer_reason(), self.method,
            self.calibrator is not None, self._threshold_value(), finish, used, scored, None, completion,
            prompt_tokens or ask.prompted.prompt_tokens or 0, rec,
        )  # fmt: skip

    # ------------------------------------------------------------ tuning on dev

    def confidences(self, records: Sequence[Record]) -> np.ndarray:
        """Raw (uncalibrated) confidence of annotated records' greedy answers."""
        return self.source.score_records(records, self.backend)

    def tune(
        self,
        dev: Sequence[Record],
        rule: str,
        target: float,
        *,
        delta: float = 0.1,
        calibrator: str | None = None,
        seed: int = 0,
    ) -> th.Threshold:
        """Choose the threshold (and optionally fit a calibrator) on annotated dev records.

        With a calibrator, dev is split in two seeded halves: the calibrator is
        fitted on one and the threshold chosen on the other, so the threshold's
        dev estimates (and the risk-control guarantee) come from data the
        calibrator never saw.
        """
        labelled = [r for r in dev if r.greedy_correct is not None]
        if len(labelled) < len(dev):
            logger.warning("tune: skipped %d dev records without greedy correctness", len(dev) - len(labelled))
        if not labelled:
            raise CandorError("tune: no dev record has a greedy-correctness label")
        conf = self.confidences(labelled)
        correct = np.array([int(r.greedy_correct) for r in labelled])  # type: ignore[arg-type]
        if calibrator is not None:
            order = np.random.default_rng(seed).permutation(len(labelled))
            fit, held = order[: len(order) // 2], order[len(order) // 2 :]
            self.fit_calibrator(calibrator, conf[fit], correct[fit])
            conf, correct = self._calibrated(conf[held]), correct[held]
        self.threshold = th.choose(conf, correct, rule, target, delta=delta)
        return self.threshold

    def fit_calibrator(self, name: str, confidence: np.ndarray, correct: np.ndarray) -> Calibrator:
        self.calibrator = get_calibrator(name).fit(confidence, correct)
        self._calibrated_on = len(confidence)
        return self.calibrator

    # ------------------------------------------------------------ save / load

    def save_pretrained(self, folder: str | Path) -> Path:
        """Write everything needed to answer into one folder (swapped in whole)."""
        folder = Path(folder)
        with atomic_folder(folder) as tmp:
            config = {
                "generator": self._generator_config(tmp),
                "confidence": self.source.save(tmp),
                "calibrator": self._calibrator_config(),
                "threshold": None if self.threshold is None else self.threshold.to_dict(),
            }
            (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        return folder

    def _generator_config(self, folder: Path) -> dict[str, Any]:
        adapter = getattr(self.backend, "adapter", None)
        if adapter:
            shutil.copytree(adapter, folder / ADAPTER_DIR)
        return {
            "model": self.backend.model_name,
            "backend": self.backend_name,
            "adapter": ADAPTER_DIR if adapter else None,
            "template": self.template.name,
            "decoding": asdict(self.decoding),
        }

    def _calibrator_config(self) -> dict[str, Any] | None:
        if self.calibrator is None:
            return None
        return {**self.calibrator.to_dict(), "fitted_on": self._calibrated_on}

    @classmethod
    def from_pretrained(cls, folder: str | Path, backend: Backend | None = None, **backend_kwargs: Any) -> HonestModel:
        """Reload a saved model; the generator is loaded by name unless ``backend`` is given."""
        folder = Path(folder)
        path = folder / CONFIG_FILE
        if not path.exists():
            raise CandorError(f"{folder}: not a saved honest model (no {CONFIG_FILE})")
        try:
            config = json.loads(path.read_text())
            gen = config["generator"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise CandorError(f"{path}: not a valid honest-model config ({exc})") from None
        if backend is None:
            from candor.backends import load_backend

            if gen.get("adapter"):
                backend_kwargs["adapter"] = str(folder / gen["adapter"])
            backend = load_backend(gen["model"], gen.get("backend", "hf"), **backend_kwargs)
        threshold = th.Threshold.from_dict(config["threshold"]) if config.get("threshold") else None
        cal = config.get("calibrator")
        calibrator = calibrator_from_dict(cal) if cal else None
        model = cls(backend, load_source(config["confidence"], folder), calibrator, threshold,
                    template=gen.get("template", "auto"), decoding=Decoding(**gen.get("decoding", {})),
                    backend_name=gen.get("backend", "hf"))  # fmt: skip
        model._calibrated_on = int(cal.get("fitted_on", 0)) if cal else 0
        return model


def question_seed(question: str) -> int:
    """A seed from the question's text, so its samples never depend on the batch it shares."""
    return int.from_bytes(hashlib.sha256(question.encode("utf-8")).digest()[:8], "little") >> 1


def reply_seed(ask: Ask) -> int:
    """A sampled reply's seed: the request's (mixed with the question), else a fresh one."""
    if ask.reply.seed is None:
        return secrets.randbits(31)
    digest = hashlib.sha256(f"{ask.reply.seed}\0{ask.prompted.question}".encode()).digest()
    return int.from_bytes(digest[:4], "little") >> 1


def check_text(text: str, what: str) -> None:
    """Refuse text that is not valid Unicode (a lone surrogate from JSON ``\\ud800``) before a tokenizer sees it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise CandorError(f"{what} is not valid Unicode (a lone surrogate at character {exc.start})") from None


def isolated(run: Callable[[Sequence[T]], Sequence[R]], items: Sequence[T]) -> list[R | Exception]:
    """``run(items)``; when it raises, each item is run alone, so a failure is the failing item's only."""
    if not items:
        return []
    try:
        return list(run(items))
    except Exception as exc:
        if len(items) == 1:
            if not isinstance(exc, CandorError):
                logger.exception("answering failed")
            return [exc]
    return [isolated(run, [item])[0] for item in items]
