"""LiteLLM with ``candor serve``: the confidence of plain and streamed completions, and a streamed refusal kept.

Install with ``pip install "candor-honesty[litellm]"``::

    import litellm
    from candor.integrations.litellm import CandorStream, served_confidence

    kwargs = dict(model="openai/candor", api_base="http://127.0.0.1:8000/v1", api_key="...", messages=messages)
    response = litellm.completion(**kwargs)
    served_confidence(response).value                 # plain: the choice's confidence object

    stream = CandorStream(litellm.completion(**kwargs, stream=True))
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream)
    served_confidence(stream).value                   # once the stream is consumed

A plain LiteLLM response keeps candor's ``confidence`` in ``choices[0].provider_specific_fields``
(and the ``x-candor-*`` headers in ``_hidden_params["additional_headers"]``); ``served_confidence``
reads it from there. A stream loses both: LiteLLM rebuilds each chunk and drops the fields it does
not know, the confidence on the last chunk and, with ``--abstain-as refusal``, the refusal itself (an
empty answer). ``CandorStream`` wraps LiteLLM's stream (sync or async) and reads the provider's chunks
as LiteLLM consumes them: it keeps the confidence, and puts a refusal LiteLLM dropped back in the
chunk's ``delta.content``, so the user sees the refusal text either way. With ``candor serve --stream live``
the answer's text streams before the decision and an abstention's refusal withdraws it: ``stream.withdrawn``
is then true and ``served_answer(stream).text`` is the refusal alone (the chunks already read held the
withdrawn text; show ``served_answer(stream).text`` once the stream ends).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

try:
    import litellm  # noqa: F401  (the extra's presence; the wrapper reads LiteLLM's stream objects)
except ImportError as exc:  # the extra is optional; say how to get it
    raise ImportError('candor.integrations.litellm needs litellm: pip install "candor-honesty[litellm]"') from exc

from candor.integrations.served import ServedAnswer, ServedConfidence, answer, choice_confidence


class CandorStream:
    """LiteLLM's ``CustomStreamWrapper`` (from ``completion(..., stream=True)`` or ``acompletion``) read for candor.

    Iterate it as LiteLLM's stream (``for`` or ``async for``); it yields LiteLLM's chunks. ``confidence``
    is the last choice's confidence object once seen, ``refusal`` the refusal text if the server sent
    one, ``text`` the content the chunks carried (the refusal included), or the refusal alone when it
    withdrew text streamed before it (``withdrawn``: ``--stream live``).
    """

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.confidence: dict[str, Any] | None = None
        self.refusal: str | None = None
        self.text = ""
        self.withdrawn = False
        self._streamed_text = False
        self._pending_refusal = ""
        provider_stream = stream.completion_stream  # the provider's own chunks (the openai SDK's stream)
        if hasattr(provider_stream, "__aiter__"):
            stream.completion_stream = self._read_async(provider_stream)
        else:
            stream.completion_stream = self._read(provider_stream)

    def _see(self, chunk: Any) -> None:
        for choice in getattr(chunk, "choices", None) or []:
            if (confidence := choice_confidence(choice)) is not None:
                self.confidence = confidence
            delta = getattr(choice, "delta", None)
            self._streamed_text = self._streamed_text or bool(getattr(delta, "content", None))
            refusal = getattr(delta, "refusal", None)
            if refusal:
                self.withdrawn = self.withdrawn or self._streamed_text
                self.refusal = (self.refusal or "") + refusal
                self._pending_refusal += refusal

    def _read(self, provider_stream: Any) -> Iterator[Any]:
        for chunk in provider_stream:
            self._see(chunk)
            yield chunk

    async def _read_async(self, provider_stream: Any) -> AsyncIterator[Any]:
        async for chunk in provider_stream:
            self._see(chunk)
            yield chunk

    def _restore(self, chunk: Any) -> Any:
        """Put a refusal LiteLLM dropped back into the chunk it was read with, as content."""
        choices = getattr(chunk, "choices", None) or []
        if self._pending_refusal and choices:
            delta = choices[0].delta
            if not getattr(delta, "refusal", None):
                delta.content = (delta.content or "") + self._pending_refusal
            if self.withdrawn and self.refusal == self._pending_refusal:  # the refusal's first part: text withdrawn
                self.text = ""
            self._pending_refusal = ""
        if choices:
            self.text += choices[0].delta.content or ""
        return chunk

    def __iter__(self) -> Iterator[Any]:
        for chunk in self.stream:
            yield self._restore(chunk)

    async def __aiter__(self) -> AsyncIterator[Any]:
        async for chunk in self.stream:
            yield self._restore(chunk)


def served_confidence(response: Any) -> ServedConfidence | None:
    """The confidence of a LiteLLM ``ModelResponse`` (choice 0) or of a consumed ``CandorStream``."""
    if isinstance(response, CandorStream):
        return ServedConfidence.from_object(response.confidence)
    choices = getattr(response, "choices", None) or []
    if choices:
        fields = getattr(choices[0], "provider_specific_fields", None) or {}
        if (found := ServedConfidence.from_object(fields.get("confidence"))) is not None:
            return found
    headers = (getattr(response, "_hidden_params", None) or {}).get("additional_headers") or {}
    return ServedConfidence.from_headers({k.removeprefix("llm_provider-"): v for k, v in headers.items()})


def served_answer(response: Any) -> ServedAnswer:
    """The answer as the user sees it (the refusal text for an abstention), whether it abstained, its confidence."""
    if isinstance(response, CandorStream):
        return answer(response.text, served_confidence(response))
    message = response.choices[0].message
    return answer(message.content or getattr(message, "refusal", None), served_confidence(response))
