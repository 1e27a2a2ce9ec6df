"""pydantic-ai's OpenAI chat model for ``candor serve``: an abstention is an answer, and each carries its confidence.

Install with ``pip install "candor-honesty[pydantic-ai]"``::

    from pydantic_ai import Agent
    from pydantic_ai.providers.openai import OpenAIProvider
    from candor.integrations.pydantic_ai import CandorChatModel, served_answer

    model = CandorChatModel("candor", provider=OpenAIProvider(base_url="http://127.0.0.1:8000/v1", api_key="..."))
    result = await Agent(model, instructions="Answer briefly.").run("Who wrote Hamlet?")
    answer = served_answer(result)          # ServedAnswer: .text, .abstained, .confidence.value

``CandorChatModel`` is pydantic-ai's ``OpenAIChatModel`` (every option of it works) through the two
hooks that class documents for subclasses (``_process_provider_details`` and
``_streamed_response_cls``) and its response processing:

- the ``confidence`` object candor puts on the choice is kept in the response's ``provider_details``,
  for ``run`` and ``run_stream``;
- with ``candor serve --abstain-as refusal``, the refusal is read as the answer's text, so an
  abstention is a result (``served_answer(result).abstained``) instead of pydantic-ai's
  ``ContentFilterError``. With ``--abstain-as text`` (the default) it is text already.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

try:
    from openai.types.chat import ChatCompletion, ChatCompletionChunk
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIStreamedResponse
except ImportError as exc:  # the extra is optional; say how to get it
    raise ImportError(
        'candor.integrations.pydantic_ai needs pydantic-ai: pip install "candor-honesty[pydantic-ai]"'
    ) from exc

from candor.integrations.served import ServedAnswer, ServedConfidence, answer, choice_confidence, refusal_as_text


class CandorStreamedResponse(OpenAIStreamedResponse):
    """pydantic-ai's streamed OpenAI response, keeping candor's confidence and reading a refusal as text."""

    def _map_chunk(self, chunk: ChatCompletionChunk) -> Iterator[Any]:
        return super()._map_chunk(refusal_as_text(chunk))

    def _map_chunk_provider_details(self, chunk: ChatCompletionChunk) -> dict[str, Any] | None:
        details = dict(super()._map_chunk_provider_details(chunk) or {})
        if chunk.choices and (confidence := choice_confidence(chunk.choices[0])) is not None:
            details["confidence"] = confidence  # the choice's last chunk carries it (a head's first one too)
        return details or None


class CandorChatModel(OpenAIChatModel):
    """``OpenAIChatModel`` that keeps candor's confidence and shows an abstention as an answer (module docstring)."""

    def _process_response(self, response: ChatCompletion | str, **kwargs: Any) -> Any:
        return super()._process_response(refusal_as_text(response), **kwargs)

    def _process_provider_details(self, response: ChatCompletion) -> dict[str, Any] | None:
        details = dict(super()._process_provider_details(response) or {})
        if response.choices and (confidence := choice_confidence(response.choices[0])) is not None:
            details["confidence"] = confidence
        return details or None

    @property
    def _streamed_response_cls(self) -> type[OpenAIStreamedResponse]:
        return CandorStreamedResponse


def served_confidence(result: Any) -> ServedConfidence | None:
    """The confidence of a run's last answer (an ``AgentRunResult`` or a finished ``StreamedRunResult``)."""
    details = getattr(result.response, "provider_details", None) or {}
    return ServedConfidence.from_object(details.get("confidence"))


def served_answer(result: Any, output: str | None = None) -> ServedAnswer:
    """The run's answer as the user sees it, whether it abstained, and its confidence.

    ``result`` is ``agent.run``'s result, or ``agent.run_stream``'s once consumed, with the text
    ``await stream.get_output()`` returned as ``output``.
    """
    if output is None:
        output = getattr(result, "output", None)
    return answer(output if isinstance(output, str) else None, served_confidence(result))
