"""``HonestModel``: a generator, a confidence source, an optional calibrator and an abstention threshold.

    from candor.serve import HonestModel
    model = HonestModel(load_backend("smollm2-135m"), confidence="n-prob", threshold=0.3)
    model.answer("Who wrote Hamlet?").to_dict()
    # {"answer": ..., "confidence": 0.41, "abstained": False, "reason": "...", "method": "n-prob", ...}

A question-level source (an EliCal head) decides before generating, so a
declined question is never generated; where the generator prefills the very
prompt the head reads, the head is read from that prefill (one prefill for
confidence and answer). An answer-level source generates first, then scores
the answer. The question is rendered with the QA prompt template the
confidence was made for (``fewshot`` for the embedded default).

Each question is one flow (:meth:`HonestModel.answer_one`) over a
:class:`~candor.backends.base.LiveEngine` (:mod:`candor.serve.batching`):
its decode requests join the engine's running batch, and its scoring runs as
one ``call`` in the engine thread holding this question alone.

The confidence always follows the method's own protocol (docs/methods.md "Generation and judging"): the
greedy answer up to the model's token cap, plus the source's samples at
temperature 1, top-p 0.95, top-k 50, seeded by the question's text, so it
never depends on a caller's sampling parameters nor on the requests decoded
beside it (for a method that reads log-probs, the answer's are re-read over
its own rows alone, :mod:`candor.serve.rescoring`). A :class:`Reply` (a
request's decoding) changes the returned text only.
Served records carry the model, template and decoding they were made with, so
an estimator that re-reads the prompt scores the sequence that was generated.

One folder holds a tuned model (:meth:`HonestModel.save_pretrained`; its layout is
:mod:`candor.serve.honest_folder`).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from candor.annotation.prompts import QATemplate, resolve_template
from candor.annotation.records import Record
from candor.backends.base import (
    LIVE_DECODE,
    TOKENIZER,
    Backend,
    Completion,
    DecodeRequest,
    Generations,
    LiveEngine,
    PrefillHook,
    SamplingParams,
    backend_capabilities,
)
from candor.backends.engine import SharedPrefix
from candor.data.items import QAItem
from candor.evaluation.calibration import Calibrator, get_calibrator
from candor.serve import thresholds as th
from candor.serve.agent_answers import AgentAnswers
from candor.serve.answering import (
    PROTOCOL_SAMPLES,
    Ask,
    Cancelled,
    ContextLengthExceeded,
    Decoding,
    HonestAnswer,
    Outcome,
    Prompted,
    Reply,
    Scored,
    ServedBy,
    check_text,
    question_seed,
    reply_seed,
)
from candor.serve.batching import done, open_engine, run_sync
from candor.serve.claim_answers import ClaimJudge, ClaimPolicy, ClaimVerdict
from candor.serve.confidence_sources import (
    ConfidenceSource,
    PrefillReader,
    answer_records,
    as_source,
    load_source,
    question_item,
)
from candor.serve.factuality import FactualityGuarantee, tuned_at
from candor.serve.honest_folder import (
    CONFIG_FILE,
    calibrator_config,
    factuality_config,
    fresh_version,
    generator_config,
    read_folder,
    write_system_prompts,
)
from candor.serve.rescoring import Reread, can_read_alone
from candor.serve.shapes import QUESTION, shape_words, shapes_of, system_prompts_of
from candor.util.errors import CandorError
from candor.util.files import atomic_folder
from candor.util.version import __version__

logger = logging.getLogger(__name__)

DEFAULT_REFUSAL = "I don't know."


class HonestModel(AgentAnswers):
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
        self.calibrated_on = 0  # dev questions the calibrator was fitted on (0: unknown)
        # Request shapes (candor.serve.shapes) the calibration and threshold were fitted on: those of the
        # records ``tune`` fitted on (questions alone, or after a system prompt), or of served traffic.
        self.tuned_on: tuple[str, ...] = (QUESTION,)
        self.system_prompts: dict[str, str] = {}  # the text of each system-prompt shape in tuned_on
        self.version = "unsaved"  # the folder's version once saved or loaded (names the model in responses)
        self.threshold = th.Threshold(float(threshold)) if isinstance(threshold, (int, float)) else threshold
        self.template: QATemplate = resolve_template(template, backend.model_name, backend)
        self.decoding = decoding or Decoding()
        self._prefix: tuple[SharedPrefix | None] | None = None  # computed on first use
        self.claims: ClaimJudge | None = None  # a confidence per claim of each answer (serve_claims)
        self.factuality: tuple[FactualityGuarantee, ...] = ()  # claim thresholds tuned with a guarantee
        self.prefill_reader: PrefillReader | None = None  # a head read from the generator's own prefill
        reader = getattr(self.source, "prefill_reader", None)
        if reader is not None:
            self.prefill_reader, why = reader(backend, self.template.name)
            logger.info("EliCal head: %s", why)

    @property
    def method(self) -> str:
        return self.source.name

    def serve_claims(self, policy: ClaimPolicy | None) -> None:
        """Give each answer of more than one claim a confidence per claim (and refine it); None: stop.

        A policy with ``factuality_alpha`` refines at the threshold this model was tuned with for that
        alpha (:attr:`factuality`); refused when it has none.
        """
        if policy is None:
            self.claims = None
            return
        guarantee = None
        if policy.factuality_alpha is not None:
            guarantee = tuned_at(self.factuality, policy.method, policy.factuality_alpha)
        self.claims = ClaimJudge(policy, self.backend, guarantee, template=self.template.name)

    @property
    def context_length(self) -> int | None:
        value = getattr(self.backend, "context_length", None)
        return int(value) if value else None

    # ------------------------------------------------------------ answering

    def prepare(
        self, question: str, max_new_tokens: int | None = None, history: Sequence[tuple[str, str]] = ()
    ) -> Prompted:
        """The question checked, templated and counted; a bad one raises :class:`CandorError` before any work.

        ``history`` is the conversation the question was asked in (``(role, text)`` turns, oldest
        first); the template renders it before the question (docs/architecture.md "Conversations").

        Raises :class:`ContextLengthExceeded` when the templated prompt plus the
        longest answer asked for (the model's cap or ``max_new_tokens``) exceeds
        the model's context.
        """
        if not question.strip():
            raise CandorError("the question is empty")
        check_text(question, "the question")
        for role, text in history:
            check_text(text, f"a {role} message")
        prompt = self.template(question_item(question, history=tuple(history)), self.backend)
        count = len(self.backend.tokenize(prompt)) if TOKENIZER in backend_capabilities(self.backend) else None
        limit = self.context_length
        answer = max(self.decoding.max_new_tokens, max_new_tokens or 0)
        if count is not None and limit is not None and count + answer > limit:
            raise ContextLengthExceeded(
                f"the prompt is {count} tokens after the QA template; with {answer} answer tokens it exceeds "
                f"the model's context of {limit} tokens"
            )
        return Prompted(question=question, prompt=prompt, prompt_tokens=count, history=tuple(history))

    def answer(self, question: str, history: Sequence[tuple[str, str]] = ()) -> HonestAnswer:
        """The greedy answer to one question, or an abstention, with its confidence.

        ``history``: the conversation it is asked in, ``(role, text)`` turns oldest first
        (``system``, ``user``, ``assistant``); see docs/architecture.md "Conversations".
        """
        if not history:
            return self.answer_batch([question])[0][0]
        outcome = self.answer_asks([Ask(self.prepare(question, None, history), Reply())])[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome[0]

    def answer_batch(
        self, questions: Sequence[str], n: int = 1, decoding: Decoding | None = None, stop: Sequence[str] = ()
    ) -> list[list[HonestAnswer]]:
        """``n`` answers per question; ``decoding`` and ``stop`` shape the returned text only.

        The first failing question raises (use :meth:`answer_asks` for per-question outcomes).
        """
        reply = Reply(n=n, stop=tuple(stop))
        if decoding is not None:
            reply = Reply(
                n=n,
                max_new_tokens=decoding.max_new_tokens,
                temperature=decoding.temperature,
                top_p=decoding.top_p,
                stop=tuple(stop),
            )
        asks = [Ask(self.prepare(q, reply.max_new_tokens), reply) for q in questions]
        out = []
        for outcome in self.answer_asks(asks):
            if isinstance(outcome, Exception):
                raise outcome
            out.append(outcome)
        return out

    def answer_asks(self, asks: Sequence[Ask]) -> list[Outcome]:
        """Per ask, its ``n`` answers or the exception that failed it alone (never its neighbours).

        Each ask runs as its own flow (:meth:`answer_one`) on an engine opened
        for the call, so concurrent asks share decode batches but nothing else.
        """
        if not asks:
            return []
        engine = self.open_engine(max_batch=min(len(asks), int(getattr(self.backend, "batch_size", 16))))
        try:
            return run_sync(self._answer_all(asks, engine))
        finally:
            engine.close()

    def open_engine(self, max_batch: int = 16, max_wait_ms: float = 5.0) -> LiveEngine:
        """The engine this model's questions run on (close it when done): ``max_batch`` questions decode together."""
        prefix = self.shared_prefix() if LIVE_DECODE in backend_capabilities(self.backend) else None
        return open_engine(
            self.backend,
            max_batch=max_batch,
            max_wait_ms=max_wait_ms,
            rows_per_request=1 + self.source.samples,
            shared_prefix=prefix.ids if prefix is not None else None,
        )

    async def _answer_all(self, asks: Sequence[Ask], engine: LiveEngine) -> list[Outcome]:
        outcomes = await asyncio.gather(*(self.answer_one(a, engine) for a in asks), return_exceptions=True)
        for o in outcomes:
            if isinstance(o, Exception) and not isinstance(o, (CandorError, Cancelled)):
                logger.error("answering failed", exc_info=o)
        return list(outcomes)  # type: ignore[arg-type]

    async def answer_one(self, ask: Ask, engine: LiveEngine) -> list[HonestAnswer]:
        """One question's ``n`` answers, as one flow over ``engine``; raises what failed it alone.

        The confidence follows the method's own protocol whatever the reply's
        parameters: a head scores the question; an estimator scores the greedy
        answer (the model's cap, the template's stops) with its samples at
        :data:`PROTOCOL_SAMPLES`, seeded by the question. Scoring runs as one
        ``engine.call`` holding this question alone, and an answer-level
        source that reads log-probs reads them recomputed over this question's
        tokens alone (:attr:`rereads_answers`; a piece per engine call), so
        the value never depends on the requests decoded beside it. The returned text is that greedy answer
        unless the reply asks for other decoding, which is then generated
        (only for a question answered: an abstention generates no reply).
        """
        ask.check_alive()
        if ask.prompted.agent is not None:
            return await self._answer_agent(ask, engine)
        if self.prefill_reader is not None and self.prefill_reader.from_engine_pass:
            return await self._answer_from_engine_pass(ask, engine, self.prefill_reader)
        if self.prefill_reader is not None:
            return await self._answer_from_prefill(ask, engine, self.prefill_reader)
        if self.source.before_generation:
            confidence = await self._question_confidence(ask.prompted.item(), engine)
            if self._declines(confidence):
                declined = self._abstention(confidence, "declined before generating")
                ask.decided(declined)
                return [declined] * ask.reply.n
            ask.decided(self._undecided(confidence))
            scored = Scored(confidence)
        else:
            prefill: list[Any] = []  # the prompt's chunked prefill, when the engine ran it in chunks
            protocol = await done(engine.submit(self._protocol_request(ask, prefill.append)))
            ask.check_alive()
            score = self._scoring_steps(ask, protocol, prefill.pop() if prefill else None)
            while (scored := await done(engine.call(score))) is None:  # type: ignore[arg-type]
                ask.check_alive()
            if scored.abstained is not None:
                return scored.abstained
        ask.check_alive()
        completions, prompt_tokens = await self._reply(ask, engine, scored)
        ask.check_alive()
        rec = scored.record
        answers = [
            self._answered(c, scored.confidence, ask, rec is None or c.text == rec.greedy.text, rec, prompt_tokens)
            for c in completions
        ]
        return await self._with_claims(ask, engine, answers)

    async def _with_claims(self, ask: Ask, engine: LiveEngine, answers: list[HonestAnswer]) -> list[HonestAnswer]:
        """Each answer's claims scored in the engine thread (the question alone); the text refined if asked."""
        judge = self.claims
        if judge is None:
            return answers
        distinct = {id(a.completion): a.completion for a in answers if a.completion is not None}

        def judged() -> dict[int, ClaimVerdict | None]:
            prompted = ask.prompted
            return {
                key: judge.judge(c, prompted.prompt, prompted.question, prompted.shape) for key, c in distinct.items()
            }

        verdicts = await done(engine.call(judged))
        out = []
        for a in answers:
            verdict = verdicts.get(id(a.completion))
            if verdict is None:
                out.append(a)
                continue
            if verdict.refined and not verdict.text.strip():
                # Every claim was refined away: that is an abstention, never an empty message.
                reason = f"every claim of the answer scored below the claim threshold {judge.threshold:g}"
                declined = self._abstention(a.confidence, reason, a.answer, a.record, below=False)
                out.append(replace(declined, claims=verdict, completion_tokens=a.completion_tokens))
                continue
            # A refined text is not the answer the confidence was computed on.
            scored = a.scores_returned_text and not verdict.refined
            out.append(replace(a, answer=verdict.text, claims=verdict, scores_returned_text=scored))
        return out

    async def _answer_from_prefill(self, ask: Ask, engine: LiveEngine, reader: PrefillReader) -> list[HonestAnswer]:
        """A head read from the reply's own prefill: declined there (its rows freed), or decoded from the same cache."""
        verdict: list[HonestAnswer] = []

        def on_prefill(states: Sequence[np.ndarray]) -> bool:
            confidence = float(self._calibrated(np.array([reader(states)]))[0])
            if self._declines(confidence):
                verdict.append(self._abstention(confidence, "declined before generating"))
            else:
                verdict.append(self._undecided(confidence))
            ask.decided(verdict[0])
            return not verdict[0].abstained and ask.alive()

        g = await done(engine.submit(self._reply_request(ask, on_prefill)))
        ask.check_alive()
        if not verdict:
            raise CandorError("the engine never prefilled the question")
        if verdict[0].abstained:
            return [verdict[0]] * ask.reply.n
        completions = [g.greedy] * ask.reply.n if g.greedy is not None else g.samples[: ask.reply.n]
        answers = [self._answered(c, verdict[0].confidence, ask, True, None, g.prompt_tokens) for c in completions]  # type: ignore[arg-type]
        return await self._with_claims(ask, engine, answers)

    async def _answer_from_engine_pass(self, ask: Ask, engine: LiveEngine, reader: PrefillReader) -> list[HonestAnswer]:
        """A head read from the prompt's states the engine returns with the reply (no second prefill).

        The engine generates before the head decides: nothing streams until the
        verdict, and a declined question's generated answer is withheld.
        """
        request = replace(self._reply_request(ask), prompt_states=True, on_token=None)
        g = await done(engine.submit(request))
        ask.check_alive()
        if g.prompt_states is None:
            raise CandorError("the engine returned no hidden states of the prompt with its generation")
        confidence = float(self._calibrated(np.array([reader(g.prompt_states)]))[0])
        if self._declines(confidence):
            declined = self._abstention(confidence, "declined on the question (the engine's answer is withheld)")
            ask.decided(declined)
            return [declined] * ask.reply.n
        ask.decided(self._undecided(confidence))
        completions = [g.greedy] * ask.reply.n if g.greedy is not None else g.samples[: ask.reply.n]
        answers = [self._answered(c, confidence, ask, True, None, g.prompt_tokens) for c in completions]  # type: ignore[arg-type]
        return await self._with_claims(ask, engine, answers)

    async def _question_confidence(self, item: QAItem, engine: LiveEngine) -> float:
        """A question-level source's value: in the engine thread (alone), or apart when it runs elsewhere."""
        if getattr(self.source, "runs_in_engine", True):
            return await done(engine.call(lambda: self._score_question(item)))
        return await asyncio.to_thread(self._score_question, item)  # a remote call must not hold the engine

    def _score_question(self, item: QAItem) -> float:
        return float(self._calibrated(self.source.score_questions([item]))[0])

    def shared_prefix(self) -> SharedPrefix | None:
        """The template's own prefix (the few-shot block), run once by the live engine and by re-reading answers.

        Found from two renderings of the template; None where it is too short
        to be worth sharing or the model does not run in this process.
        """
        if not can_read_alone(self.backend):
            return None
        if self._prefix is None:
            prompts = [self.template(question_item(q), self.backend) for q in ("Who?", "Which river is longest?")]
            self._prefix = (SharedPrefix.of(self.backend, prompts),)  # type: ignore[arg-type]
        return self._prefix[0]

    @property
    def rereads_answers(self) -> bool:
        """Whether a question's answers are re-read over its own rows before scoring (:mod:`candor.serve.rescoring`).

        Only log-probs move with the batch a question decodes in; texts and
        token ids do not, so a source that reads neither log-probs nor top-k
        (``consis-lex``, ``p-true``: ``Estimator.requires``) skips the pass.
        """
        return can_read_alone(self.backend) and bool(getattr(self.source, "reads_token_logprobs", True))

    def _protocol_request(self, ask: Ask, on_chunked_prefill: Callable[[Any], None] | None = None) -> DecodeRequest:
        """The greedy answer and the source's samples, seeded by the question.

        See docs/methods.md "Generation and judging". ``on_chunked_prefill``
        keeps the prompt's prefill (where the engine runs it in chunks) for the
        re-read of the answers, which then skips the prompt.
        """
        params = replace(PROTOCOL_SAMPLES, max_new_tokens=self.decoding.max_new_tokens, stop=self.template.stop)
        streamed = range(ask.reply.n) if self._returns_greedy(ask.reply) else range(0)
        return DecodeRequest(
            prompt=ask.prompted.prompt,
            n=self.source.samples,
            params=params,
            greedy=True,
            seed=question_seed(ask.prompted.question, ask.prompted.history),
            on_token=ask.token_hook(lambda sample: streamed if sample < 0 else ()),
            on_chunked_prefill=on_chunked_prefill if self.rereads_answers else None,
        )

    def _scoring_steps(self, ask: Ask, protocol: Generations, prefill: Any = None) -> Callable[[], Scored | None]:
        """Engine work that scores the protocol, a step per call: None until the answer is scored.

        Where the answers are re-read alone, each call runs one piece of the
        re-read (a long prompt holds the engine for a piece at a time, between
        the others' decode steps), and the call with the last piece scores.
        """
        if not self.rereads_answers:
            return lambda: self._score_answer(ask, protocol)
        reread = Reread(
            self.backend,
            ask.prompted.prompt,
            protocol,
            self.shared_prefix(),  # type: ignore[arg-type]
            prefilled=prefill,
        )
        return lambda: self._score_answer(ask, reread.result()) if reread.step() else None

    def _score_answer(self, ask: Ask, protocol: Generations) -> Scored:
        """The protocol's answer scored (in the engine thread, this question alone); an abstention is returned whole."""
        rec = answer_records(
            [ask.prompted.item()],
            [protocol.greedy],
            [protocol.samples],  # type: ignore[list-item]
            self.provenance(),
        )[0]
        n = ask.reply.n
        try:
            confidence = float(self._calibrated(self.source.score_records([rec], self.backend))[0])
        except CandorError as exc:  # an answer the method cannot score (an empty one) abstains
            reason = f"the answer could not be scored: {exc}"
            return Scored(0.0, rec, [self._abstention(0.0, reason, rec=rec, below=False)] * n)
        if self._declines(confidence):
            declined = self._abstention(confidence, "answer scored below the threshold", rec.greedy.text, rec)
            return Scored(confidence, rec, [declined] * n)
        return Scored(confidence, rec, prompt_tokens=protocol.prompt_tokens)

    async def _reply(self, ask: Ask, engine: LiveEngine, scored: Scored) -> tuple[list[Completion], int | None]:
        """The returned texts: the protocol's greedy answer, or a generation with the reply's own decoding."""
        reply = ask.reply
        if scored.record is not None and self._reply_is_greedy(reply, scored.record.greedy):
            return [scored.record.greedy] * reply.n, scored.prompt_tokens
        g = await done(engine.submit(self._reply_request(ask)))
        completions = [g.greedy] * reply.n if reply.temperature == 0 else g.samples[: reply.n]
        return completions, scored.prompt_tokens or g.prompt_tokens  # type: ignore[return-value]

    def _reply_request(self, ask: Ask, on_prefill: PrefillHook | None = None) -> DecodeRequest:
        """The reply's decoding: greedy (one row, repeated to ``n`` choices) or ``n`` seeded samples."""
        reply = ask.reply
        greedy = reply.temperature == 0
        return DecodeRequest(
            prompt=ask.prompted.prompt,
            n=0 if greedy else reply.n,
            params=self._reply_params(reply),
            greedy=greedy,
            seed=reply_seed(ask),
            on_token=ask.token_hook(lambda s: range(reply.n) if s < 0 else (s,)),
            on_prefill=on_prefill,
        )

    def _returns_greedy(self, reply: Reply) -> bool:
        cap = reply.max_new_tokens
        return reply.temperature == 0 and not reply.stop and cap in (None, self.decoding.max_new_tokens)

    def _reply_is_greedy(self, reply: Reply, greedy: Completion) -> bool:
        """Whether the reply would decode exactly the protocol's greedy answer, so it need not be generated again.

        A longer cap than the model's decodes the same text when the greedy answer ended before
        the model's cap (at a stop string or the end of sequence).
        """
        if self._returns_greedy(reply):
            return True
        own = self.decoding.max_new_tokens
        longer = reply.max_new_tokens is not None and reply.max_new_tokens > own
        return reply.temperature == 0 and not reply.stop and longer and len(greedy.token_ids) < own

    def _reply_params(self, reply: Reply) -> SamplingParams:
        cap = reply.max_new_tokens or self.decoding.max_new_tokens
        stop = tuple(dict.fromkeys((*self.template.stop, *reply.stop)))
        return SamplingParams(max_new_tokens=cap, temperature=reply.temperature, top_p=reply.top_p, top_k=0, stop=stop)

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
            },
            "candor_version": __version__,
            "model_version": self.version,
            "served": True,
        }

    # ------------------------------------------------------------ deciding

    @property
    def fitted_on_labels(self) -> bool:
        """Whether the confidence is a probability fitted on labels: a calibrator, or a head trained on labels."""
        return self.calibrator is not None or bool(getattr(self.source, "calibrated_on_labels", False))

    def calibration(self, shape: str) -> dict[str, Any]:
        """``calibrated``: the value is a probability fitted on labels for requests of ``shape``; and where."""
        return self.served_by().calibration(shape)

    def served_by(self) -> ServedBy:
        """What this model stands for now (version, threshold, calibration); every answer carries it."""
        return ServedBy(
            version=self.version,
            threshold=self.threshold,
            fitted_where=self._fitted_where(),
            tuned_on=tuple(self.tuned_on),
        )

    def _fitted_where(self) -> str | None:
        shapes = " and ".join(shape_words(s) for s in self.tuned_on)
        if self.calibrator is not None:
            count = f"{self.calibrated_on} " if self.calibrated_on else ""
            return f"a {self.calibrator.name} calibrator fitted on {count}labelled {shapes}"
        if self.fitted_on_labels:
            return f"the head's stage 2, trained on labelled {shapes}"
        return None

    def _calibrated(self, raw: np.ndarray) -> np.ndarray:
        return self.calibrator.predict(raw) if self.calibrator is not None else np.asarray(raw, dtype=float)

    def _declines(self, confidence: float) -> bool:
        return self.threshold is not None and self.threshold.abstains(float(confidence))

    def _threshold_value(self) -> float | None:
        return None if self.threshold is None else self.threshold.value

    def _abstention(
        self,
        confidence: float,
        reason: str,
        withheld: str | None = None,
        rec: Record | None = None,
        below: bool = True,
    ) -> HonestAnswer:
        if below and self.threshold is not None:
            reason = f"{reason} ({confidence:.3f} < {self.threshold.value:.3f})"
        generated = len(rec.greedy.token_ids) if rec is not None else 0  # an answer-level source generated it
        return HonestAnswer(
            answer=None,
            confidence=float(confidence),
            abstained=True,
            reason=reason,
            method=self.method,
            calibrated=self.fitted_on_labels,
            threshold=self._threshold_value(),
            finish_reason="abstained",
            completion_tokens=generated,
            withheld=withheld,
            record=rec,
            served_by=self.served_by(),
        )

    def _undecided(self, confidence: float) -> HonestAnswer:
        """The head's verdict for a question it answers, before the answer exists (the first streamed chunk)."""
        return HonestAnswer(
            answer=None,
            confidence=float(confidence),
            abstained=False,
            reason=self._answer_reason(),
            method=self.method,
            calibrated=self.fitted_on_labels,
            threshold=self._threshold_value(),
            served_by=self.served_by(),
        )

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
            answer=completion.text,
            confidence=float(confidence),
            abstained=False,
            reason=self._answer_reason(),
            method=self.method,
            calibrated=self.fitted_on_labels,
            threshold=self._threshold_value(),
            finish_reason=finish,
            completion_tokens=used,
            scores_returned_text=scored,
            completion=completion,
            prompt_tokens=prompt_tokens or ask.prompted.prompt_tokens or 0,
            record=rec,
            served_by=self.served_by(),
        )

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

        The model is then tuned for the request shapes of ``dev`` (:mod:`candor.serve.shapes`):
        records annotated after a system prompt (their item's ``history``) make it calibrated for
        requests with that system prompt.
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
        self.tuned_on = shapes_of(r.item.history for r in labelled)
        self.system_prompts = system_prompts_of(r.item.history for r in labelled)
        return self.threshold

    def fit_calibrator(self, name: str, confidence: np.ndarray, correct: np.ndarray) -> Calibrator:
        self.calibrator = get_calibrator(name).fit(confidence, correct)
        self.calibrated_on = len(confidence)
        return self.calibrator

    # ------------------------------------------------------------ save / load

    def save_pretrained(self, folder: str | Path) -> Path:
        """Write everything needed to answer into one folder (swapped in whole; :mod:`candor.serve.honest_folder`)."""
        folder = Path(folder)
        if self.version == "unsaved":
            self.version = fresh_version()
        with atomic_folder(folder) as tmp:
            config = {
                "generator": generator_config(self.backend, self.backend_name, self.template.name, self.decoding, tmp),
                "confidence": self.source.save(tmp),
                "calibrator": calibrator_config(self.calibrator, self.calibrated_on),
                "threshold": None if self.threshold is None else self.threshold.to_dict(),
                "tuned_on": list(self.tuned_on),
                "version": self.version,
                "factuality": factuality_config(self.factuality),
            }
            write_system_prompts(tmp, self.tuned_on, self.system_prompts)
            (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        return folder

    @classmethod
    def from_pretrained(cls, folder: str | Path, backend: Backend | None = None, **backend_kwargs: Any) -> HonestModel:
        """Reload a saved model; the generator is loaded by name unless ``backend`` is given."""
        saved = read_folder(folder)
        backend = backend if backend is not None else saved.load_generator(**backend_kwargs)
        model = cls(
            backend,
            load_source(saved.confidence, saved.folder),
            saved.calibrator,
            saved.threshold,
            template=saved.generator.get("template", "auto"),
            decoding=saved.decoding,
            backend_name=saved.generator.get("backend", "hf"),
        )
        model.calibrated_on, model.tuned_on, model.version = saved.fitted_on, saved.tuned_on, saved.version
        model.factuality = saved.factuality
        model.system_prompts = dict(saved.system_prompts)
        return model
