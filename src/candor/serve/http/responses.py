"""The OpenAI response shapes candor answers with: choices, log-probs, usage, the ``confidence`` object and headers.

An abstention is shown as ``settings.abstain_as`` says: ``"text"``, the refusal text is the answer's text
(``message.content``), which every client and framework shows; ``"refusal"``, OpenAI's own refusal field
(``message.refusal``, content ``null``), which some frameworks raise as an error. Either way its
``finish_reason`` is ``"stop"`` (as OpenAI's own refusals end), and ``confidence.abstained`` and the
``x-candor-*`` headers (:func:`answer_headers`) say that it abstained.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from candor.serve.answering import Ask, HonestAnswer
from candor.serve.http.settings import ServeSettings


@dataclass(frozen=True)
class Endpoint:
    """How one endpoint shapes its choices (chat messages or completion texts)."""

    object: str
    chunk_object: str
    prefix: str
    chat: bool


CHAT = Endpoint("chat.completion", "chat.completion.chunk", "chatcmpl", True)
COMPLETION = Endpoint("text_completion", "text_completion", "cmpl", False)


def response_head(obj: str, prefix: str, settings: ServeSettings) -> dict[str, Any]:
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": obj,
        "created": int(time.time()),
        "model": settings.model_id,
    }


# The headers an answer carries (docs/serving.md "Headers"): choice 0's confidence and whether it
# abstained, the indexes of every abstained choice, and the version of the model that answered.
CONFIDENCE_HEADER = "x-candor-confidence"
ABSTAINED_HEADER = "x-candor-abstained"
ABSTAINED_CHOICES_HEADER = "x-candor-abstained-choices"
MODEL_VERSION_HEADER = "x-candor-model-version"
CANDOR_HEADERS = (CONFIDENCE_HEADER, ABSTAINED_HEADER, ABSTAINED_CHOICES_HEADER, MODEL_VERSION_HEADER)


def answer_headers(answers: Sequence[HonestAnswer], version: str) -> dict[str, str]:
    """A plain response's headers: the first choice's confidence (six decimals) and abstention, every
    abstained choice's index (comma-separated, empty when none) and the model version."""
    first = answers[0]
    return {
        CONFIDENCE_HEADER: f"{first.confidence:.6f}",
        ABSTAINED_HEADER: "true" if first.abstained else "false",
        ABSTAINED_CHOICES_HEADER: ",".join(str(i) for i, a in enumerate(answers) if a.abstained),
        MODEL_VERSION_HEADER: version,
    }


def stream_headers(version: str) -> dict[str, str]:
    """A stream's headers are sent before any decision: only the model version is known then (the
    confidence rides in the stream's events)."""
    return {"Cache-Control": "no-cache", MODEL_VERSION_HEADER: version}


def finish_reason_of(answer: HonestAnswer) -> str:
    """OpenAI's finish reason: ``"stop"`` for an abstention, as OpenAI's own refusals end; else the answer's own."""
    return "stop" if answer.abstained else answer.finish_reason


def refusal_as_text(settings: ServeSettings) -> bool:
    """True when an abstention's refusal text is the answer's text (``--abstain-as text``)."""
    return settings.abstain_as == "text"


def choice_of(
    endpoint: Endpoint, index: int, a: HonestAnswer, ask: Ask, body: Any, settings: ServeSettings
) -> dict[str, Any]:
    logprobs = logprobs_of(a, body, endpoint)
    confidence = confidence_object(a, ask)
    as_text = refusal_as_text(settings)
    if endpoint.chat:
        # An abstention is the refusal text as content (--abstain-as text) or OpenAI's refusal field, never
        # the withheld answer.
        message = (
            {
                "role": "assistant",
                "content": settings.refusal if as_text else None,
                "refusal": None if as_text else settings.refusal,
            }
            if a.abstained
            else {"role": "assistant", "content": a.answer or "", "refusal": None}
        )
        return {
            "index": index,
            "message": message,
            "finish_reason": finish_reason_of(a),
            "logprobs": logprobs,
            "confidence": confidence,
        }
    # A completion has only text: it always carries the refusal text; ``refusal`` too with --abstain-as refusal.
    text = settings.refusal if a.abstained else (a.answer or "")
    out = {
        "index": index,
        "text": text,
        "finish_reason": finish_reason_of(a),
        "logprobs": logprobs,
        "confidence": confidence,
    }
    if a.abstained and not as_text:
        out["refusal"] = settings.refusal
    return out


def logprobs_of(a: HonestAnswer, body: Any, endpoint: Endpoint) -> dict[str, Any] | None:
    """The returned tokens' log-probs in the endpoint's OpenAI shape, when asked for."""
    top = body.top_logprobs_wanted()
    if top is None or a.completion is None or a.abstained:
        return None
    c = a.completion
    alts = c.top_logprobs or [{} for _ in c.tokens]
    if endpoint.chat:

        def entry(tok: str, lp: float) -> dict[str, Any]:
            return {"token": tok, "logprob": lp, "bytes": list(tok.encode("utf-8", "replace"))}

        content = [
            {**entry(t, lp), "top_logprobs": [entry(x, v) for x, v in list(alt.items())[:top]]}
            for t, lp, alt in zip(c.tokens, c.logprobs, alts, strict=True)
        ]
        return {"content": content}
    offsets, at = [], 0
    for t in c.tokens:
        offsets.append(at)
        at += len(t)
    return {
        "tokens": list(c.tokens),
        "token_logprobs": list(c.logprobs),
        "top_logprobs": [dict(list(alt.items())[:top]) for alt in alts],
        "text_offset": offsets,
    }


def confidence_object(answer: HonestAnswer, ask: Ask) -> dict[str, Any]:
    """The response's ``confidence`` object, from what the answer carries (never from the model, which a
    reload may have replaced since it answered)."""
    served = answer.served_by
    if served is None:
        raise ValueError("an answer served over HTTP carries what its model stood for (HonestAnswer.served_by)")
    t = served.threshold
    shape = ask.prompted.shape
    calibration = served.calibration(shape) if answer.calibrated else {"calibrated": False, "calibrated_on": None}
    return {
        "value": answer.confidence,
        "method": answer.method,
        **calibration,
        # What the value was computed on: the question alone, or the question after the earlier messages.
        "computed_on": {"shape": shape, "earlier_messages": len(ask.prompted.history)},
        "model_version": served.version,
        "threshold": answer.threshold,
        "abstained": answer.abstained,
        "expected_accuracy": None if t is None else t.expected_accuracy,
        "expected_coverage": None if t is None else t.expected_coverage,
        "reason": answer.reason,
        # False: the text was decoded with the request's parameters, the value is the greedy answer's
        "scores_returned_text": answer.scores_returned_text,
        # --claims: each claim of a long answer with its own confidence, and those refined away
        **({} if answer.claims is None else answer.claims.describe()),
    }


def usage_of(asks: Sequence[Ask], answers: Sequence[list[HonestAnswer]]) -> dict[str, int]:
    """The engine's own counts: the templated prompt once per question, each distinct returned text once."""
    prompt = completion = 0
    for ask, per_q in zip(asks, answers, strict=False):
        prompt += max((a.prompt_tokens for a in per_q), default=0) or ask.prompted.prompt_tokens or 0
        seen: set[int] = set()
        for a in per_q:
            # An answer-level abstention's answer was generated (and scored), though not returned.
            made = a.completion if a.completion is not None else (a.record.greedy if a.record is not None else None)
            if made is not None and id(made) not in seen:
                seen.add(id(made))
                completion += a.completion_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
