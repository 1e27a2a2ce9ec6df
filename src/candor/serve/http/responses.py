"""The OpenAI response shapes candor answers with: choices, log-probs, usage, the ``confidence`` object and headers.

An abstention is shown as ``settings.abstain_as`` says: ``"text"``, the refusal text is the answer's text
(``message.content``), which every client and framework shows; ``"refusal"``, OpenAI's own refusal field
(``message.refusal``, content ``null``), which some frameworks raise as an error. Either way its
``finish_reason`` is ``"stop"`` (as OpenAI's own refusals end), and ``confidence.abstained`` and the
``x-candor-*`` headers (:func:`answer_headers`) say that it abstained.
"""

from __future__ import annotations

import json
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


def refusal_as_text(settings: ServeSettings, ask: Ask | None = None) -> bool:
    """True when an abstention's refusal text is the answer's text (``--abstain-as text``).

    Never for a structured output: a JSON parser must not be handed the refusal text as if it were the
    JSON asked for, so it is OpenAI's ``refusal`` field whatever ``--abstain-as`` says.
    """
    structured = ask is not None and ask.prompted.agent is not None and ask.prompted.agent.output_schema is not None
    return settings.abstain_as == "text" and not structured


def tool_calls_of(answer: HonestAnswer) -> list[dict[str, Any]] | None:
    """An answer's calls in OpenAI's ``tool_calls`` shape (arguments as JSON text); None when it makes none."""
    agent = answer.agent
    if answer.abstained or agent is None or not agent.calls:
        return None
    return [
        {
            "id": call_id(answer, i),
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
        }
        for i, c in enumerate(agent.calls)
    ]


def call_id(answer: HonestAnswer, index: int) -> str:
    """A call's id, the same each time the answer is shown (plain, streamed, logged)."""
    ids = answer.agent.call_ids
    while len(ids) <= index:
        ids.append(f"call_{uuid.uuid4().hex[:24]}")
    return str(ids[index])


def choice_of(
    endpoint: Endpoint, index: int, a: HonestAnswer, ask: Ask, body: Any, settings: ServeSettings
) -> dict[str, Any]:
    logprobs = logprobs_of(a, body, endpoint)
    confidence = confidence_object(a, ask)
    as_text = refusal_as_text(settings, ask)
    calls = tool_calls_of(a)
    if endpoint.chat and calls is not None:
        message = {"role": "assistant", "content": None, "refusal": None, "tool_calls": calls}
        return {
            "index": index,
            "message": message,
            "finish_reason": "tool_calls",
            "logprobs": None,
            "confidence": confidence,
        }
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
    tokens = returned_tokens(c.tokens, a.answer or "")
    if endpoint.chat:

        def entry(tok: str, lp: float) -> dict[str, Any]:
            return {"token": tok, "logprob": lp, "bytes": list(tok.encode("utf-8", "replace"))}

        content = [
            {**entry(t, lp), "top_logprobs": [entry(x, v) for x, v in list(alt.items())[:top]]}
            for t, lp, alt in zip(tokens, c.logprobs, alts, strict=True)
        ]
        return {"content": content}
    offsets, at = [], 0
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": list(c.logprobs),
        "top_logprobs": [dict(list(alt.items())[:top]) for alt in alts],
        "text_offset": offsets,
    }


def returned_tokens(tokens: Sequence[str], content: str) -> list[str]:
    """The generated tokens' texts trimmed as the content was (its leading and trailing whitespace), so that
    they concatenate to the returned content, as a client that rebuilds the text from them expects."""
    out = list(tokens)
    joined = "".join(out)
    lead = len(joined) - len(joined.lstrip())
    trail = len(joined.lstrip()) - len(joined.strip())
    i = 0
    while lead and i < len(out):
        cut = min(lead, len(out[i]))
        out[i], lead, i = out[i][cut:], lead - cut, i + 1
    i = len(out) - 1
    while trail and i >= 0:
        cut = min(trail, len(out[i]))
        out[i], trail, i = out[i][: len(out[i]) - cut], trail - cut, i - 1
    return out


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
        # an agent turn: each call's values, or each top-level field's
        **({} if answer.agent is None else answer.agent.describe()),
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
