"""The OpenAI response shapes candor answers with: choices, log-probs, usage and the ``confidence`` object."""

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


def choice_of(
    endpoint: Endpoint, index: int, a: HonestAnswer, ask: Ask, body: Any, settings: ServeSettings
) -> dict[str, Any]:
    logprobs = logprobs_of(a, body, endpoint)
    confidence = confidence_object(a, ask)
    if endpoint.chat:
        # An abstention is OpenAI's refusal: no content, the refusal text in ``message.refusal``.
        message = (
            {"role": "assistant", "content": None, "refusal": settings.refusal}
            if a.abstained
            else {"role": "assistant", "content": a.answer or "", "refusal": None}
        )
        return {
            "index": index,
            "message": message,
            "finish_reason": a.finish_reason,
            "logprobs": logprobs,
            "confidence": confidence,
        }
    text = settings.refusal if a.abstained else (a.answer or "")
    out = {
        "index": index,
        "text": text,
        "finish_reason": a.finish_reason,
        "logprobs": logprobs,
        "confidence": confidence,
    }
    if a.abstained:
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
