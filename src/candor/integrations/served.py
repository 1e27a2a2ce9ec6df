"""What ``candor serve`` said about one answer, as the framework adapters hand it to an application.

Every adapter in ``candor.integrations`` (LiteLLM, pydantic-ai, openai-agents) returns these two typed
values, whatever the framework's own result looks like:

- ``ServedConfidence``: the ``confidence`` object the server put on the choice (``value``, ``abstained``,
  and the whole object in ``details``: ``method``, ``calibrated``, ``threshold``, ``reason`` …);
- ``ServedAnswer``: the text the user sees (the refusal text for an abstention), whether the model
  abstained, and its ``ServedConfidence``.

An abstention is a value here, never an exception: with ``--abstain-as refusal`` the adapters turn
OpenAI's refusal field into the answer's text (``refusal_as_text``) before the framework sees it, so
pydantic-ai and openai-agents return it instead of raising their refusal errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ServedConfidence:
    """The confidence object ``candor serve`` put on one choice (docs/serving.md lists its fields)."""

    value: float
    abstained: bool
    details: Mapping[str, Any]

    @classmethod
    def from_object(cls, confidence: Mapping[str, Any] | None) -> ServedConfidence | None:
        """From the JSON object (``None`` when the response carried none: not a candor server)."""
        if not confidence or "value" not in confidence:
            return None
        return cls(value=float(confidence["value"]), abstained=bool(confidence.get("abstained")), details=confidence)

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> ServedConfidence | None:
        """From the ``x-candor-confidence`` / ``x-candor-abstained`` headers of a plain response (choice 0)."""
        lowered = {str(k).lower(): v for k, v in headers.items()}
        if "x-candor-confidence" not in lowered:
            return None
        value = float(lowered["x-candor-confidence"])
        abstained = lowered.get("x-candor-abstained") == "true"
        details = {"value": value, "abstained": abstained, "model_version": lowered.get("x-candor-model-version")}
        return cls(value=value, abstained=abstained, details=details)


@dataclass(frozen=True)
class ServedAnswer:
    """One answer as the user sees it: its text (the refusal text when it abstained) and its confidence."""

    text: str
    abstained: bool
    confidence: ServedConfidence | None


def answer(text: str | None, confidence: ServedConfidence | None) -> ServedAnswer:
    """A ``ServedAnswer`` from the text a framework returned and the confidence the adapter kept."""
    return ServedAnswer(text=text or "", abstained=bool(confidence and confidence.abstained), confidence=confidence)


def choice_confidence(choice: Any) -> dict[str, Any] | None:
    """The ``confidence`` object of a chat completion choice or chunk choice (openai SDK objects or dicts)."""
    extra = choice if isinstance(choice, Mapping) else (getattr(choice, "model_extra", None) or {})
    found = extra.get("confidence")
    return found if isinstance(found, Mapping) else None


def refusal_as_text(completion: Any) -> Any:
    """A chat completion (or chunk) whose refusals are the answer's text, as ``--abstain-as text`` sends it.

    ``candor serve --abstain-as refusal`` puts an abstention in ``message.refusal`` (``delta.refusal``
    when streamed), which pydantic-ai and openai-agents raise as an error. Copied with the refusal in
    ``content`` (and ``refusal`` empty) they return it as the answer; the confidence, which stays on
    the choice, says it abstained. Any other completion is returned unchanged.
    """
    choices = getattr(completion, "choices", None) or []
    changed = []
    for choice in choices:
        field = "message" if getattr(choice, "message", None) is not None else "delta"
        message = getattr(choice, field, None)
        refusal = getattr(message, "refusal", None)
        if not refusal:
            changed.append(choice)
            continue
        text = (getattr(message, "content", None) or "") + refusal
        changed.append(choice.model_copy(update={field: message.model_copy(update={"content": text, "refusal": None})}))
    if all(a is b for a, b in zip(changed, choices, strict=True)):
        return completion
    return completion.model_copy(update={"choices": changed})
